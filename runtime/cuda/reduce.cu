#include <cuda_bf16.h>

#include <stdexcept>

#include "cuda/check.h"
#include "cuda/reduce.h"

namespace pipesim::runtime::cuda {
namespace {

__device__ float load(const float* p, std::size_t i) { return p[i]; }
__device__ float load(const __nv_bfloat16* p, std::size_t i) { return __bfloat162float(p[i]); }
__device__ void store(float* p, std::size_t i, float v) { p[i] = v; }
__device__ void store(__nv_bfloat16* p, std::size_t i, float v) { p[i] = __float2bfloat16(v); }

template <class T>
__global__ void combine_kernel(T* into, const T* from, std::size_t count, bool max) {
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < count; i += std::size_t(gridDim.x) * blockDim.x) {
    const float a = load(into, i), b = load(from, i);
    store(into, i, max ? fmaxf(a, b) : a + b);
  }
}

template <class T>
__global__ void scale_kernel(T* data, float factor, std::size_t count) {
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < count; i += std::size_t(gridDim.x) * blockDim.x)
    store(data, i, load(data, i) * factor);
}

unsigned blocks_for(std::size_t count) { return unsigned(std::min<std::size_t>((count + 255) / 256, 4096)); }

}  // namespace

void combine(void* into, const void* from, std::size_t count, DType dtype, ReduceOp op, cudaStream_t stream) {
  if (count == 0) return;
  if (op != ReduceOp::Sum && op != ReduceOp::Max) throw CudaError("combine: only Sum and Max reduce element-wise");
  const bool max = op == ReduceOp::Max;
  switch (dtype) {
    case DType::F32:
      combine_kernel<<<blocks_for(count), 256, 0, stream>>>(static_cast<float*>(into), static_cast<const float*>(from), count, max);
      break;
    case DType::BF16:
      combine_kernel<<<blocks_for(count), 256, 0, stream>>>(static_cast<__nv_bfloat16*>(into),
                                                            static_cast<const __nv_bfloat16*>(from), count, max);
      break;
    case DType::F64: throw CudaError("combine: fp64 buffers are host-only (the control lane)");
  }
  CUDA_CHECK_LAUNCH();
}

void scale(void* data, float factor, std::size_t count, DType dtype, cudaStream_t stream) {
  if (count == 0) return;
  switch (dtype) {
    case DType::F32: scale_kernel<<<blocks_for(count), 256, 0, stream>>>(static_cast<float*>(data), factor, count); break;
    case DType::BF16:
      scale_kernel<<<blocks_for(count), 256, 0, stream>>>(static_cast<__nv_bfloat16*>(data), factor, count);
      break;
    case DType::F64: throw CudaError("scale: fp64 buffers are host-only");
  }
  CUDA_CHECK_LAUNCH();
}

}  // namespace pipesim::runtime::cuda
