#pragma once
/// What the CUDA backend's ops run with: the calling thread's stream and cuBLASLt handle
/// (ThreadContexts) and, around them, the rank's activation type and sizes and the stream-ordered
/// memory every op takes (OpContext). The layer and vocabulary math (layer_ops.h, layer.h,
/// vocab_passes.h) see the backend only through an OpContext.
///
/// Streams: every host thread that calls the backend gets a stream of its own (the rank's compute
/// thread and its communication thread), created in the rank's share of the GPU's SMs. Every op ends
/// with synchronize(), so when the executor marks an op done its results exist and any thread may use
/// them. Memory comes from the stream-ordered pool: ops take it without waiting; Backend::allocate(),
/// which the executor calls from either thread, returns it ready.
#include <cstddef>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

#include <cuda_runtime_api.h>

#include "cuda/gemm.h"
#include "cuda/sm_share.h"
#include "tensor.h"

namespace pipesim::runtime::cuda {

/// Each host thread's stream and GEMM handle on one rank's GPU, made on the thread's first call and
/// kept until the thread releases them or this is destroyed.
class ThreadContexts {
 public:
  /// Streams on `device`, made in `share` (which outlives this).
  ThreadContexts(int device, SmShare& share) : device_(device), share_(share) {}
  /// Retires the streams (thread_stream.h: no thread's communicator copies go on them after this)
  /// and destroys them.
  ~ThreadContexts();
  ThreadContexts(const ThreadContexts&) = delete;
  ThreadContexts& operator=(const ThreadContexts&) = delete;

  /// The calling thread's stream.
  cudaStream_t stream() { return context().stream; }
  /// The calling thread's stream if it has one (null otherwise): unlike stream(), never makes one.
  cudaStream_t existing_stream() const;
  /// How many threads hold a cuBLASLt handle (each with its workspace, gemm_workspace_bytes()).
  int gemm_handles() const;
  static std::size_t gemm_workspace_bytes();
  /// The calling thread's GEMM handle, made on its first GEMM: a thread that only copies (the
  /// communication thread) never pays for a cuBLASLt workspace.
  GemmHandle& gemm();
  /// A thread that ends (the executor starts a compute thread per step) leaves its stream and GEMM
  /// handle, with its cached plans, for the next thread instead of leaking them.
  void release_thread();

 private:
  struct ThreadContext {
    cudaStream_t stream = nullptr;
    std::unique_ptr<GemmHandle> gemm;
  };

  /// The calling thread's stream and GEMM handle, made on its first call (on this rank's GPU).
  ThreadContext& context();

  int device_;
  SmShare& share_;
  mutable std::mutex mutex_;
  std::unordered_map<std::thread::id, ThreadContext> contexts_;
  std::vector<ThreadContext> spare_;  ///< left by threads that ended
};

/// One rank's view of its backend for the math of an op: the calling thread's stream and GEMM handle
/// (looked up at every use, as a thread's are made on its first), the activation type, a
/// microbatch's size, and the Allocator that takes back what it allocates.
struct OpContext {
  ThreadContexts& threads;
  Allocator& owner;  ///< the backend: frees its tensors on the freeing thread's stream
  DType dtype;       ///< of weights and activations (BackendOptions::dtype)
  int n;             ///< tokens of a microbatch: batch · seq
  int h;             ///< the hidden width

  cudaStream_t stream() const { return threads.stream(); }
  GemmHandle& gemm() const { return threads.gemm(); }
  /// Returns once the calling thread's stream has done all it was given.
  void synchronize() const;

  /// Memory on this thread's stream, ordered before whatever it launches next: enough inside an op,
  /// which ends with a synchronisation before any other thread sees its tensors. For outputs that
  /// are written whole before anything reads them (beta = 0 GEMMs, LayerNorm's forward, copies).
  Tensor uninitialized(std::size_t count, DType type) const;
  /// Zeros: for outputs that kernels accumulate into (+=).
  Tensor scratch(std::size_t count, DType type) const;
  /// Elements of an activation of every row: n × h.
  std::size_t activation_size() const { return std::size_t(n) * std::size_t(h); }
  /// n × h zeros of the activation type.
  Tensor activation() const { return scratch(activation_size(), dtype); }
  /// n fp32 zeros: a per-token statistic.
  Tensor stats() const { return scratch(std::size_t(n), DType::F32); }

  /// dst[dst_at .. dst_at + count) = src[src_at .. src_at + count) on this thread's stream; same dtype.
  void copy(const Tensor& src, std::size_t src_at, Tensor& dst, std::size_t dst_at, std::size_t count) const;
  /// The double on the device at `value`, once this thread's stream has computed it.
  double download_scalar(const Tensor& value) const;
};

/// An fp32 tensor's elements (statistics, logits, losses' terms).
inline float* f32(const Tensor& t) { return static_cast<float*>(t.data()); }
/// The address of element `at` of `t`.
inline void* element(const Tensor& t, std::size_t at) {
  return static_cast<std::byte*>(t.data()) + at * size_of(t.dtype());
}

}  // namespace pipesim::runtime::cuda
