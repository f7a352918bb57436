// Element-wise kernels: residual add, dtype conversion, bias add, GELU and the optimizer steps, with
// 16-byte loads and stores where the tensors are aligned.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <initializer_list>

#include "device_util.cuh"
#include "kernels.h"

namespace pipesim::runtime::cuda {
namespace {

using detail::from_float;
using detail::to_float;

constexpr int kThreads = 256;
constexpr float kSqrt2OverPi = 0.7978845608028654f;  // as runtime/cpu/kernels.cpp
constexpr float kGeluCubic = 0.044715f;

// Every kernel here is a map over [0, count): an Op whose apply<L>(i) does elements i..i+L−1. Where
// every pointer is 16-byte aligned, each thread moves whole 16-byte packs (L elements of the widest
// type), and the count % L elements left over run one at a time; elsewhere all run one at a time.
// The math per element is the same either way, so the vectorised path gives the scalar path's bits.

/// Elements i..i+L−1 of p as floats: one load of L·sizeof(T) bytes when that is 16 or 8.
template <int L, class T>
__device__ __forceinline__ void load(const T* p, float (&v)[L]) {
  T raw[L];
  if constexpr (L * sizeof(T) == 16) {
    const uint4 bits = *reinterpret_cast<const uint4*>(p);
    memcpy(raw, &bits, sizeof(bits));
  } else if constexpr (L * sizeof(T) == 8) {
    const uint2 bits = *reinterpret_cast<const uint2*>(p);
    memcpy(raw, &bits, sizeof(bits));
  } else {
    for (int j = 0; j < L; ++j) raw[j] = p[j];
  }
  for (int j = 0; j < L; ++j) v[j] = to_float(raw[j]);
}

template <int L, class T>
__device__ __forceinline__ void store(T* p, const float (&v)[L]) {
  T raw[L];
  for (int j = 0; j < L; ++j) raw[j] = from_float<T>(v[j]);
  if constexpr (L * sizeof(T) == 16) {
    uint4 bits;
    memcpy(&bits, raw, sizeof(bits));
    *reinterpret_cast<uint4*>(p) = bits;
  } else if constexpr (L * sizeof(T) == 8) {
    uint2 bits;
    memcpy(&bits, raw, sizeof(bits));
    *reinterpret_cast<uint2*>(p) = bits;
  } else {
    for (int j = 0; j < L; ++j) p[j] = raw[j];
  }
}

/// Grid-stride over packs of N elements, then the tail one element a thread.
template <int N, class Op>
__global__ void map_kernel(Op op, std::size_t count) {
  const std::size_t packs = count / N, done = packs * N;
  FOR_EACH_INDEX(p, packs) op.template apply<N>(p * N);
  if constexpr (N > 1) {
    FOR_EACH_INDEX(i, count - done) op.template apply<1>(done + i);
  }
}

bool aligned16(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }

/// Launches op over `count` elements: packs of N when every pointer in `pointers` is 16-byte aligned.
template <int N, class Op>
void launch_map(const Op& op, std::size_t count, std::initializer_list<const void*> pointers, cudaStream_t stream) {
  bool vector = true;
  for (const void* p : pointers) vector = vector && aligned16(p);
  if (vector && N > 1)
    map_kernel<N><<<detail::grid_for(count / N + 1, kThreads), kThreads, 0, stream>>>(op, count);
  else
    map_kernel<1><<<detail::grid_for(count, kThreads), kThreads, 0, stream>>>(op, count);
  CUDA_CHECK_LAUNCH();
}

/// Elements per 16 bytes of T.
template <class T>
constexpr int kPack = int(16 / sizeof(T));

template <class T>
struct Add {
  const T *a, *b;
  T* out;
  template <int L>
  __device__ void apply(std::size_t i) const {
    float x[L], y[L];
    load<L>(a + i, x), load<L>(b + i, y);
    for (int j = 0; j < L; ++j) x[j] += y[j];
    store<L>(out + i, x);
  }
};

template <class S, class D>
struct Convert {
  const S* src;
  D* dst;
  template <int L>
  __device__ void apply(std::size_t i) const {
    float v[L];
    load<L>(src + i, v);
    store<L>(dst + i, v);
  }
};

template <class T>
struct BiasAdd {
  T* y;
  const float* bias;
  std::size_t m;
  template <int L>
  __device__ void apply(std::size_t i) const {
    float v[L];
    load<L>(y + i, v);
    for (int j = 0; j < L; ++j) v[j] += bias[(i + std::size_t(j)) % m];
    store<L>(y + i, v);
  }
};

template <class T>
struct GeluForward {
  const T* x;
  T* y;
  template <int L>
  __device__ void apply(std::size_t i) const {
    float v[L];
    load<L>(x + i, v);
    for (int j = 0; j < L; ++j) {
      const float u = v[j];
      v[j] = 0.5f * u * (1 + tanhf(kSqrt2OverPi * (u + kGeluCubic * u * u * u)));
    }
    store<L>(y + i, v);
  }
};

template <class T>
struct GeluBackward {
  const T *x, *dy;
  T* dx;
  template <int L>
  __device__ void apply(std::size_t i) const {
    float v[L], g[L], d[L];
    load<L>(x + i, v), load<L>(dy + i, g), load<L>(dx + i, d);
    for (int j = 0; j < L; ++j) {
      const float t = tanhf(kSqrt2OverPi * (v[j] + kGeluCubic * v[j] * v[j] * v[j]));
      const float d_inner = kSqrt2OverPi * (1 + 3 * kGeluCubic * v[j] * v[j]);
      const float grad = 0.5f * (1 + t) + 0.5f * v[j] * (1 - t * t) * d_inner;
      d[j] = d[j] + g[j] * grad;
    }
    store<L>(dx + i, d);
  }
};

struct Sgd {
  float *w, *g;
  float learning_rate;
  template <int L>
  __device__ void apply(std::size_t i) const {
    float wv[L], gv[L];
    load<L>(w + i, wv), load<L>(g + i, gv);
    for (int j = 0; j < L; ++j) wv[j] -= learning_rate * gv[j], gv[j] = 0;
    store<L>(w + i, wv), store<L>(g + i, gv);
  }
};

/// Bias corrections are computed on the host in double and passed in: the same for every element.
struct Adam {
  float *w, *g, *m, *v;
  AdamParams p;
  float correction1, correction2;
  template <int L>
  __device__ void apply(std::size_t i) const {
    float wv[L], gv[L], mv[L], vv[L];
    load<L>(w + i, wv), load<L>(g + i, gv), load<L>(m + i, mv), load<L>(v + i, vv);
    for (int j = 0; j < L; ++j) {
      const float grad = gv[j];
      mv[j] = p.beta1 * mv[j] + (1 - p.beta1) * grad;
      vv[j] = p.beta2 * vv[j] + (1 - p.beta2) * grad * grad;
      const float m_hat = mv[j] / correction1, v_hat = vv[j] / correction2;
      wv[j] -= p.learning_rate * (m_hat / (sqrtf(v_hat) + p.epsilon) + p.weight_decay * wv[j]);
      gv[j] = 0;
    }
    store<L>(w + i, wv), store<L>(g + i, gv), store<L>(m + i, mv), store<L>(v + i, vv);
  }
};

}  // namespace

void add(const void* a, const void* b, void* out, std::size_t count, DType dtype, cudaStream_t stream) {
  if (count == 0) return;
  detail::dispatch(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const Add<T> op{static_cast<const T*>(a), static_cast<const T*>(b), static_cast<T*>(out)};
    launch_map<kPack<T>>(op, count, {a, b, out}, stream);
  });
}

