#pragma once
/// Internal to runtime/cuda's .cu files: the deterministic column sums behind the bias and norm
/// parameter gradients (defined in layernorm.cu, for T = float and bf16).
#include <cuda_runtime_api.h>

namespace pipesim::runtime::cuda::detail {

/// Over dy (n × m): dy_out[j] += Σ_i dy[i][j] and dyx_out[j] += Σ_i dy[i][j]·xhat[i][j] with xhat =
/// (x − mean)·rstd, the norm's normalised input (mean null: RMSNorm's x·rstd). Either output may be
/// null to skip it (a bias has no xhat; RMSNorm has no bias); x, mean and rstd are read only for
/// dyx_out. Per-chunk partials, then one ordered sum per column: no atomics, the same bits each run.
template <class T>
void column_sums(const T* dy, const T* x, const float* mean, const float* rstd, float* dy_out, float* dyx_out, int n,
                 int m, cudaStream_t stream);

}  // namespace pipesim::runtime::cuda::detail
