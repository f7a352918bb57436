// The vocabulary-parallel output layer's per-shard kernels and the passes built from them and GEMMs.
#include <cmath>

#include "device_util.cuh"
#include "softmax_rows.cuh"
#include "vocab.h"

namespace pipesim::runtime::cuda {
namespace {

using detail::from_float;
using detail::to_float;

constexpr int kThreads = 256;

__device__ bool holds(int token, int first, int rows) { return token >= first && token < first + rows; }

__global__ void __launch_bounds__(kThreads)
    shard_stats_kernel(const float* logits, const int* targets, int first, int rows, float* max, float* sum_exp,
                       float* target_logit) {
  __shared__ double scratch[32];
  const std::size_t t = blockIdx.x;
  const float* row = logits + t * std::size_t(rows);
  const detail::RowStats stats = detail::row_stats(row, rows, scratch);
  if (threadIdx.x != 0) return;
  max[t] = stats.max, sum_exp[t] = float(stats.sum_exp);
  const int target = targets[t];
  target_logit[t] = holds(target, first, rows) ? row[target - first] : 0.0f;
}

template <class T>
__global__ void local_softmax_kernel(const float* logits, const float* max, const float* sum_exp, std::size_t count,
                                     int rows, T* softmax) {
  FOR_EACH_INDEX(i, count) {
    const std::size_t t = i / std::size_t(rows);
    softmax[i] = from_float<T>(expf(logits[i] - max[t]) / sum_exp[t]);
  }
}

template <class T>
__global__ void gather_kernel(const T* w, const int* targets, int first, int rows, std::size_t count, int h, T* y) {
  FOR_EACH_INDEX(i, count) {
    const std::size_t t = i / std::size_t(h), j = i % std::size_t(h);
    const int target = targets[t];
    y[i] = holds(target, first, rows) ? w[std::size_t(target - first) * std::size_t(h) + j] : from_float<T>(0.0f);
  }
}

__global__ void rescale_kernel(const float* max, const float* sum_exp, const float* global_max, float* scaled, int n) {
  FOR_EACH_INDEX(t, std::size_t(n)) scaled[t] = sum_exp[t] == 0 ? 0.0f : sum_exp[t] * expf(max[t] - global_max[t]);
}

template <class T>
__global__ void input_grad_share_kernel(const float* scaled, const float* global_sum_exp, const T* a, const T* y,
                                        float g, std::size_t count, int h, T* dx) {
  FOR_EACH_INDEX(i, count) {
    const std::size_t t = i / std::size_t(h);
    const float weight = scaled[t] / global_sum_exp[t];
    dx[i] = from_float<T>(g * (weight * to_float(a[i]) - to_float(y[i])));
  }
}

/// One block: thread k sums tokens k, k + blockDim, ... in order, then a fixed tree.
__global__ void __launch_bounds__(kThreads)
    loss_sum_kernel(const float* global_max, const float* global_sum_exp, const float* target_logit, int n,
                    double* loss) {
  __shared__ double scratch[32];
  double sum = 0;
  for (int t = int(threadIdx.x); t < n; t += blockDim.x)
    sum += double(global_max[t]) + log(double(global_sum_exp[t])) - double(target_logit[t]);
  sum = detail::block_reduce(sum, detail::Sum{}, 0.0, scratch);
  if (threadIdx.x == 0) *loss = sum;
}

template <class T>
__global__ void output_grad_kernel(const float* logits, const float* global_max, const float* global_sum_exp,
                                   const int* targets, int first, int rows, float g, std::size_t count, T* grad) {
  FOR_EACH_INDEX(i, count) {
    const std::size_t t = i / std::size_t(rows);
    const int v = int(i % std::size_t(rows));
    float value = expf(logits[i] - global_max[t]) / global_sum_exp[t] * g;
    if (targets[t] - first == v) value -= g;
    grad[i] = from_float<T>(value);
  }
}


std::size_t elements(int a, int b) { return std::size_t(a) * std::size_t(b); }

}  // namespace

void shard_softmax_stats(const ShardSoftmaxStatsTensors& t, VocabShard shard, int n, cudaStream_t stream) {
  if (n == 0) return;
  shard_stats_kernel<<<unsigned(n), kThreads, 0, stream>>>(t.logits, t.targets, shard.first, shard.rows, t.max,
                                                           t.sum_exp, t.target_logit);
  CUDA_CHECK_LAUNCH();
}

void local_softmax(const LocalSoftmaxTensors& t, int n, int rows, DType dtype, cudaStream_t stream) {
  const std::size_t count = elements(n, rows);
  if (count == 0) return;
  detail::dispatch(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    local_softmax_kernel<<<detail::grid_for(count, kThreads), kThreads, 0, stream>>>(
        t.logits, t.max, t.sum_exp, count, rows, static_cast<T*>(t.softmax));
  });
  CUDA_CHECK_LAUNCH();
}

