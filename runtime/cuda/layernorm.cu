// LayerNorm forward (alone or after the residual add) and backward, and the bias gradient: row
// kernels (one block per row) and deterministic column sums (per-chunk partials, then one ordered sum
// per column), which RMSNorm's gain gradient shares (column_sums.cuh).
#include "column_sums.cuh"
#include "device_util.cuh"
#include "kernels.h"

namespace pipesim::runtime::cuda {
namespace {

using detail::from_float;
using detail::to_float;

constexpr float kLayerNormEpsilon = 1e-5f;  // as runtime/cpu/kernels.cpp
constexpr int kRowThreads = 256;
/// Column sums: a block covers 32 columns × kChunkRows rows with 32×8 threads; each chunk of rows
/// writes one partial per column, and a second kernel adds the partials in chunk order.
constexpr int kColumns = 32, kRowLanes = 8, kChunkRows = 64;

/// LayerNorm of x's rows or, with a residual, of x + residual (kept in `sum`; detail::norm_input).
template <class T>
__global__ void __launch_bounds__(kRowThreads)
    layernorm_forward_kernel(const T* x, const T* residual, T* sum_out, const float* gamma, const float* beta, T* y,
                             float* mean, float* rstd, int h) {
  __shared__ float scratch[32];
  const std::size_t row = blockIdx.x;
  const T* in = detail::norm_input(x, residual, sum_out, row * std::size_t(h), h);
  float sum = 0;
  for (int j = int(threadIdx.x); j < h; j += blockDim.x) sum += to_float(in[j]);
  const float mu = detail::block_reduce(sum, detail::Sum{}, 0.0f, scratch) / float(h);
  float squares = 0;
  for (int j = int(threadIdx.x); j < h; j += blockDim.x) {
    const float centred = to_float(in[j]) - mu;
    squares += centred * centred;
  }
  const float variance = detail::block_reduce(squares, detail::Sum{}, 0.0f, scratch) / float(h);
  const float r = 1.0f / sqrtf(variance + kLayerNormEpsilon);  // IEEE sqrt and divide, not rsqrtf
  if (threadIdx.x == 0) mean[row] = mu, rstd[row] = r;
  T* out = y + row * std::size_t(h);
  for (int j = int(threadIdx.x); j < h; j += blockDim.x)
    out[j] = from_float<T>((to_float(in[j]) - mu) * r * gamma[j] + beta[j]);
}

/// dx += r·(g − mean(g) − xhat·mean(g·xhat)) with g = dy·gamma, xhat = (x − mean)·r.
template <class T>
__global__ void __launch_bounds__(kRowThreads)
    layernorm_dx_kernel(const T* x, const float* gamma, const float* mean, const float* rstd, const T* dy, T* dx,
                        int h) {
  __shared__ float scratch[32];
  const std::size_t row = blockIdx.x, base = row * std::size_t(h);
  const float mu = mean[row], r = rstd[row];
  float g_sum = 0, gx_sum = 0;
  for (int j = int(threadIdx.x); j < h; j += blockDim.x) {
    const float xhat = (to_float(x[base + j]) - mu) * r, g = to_float(dy[base + j]) * gamma[j];
    g_sum += g, gx_sum += g * xhat;
  }
  const float g_mean = detail::block_reduce(g_sum, detail::Sum{}, 0.0f, scratch) / float(h);
  const float gx_mean = detail::block_reduce(gx_sum, detail::Sum{}, 0.0f, scratch) / float(h);
  for (int j = int(threadIdx.x); j < h; j += blockDim.x) {
    const float xhat = (to_float(x[base + j]) - mu) * r, g = to_float(dy[base + j]) * gamma[j];
    dx[base + j] = from_float<T>(to_float(dx[base + j]) + r * (g - g_mean - xhat * gx_mean));
  }
}

/// Pass 1 of the column sums over one chunk of rows: partial_dy[chunk·m + j] = Σ dy[i][j] and, when
/// `x` is given (a norm), partial_dyx[chunk·m + j] = Σ dy[i][j]·xhat[i][j], xhat = (x − mean)·rstd
/// (mean null: RMSNorm's x·rstd).
template <class T>
__global__ void __launch_bounds__(kColumns * kRowLanes)
    column_partials_kernel(const T* dy, const T* x, const float* mean, const float* rstd, float* partial_dy,
                           float* partial_dyx, int n, int m) {
  __shared__ float sums[2][kRowLanes][kColumns + 1];
  const int lane = int(threadIdx.x), row_lane = int(threadIdx.y);
  const int j = int(blockIdx.x) * kColumns + lane, chunk = int(blockIdx.y);
  const int end = min(n, (chunk + 1) * kChunkRows);
  float sum_dy = 0, sum_dyx = 0;
  if (j < m)
    for (int i = chunk * kChunkRows + row_lane; i < end; i += kRowLanes) {
      const std::size_t at = std::size_t(i) * std::size_t(m) + std::size_t(j);
      const float g = to_float(dy[at]);
      sum_dy += g;
      if (x != nullptr) sum_dyx += g * (to_float(x[at]) - (mean != nullptr ? mean[i] : 0.0f)) * rstd[i];
    }
  sums[0][row_lane][lane] = sum_dy, sums[1][row_lane][lane] = sum_dyx;
  __syncthreads();
  if (row_lane != 0 || j >= m) return;
  float total_dy = 0, total_dyx = 0;
  for (int r = 0; r < kRowLanes; ++r) total_dy += sums[0][r][lane], total_dyx += sums[1][r][lane];
  const std::size_t out = std::size_t(chunk) * std::size_t(m) + std::size_t(j);
  partial_dy[out] = total_dy;
  if (partial_dyx != nullptr) partial_dyx[out] = total_dyx;
}

/// Pass 2: out[j] += Σ over chunks of partial[chunk·m + j], in chunk order.
__global__ void column_finish_kernel(const float* partial, float* out, int chunks, int m) {
  const int j = int(blockIdx.x * blockDim.x + threadIdx.x);
  if (j >= m) return;
  float total = 0;
  for (int c = 0; c < chunks; ++c) total += partial[std::size_t(c) * std::size_t(m) + std::size_t(j)];
  out[j] += total;
}

}  // namespace

namespace detail {

template <class T>
void column_sums(const T* dy, const T* x, const float* mean, const float* rstd, float* dy_out, float* dyx_out, int n,
                 int m, cudaStream_t stream) {
  const int chunks = (n + kChunkRows - 1) / kChunkRows;
  const std::size_t partial_floats = std::size_t(chunks) * std::size_t(m);
  detail::StreamScratch scratch(partial_floats * (dyx_out ? 2 : 1) * sizeof(float), stream);
  float* partial_dy = scratch.as<float>();
  float* partial_dyx = dyx_out ? partial_dy + partial_floats : nullptr;
  const dim3 grid(unsigned((m + kColumns - 1) / kColumns), unsigned(chunks)), block(kColumns, kRowLanes);
  column_partials_kernel<<<grid, block, 0, stream>>>(dy, x, mean, rstd, partial_dy, partial_dyx, n, m);
  CUDA_CHECK_LAUNCH();
  const unsigned finish_blocks = unsigned((m + kRowThreads - 1) / kRowThreads);
  if (dy_out) {
    column_finish_kernel<<<finish_blocks, kRowThreads, 0, stream>>>(partial_dy, dy_out, chunks, m);
    CUDA_CHECK_LAUNCH();
  }
  if (dyx_out) {
    column_finish_kernel<<<finish_blocks, kRowThreads, 0, stream>>>(partial_dyx, dyx_out, chunks, m);
    CUDA_CHECK_LAUNCH();
  }
}

template void column_sums<float>(const float*, const float*, const float*, const float*, float*, float*, int, int,
                                 cudaStream_t);
template void column_sums<bf16>(const bf16*, const bf16*, const float*, const float*, float*, float*, int, int,
                                cudaStream_t);

}  // namespace detail

namespace {

/// layernorm_forward, after the residual add where `residual` is given (add_layernorm_forward).
void layernorm_rows(const LayerNormForwardTensors& t, const void* residual, void* sum, RowShape shape, DType dtype,
                    cudaStream_t stream) {
  const int n = shape.n, h = shape.h;
  if (n == 0 || h == 0) return;
  detail::dispatch(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    layernorm_forward_kernel<<<unsigned(n), kRowThreads, 0, stream>>>(
        static_cast<const T*>(t.x), static_cast<const T*>(residual), static_cast<T*>(sum), t.gamma, t.beta,
        static_cast<T*>(t.y), t.mean, t.rstd, h);
  });
  CUDA_CHECK_LAUNCH();
}

}  // namespace

