// Causal attention forward, flash-attention style: per block one (sequence, head) and kTile queries;
// key tiles stream through shared memory with an online softmax, so only the logsumexp per query
// row is kept for the backward.
#include "attention_common.cuh"
#include "kernels.h"

namespace pipesim::runtime::cuda {
namespace {

using namespace detail;

constexpr float kNegativeInfinity = -INFINITY;

/// Each query row r has lanes g = 0..3: lane g scores keys g, g+4, ... of a tile and owns output
/// columns g, g+4, ... of the row, so the row's max and sum need a 4-lane shuffle only.
template <class T, int kMaxD>
__global__ void __launch_bounds__(kThreads)
    attention_forward_kernel(const T* qkv, T* out, float* lse, AttentionLayout s) {
  extern __shared__ float smem[];
  const int stride = s.d + 1;
  float* q_tile = smem;                        // kTile × stride
  float* kv_tile = q_tile + kTile * stride;    // kTile × stride: the key tile, then its value tile
  float* p_tile = kv_tile + kTile * stride;    // kTile × (kTile + 1): this tile's unnormalised probabilities
  const int bh = int(blockIdx.x), b = bh / s.heads, head = bh % s.heads;
  const int q0 = int(blockIdx.y) * kTile, r = int(threadIdx.x) / kLanes, g = int(threadIdx.x) % kLanes;
  const int qi = q0 + r;
  const std::size_t qkv_stride = std::size_t(s.width);
  const T* sequence = qkv + std::size_t(b) * std::size_t(s.seq) * qkv_stride;
  const T* q_base = sequence + s.q_column(head);
  const T* k_base = sequence + s.k_column(head);  // the key/value head this query head reads
  const T* v_base = sequence + s.v_column(head);

  load_tile(q_tile, q_base, q0, qkv_stride, s);
  float o[kMaxD / kLanes] = {};
  float m = kNegativeInfinity, l = 0;  // running max and sum of exp(score − m) of row r
  const int q_last = min(q0 + kTile, s.seq) - 1;
  for (int k0 = 0; k0 <= q_last; k0 += kTile) {  // causal: no key tile after the last query
    __syncthreads();                             // the previous value tile is no longer read
    load_tile(kv_tile, k_base, k0, qkv_stride, s);
    __syncthreads();
    float score[kPerLane] = {};
    for (int e = 0; e < s.d; ++e) {
      const float q = q_tile[r * stride + e];
#pragma unroll
      for (int t = 0; t < kPerLane; ++t) score[t] += q * kv_tile[(g + kLanes * t) * stride + e];
    }
    float tile_max = kNegativeInfinity;
#pragma unroll
    for (int t = 0; t < kPerLane; ++t) {
      const int kj = k0 + g + kLanes * t;
      score[t] = kj <= qi && kj < s.seq ? score[t] * s.scale : kNegativeInfinity;
      tile_max = fmaxf(tile_max, score[t]);
    }
    tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
    tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 2));
    const float m_new = fmaxf(m, tile_max);
    // A row with no key yet (m_new = −∞) keeps zeros rather than exp(−∞ + ∞) = NaN.
    const float alpha = m_new == kNegativeInfinity ? 0.0f : expf(m - m_new);
    float p_sum = 0;
#pragma unroll
    for (int t = 0; t < kPerLane; ++t) {
      const float p = score[t] == kNegativeInfinity ? 0.0f : expf(score[t] - m_new);
      p_tile[r * (kTile + 1) + g + kLanes * t] = p;
      p_sum += p;
    }
    p_sum += __shfl_xor_sync(0xffffffffu, p_sum, 1);
    p_sum += __shfl_xor_sync(0xffffffffu, p_sum, 2);
    l = l * alpha + p_sum, m = m_new;
#pragma unroll
    for (int t = 0; t < kMaxD / kLanes; ++t) o[t] *= alpha;
    __syncthreads();  // every lane is done with the key tile and has written its probabilities
    load_tile(kv_tile, v_base, k0, qkv_stride, s);
    __syncthreads();
    for (int c = 0; c < kTile; ++c) {
      const float p = p_tile[r * (kTile + 1) + c];
#pragma unroll
      for (int t = 0; t < kMaxD / kLanes; ++t)
        if (const int e = g + kLanes * t; e < s.d) o[t] += p * kv_tile[c * stride + e];
    }
  }
  if (qi >= s.seq) return;
  T* row_out = out + (std::size_t(b) * std::size_t(s.seq) + std::size_t(qi)) * std::size_t(s.h) +
               std::size_t(head) * std::size_t(s.d);
#pragma unroll
  for (int t = 0; t < kMaxD / kLanes; ++t)
    if (const int e = g + kLanes * t; e < s.d) row_out[e] = from_float<T>(o[t] / l);
  if (g == 0) lse[std::size_t(bh) * std::size_t(s.seq) + std::size_t(qi)] = m + logf(l);
}

}  // namespace

void attention_forward(const AttentionForwardTensors& t, AttentionShape shape, DType dtype, cudaStream_t stream) {
  const int batch = shape.batch, seq = shape.seq, heads = shape.heads;
  const AttentionLayout s = attention_layout(batch, seq, shape.h, heads, shape.kv_heads);
  const std::size_t smem = (2 * std::size_t(kTile) * std::size_t(s.d + 1) + kTile * (kTile + 1)) * sizeof(float);
  const dim3 grid(unsigned(batch * heads), unsigned((seq + kTile - 1) / kTile));
  dispatch(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    dispatch_head_width(s.d, [&](auto width) {
      const auto kernel = attention_forward_kernel<T, decltype(width)::value>;
      allow_shared_memory(kernel, smem);
      kernel<<<grid, kThreads, smem, stream>>>(static_cast<const T*>(t.qkv), static_cast<T*>(t.out), t.lse, s);
    });
  });
  CUDA_CHECK_LAUNCH();
}

}  // namespace pipesim::runtime::cuda
