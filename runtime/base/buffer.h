#pragma once
/// Element types and untyped views of memory: what a tensor-parallel group (tensor_parallel.h) and a
/// communicator (comm.h) move without knowing where the bytes live. Owned memory is a Tensor
/// (tensor.h).
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

namespace pipesim::runtime {

enum class DType : std::uint8_t { F32, BF16, F64 };

constexpr std::size_t size_of(DType dtype) {
  switch (dtype) {
    case DType::F32: return 4;
    case DType::BF16: return 2;
    case DType::F64: return 8;
  }
  return 0;
}
constexpr std::string_view dtype_name(DType dtype) {
  switch (dtype) {
    case DType::F32: return "fp32";
    case DType::BF16: return "bf16";
    case DType::F64: return "fp64";
  }
  return "?";
}

/// An untyped view of `count` elements of `dtype`: what communicators move.
struct Buffer {
  void* data = nullptr;
  std::size_t count = 0;
  DType dtype = DType::F32;
  std::size_t bytes() const { return count * size_of(dtype); }
};

/// Host fp32 values as a buffer: what the CPU backend's layers hand their groups. The values are
/// read, or with a reduction overwritten, so the view is mutable whatever `values` says.
inline Buffer host_floats(std::span<const float> values) {
  return {const_cast<float*>(values.data()), values.size(), DType::F32};
}

}  // namespace pipesim::runtime
