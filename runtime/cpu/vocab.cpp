#include "vocab.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "kernels.h"

namespace pipesim::cpu {
namespace {

std::size_t at(int row, int width, int col) { return std::size_t(row) * std::size_t(width) + std::size_t(col); }

}  // namespace

void output_logits(std::span<const float> x, std::span<const float> w, std::span<const int> targets, VocabShard shard,
                   int n, int h, std::span<float> logits, std::span<float> max, std::span<float> sum_exp,
                   std::span<float> target_logit) {
  const int r = shard.rows;
  std::fill(logits.begin(), logits.end(), 0.0f);
  if (r > 0) matmul_bt(x, w, logits, n, h, r);
  for (int t = 0; t < n; ++t) {
    const float* row = logits.data() + at(t, r, 0);
    const float m = r > 0 ? *std::max_element(row, row + r) : -std::numeric_limits<float>::infinity();
    double s = 0;
    for (int v = 0; v < r; ++v) s += std::exp(double(row[v]) - m);
    max[std::size_t(t)] = m;
    sum_exp[std::size_t(t)] = float(s);
    const int target = targets[std::size_t(t)];
    target_logit[std::size_t(t)] = shard.holds(target) ? row[target - shard.first] : 0.0f;
  }
}

void output_input_grad_terms(std::span<const float> logits, std::span<const float> max, std::span<const float> sum_exp,
                             std::span<const float> w, std::span<const int> targets, VocabShard shard, int n, int h,
                             std::span<float> a, std::span<float> y) {
  const int r = shard.rows;
  std::fill(a.begin(), a.end(), 0.0f);
  std::fill(y.begin(), y.end(), 0.0f);
  if (r == 0) return;
  std::vector<float> softmax(std::size_t(n) * std::size_t(r));
  for (int t = 0; t < n; ++t)
    for (int v = 0; v < r; ++v)
      softmax[at(t, r, v)] = float(std::exp(double(logits[at(t, r, v)]) - max[std::size_t(t)]) / sum_exp[std::size_t(t)]);
  matmul(softmax, w, a, n, r, h);
  for (int t = 0; t < n; ++t)
    if (const int target = targets[std::size_t(t)]; shard.holds(target))
      std::copy_n(w.begin() + std::ptrdiff_t(at(target - shard.first, h, 0)), h, y.begin() + std::ptrdiff_t(at(t, h, 0)));
}

void rescale_sum_exp(std::span<const float> max, std::span<const float> sum_exp, std::span<const float> global_max,
                     std::span<float> scaled) {
  for (std::size_t t = 0; t < max.size(); ++t)
    scaled[t] = sum_exp[t] == 0 ? 0.0f : float(sum_exp[t] * std::exp(double(max[t]) - global_max[t]));
}

void input_grad_share(std::span<const float> scaled_sum_exp, std::span<const float> global_sum_exp,
                      std::span<const float> a, std::span<const float> y, float g, int n, int h, std::span<float> dx) {
  for (int t = 0; t < n; ++t) {
    const float weight = scaled_sum_exp[std::size_t(t)] / global_sum_exp[std::size_t(t)];
    for (int j = 0; j < h; ++j) dx[at(t, h, j)] = g * (weight * a[at(t, h, j)] - y[at(t, h, j)]);
  }
}

double loss_sum(std::span<const float> global_max, std::span<const float> global_sum_exp,
                std::span<const float> target_logit) {
  double total = 0;
  for (std::size_t t = 0; t < global_max.size(); ++t)
    total += double(global_max[t]) + std::log(double(global_sum_exp[t])) - target_logit[t];
  return total;
}

void output_backward(std::span<const float> logits, std::span<const float> global_max,
                     std::span<const float> global_sum_exp, std::span<const int> targets, VocabShard shard, float g,
                     std::span<const float> x, std::span<const float> w, int n, int h, std::span<float> dw,
                     std::span<float> dx) {
  const int r = shard.rows;
  if (!dx.empty()) std::fill(dx.begin(), dx.end(), 0.0f);
  if (r == 0) return;
  std::vector<float> grad(std::size_t(n) * std::size_t(r));
  for (int t = 0; t < n; ++t) {
    for (int v = 0; v < r; ++v)
      grad[at(t, r, v)] = float(std::exp(double(logits[at(t, r, v)]) - global_max[std::size_t(t)]) /
                                global_sum_exp[std::size_t(t)]) * g;
    if (const int target = targets[std::size_t(t)]; shard.holds(target)) grad[at(t, r, target - shard.first)] -= g;
  }
  matmul_at(grad, x, dw, n, r, h);
  if (!dx.empty()) matmul(grad, w, dx, n, r, h);
}

}  // namespace pipesim::cpu
