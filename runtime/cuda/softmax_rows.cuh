#pragma once
/// Row statistics of fp32 logits for the cross-entropy kernels (internal): one block per row.
#include <cmath>

#include "device_util.cuh"

namespace pipesim::runtime::cuda::detail {

struct RowStats {
  float max;       ///< −∞ for an empty row
  double sum_exp;  ///< Σ exp(x − max), 0 for an empty row; summed in double as the CPU does
};

/// Every thread of the block gets the row's stats. `scratch` holds 32 doubles of shared memory.
__device__ inline RowStats row_stats(const float* row, int width, double* scratch) {
  float max = -INFINITY;
  for (int j = int(threadIdx.x); j < width; j += blockDim.x) max = fmaxf(max, row[j]);
  max = block_reduce(max, Max{}, -INFINITY, reinterpret_cast<float*>(scratch));
  double sum = 0;
  for (int j = int(threadIdx.x); j < width; j += blockDim.x) sum += double(expf(row[j] - max));
  sum = block_reduce(sum, Sum{}, 0.0, scratch);
  return RowStats{max, sum};
}

}  // namespace pipesim::runtime::cuda::detail
