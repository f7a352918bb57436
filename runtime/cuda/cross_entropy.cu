// Full-vocabulary softmax cross-entropy (the baseline output layer): one block per row, then one
// block sums the rows' losses in a fixed order.
#include <cmath>

#include "device_util.cuh"
#include "kernels.h"
#include "softmax_rows.cuh"

namespace pipesim::runtime::cuda {
namespace {

using detail::from_float;

constexpr int kThreads = 256;

/// dlogits = (softmax − onehot)/n for row i; row_loss[i] = max + log(sum) − logit[target].
template <class T>
__global__ void __launch_bounds__(kThreads)
    cross_entropy_rows_kernel(const float* logits, const int* targets, T* dlogits, double* row_loss, int n,
                              int vocab) {
  __shared__ double scratch[32];
  const std::size_t i = blockIdx.x, base = i * std::size_t(vocab);
  const float* row = logits + base;
  const detail::RowStats stats = detail::row_stats(row, vocab, scratch);
  const int target = targets[i];
  const bool valid = target >= 0 && target < vocab;
  for (int j = int(threadIdx.x); j < vocab; j += blockDim.x) {
    const double p = double(expf(row[j] - stats.max)) / stats.sum_exp;
    dlogits[base + j] = from_float<T>(float((p - (j == target ? 1.0 : 0.0)) / n));
  }
  if (threadIdx.x == 0)
    row_loss[i] = valid ? double(stats.max) + log(stats.sum_exp) - double(row[target]) : double(NAN);
}

/// *out = scale·Σ values, thread k summing k, k + blockDim, ... then a fixed tree (one block).
__global__ void __launch_bounds__(kThreads) sum_kernel(const double* values, int n, double scale, double* out) {
  __shared__ double scratch[32];
  double sum = 0;
  for (int i = int(threadIdx.x); i < n; i += blockDim.x) sum += values[i];
  sum = detail::block_reduce(sum, detail::Sum{}, 0.0, scratch);
  if (threadIdx.x == 0) *out = sum * scale;
}

}  // namespace

void cross_entropy(const CrossEntropyTensors& t, int n, int vocab, DType dtype, cudaStream_t stream) {
  if (n == 0) {
    CUDA_CHECK(cudaMemsetAsync(t.loss, 0, sizeof(double), stream));
    return;
  }
  detail::StreamScratch row_loss(std::size_t(n) * sizeof(double), stream);
  detail::dispatch(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    cross_entropy_rows_kernel<<<unsigned(n), kThreads, 0, stream>>>(t.logits, t.targets, static_cast<T*>(t.dlogits),
                                                                    row_loss.as<double>(), n, vocab);
  });
  CUDA_CHECK_LAUNCH();
  sum_kernel<<<1, kThreads, 0, stream>>>(row_loss.as<double>(), n, 1.0 / n, t.loss);
  CUDA_CHECK_LAUNCH();
}

}  // namespace pipesim::runtime::cuda
