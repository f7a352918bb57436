#pragma once
/// Shared by the attention kernels (internal). Tiles of kTile query rows × kTile key rows; a block of
/// kThreads threads gives each row of its tile four threads ("lanes"), which split the tile's other
/// dimension and the head width between them. Tiles live in shared memory as fp32 with rows padded
/// to d + 1 floats, so that threads reading the same column of different rows hit different banks.
#include <cmath>
#include <string>

#include "device_util.cuh"

namespace pipesim::runtime::cuda::detail {

constexpr int kTile = 32;
constexpr int kLanes = 4;
constexpr int kThreads = kTile * kLanes;
constexpr int kMaxHeadWidth = 128;
/// Per-thread columns of a kTile-wide row (kTile / kLanes).
constexpr int kPerLane = kTile / kLanes;

/// A fused QKV row is [q: heads·d | k: kv_heads·d | v: kv_heads·d] (cpu::attention_forward's layout);
/// query head i reads key/value head i / group, group = heads / kv_heads (1 for multi-head attention).
struct AttentionLayout {
  int batch = 0, seq = 0, h = 0, heads = 0;
  int d = 0;         ///< head width h / heads
  float scale = 0;   ///< 1/sqrt(d)
  int kv_heads = 0;  ///< key/value heads, dividing heads
  int group = 1;     ///< query heads per key/value head
  int width = 0;     ///< a QKV row: h + 2·kv_heads·d (3h for multi-head attention)
  /// Columns of a QKV row where query head `head`'s vector and its key and value heads' start.
  __host__ __device__ std::size_t q_column(int head) const { return std::size_t(head) * std::size_t(d); }
  __host__ __device__ std::size_t k_column(int head) const {
    return std::size_t(h) + std::size_t(head / group) * std::size_t(d);
  }
  __host__ __device__ std::size_t v_column(int head) const {
    return std::size_t(h) + std::size_t(kv_heads + head / group) * std::size_t(d);
  }
};

/// kv_heads 0 means heads (multi-head attention).
inline AttentionLayout attention_layout(int batch, int seq, int h, int heads, int kv_heads) {
  if (kv_heads == 0) kv_heads = heads;
  if (batch < 1 || seq < 1 || heads < 1 || h < 1 || h % heads != 0 || kv_heads < 1 || heads % kv_heads != 0)
    throw CudaError("attention: need batch, seq, h, heads, kv_heads >= 1, h divisible by heads and heads by kv_heads; "
                    "got batch=" + std::to_string(batch) + " seq=" + std::to_string(seq) + " h=" + std::to_string(h) +
                    " heads=" + std::to_string(heads) + " kv_heads=" + std::to_string(kv_heads));
  if (seq > 65535 * kTile)  // query tiles are the grid's y dimension
    throw CudaError("attention: seq " + std::to_string(seq) + " exceeds " + std::to_string(65535 * kTile));
  const int d = h / heads;
  if (d > kMaxHeadWidth)
    throw CudaError("attention: head width h/heads = " + std::to_string(d) + " exceeds the kernels' " +
                    std::to_string(kMaxHeadWidth) + "; use more heads");
  return AttentionLayout{.batch = batch, .seq = seq, .h = h, .heads = heads, .d = d,
                         .scale = 1.0f / std::sqrt(float(d)), .kv_heads = kv_heads, .group = heads / kv_heads,
                         .width = h + 2 * kv_heads * d};
}

/// Loads rows [row0, row0 + kTile) of one head of a (seq × row_stride) matrix into `tile` (kTile ×
/// (d + 1) floats); rows past seq read as zero. `base` points at row 0, column of this head.
template <class T>
__device__ void load_tile(float* tile, const T* base, int row0, std::size_t row_stride, const AttentionLayout& s) {
  const int stride = s.d + 1;
  for (int idx = int(threadIdx.x); idx < kTile * s.d; idx += blockDim.x) {
    const int r = idx / s.d, e = idx % s.d, row = row0 + r;
    tile[r * stride + e] = row < s.seq ? to_float(base[std::size_t(row) * row_stride + std::size_t(e)]) : 0.0f;
  }
}

/// Σ_e a[e]·b[e] over the head width, in order e = 0, 1, ... (the CPU's order).
__device__ __forceinline__ float dot(const float* a, const float* b, int d) {
  float sum = 0;
  for (int e = 0; e < d; ++e) sum += a[e] * b[e];
  return sum;
}

/// The padded-tile template for the head widths the kernels are instantiated for.
template <class F>
void dispatch_head_width(int d, F&& f) {
  if (d <= 32) f(std::integral_constant<int, 32>{});
  else if (d <= 64) f(std::integral_constant<int, 64>{});
  else f(std::integral_constant<int, 128>{});
}

/// delta[(b·heads + head)·seq + i] = Σ_e dout·out over the head's columns of token (b, i), the
/// softmax backward's Σ_j p_j·dp_j: both attention backwards start from it (attention_backward.cu).
void attention_delta(const void* out, const void* dout, float* delta, const AttentionLayout& s, DType dtype,
                     cudaStream_t stream);

/// Dynamic shared memory beyond the default 48 KiB must be opted into per kernel (and device).
template <class Kernel>
void allow_shared_memory(Kernel kernel, std::size_t bytes) {
  if (bytes > 48 * 1024)
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
}

}  // namespace pipesim::runtime::cuda::detail
