// Device memory for the in-process communicator: ranks that are threads of one process hand each
// other device pointers; a receive or a collective's result is a device-to-device copy, and
// reductions run on the GPU that holds the result. Calls are synchronous (on the stream the backend
// gave the calling thread, else its per-thread stream), as the World expects a copy to be done when
// it returns.
#include <atomic>

#include "cuda/check.h"
#include "cuda/cuda_backend.h"
#include "cuda/reduce.h"
#include "cuda/thread_stream.h"

namespace pipesim::runtime::cuda {
namespace {

std::atomic<std::uint64_t> generation{1};

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
  void free(void* data, std::size_t) noexcept override { static_cast<void>(cudaFreeAsync(data, cudaStreamPerThread)); }
  void copy(void* to, const void* from, std::size_t bytes) override {
    if (bytes == 0) return;
    // A copy may go on a stream of another device than the current one (a kernel may not).
    const cudaStream_t stream = stream_for(-1);
    CUDA_CHECK(cudaMemcpyAsync(to, from, bytes, cudaMemcpyDefault, stream));
    CUDA_CHECK(cudaStreamSynchronize(stream));
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
    const cudaStream_t stream = stream_for(device);
    cuda::combine(into, operand, count, dtype, op, stream);
    CUDA_CHECK(cudaStreamSynchronize(stream));
    if (remote) free(operand, count * size_of(dtype));
    CUDA_CHECK(cudaSetDevice(previous));
  }
};

}  // namespace

ThreadStream& thread_stream() {
  thread_local ThreadStream stream;
  return stream;
}
std::uint64_t stream_generation() { return generation.load(); }
void retire_streams() { generation.fetch_add(1); }
cudaStream_t stream_for(int device) {
  const ThreadStream& s = thread_stream();
  const bool live = s.stream != nullptr && s.generation == stream_generation();
  return live && (device < 0 || device == s.device) ? s.stream : cudaStreamPerThread;
}

Memory& device_memory() {
  static DeviceMemory memory;
  return memory;
}

}  // namespace pipesim::runtime::cuda