void gather_target_rows(const GatherTargetRowsTensors& t, VocabShard shard, RowShape shape, DType dtype,
                        cudaStream_t stream) {
  const std::size_t count = elements(shape.n, shape.h);
  if (count == 0) return;
  detail::dispatch(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    gather_kernel<<<detail::grid_for(count, kThreads), kThreads, 0, stream>>>(
        static_cast<const T*>(t.w), t.targets, shard.first, shard.rows, count, shape.h, static_cast<T*>(t.y));
  });
  CUDA_CHECK_LAUNCH();
}

void rescale_sum_exp(const float* max, const float* sum_exp, const float* global_max, float* scaled, int n,
                     cudaStream_t stream) {
  if (n == 0) return;
  rescale_kernel<<<detail::grid_for(std::size_t(n), kThreads), kThreads, 0, stream>>>(max, sum_exp, global_max,
                                                                                       scaled, n);
  CUDA_CHECK_LAUNCH();
}

void input_grad_share(const InputGradShareTensors& t, float g, RowShape shape, DType dtype, cudaStream_t stream) {
  const std::size_t count = elements(shape.n, shape.h);
  if (count == 0) return;
  detail::dispatch(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    input_grad_share_kernel<<<detail::grid_for(count, kThreads), kThreads, 0, stream>>>(
        t.scaled_sum_exp, t.global_sum_exp, static_cast<const T*>(t.a), static_cast<const T*>(t.y), g, count, shape.h,
        static_cast<T*>(t.dx));
  });
  CUDA_CHECK_LAUNCH();
}

void loss_sum(const float* global_max, const float* global_sum_exp, const float* target_logit, int n, double* loss,
              cudaStream_t stream) {
  loss_sum_kernel<<<1, kThreads, 0, stream>>>(global_max, global_sum_exp, target_logit, n, loss);
  CUDA_CHECK_LAUNCH();
}

void output_grad(const OutputGradTensors& t, VocabShard shard, float g, int n, DType dtype, cudaStream_t stream) {
  const std::size_t count = elements(n, shard.rows);
  if (count == 0) return;
  detail::dispatch(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    output_grad_kernel<<<detail::grid_for(count, kThreads), kThreads, 0, stream>>>(
        t.logits, t.global_max, t.global_sum_exp, t.targets, shard.first, shard.rows, g, count,
        static_cast<T*>(t.grad));
  });
  CUDA_CHECK_LAUNCH();
}

void output_logits(GemmHandle& gemm, const OutputLogitsTensors& t, VocabShard shard, RowShape shape, DType dtype,
                   cudaStream_t stream) {
  matmul_bt(gemm, {.a = t.x, .b = t.w, .c = t.logits}, {.n = shape.n, .k = shape.h, .m = shard.rows},
            GemmTypes{dtype, DType::F32}, false, stream);
  shard_softmax_stats({.logits = t.logits, .targets = t.targets, .max = t.max, .sum_exp = t.sum_exp,
                       .target_logit = t.target_logit},
                      shard, shape.n, stream);
}

void output_input_grad_terms(GemmHandle& gemm, const OutputInputGradTermsTensors& t, VocabShard shard, RowShape shape,
                             DType dtype, cudaStream_t stream) {
  const int n = shape.n, h = shape.h, rows = shard.rows;
  detail::StreamScratch softmax(elements(n, rows) * element_size(dtype), stream);
  local_softmax({.logits = t.logits, .max = t.max, .sum_exp = t.sum_exp, .softmax = softmax.as<void>()}, n, rows,
                dtype, stream);
  // An empty shard has k = 0: the GEMM writes A = 0.
  matmul(gemm, {.a = softmax.as<void>(), .b = t.w, .c = t.a}, {.n = n, .k = rows, .m = h}, GemmTypes{dtype, dtype},
         false, stream);
  gather_target_rows({.w = t.w, .targets = t.targets, .y = t.y}, shard, shape, dtype, stream);
}

void output_backward(GemmHandle& gemm, const OutputBackwardTensors& t, VocabShard shard, float g, RowShape shape,
                     DType dtype, cudaStream_t stream) {
  const int n = shape.n, h = shape.h, rows = shard.rows;
  detail::StreamScratch grad(elements(n, rows) * element_size(dtype), stream);
  output_grad({.logits = t.logits, .global_max = t.global_max, .global_sum_exp = t.global_sum_exp,
               .targets = t.targets, .grad = grad.as<void>()},
              shard, g, n, dtype, stream);
  matmul_at(gemm, {.a = grad.as<void>(), .b = t.x, .c = t.dw}, {.n = n, .k = rows, .m = h},
            GemmTypes{dtype, DType::F32}, true, stream);
  // With rows = 0 the GEMM has k = 0 and writes dX = 0, as the CPU's fill does.
  if (t.dx != nullptr)
    matmul(gemm, {.a = grad.as<void>(), .b = t.w, .c = t.dx}, {.n = n, .k = rows, .m = h}, GemmTypes{dtype, dtype},
           false, stream);
}

}  // namespace pipesim::runtime::cuda