void convert(const void* src, DType src_type, void* dst, DType dst_type, std::size_t count, cudaStream_t stream) {
  if (count == 0) return;
  detail::dispatch(src_type, [&](auto src_tag) {
    detail::dispatch(dst_type, [&](auto dst_tag) {
      using S = typename decltype(src_tag)::type;
      using D = typename decltype(dst_tag)::type;
      const Convert<S, D> op{static_cast<const S*>(src), static_cast<D*>(dst)};
      launch_map<std::min(kPack<S>, kPack<D>)>(op, count, {src, dst}, stream);
    });
  });
}

void bias_add(void* y, const float* bias, int n, int m, DType dtype, cudaStream_t stream) {
  const std::size_t count = std::size_t(n) * std::size_t(m);
  if (count == 0) return;
  detail::dispatch(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const BiasAdd<T> op{static_cast<T*>(y), bias, std::size_t(m)};
    launch_map<kPack<T>>(op, count, {y}, stream);
  });
}

void gelu_forward(const void* x, void* y, std::size_t count, DType dtype, cudaStream_t stream) {
  if (count == 0) return;
  detail::dispatch(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const GeluForward<T> op{static_cast<const T*>(x), static_cast<T*>(y)};
    launch_map<kPack<T>>(op, count, {x, y}, stream);
  });
}

void gelu_backward(const void* x, const void* dy, void* dx, std::size_t count, DType dtype, cudaStream_t stream) {
  if (count == 0) return;
  detail::dispatch(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const GeluBackward<T> op{static_cast<const T*>(x), static_cast<const T*>(dy), static_cast<T*>(dx)};
    launch_map<kPack<T>>(op, count, {x, dy, dx}, stream);
  });
}

void sgd_step(float* w, float* g, std::size_t count, float learning_rate, cudaStream_t stream) {
  if (count == 0) return;
  launch_map<kPack<float>>(Sgd{w, g, learning_rate}, count, {w, g}, stream);
}

void adam_step(const AdamTensors& t, std::size_t count, const AdamParams& params, int step, cudaStream_t stream) {
  if (step < 1) throw CudaError("adam_step: step must be >= 1, got " + std::to_string(step));
  if (count == 0) return;
  const auto correction1 = float(1 - std::pow(double(params.beta1), step));
  const auto correction2 = float(1 - std::pow(double(params.beta2), step));
  launch_map<kPack<float>>(Adam{t.w, t.g, t.m, t.v, params, correction1, correction2}, count, {t.w, t.g, t.m, t.v},
                           stream);
}

}  // namespace pipesim::runtime::cuda
