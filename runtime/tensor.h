#pragma once
/// Device-agnostic tensors: the executor, the buffer store and the communicators move these without
/// knowing where the bytes live (host memory for the CPU backend, device memory for CUDA). Only the
/// backend that made a tensor reads its elements.
#include <cstddef>
#include <span>
#include <stdexcept>
#include <utility>

#include "buffer.h"

namespace pipesim::runtime {

/// Gives memory back: what owns the bytes of a Tensor. A backend is one (its tensors), and so is a
/// memory space the in-process communicator moves data through (Memory, inprocess_comm.h).
class Allocator {
 public:
  virtual ~Allocator() = default;
  virtual void free(void* data, std::size_t bytes) noexcept = 0;
};

/// Owns `count` elements of `dtype` made by `owner`, and gives them back when destroyed. Move-only:
/// one owner at a time, as the IR's buffers have one producer and one last consumer.
class Tensor {
 public:
  Tensor() = default;
  Tensor(void* data, std::size_t count, DType dtype, Allocator* owner)
      : data_(data), count_(count), dtype_(dtype), owner_(owner) {}
  Tensor(Tensor&& other) noexcept { *this = std::move(other); }
  Tensor& operator=(Tensor&& other) noexcept {
    if (this != &other) {
      reset();
      data_ = std::exchange(other.data_, nullptr), count_ = std::exchange(other.count_, 0);
      dtype_ = other.dtype_, owner_ = std::exchange(other.owner_, nullptr);
    }
    return *this;
  }
  Tensor(const Tensor&) = delete;
  Tensor& operator=(const Tensor&) = delete;
  ~Tensor() { reset(); }

  void* data() const { return data_; }
  std::size_t count() const { return count_; }
  DType dtype() const { return dtype_; }
  std::size_t bytes() const { return count_ * size_of(dtype_); }
  bool empty() const { return count_ == 0; }
  Buffer view() const { return {data_, count_, dtype_}; }

  /// The elements as T, for the backend that owns host memory; a mismatched type is a bug.
  template <class T>
  std::span<T> as() const {
    if (sizeof(T) != size_of(dtype_)) throw std::logic_error("tensor read as the wrong element type");
    return {static_cast<T*>(data_), count_};
  }

 private:
  void reset() noexcept {
    if (owner_ && data_) owner_->free(data_, bytes());
    data_ = nullptr, count_ = 0, owner_ = nullptr;
  }
  void* data_ = nullptr;
  std::size_t count_ = 0;
  DType dtype_ = DType::F32;
  Allocator* owner_ = nullptr;
};

}  // namespace pipesim::runtime
