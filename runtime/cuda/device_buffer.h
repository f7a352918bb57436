#pragma once
/// A typed device allocation that frees itself: cudaMalloc on construction, cudaFree on destruction,
/// move-only. For tests and tools; a backend with a pool should own its memory differently.
#include <cstddef>
#include <span>
#include <utility>
#include <vector>

#include "check.h"

namespace pipesim::runtime::cuda {

template <class T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(std::size_t count) : count_(count) {
    if (count_ > 0) CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&data_), count_ * sizeof(T)));
  }
  /// Allocates and copies `host` in (synchronously).
  explicit DeviceBuffer(std::span<const T> host) : DeviceBuffer(host.size()) { upload(host); }
  DeviceBuffer(DeviceBuffer&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)), count_(std::exchange(other.count_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept {
    if (this != &other) {
      release();
      data_ = std::exchange(other.data_, nullptr);
      count_ = std::exchange(other.count_, 0);
    }
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() { release(); }

  T* get() { return data_; }
  const T* get() const { return data_; }
  std::size_t size() const { return count_; }
  std::size_t bytes() const { return count_ * sizeof(T); }

  /// Synchronous copies (cudaMemcpy waits for the device); `host` must hold size() elements.
  void upload(std::span<const T> host) {
    if (host.size() != count_) throw CudaError("DeviceBuffer::upload: size mismatch");
    if (count_ > 0) CUDA_CHECK(cudaMemcpy(data_, host.data(), bytes(), cudaMemcpyHostToDevice));
  }
  std::vector<T> download() const {
    std::vector<T> host(count_);
    if (count_ > 0) CUDA_CHECK(cudaMemcpy(host.data(), data_, bytes(), cudaMemcpyDeviceToHost));
    return host;
  }

 private:
  /// No throw from a destructor: a failing cudaFree (device already lost) leaves nothing to recover.
  void release() noexcept {
    if (data_ != nullptr) static_cast<void>(cudaFree(data_));
    data_ = nullptr, count_ = 0;
  }

  T* data_ = nullptr;
  std::size_t count_ = 0;
};

}  // namespace pipesim::runtime::cuda
