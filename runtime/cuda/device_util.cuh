#pragma once
/// Internal to runtime/cuda's .cu files: storage-type conversion, deterministic block reductions,
/// DType dispatch and stream-ordered scratch memory.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <type_traits>

#include "check.h"
#include "dtype.h"

/// Grid-stride loop over [0, count): each thread takes every (grid size)-th index from its own.
#define FOR_EACH_INDEX(i, count)                                                                  \
  for (std::size_t i = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < (count);           \
       i += std::size_t(gridDim.x) * blockDim.x)

namespace pipesim::runtime::cuda::detail {

using bf16 = __nv_bfloat16;

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(bf16 x) { return __bfloat162float(x); }

template <class T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ float from_float<float>(float x) {
  return x;
}
/// Round to nearest even, as dtype.h's float_to_bf16_bits.
template <>
__device__ __forceinline__ bf16 from_float<bf16>(float x) {
  return __float2bfloat16(x);
}

/// Calls f(std::type_identity<T>{}) with T the device storage type of `t`.
template <class F>
void dispatch(DType t, F&& f) {
  switch (t) {
    case DType::F32: f(std::type_identity<float>{}); return;
    case DType::BF16: f(std::type_identity<bf16>{}); return;
    case DType::F64: break;
  }
  throw CudaError("fp64 tensors are host-only: device kernels take fp32 or bf16");
}

struct Sum {
  template <class V>
  __device__ V operator()(V a, V b) const { return a + b; }
};
struct Max {
  __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

template <class V, class Op>
__device__ __forceinline__ V warp_reduce(V v, Op op) {
  for (int offset = 16; offset > 0; offset /= 2) v = op(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

/// The reduction of v over the whole block, returned to every thread. The tree is fixed by the block
/// size, so results repeat bit for bit. blockDim.x must be a multiple of 32; `scratch` is 32 values
/// of shared memory, reusable by consecutive calls (the leading barrier guards it).
template <class V, class Op>
__device__ V block_reduce(V v, Op op, V identity, V* scratch) {
  const int lane = int(threadIdx.x % 32), warp = int(threadIdx.x / 32), warps = int(blockDim.x / 32);
  v = warp_reduce(v, op);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  return warp_reduce(lane < warps ? scratch[lane] : identity, op);
}

/// Row `base` (h elements) of a norm's input: x's or, with a residual, the sum x + residual rounded
/// to T as add() rounds it, which this loop writes to `sum` (the caller's next residual stream; it
/// may be x or residual) and the norm's later loops read back from there. Each thread reads back only
/// what it wrote, so no barrier is needed, and the norm sees the stored sum's values: the statistics
/// and output are add() then the plain norm's, bit for bit, and the norm's backward reads `sum`.
template <class T>
__device__ const T* norm_input(const T* x, const T* residual, T* sum, std::size_t base, int h) {
  if (residual == nullptr) return x + base;
  for (int j = int(threadIdx.x); j < h; j += blockDim.x)
    sum[base + j] = from_float<T>(to_float(x[base + j]) + to_float(residual[base + j]));
  return sum + base;
}

/// Blocks for a grid-stride loop over `count` elements: enough to fill the device, never more than the
/// elements need.
inline unsigned grid_for(std::size_t count, int threads) {
  const std::size_t needed = (count + std::size_t(threads) - 1) / std::size_t(threads);
  return unsigned(std::clamp<std::size_t>(needed, 1, 65535));
}

/// Device memory that lives for a launcher's call: allocated and freed in stream order
/// (cudaMallocAsync), so it costs no synchronisation and is reused from the stream's pool.
class StreamScratch {
 public:
  StreamScratch(std::size_t bytes, cudaStream_t stream) : stream_(stream) {
    if (bytes > 0) CUDA_CHECK(cudaMallocAsync(&data_, bytes, stream_));
  }
  ~StreamScratch() {
    if (data_ != nullptr) static_cast<void>(cudaFreeAsync(data_, stream_));
  }
  StreamScratch(const StreamScratch&) = delete;
  StreamScratch& operator=(const StreamScratch&) = delete;
  template <class T>
  T* as() const {
    return static_cast<T*>(data_);
  }

 private:
  void* data_ = nullptr;
  cudaStream_t stream_;
};

}  // namespace pipesim::runtime::cuda::detail
