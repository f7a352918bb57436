// Element-wise kernels: residual add, dtype conversion, bias add, GELU and the optimizer steps.
#include <cmath>

#include "device_util.cuh"
#include "kernels.h"

namespace pipesim::runtime::cuda {
namespace {

using detail::from_float;
using detail::to_float;

constexpr int kThreads = 256;
constexpr float kSqrt2OverPi = 0.7978845608028654f;  // as runtime/cpu/kernels.cpp
constexpr float kGeluCubic = 0.044715f;

template <class T>
__global__ void add_kernel(const T* a, const T* b, T* out, std::size_t count) {
  FOR_EACH_INDEX(i, count) out[i] = from_float<T>(to_float(a[i]) + to_float(b[i]));
}

template <class S, class D>
__global__ void convert_kernel(const S* src, D* dst, std::size_t count) {
  FOR_EACH_INDEX(i, count) dst[i] = from_float<D>(to_float(src[i]));
}

template <class T>
__global__ void bias_add_kernel(T* y, const float* bias, std::size_t count, int m) {
  FOR_EACH_INDEX(i, count) y[i] = from_float<T>(to_float(y[i]) + bias[i % std::size_t(m)]);
}

template <class T>
__global__ void gelu_forward_kernel(const T* x, T* y, std::size_t count) {
  FOR_EACH_INDEX(i, count) {
    const float v = to_float(x[i]);
    y[i] = from_float<T>(0.5f * v * (1 + tanhf(kSqrt2OverPi * (v + kGeluCubic * v * v * v))));
  }
}

template <class T>
__global__ void gelu_backward_kernel(const T* x, const T* dy, T* dx, std::size_t count) {
  FOR_EACH_INDEX(i, count) {
    const float v = to_float(x[i]), t = tanhf(kSqrt2OverPi * (v + kGeluCubic * v * v * v));
    const float d_inner = kSqrt2OverPi * (1 + 3 * kGeluCubic * v * v);
    const float grad = 0.5f * (1 + t) + 0.5f * v * (1 - t * t) * d_inner;
    dx[i] = from_float<T>(to_float(dx[i]) + to_float(dy[i]) * grad);
  }
}

__global__ void sgd_kernel(float* w, float* g, std::size_t count, float learning_rate) {
  FOR_EACH_INDEX(i, count) {
    w[i] -= learning_rate * g[i];
    g[i] = 0;
  }
}

/// Bias corrections are computed on the host in double and passed in: the same for every element.
__global__ void adam_kernel(float* w, float* g, float* m, float* v, std::size_t count, AdamParams p,
                            float correction1, float correction2) {
  FOR_EACH_INDEX(i, count) {
    const float grad = g[i];
    m[i] = p.beta1 * m[i] + (1 - p.beta1) * grad;
    v[i] = p.beta2 * v[i] + (1 - p.beta2) * grad * grad;
    const float m_hat = m[i] / correction1, v_hat = v[i] / correction2;
    w[i] -= p.learning_rate * (m_hat / (sqrtf(v_hat) + p.epsilon) + p.weight_decay * w[i]);
    g[i] = 0;
  }
}


}  // namespace

void add(const void* a, const void* b, void* out, std::size_t count, DType dtype, cudaStream_t stream) {
  if (count == 0) return;
  detail::dispatch(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    add_kernel<<<detail::grid_for(count, kThreads), kThreads, 0, stream>>>(
        static_cast<const T*>(a), static_cast<const T*>(b), static_cast<T*>(out), count);
  });
  CUDA_CHECK_LAUNCH();
}

void convert(const void* src, DType src_type, void* dst, DType dst_type, std::size_t count, cudaStream_t stream) {
  if (count == 0) return;
  detail::dispatch(src_type, [&](auto src_tag) {
    detail::dispatch(dst_type, [&](auto dst_tag) {
      using S = typename decltype(src_tag)::type;
      using D = typename decltype(dst_tag)::type;
      convert_kernel<<<detail::grid_for(count, kThreads), kThreads, 0, stream>>>(static_cast<const S*>(src),
                                                                                 static_cast<D*>(dst), count);
    });
  });
  CUDA_CHECK_LAUNCH();
}

void bias_add(void* y, const float* bias, int n, int m, DType dtype, cudaStream_t stream) {
  const std::size_t count = std::size_t(n) * std::size_t(m);
  if (count == 0) return;
  detail::dispatch(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    bias_add_kernel<<<detail::grid_for(count, kThreads), kThreads, 0, stream>>>(static_cast<T*>(y), bias, count, m);
  });
  CUDA_CHECK_LAUNCH();
}

void gelu_forward(const void* x, void* y, std::size_t count, DType dtype, cudaStream_t stream) {
  if (count == 0) return;
  detail::dispatch(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    gelu_forward_kernel<<<detail::grid_for(count, kThreads), kThreads, 0, stream>>>(static_cast<const T*>(x),
                                                                                    static_cast<T*>(y), count);
  });
  CUDA_CHECK_LAUNCH();
}

void gelu_backward(const void* x, const void* dy, void* dx, std::size_t count, DType dtype, cudaStream_t stream) {
  if (count == 0) return;
  detail::dispatch(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    gelu_backward_kernel<<<detail::grid_for(count, kThreads), kThreads, 0, stream>>>(
        static_cast<const T*>(x), static_cast<const T*>(dy), static_cast<T*>(dx), count);
  });
  CUDA_CHECK_LAUNCH();
}

void sgd_step(float* w, float* g, std::size_t count, float learning_rate, cudaStream_t stream) {
  if (count == 0) return;
  sgd_kernel<<<detail::grid_for(count, kThreads), kThreads, 0, stream>>>(w, g, count, learning_rate);
  CUDA_CHECK_LAUNCH();
}

void adam_step(float* w, float* g, float* m, float* v, std::size_t count, const AdamParams& params, int step,
               cudaStream_t stream) {
  if (step < 1) throw CudaError("adam_step: step must be >= 1, got " + std::to_string(step));
  if (count == 0) return;
  const auto correction1 = float(1 - std::pow(double(params.beta1), step));
  const auto correction2 = float(1 - std::pow(double(params.beta2), step));
  adam_kernel<<<detail::grid_for(count, kThreads), kThreads, 0, stream>>>(w, g, m, v, count, params, correction1,
                                                                          correction2);
  CUDA_CHECK_LAUNCH();
}

}  // namespace pipesim::runtime::cuda
