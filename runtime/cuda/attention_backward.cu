// Causal attention backward (flash-attention-2 style, deterministic): D = rowsum(dO∘O), then one
// kernel per key tile that loops over the query tiles at or after it for dK and dV, and one per query
// tile that loops over the key tiles up to it for dQ. Both recompute P = exp(S − logsumexp).
#include "attention_common.cuh"
#include "kernels.h"

namespace pipesim::runtime::cuda {
namespace {

using namespace detail;

constexpr int kDeltaThreads = 256;

/// delta[(b·heads + head)·seq + i] = Σ_e dout·out over the head's columns of token (b, i): the
/// softmax backward's Σ_j p_j·dp_j. One warp per (token, head).
template <class T>
__global__ void attention_delta_kernel(const T* out, const T* dout, float* delta, AttentionLayout s) {
  const std::size_t warp = (std::size_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = int(threadIdx.x % 32);
  const std::size_t rows = std::size_t(s.batch) * std::size_t(s.seq) * std::size_t(s.heads);
  if (warp >= rows) return;  // whole warps leave together: blockDim is a multiple of 32
  const std::size_t token = warp / std::size_t(s.heads);
  const int head = int(warp % std::size_t(s.heads));
  const std::size_t at = token * std::size_t(s.h) + std::size_t(head) * std::size_t(s.d);
  float sum = 0;
  for (int e = lane; e < s.d; e += 32) sum += to_float(dout[at + e]) * to_float(out[at + e]);
  sum = warp_reduce(sum, Sum{});
  const std::size_t b = token / std::size_t(s.seq), i = token % std::size_t(s.seq);
  if (lane == 0) delta[(b * std::size_t(s.heads) + std::size_t(head)) * std::size_t(s.seq) + i] = sum;
}

/// Loads lse and delta of query rows [q0, q0 + kTile) (zero past seq) into shared memory.
__device__ void load_row_stats(float* lse_tile, float* delta_tile, const float* lse, const float* delta, int q0,
                               int seq) {
  for (int r = int(threadIdx.x); r < kTile; r += blockDim.x) {
    const bool valid = q0 + r < seq;
    lse_tile[r] = valid ? lse[q0 + r] : 0.0f;
    delta_tile[r] = valid ? delta[q0 + r] : 0.0f;
  }
}

/// dK and dV of key rows [k0, k0 + kTile) of one key/value head: key row c has lanes g = 0..3; lane g
/// scores queries g, g+4, ... of each query tile and owns columns g, g+4, ... of dK_c and dV_c. Under
/// grouped-query attention the block goes through every query head that reads this key/value head,
/// in head order (the CPU's order), so each element still has one writer.
template <class T, int kMaxD>
__global__ void __launch_bounds__(kThreads)
    attention_dkv_kernel(const T* qkv, const T* dout, const float* lse, const float* delta, T* dqkv,
                         AttentionLayout s) {
  extern __shared__ float smem[];
  const int stride = s.d + 1;
  float* k_tile = smem;
  float* v_tile = k_tile + kTile * stride;
  float* q_tile = v_tile + kTile * stride;
  float* do_tile = q_tile + kTile * stride;
  float* p_tile = do_tile + kTile * stride;     // kTile × (kTile + 1), [query][key]
  float* ds_tile = p_tile + kTile * (kTile + 1);
  float* lse_tile = ds_tile + kTile * (kTile + 1);
  float* delta_tile = lse_tile + kTile;
  const int bkv = int(blockIdx.x), b = bkv / s.kv_heads, kv_head = bkv % s.kv_heads;
  const int first_head = kv_head * s.group;  // the query heads reading this key/value head
  const int k0 = int(blockIdx.y) * kTile, c = int(threadIdx.x) / kLanes, g = int(threadIdx.x) % kLanes;
  const int kj = k0 + c;
  const std::size_t qkv_stride = std::size_t(s.width), token0 = std::size_t(b) * std::size_t(s.seq);
  const T* sequence = qkv + token0 * qkv_stride;
  const std::size_t k_column = s.k_column(first_head), v_column = s.v_column(first_head);

  load_tile(k_tile, sequence + k_column, k0, qkv_stride, s);
  load_tile(v_tile, sequence + v_column, k0, qkv_stride, s);
  float dk[kMaxD / kLanes] = {}, dv[kMaxD / kLanes] = {};
  for (int head = first_head; head < first_head + s.group; ++head) {
    const std::size_t bh = std::size_t(b) * std::size_t(s.heads) + std::size_t(head);
    const T* q_base = sequence + s.q_column(head);
    const T* do_base = dout + token0 * std::size_t(s.h) + std::size_t(head) * std::size_t(s.d);
    const float* row_lse = lse + bh * std::size_t(s.seq);
    const float* row_delta = delta + bh * std::size_t(s.seq);
    for (int q0 = k0; q0 < s.seq; q0 += kTile) {  // causal: queries before k0 never see these keys
      __syncthreads();                            // the previous query tile is no longer read
      load_tile(q_tile, q_base, q0, qkv_stride, s);
      load_tile(do_tile, do_base, q0, std::size_t(s.h), s);
      load_row_stats(lse_tile, delta_tile, row_lse, row_delta, q0, s.seq);
      __syncthreads();
#pragma unroll
      for (int t = 0; t < kPerLane; ++t) {
        const int r = g + kLanes * t, qi = q0 + r;
        const float score = dot(&q_tile[r * stride], &k_tile[c * stride], s.d) * s.scale;
        const float dp = dot(&do_tile[r * stride], &v_tile[c * stride], s.d);
        const float p = qi < s.seq && kj <= qi ? expf(score - lse_tile[r]) : 0.0f;
        p_tile[r * (kTile + 1) + c] = p;
        ds_tile[r * (kTile + 1) + c] = p * (dp - delta_tile[r]) * s.scale;
      }
      __syncthreads();
      for (int r = 0; r < kTile; ++r) {
        const float p = p_tile[r * (kTile + 1) + c], ds = ds_tile[r * (kTile + 1) + c];
#pragma unroll
        for (int t = 0; t < kMaxD / kLanes; ++t)
          if (const int e = g + kLanes * t; e < s.d) {
            dv[t] += p * do_tile[r * stride + e];
            dk[t] += ds * q_tile[r * stride + e];
          }
      }
    }
  }
  if (kj >= s.seq) return;
  T* row = dqkv + (token0 + std::size_t(kj)) * qkv_stride;
#pragma unroll
  for (int t = 0; t < kMaxD / kLanes; ++t)
    if (const int e = g + kLanes * t; e < s.d) {
      row[k_column + e] = from_float<T>(to_float(row[k_column + e]) + dk[t]);
      row[v_column + e] = from_float<T>(to_float(row[v_column + e]) + dv[t]);
    }
}

/// dQ of query rows [q0, q0 + kTile): query row r has lanes g = 0..3; lane g scores keys g, g+4, ...
/// of each key tile and owns columns g, g+4, ... of dQ_r.
template <class T, int kMaxD>
__global__ void __launch_bounds__(kThreads)
    attention_dq_kernel(const T* qkv, const T* dout, const float* lse, const float* delta, T* dqkv,
                        AttentionLayout s) {
  extern __shared__ float smem[];
  const int stride = s.d + 1;
  float* q_tile = smem;
  float* do_tile = q_tile + kTile * stride;
  float* k_tile = do_tile + kTile * stride;
  float* v_tile = k_tile + kTile * stride;
  float* ds_tile = v_tile + kTile * stride;  // kTile × (kTile + 1), [query][key]
  const int bh = int(blockIdx.x), b = bh / s.heads, head = bh % s.heads;
  const int q0 = int(blockIdx.y) * kTile, r = int(threadIdx.x) / kLanes, g = int(threadIdx.x) % kLanes;
  const int qi = q0 + r;
  const std::size_t qkv_stride = std::size_t(s.width), token0 = std::size_t(b) * std::size_t(s.seq);
  const std::size_t column = s.q_column(head);  // also the head's column of dout (rows of width h)
  const T* sequence = qkv + token0 * qkv_stride;

  load_tile(q_tile, sequence + column, q0, qkv_stride, s);
  load_tile(do_tile, dout + token0 * std::size_t(s.h) + column, q0, std::size_t(s.h), s);
  const bool valid_row = qi < s.seq;
  const std::size_t stat = std::size_t(bh) * std::size_t(s.seq) + std::size_t(qi);
  const float row_lse = valid_row ? lse[stat] : 0.0f, row_delta = valid_row ? delta[stat] : 0.0f;
  float dq[kMaxD / kLanes] = {};
  const int q_last = min(q0 + kTile, s.seq) - 1;
  for (int k0 = 0; k0 <= q_last; k0 += kTile) {
    __syncthreads();  // the previous key and value tiles are no longer read
    load_tile(k_tile, sequence + s.k_column(head), k0, qkv_stride, s);
    load_tile(v_tile, sequence + s.v_column(head), k0, qkv_stride, s);
    __syncthreads();
#pragma unroll
    for (int t = 0; t < kPerLane; ++t) {
      const int c = g + kLanes * t, kj = k0 + c;
      const float score = dot(&q_tile[r * stride], &k_tile[c * stride], s.d) * s.scale;
      const float dp = dot(&do_tile[r * stride], &v_tile[c * stride], s.d);
      const float p = valid_row && kj <= qi ? expf(score - row_lse) : 0.0f;
      ds_tile[r * (kTile + 1) + c] = p * (dp - row_delta) * s.scale;
    }
    __syncwarp();  // a row's four lanes share a warp, and only they read the row's ds
    for (int c = 0; c < kTile; ++c) {
      const float ds = ds_tile[r * (kTile + 1) + c];
#pragma unroll
      for (int t = 0; t < kMaxD / kLanes; ++t)
        if (const int e = g + kLanes * t; e < s.d) dq[t] += ds * k_tile[c * stride + e];
    }
  }
  if (!valid_row) return;
  T* row = dqkv + (token0 + std::size_t(qi)) * qkv_stride + column;
#pragma unroll
  for (int t = 0; t < kMaxD / kLanes; ++t)
    if (const int e = g + kLanes * t; e < s.d) row[e] = from_float<T>(to_float(row[e]) + dq[t]);
}

std::size_t tile_floats(const AttentionLayout& s) { return std::size_t(kTile) * std::size_t(s.d + 1); }
constexpr std::size_t kScoreTileFloats = std::size_t(kTile) * (kTile + 1);

}  // namespace

namespace detail {

void attention_delta(const void* out, const void* dout, float* delta, const AttentionLayout& s, DType dtype,
                     cudaStream_t stream) {
  const std::size_t rows = std::size_t(s.batch) * std::size_t(s.heads) * std::size_t(s.seq);
  const unsigned blocks = unsigned((rows * 32 + kDeltaThreads - 1) / kDeltaThreads);
  dispatch(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    attention_delta_kernel<<<blocks, kDeltaThreads, 0, stream>>>(static_cast<const T*>(out),
                                                                 static_cast<const T*>(dout), delta, s);
    CUDA_CHECK_LAUNCH();
  });
}

}  // namespace detail

void attention_backward(const AttentionBackwardTensors& t, AttentionShape shape, DType dtype, cudaStream_t stream) {
  const int batch = shape.batch, seq = shape.seq, heads = shape.heads;
  const AttentionLayout s = attention_layout(batch, seq, shape.h, heads, shape.kv_heads);
  const std::size_t rows = std::size_t(batch) * std::size_t(heads) * std::size_t(seq);
  StreamScratch delta(rows * sizeof(float), stream);
  const std::size_t dkv_smem = (4 * tile_floats(s) + 2 * kScoreTileFloats + 2 * kTile) * sizeof(float);
  const std::size_t dq_smem = (4 * tile_floats(s) + kScoreTileFloats) * sizeof(float);
  // dK and dV: a block per key/value head; dQ: a block per query head.
  const unsigned tiles = unsigned((seq + kTile - 1) / kTile);
  const dim3 dkv_grid(unsigned(batch * s.kv_heads), tiles), dq_grid(unsigned(batch * heads), tiles);
  attention_delta(t.out, t.dout, delta.as<float>(), s, dtype, stream);
  dispatch(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const auto* qkv_t = static_cast<const T*>(t.qkv);
    const auto* dout_t = static_cast<const T*>(t.dout);
    auto* dqkv_t = static_cast<T*>(t.dqkv);
    dispatch_head_width(s.d, [&](auto width) {
      constexpr int kMaxD = decltype(width)::value;
      const auto dkv = attention_dkv_kernel<T, kMaxD>;
      allow_shared_memory(dkv, dkv_smem);
      dkv<<<dkv_grid, kThreads, dkv_smem, stream>>>(qkv_t, dout_t, t.lse, delta.as<float>(), dqkv_t, s);
      CUDA_CHECK_LAUNCH();
      const auto dq = attention_dq_kernel<T, kMaxD>;
      allow_shared_memory(dq, dq_smem);
      dq<<<dq_grid, kThreads, dq_smem, stream>>>(qkv_t, dout_t, t.lse, delta.as<float>(), dqkv_t, s);
      CUDA_CHECK_LAUNCH();
    });
  });
}

}  // namespace pipesim::runtime::cuda
