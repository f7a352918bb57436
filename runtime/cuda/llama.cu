// The Llama family's kernels: RMSNorm, alone or after the residual add (row kernels, one block per
// row, and layernorm.cu's column sums for the gain), rotary position embeddings (one thread per
// rotated pair) and SwiGLU (one thread per output element).
#include <string>

#include "column_sums.cuh"
#include "device_util.cuh"
#include "llama_kernels.h"

namespace pipesim::runtime::cuda {
namespace {

using detail::from_float;
using detail::to_float;

constexpr float kRmsNormEpsilon = 1e-5f;  // as runtime/cpu/llama_kernels.h
constexpr int kRowThreads = 256, kThreads = 256;
constexpr double kTwoPi = 6.283185307179586;

/// RMSNorm of x's rows or, with a residual, of x + residual (kept in `sum`; detail::norm_input).
template <class T>
__global__ void __launch_bounds__(kRowThreads)
    rmsnorm_forward_kernel(const T* x, const T* residual, T* sum, const float* gain, T* y, float* rstd, int h) {
  __shared__ float scratch[32];
  const std::size_t row = blockIdx.x;
  const T* in = detail::norm_input(x, residual, sum, row * std::size_t(h), h);
  float squares = 0;
  for (int j = int(threadIdx.x); j < h; j += blockDim.x) {
    const float v = to_float(in[j]);
    squares += v * v;
  }
  const float mean_square = detail::block_reduce(squares, detail::Sum{}, 0.0f, scratch) / float(h);
  const float r = 1.0f / sqrtf(mean_square + kRmsNormEpsilon);  // IEEE sqrt and divide, not rsqrtf
  if (threadIdx.x == 0) rstd[row] = r;
  T* out = y + row * std::size_t(h);
  for (int j = int(threadIdx.x); j < h; j += blockDim.x) out[j] = from_float<T>(to_float(in[j]) * r * gain[j]);
}

/// dx += r·(g − xhat·mean(g·xhat)) with g = dy·gain, xhat = x·r.
template <class T>
__global__ void __launch_bounds__(kRowThreads)
    rmsnorm_dx_kernel(const T* x, const float* gain, const float* rstd, const T* dy, T* dx, int h) {
  __shared__ float scratch[32];
  const std::size_t row = blockIdx.x, base = row * std::size_t(h);
  const float r = rstd[row];
  float gx_sum = 0;
  for (int j = int(threadIdx.x); j < h; j += blockDim.x)
    gx_sum += to_float(dy[base + j]) * gain[j] * to_float(x[base + j]) * r;
  const float gx_mean = detail::block_reduce(gx_sum, detail::Sum{}, 0.0f, scratch) / float(h);
  for (int j = int(threadIdx.x); j < h; j += blockDim.x) {
    const float xhat = to_float(x[base + j]) * r, g = to_float(dy[base + j]) * gain[j];
    dx[base + j] = from_float<T>(to_float(dx[base + j]) + r * (g - xhat * gx_mean));
  }
}

/// One rope_kernel launch: the launcher's RopeShape and the direction.
struct RopeLaunch {
  int n, seq, width, heads, d;
  float theta;
  double sign;  ///< +1 forward, −1 backward
};

/// Thread k rotates pair i = k % half of head (k / half) % heads of row k / (half·heads). Each block
/// first tabulates theta^(−2i/d) for every i (half doubles of dynamic shared memory), so a thread pays
/// one double multiply and a reduction modulo 2π rather than a double pow and sincos.
template <class T>
__global__ void __launch_bounds__(kThreads) rope_kernel(T* x, RopeLaunch s) {
  extern __shared__ double inverse_frequency[];
  const int half = s.d / 2;
  for (int i = int(threadIdx.x); i < half; i += blockDim.x) inverse_frequency[i] = pow(double(s.theta), -2.0 * i / s.d);
  __syncthreads();
  const std::size_t pairs = std::size_t(s.n) * std::size_t(s.heads) * std::size_t(half);
  FOR_EACH_INDEX(k, pairs) {
    const int i = int(k % std::size_t(half)), head = int(k / std::size_t(half) % std::size_t(s.heads));
    const std::size_t row = k / (std::size_t(half) * std::size_t(s.heads));
    const double angle = s.sign * double(row % std::size_t(s.seq)) * inverse_frequency[i];
    float sine, cosine;
    // Reduced to [−π, π] in double first: the fp32 argument is then off by at most half an ulp of π.
    sincosf(float(angle - kTwoPi * rint(angle / kTwoPi)), &sine, &cosine);
    T* v = x + row * std::size_t(s.width) + std::size_t(head) * std::size_t(s.d);
    const float a = to_float(v[i]), b = to_float(v[i + half]);
    v[i] = from_float<T>(a * cosine - b * sine);
    v[i + half] = from_float<T>(b * cosine + a * sine);
  }
}

__device__ __forceinline__ float sigmoid(float g) { return 1.0f / (1.0f + expf(-g)); }

template <class T>
__global__ void __launch_bounds__(kThreads) swiglu_forward_kernel(const T* gate_up, T* out, int f, std::size_t count) {
  FOR_EACH_INDEX(k, count) {
    const std::size_t row = k / std::size_t(f), gate = row * 2 * std::size_t(f) + k % std::size_t(f);
    const float g = to_float(gate_up[gate]), u = to_float(gate_up[gate + std::size_t(f)]);
    out[k] = from_float<T>(g * sigmoid(g) * u);
  }
}

template <class T>
__global__ void __launch_bounds__(kThreads)
    swiglu_backward_kernel(const T* gate_up, const T* dout, T* dgate_up, int f, std::size_t count) {
  FOR_EACH_INDEX(k, count) {
    const std::size_t row = k / std::size_t(f), gate = row * 2 * std::size_t(f) + k % std::size_t(f);
    const std::size_t up = gate + std::size_t(f);
    const float g = to_float(gate_up[gate]), u = to_float(gate_up[up]), go = to_float(dout[k]), s = sigmoid(g);
    dgate_up[gate] = from_float<T>(to_float(dgate_up[gate]) + go * u * s * (1 + g * (1 - s)));  // silu'
    dgate_up[up] = from_float<T>(to_float(dgate_up[up]) + go * g * s);
  }
}

void rope(void* x, const RopeLaunch& s, DType dtype, cudaStream_t stream) {
  if (s.d % 2 != 0 || s.heads * s.d > s.width || s.seq < 1)
    throw CudaError("rope: need an even head width d, heads·d <= width and seq >= 1; got d=" + std::to_string(s.d) +
                    " heads=" + std::to_string(s.heads) + " width=" + std::to_string(s.width) +
                    " seq=" + std::to_string(s.seq));
  const std::size_t pairs = std::size_t(s.n) * std::size_t(s.heads) * std::size_t(s.d / 2);
  if (pairs == 0) return;
  const std::size_t table = std::size_t(s.d / 2) * sizeof(double);
  detail::dispatch(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    rope_kernel<<<detail::grid_for(pairs, kThreads), kThreads, table, stream>>>(static_cast<T*>(x), s);
  });
  CUDA_CHECK_LAUNCH();
}

/// rmsnorm_forward, after the residual add where `residual` is given (add_rmsnorm_forward).
void rmsnorm_rows(const RmsNormForwardTensors& t, const void* residual, void* sum, RowShape shape, DType dtype,
                  cudaStream_t stream) {
  const int n = shape.n, h = shape.h;
  if (n == 0 || h == 0) return;
  detail::dispatch(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    rmsnorm_forward_kernel<<<unsigned(n), kRowThreads, 0, stream>>>(static_cast<const T*>(t.x),
                                                                    static_cast<const T*>(residual),
                                                                    static_cast<T*>(sum), t.gain,
                                                                    static_cast<T*>(t.y), t.rstd, h);
  });
  CUDA_CHECK_LAUNCH();
}

}  // namespace

