#pragma once
/// Element types of device tensors: the runtime's DType (tensor.h), so that a Tensor's dtype is what
/// the kernels take. Device kernels take F32 and BF16; F64 buffers are host-only (the control lane),
/// and a kernel given one throws. BF16 is bfloat16 (the top 16 bits of a binary32), stored as
/// __nv_bfloat16 on the device: only a storage format, math is fp32.
#include <bit>
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "tensor.h"

namespace pipesim::runtime::cuda {

using runtime::DType;
using runtime::dtype_name;
constexpr std::size_t element_size(DType t) { return size_of(t); }

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
