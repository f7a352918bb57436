// Embedding lookup for one vocabulary shard, and its deterministic scatter-add backward.
#include <cub/device/device_radix_sort.cuh>

#include "device_util.cuh"
#include "kernels.h"

namespace pipesim::runtime::cuda {
namespace {

using detail::from_float;
using detail::to_float;

constexpr int kThreads = 256;

template <class T>
__global__ void embedding_forward_kernel(const float* table, const int* tokens, T* out, std::size_t count, int h,
                                         int first_row, int rows) {
  for (std::size_t i = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += std::size_t(gridDim.x) * blockDim.x) {
    const std::size_t t = i / std::size_t(h), j = i % std::size_t(h);
    const int row = tokens[t] - first_row;
    out[i] = from_float<T>(row >= 0 && row < rows ? table[std::size_t(row) * std::size_t(h) + j] : 0.0f);
  }
}

/// Sort keys: the token's row in the shard, or `rows` (sorted last, then skipped) when outside it.
__global__ void shard_rows_kernel(const int* tokens, int n, int first_row, int rows, int* keys, int* positions) {
  const int i = int(blockIdx.x * blockDim.x + threadIdx.x);
  if (i >= n) return;
  const int row = tokens[i] - first_row;
  keys[i] = row >= 0 && row < rows ? row : rows;
  positions[i] = i;
}

/// Block p handles the run of equal sorted keys that starts at p (other blocks leave at once): the
/// row's gradient gains its tokens' dout rows, in token order (the sort is stable).
template <class T>
__global__ void __launch_bounds__(kThreads)
    scatter_rows_kernel(const int* keys, const int* positions, const T* dout, float* dtable, int n, int h, int rows) {
  const int p = int(blockIdx.x), row = keys[p];
  if (row == rows || (p > 0 && keys[p - 1] == row)) return;
  int end = p + 1;
  while (end < n && keys[end] == row) ++end;
  for (int j = int(threadIdx.x); j < h; j += blockDim.x) {
    float sum = 0;
    for (int q = p; q < end; ++q) sum += to_float(dout[std::size_t(positions[q]) * std::size_t(h) + std::size_t(j)]);
    dtable[std::size_t(row) * std::size_t(h) + std::size_t(j)] += sum;
  }
}

/// Bits that hold 0..rows, so the radix sort does no more passes than the shard needs.
int key_bits(int rows) {
  int bits = 1;
  while (bits < 31 && (1 << bits) <= rows) ++bits;
  return bits;
}

}  // namespace

void embedding_forward(const EmbeddingForwardTensors& t, RowShape shape, VocabShard shard, DType dtype,
                       cudaStream_t stream) {
  const int h = shape.h;
  const std::size_t count = std::size_t(shape.n) * std::size_t(h);
  if (count == 0) return;
  detail::dispatch(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    embedding_forward_kernel<<<detail::grid_for(count, kThreads), kThreads, 0, stream>>>(
        t.table, t.tokens, static_cast<T*>(t.out), count, h, shard.first, shard.rows);
  });
  CUDA_CHECK_LAUNCH();
}

void embedding_backward(const EmbeddingBackwardTensors& t, RowShape shape, VocabShard shard, DType dtype,
                        cudaStream_t stream) {
  const int n = shape.n, h = shape.h, rows = shard.rows;
  if (n == 0 || h == 0 || rows == 0) return;
  // keys, positions, sorted keys, sorted positions: four arrays of n ints.
  detail::StreamScratch ints(4 * std::size_t(n) * sizeof(int), stream);
  int* keys = ints.as<int>();
  int* positions = keys + n;
  int* sorted_keys = positions + n;
  int* sorted_positions = sorted_keys + n;
  shard_rows_kernel<<<unsigned((n + kThreads - 1) / kThreads), kThreads, 0, stream>>>(t.tokens, n, shard.first, rows,
                                                                                      keys, positions);
  CUDA_CHECK_LAUNCH();
  const int bits = key_bits(rows);
  std::size_t temp_bytes = 0;
  CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, keys, sorted_keys, positions, sorted_positions, n, 0,
                                             bits, stream));
  detail::StreamScratch temp(temp_bytes, stream);
  CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp.as<void>(), temp_bytes, keys, sorted_keys, positions,
                                             sorted_positions, n, 0, bits, stream));
  detail::dispatch(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    scatter_rows_kernel<<<unsigned(n), kThreads, 0, stream>>>(sorted_keys, sorted_positions,
                                                              static_cast<const T*>(t.dout), t.dtable, n, h, rows);
  });
  CUDA_CHECK_LAUNCH();
}

}  // namespace pipesim::runtime::cuda