void rmsnorm_forward(const RmsNormForwardTensors& t, RowShape shape, DType dtype, cudaStream_t stream) {
  rmsnorm_rows(t, nullptr, nullptr, shape, dtype, stream);
}

void add_rmsnorm_forward(const AddRmsNormForwardTensors& t, RowShape shape, DType dtype, cudaStream_t stream) {
  rmsnorm_rows({.x = t.x, .gain = t.gain, .y = t.y, .rstd = t.rstd}, t.residual, t.sum, shape, dtype, stream);
}

void rmsnorm_backward(const RmsNormBackwardTensors& t, RowShape shape, DType dtype, cudaStream_t stream) {
  const int n = shape.n, h = shape.h;
  if (n == 0 || h == 0) return;
  detail::dispatch(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const auto* x_t = static_cast<const T*>(t.x);
    const auto* dy_t = static_cast<const T*>(t.dy);
    rmsnorm_dx_kernel<<<unsigned(n), kRowThreads, 0, stream>>>(x_t, t.gain, t.rstd, dy_t, static_cast<T*>(t.dx), h);
    CUDA_CHECK_LAUNCH();
    detail::column_sums(dy_t, x_t, nullptr, t.rstd, nullptr, t.dgain, n, h, stream);
  });
}

void rope_forward(void* x, RopeShape s, DType dtype, cudaStream_t stream) {
  rope(x, RopeLaunch{s.n, s.seq, s.width, s.heads, s.d, s.theta, +1.0}, dtype, stream);
}

void rope_backward(void* dx, RopeShape s, DType dtype, cudaStream_t stream) {
  rope(dx, RopeLaunch{s.n, s.seq, s.width, s.heads, s.d, s.theta, -1.0}, dtype, stream);
}

void swiglu_forward(const void* gate_up, void* out, int n, int f, DType dtype, cudaStream_t stream) {
  const std::size_t count = std::size_t(n) * std::size_t(f);
  if (count == 0) return;
  detail::dispatch(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    swiglu_forward_kernel<<<detail::grid_for(count, kThreads), kThreads, 0, stream>>>(
        static_cast<const T*>(gate_up), static_cast<T*>(out), f, count);
  });
  CUDA_CHECK_LAUNCH();
}

void swiglu_backward(const void* gate_up, const void* dout, void* dgate_up, int n, int f, DType dtype,
                     cudaStream_t stream) {
  const std::size_t count = std::size_t(n) * std::size_t(f);
  if (count == 0) return;
  detail::dispatch(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    swiglu_backward_kernel<<<detail::grid_for(count, kThreads), kThreads, 0, stream>>>(
        static_cast<const T*>(gate_up), static_cast<const T*>(dout), static_cast<T*>(dgate_up), f, count);
  });
  CUDA_CHECK_LAUNCH();
}

}  // namespace pipesim::runtime::cuda
