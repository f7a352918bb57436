#include "llama_kernels.h"

#include <cmath>
#include <cstddef>

namespace pipesim::cpu {

void rmsnorm_forward(std::span<const float> x, std::span<const float> gain, std::span<float> y, std::span<float> rstd,
                     int n, int h) {
  for (int i = 0; i < n; ++i) {
    const float* row = &x[std::size_t(i) * h];
    double squares = 0;  // in double, as layernorm_forward's sums
    for (int j = 0; j < h; ++j) squares += double(row[j]) * row[j];
    const float r = float(1.0 / std::sqrt(squares / h + kRmsNormEpsilon));
    rstd[std::size_t(i)] = r;
    for (int j = 0; j < h; ++j) y[std::size_t(i) * h + j] = row[j] * r * gain[std::size_t(j)];
  }
}

void rmsnorm_backward(std::span<const float> x, std::span<const float> gain, std::span<const float> rstd,
                      std::span<const float> dy, std::span<float> dx, std::span<float> dgain, int n, int h) {
  for (int i = 0; i < n; ++i) {
    const float r = rstd[std::size_t(i)];
    // y = xhat · gain with xhat = x · r and r depending on every x of the row: dr/dx_j = −r³ x_j / h,
    // which gives dx = r (g − xhat · mean(g · xhat)), LayerNorm's form without the mean terms.
    double gx_mean = 0;
    for (int j = 0; j < h; ++j) {
      const std::size_t at = std::size_t(i) * h + j;
      const float xhat = x[at] * r;
      gx_mean += dy[at] * gain[std::size_t(j)] * xhat;
      dgain[std::size_t(j)] += dy[at] * xhat;
    }
    gx_mean /= h;
    for (int j = 0; j < h; ++j) {
      const std::size_t at = std::size_t(i) * h + j;
      const float xhat = x[at] * r, g = dy[at] * gain[std::size_t(j)];
      dx[at] += r * (g - xhat * float(gx_mean));
    }
  }
}

namespace {

/// Rotates every head pair of every row by `sign` times its angle (rope_forward: +1, backward: −1).
void rotate(std::span<float> x, int n, int seq, int width, int heads, int d, float theta, int sign) {
  const int half = d / 2;
  for (int row = 0; row < n; ++row) {
    const double position = row % seq;
    for (int i = 0; i < half; ++i) {
      const double angle = sign * position * std::pow(double(theta), -2.0 * i / d);
      const auto c = float(std::cos(angle)), s = float(std::sin(angle));
      for (int head = 0; head < heads; ++head) {
        float* v = &x[std::size_t(row) * width + std::size_t(head) * d];
        const float a = v[i], b = v[i + half];
        v[i] = a * c - b * s, v[i + half] = b * c + a * s;
      }
    }
  }
}

float sigmoid(float g) { return 1.0f / (1.0f + std::exp(-g)); }

}  // namespace

void rope_forward(std::span<float> x, int n, int seq, int width, int heads, int d, float theta) {
  rotate(x, n, seq, width, heads, d, theta, +1);
}

void rope_backward(std::span<float> dx, int n, int seq, int width, int heads, int d, float theta) {
  rotate(dx, n, seq, width, heads, d, theta, -1);
}

void swiglu_forward(std::span<const float> gate_up, std::span<float> out, int n, int f) {
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < f; ++j) {
      const std::size_t row = std::size_t(i) * 2 * f;
      const float g = gate_up[row + j], u = gate_up[row + f + j];
      out[std::size_t(i) * f + j] = g * sigmoid(g) * u;
    }
}

void swiglu_backward(std::span<const float> gate_up, std::span<const float> dout, std::span<float> dgate_up, int n,
                     int f) {
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < f; ++j) {
      const std::size_t row = std::size_t(i) * 2 * f;
      const float g = gate_up[row + j], u = gate_up[row + f + j], go = dout[std::size_t(i) * f + j];
      const float s = sigmoid(g);
      dgate_up[row + j] += go * u * s * (1 + g * (1 - s));  // silu'(g) = s + g·s·(1 − s)
      dgate_up[row + f + j] += go * g * s;
    }
}

}  // namespace pipesim::cpu
