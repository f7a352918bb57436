// Device memory for the in-process communicator: ranks that are threads of one process hand each
// other device pointers; a receive or a collective's result is a device-to-device copy, and
// reductions run on the GPU that holds the result. Calls are synchronous (on the calling thread's
// per-thread stream), as the World expects a copy to be done when it returns.
#include "cuda/check.h"
#include "cuda/cuda_backend.h"
#include "cuda/reduce.h"

namespace pipesim::runtime::cuda {
namespace {

/// The device that holds `pointer` (memory from cudaMalloc or cudaMallocAsync).
int device_of(const void* pointer) {
  cudaPointerAttributes attributes{};
  CUDA_CHECK(cudaPointerGetAttributes(&attributes, pointer));
  return attributes.device;
}

class DeviceMemory final : public Memory {
 public:
  void* allocate(std::size_t bytes) override {
    void* data = nullptr;
    CUDA_CHECK(cudaMallocAsync(&data, std::max<std::size_t>(bytes, 1), cudaStreamPerThread));
    CUDA_CHECK(cudaStreamSynchronize(cudaStreamPerThread));
    return data;
  }
  void free(void* data) noexcept override { static_cast<void>(cudaFreeAsync(data, cudaStreamPerThread)); }
  void copy(void* to, const void* from, std::size_t bytes) override {
    if (bytes == 0) return;
    CUDA_CHECK(cudaMemcpyAsync(to, from, bytes, cudaMemcpyDefault, cudaStreamPerThread));
    CUDA_CHECK(cudaStreamSynchronize(cudaStreamPerThread));
  }
  void combine(void* into, const void* from, std::size_t count, DType dtype, ReduceOp op) override {
    if (count == 0) return;
    // The kernel runs where the result lives; an operand on another GPU is copied over first.
    int previous = 0;
    CUDA_CHECK(cudaGetDevice(&previous));
    const int device = device_of(into);
    CUDA_CHECK(cudaSetDevice(device));
    void* operand = const_cast<void*>(from);
    const bool remote = device_of(from) != device;
    if (remote) {
      operand = allocate(count * size_of(dtype));
      copy(operand, from, count * size_of(dtype));
    }
    cuda::combine(into, operand, count, dtype, op, cudaStreamPerThread);
    CUDA_CHECK(cudaStreamSynchronize(cudaStreamPerThread));
    if (remote) free(operand);
    CUDA_CHECK(cudaSetDevice(previous));
  }
};

}  // namespace

Memory& device_memory() {
  static DeviceMemory memory;
  return memory;
}

}  // namespace pipesim::runtime::cuda
