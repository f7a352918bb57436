#pragma once
/// Element types of device tensors. Plain C++ with no CUDA include, so that host code (executor,
/// communicators, tests) can size and name buffers without the CUDA toolkit's headers.
#include <bit>
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace pipesim::runtime::cuda {

/// F32: IEEE binary32. BF16: bfloat16 (the top 16 bits of a binary32), stored as __nv_bfloat16 on
/// the device. Math is always fp32; BF16 is only a storage format.
enum class DType { F32, BF16 };

constexpr std::size_t element_size(DType t) {
  switch (t) {
    case DType::F32: return 4;
    case DType::BF16: return 2;
  }
  return 0;  // unreachable: the switch is exhaustive
}

constexpr std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "f32";
    case DType::BF16: return "bf16";
  }
  return "?";
}

/// fp32 -> bf16 bits, round to nearest even (the device's __float2bfloat16 rounding); NaN stays a
/// quiet NaN. For host code that uploads bf16 tensors or checks them.
constexpr std::uint16_t float_to_bf16_bits(float value) {
  const std::uint32_t bits = std::bit_cast<std::uint32_t>(value);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return std::uint16_t((bits >> 16) | 0x40u);
  const std::uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);
  return std::uint16_t((bits + rounding) >> 16);
}

constexpr float bf16_bits_to_float(std::uint16_t bits) { return std::bit_cast<float>(std::uint32_t(bits) << 16); }

}  // namespace pipesim::runtime::cuda
