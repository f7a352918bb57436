// cuBLASLt GEMMs against cpu::matmul, matmul_bt and matmul_at.
#include <algorithm>

#include "cpu/kernels.h"
#include "cuda/gemm.h"
#include "harness.h"

namespace pipesim::cuda_test {
namespace {

using runtime::cuda::GemmHandle;
using runtime::cuda::GemmTypes;

enum class Product { AB, ABt, AtB };

struct Case {
  Product product;
  int n, k, m;
  GemmTypes types;
  bool accumulate;
};

const char* product_name(Product p) {
  switch (p) {
    case Product::AB: return "matmul";
    case Product::ABt: return "matmul_bt";
    case Product::AtB: return "matmul_at";
  }
  return "?";
}

void run_case(Report& report, GemmHandle& gemm, const Stream& stream, std::mt19937& rng, const Case& c) {
  // Stored sizes: matmul A n×k, B k×m, C n×m; matmul_bt B m×k; matmul_at A n×k, B n×m, C k×m.
  const std::size_t a_size = std::size_t(c.n) * c.k;
  const std::size_t b_size = c.product == Product::AtB ? std::size_t(c.n) * c.m : std::size_t(c.k) * c.m;
  const std::size_t c_size = c.product == Product::AtB ? std::size_t(c.k) * c.m : std::size_t(c.n) * c.m;
  const auto a = rounded(random_values(a_size, rng), c.types.inputs);
  const auto b = rounded(random_values(b_size, rng), c.types.inputs);
  const auto c0 = rounded(c.accumulate ? random_values(c_size, rng) : std::vector<float>(c_size), c.types.output);
  Tensor a_d(a, c.types.inputs), b_d(b, c.types.inputs), c_d(c0, c.types.output);
  std::vector<float> want = c0;
  switch (c.product) {
    case Product::AB:
      runtime::cuda::matmul(gemm, {.a = a_d.get(), .b = b_d.get(), .c = c_d.get()}, {.n = c.n, .k = c.k, .m = c.m},
                            c.types, c.accumulate, stream.get());
      cpu::matmul(a, b, want, c.n, c.k, c.m, c.accumulate);
      break;
    case Product::ABt:
      runtime::cuda::matmul_bt(gemm, {.a = a_d.get(), .b = b_d.get(), .c = c_d.get()}, {.n = c.n, .k = c.k, .m = c.m},
                               c.types, c.accumulate, stream.get());
      if (!c.accumulate) std::fill(want.begin(), want.end(), 0.0f);
      cpu::matmul_bt(a, b, want, c.n, c.k, c.m);
      break;
    case Product::AtB:
      runtime::cuda::matmul_at(gemm, {.a = a_d.get(), .b = b_d.get(), .c = c_d.get()}, {.n = c.n, .k = c.k, .m = c.m},
                               c.types, c.accumulate, stream.get());
      if (!c.accumulate) std::fill(want.begin(), want.end(), 0.0f);
      cpu::matmul_at(a, b, want, c.n, c.k, c.m);
      break;
  }
  stream.sync();
  const std::string shape =
      shape_name({{"n", c.n}, {"k", c.k}, {"m", c.m}, {"acc", int(c.accumulate)}}) +
      (c.types.output != c.types.inputs ? " ->f32" : "");
  report.compare(product_name(c.product), shape, c.types.inputs, "C", c_d.download(), want,
                 tolerance(c.types.inputs, kF32));
}

}  // namespace

void check_gemm(Report& report) {
  GemmHandle gemm;
  Stream stream;
  std::mt19937 rng(1);
  const GemmTypes f32{DType::F32, DType::F32}, bf16{DType::BF16, DType::BF16}, mixed{DType::BF16, DType::F32};
  const Case cases[] = {
      {Product::AB, 37, 19, 23, f32, false},   {Product::AB, 64, 128, 96, f32, true},
      {Product::ABt, 37, 19, 23, f32, true},   {Product::ABt, 1, 300, 7, f32, false},
      {Product::AtB, 37, 19, 23, f32, true},   {Product::AtB, 130, 64, 48, f32, false},
      {Product::AB, 64, 128, 96, bf16, false}, {Product::ABt, 33, 64, 80, bf16, true},
      {Product::AtB, 96, 32, 64, mixed, true}, {Product::AB, 5, 0, 7, f32, false},
  };
  for (const Case& c : cases) run_case(report, gemm, stream, rng, c);

  // The plan cache: the same shapes again add no plan.
  const std::size_t plans = gemm.cached_plans();
  for (const Case& c : cases) run_case(report, gemm, stream, rng, c);
  report.compare("gemm plan cache", "repeat all shapes", DType::F32, "plans", std::vector<float>{float(gemm.cached_plans())},
                 std::vector<float>{float(plans)}, 0);
}

}  // namespace pipesim::cuda_test
