#include "cuda/op_context.h"

#include <algorithm>
#include <utility>

#include "cuda/check.h"
#include "cuda/thread_stream.h"

namespace pipesim::runtime::cuda {
namespace {

/// Each thread's cuBLASLt workspace: what cuBLAS recommends for Hopper.
constexpr std::size_t kGemmWorkspace = std::size_t(32) << 20;

}  // namespace

ThreadContexts::~ThreadContexts() {
  retire_streams();
  for (auto& [id, context] : contexts_) static_cast<void>(cudaStreamDestroy(context.stream));
  for (ThreadContext& context : spare_) static_cast<void>(cudaStreamDestroy(context.stream));
}

ThreadContexts::ThreadContext& ThreadContexts::context() {
  std::lock_guard lock(mutex_);
  auto [it, added] = contexts_.try_emplace(std::this_thread::get_id());
  if (added) {
    CUDA_CHECK(cudaSetDevice(device_));
    if (spare_.empty()) {
      it->second.stream = share_.make_stream();
    } else {
      it->second = std::move(spare_.back());
      spare_.pop_back();
    }
  }
  // The in-process communicator's copies on this thread go on this stream too (thread_stream.h).
  ThreadStream& bound = thread_stream();
  if (bound.stream != it->second.stream || bound.generation != stream_generation())
    bound = {it->second.stream, device_, stream_generation()};
  return it->second;
}

cudaStream_t ThreadContexts::existing_stream() const {
  std::lock_guard lock(mutex_);
  const auto it = contexts_.find(std::this_thread::get_id());
  return it == contexts_.end() ? nullptr : it->second.stream;
}

int ThreadContexts::gemm_handles() const {
  std::lock_guard lock(mutex_);
  int handles = 0;
  for (const auto& [id, context] : contexts_) handles += context.gemm != nullptr;
  for (const ThreadContext& context : spare_) handles += context.gemm != nullptr;
  return handles;
}

std::size_t ThreadContexts::gemm_workspace_bytes() { return kGemmWorkspace; }

GemmHandle& ThreadContexts::gemm() {
  ThreadContext& c = context();
  if (!c.gemm) c.gemm = std::make_unique<GemmHandle>(kGemmWorkspace, share_.sm_count());
  return *c.gemm;
}

void ThreadContexts::release_thread() {
  std::lock_guard lock(mutex_);
  const auto it = contexts_.find(std::this_thread::get_id());
  if (it == contexts_.end()) return;
  CUDA_CHECK(cudaStreamSynchronize(it->second.stream));
  thread_stream() = {};
  spare_.push_back(std::move(it->second));
  contexts_.erase(it);
}

void OpContext::synchronize() const { CUDA_CHECK(cudaStreamSynchronize(stream())); }

Tensor OpContext::uninitialized(std::size_t count, DType type) const {
  void* data = nullptr;
  CUDA_CHECK(cudaMallocAsync(&data, std::max<std::size_t>(count * size_of(type), 1), stream()));
  return Tensor(data, count, type, &owner);
}

Tensor OpContext::scratch(std::size_t count, DType type) const {
  Tensor t = uninitialized(count, type);
  if (t.bytes()) CUDA_CHECK(cudaMemsetAsync(t.data(), 0, t.bytes(), stream()));
  return t;
}

void OpContext::copy(const Tensor& src, std::size_t src_at, Tensor& dst, std::size_t dst_at, std::size_t count) const {
  const std::size_t element = size_of(src.dtype());
  CUDA_CHECK(cudaMemcpyAsync(static_cast<std::byte*>(dst.data()) + dst_at * element,
                             static_cast<const std::byte*>(src.data()) + src_at * element, count * element,
                             cudaMemcpyDeviceToDevice, stream()));
}

double OpContext::download_scalar(const Tensor& value) const {
  double result = 0;
  CUDA_CHECK(cudaMemcpyAsync(&result, value.data(), sizeof(double), cudaMemcpyDeviceToHost, stream()));
  synchronize();
  return result;
}

}  // namespace pipesim::runtime::cuda
