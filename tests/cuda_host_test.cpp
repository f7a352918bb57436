// The host side of runtime/cuda that runs without a GPU: bf16 rounding, the check macros' messages
// and the launchers' refusals of shapes the kernels do not support.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdlib>
#include <limits>
#include <string>

#include "cuda/check.h"
#include "cuda/dtype.h"
#include "cuda/gemm.h"
#include "cuda/kernels.h"

namespace gpu = pipesim::runtime::cuda;

TEST_CASE("bf16 rounding is round-to-nearest-even on the top 16 bits") {
  CHECK(gpu::float_to_bf16_bits(1.0f) == 0x3f80);
  CHECK(gpu::bf16_bits_to_float(0x3f80) == 1.0f);
  // 1 + 2^-8 lies halfway between 1 and 1 + 2^-7: ties go to the even mantissa (1).
  CHECK(gpu::float_to_bf16_bits(1.0f + std::ldexp(1.0f, -8)) == 0x3f80);
  // 1 + 3·2^-8 lies halfway between 1 + 2^-7 and 1 + 2^-6: ties go up to the even one.
  CHECK(gpu::float_to_bf16_bits(1.0f + 3 * std::ldexp(1.0f, -8)) == 0x3f82);
  CHECK(gpu::float_to_bf16_bits(1.0f + std::ldexp(1.0f, -8) + std::ldexp(1.0f, -20)) == 0x3f81);
  CHECK(gpu::float_to_bf16_bits(-2.0f) == 0xc000);
  CHECK(gpu::float_to_bf16_bits(std::numeric_limits<float>::infinity()) == 0x7f80);
  CHECK(std::isnan(gpu::bf16_bits_to_float(gpu::float_to_bf16_bits(std::numeric_limits<float>::quiet_NaN()))));
  // The largest float rounds to infinity, as the device's conversion does.
  CHECK(gpu::float_to_bf16_bits(std::numeric_limits<float>::max()) == 0x7f80);
}

TEST_CASE("element sizes and names") {
  STATIC_REQUIRE(gpu::element_size(gpu::DType::F32) == 4);
  STATIC_REQUIRE(gpu::element_size(gpu::DType::BF16) == 2);
  CHECK(gpu::dtype_name(gpu::DType::BF16) == "bf16");
}

namespace {
std::string message_of(void (*f)()) {
  try {
    f();
  } catch (const gpu::CudaError& e) {
    return e.what();
  }
  return "(no exception)";
}
}  // namespace

TEST_CASE("CUDA_CHECK throws CudaError naming the spot, the call and the error") {
  const int line = __LINE__ + 1;
  const auto fails = [] { CUDA_CHECK(cudaErrorInvalidValue); };
  CHECK(message_of(fails) == std::string(__FILE__) + ":" + std::to_string(line) +
                                 ": cudaErrorInvalidValue failed: cudaErrorInvalidValue (invalid argument)");
  const auto cublas_fails = [] { CUBLAS_CHECK(CUBLAS_STATUS_NOT_SUPPORTED); };
  CHECK(message_of(cublas_fails).ends_with(": CUBLAS_STATUS_NOT_SUPPORTED failed: CUBLAS_STATUS_NOT_SUPPORTED (the "
                                           "requested functionality is not supported)"));
}

TEST_CASE("attention refuses shapes its kernels do not handle, before touching the device") {
  CHECK(message_of([] {
          gpu::attention_forward({}, {.batch = 1, .seq = 8, .h = 256, .heads = 1}, gpu::DType::F32, nullptr);
        }) ==
        "attention: head width h/heads = 256 exceeds the kernels' 128; use more heads");
  CHECK(message_of([] {
          gpu::attention_backward({}, {.batch = 1, .seq = 8, .h = 100, .heads = 3}, gpu::DType::BF16, nullptr);
        }) ==
        "attention: need batch, seq, h, heads, kv_heads >= 1, h divisible by heads and heads by kv_heads; got "
        "batch=1 seq=8 h=100 heads=3 kv_heads=3");
  // Grouped-query attention: each key/value head serves a whole number of query heads.
  CHECK(message_of([] {
          gpu::attention_forward({}, {.batch = 1, .seq = 8, .h = 64, .heads = 4, .kv_heads = 3}, gpu::DType::F32,
                                 nullptr);
        }) ==
        "attention: need batch, seq, h, heads, kv_heads >= 1, h divisible by heads and heads by kv_heads; got "
        "batch=1 seq=8 h=64 heads=4 kv_heads=3");
}

TEST_CASE("adam_step refuses step 0, whose bias correction divides by zero") {
  CHECK(message_of([] { gpu::adam_step({}, 1, gpu::AdamParams{}, 0, nullptr); }) ==
        "adam_step: step must be >= 1, got 0");
}

TEST_CASE("PIPESIM_GEMM_AUTOTUNE: a value other than 1, on, 0 or off is an error; the first it accepts stays") {
  // Read once per process: a refused value leaves it unread, so the next call reads the variable again.
  REQUIRE(setenv("PIPESIM_GEMM_AUTOTUNE", "fast", 1) == 0);
  CHECK_THROWS_WITH(gpu::GemmHandle::autotune_by_default(), "PIPESIM_GEMM_AUTOTUNE=fast: expected 1, on, 0 or off");
  REQUIRE(setenv("PIPESIM_GEMM_AUTOTUNE", "off", 1) == 0);
  CHECK_FALSE(gpu::GemmHandle::autotune_by_default());
  REQUIRE(setenv("PIPESIM_GEMM_AUTOTUNE", "on", 1) == 0);
  CHECK_FALSE(gpu::GemmHandle::autotune_by_default());
  REQUIRE(unsetenv("PIPESIM_GEMM_AUTOTUNE") == 0);
}