void layernorm_forward(const LayerNormForwardTensors& t, RowShape shape, DType dtype, cudaStream_t stream) {
  layernorm_rows(t, nullptr, nullptr, shape, dtype, stream);
}

void add_layernorm_forward(const AddLayerNormForwardTensors& t, RowShape shape, DType dtype, cudaStream_t stream) {
  layernorm_rows({.x = t.x, .gamma = t.gamma, .beta = t.beta, .y = t.y, .mean = t.mean, .rstd = t.rstd}, t.residual,
                 t.sum, shape, dtype, stream);
}

void layernorm_backward(const LayerNormBackwardTensors& t, RowShape shape, DType dtype, cudaStream_t stream) {
  const int n = shape.n, h = shape.h;
  if (n == 0 || h == 0) return;
  detail::dispatch(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const auto* x_t = static_cast<const T*>(t.x);
    const auto* dy_t = static_cast<const T*>(t.dy);
    layernorm_dx_kernel<<<unsigned(n), kRowThreads, 0, stream>>>(x_t, t.gamma, t.mean, t.rstd, dy_t,
                                                                  static_cast<T*>(t.dx), h);
    CUDA_CHECK_LAUNCH();
    detail::column_sums(dy_t, x_t, t.mean, t.rstd, t.dbeta, t.dgamma, n, h, stream);
  });
}

void bias_grad(const void* dy, float* dbias, int n, int m, DType dtype, cudaStream_t stream) {
  if (n == 0 || m == 0) return;
  detail::dispatch(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    detail::column_sums<T>(static_cast<const T*>(dy), nullptr, nullptr, nullptr, dbias, nullptr, n, m, stream);
  });
}

}  // namespace pipesim::runtime::cuda
