// cuBLASLt GEMMs against cpu::matmul, matmul_bt and matmul_at, and autotuned GEMMs against the
// heuristic's first algorithm.
#include <algorithm>
#include <cstring>

#include "cpu/kernels.h"
#include "cuda/gemm.h"
#include "harness.h"

namespace pipesim::cuda_test {
namespace {

namespace gpu = runtime::cuda;
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

constexpr std::size_t kWorkspace = std::size_t(32) << 20;

bool same_algorithm(const cublasLtMatmulAlgo_t& a, const cublasLtMatmulAlgo_t& b) {
  return std::memcmp(&a, &b, sizeof(a)) == 0;
}

/// One product through both handles from the same inputs and initial C: results within the type's
/// tolerance (another algorithm may sum in another order), which also shows that an accumulating
/// product added once (the trials wrote scratch, not C). Then the tuned handle again: the cached
/// algorithm, no new plan.
void check_tuned_matmul(Report& report, GemmHandle& tuned, GemmHandle& first, const Stream& stream, std::mt19937& rng,
                        int n, int k, int m, GemmTypes types, bool accumulate) {
  const std::string shape = shape_name({{"n", n}, {"k", k}, {"m", m}, {"acc", int(accumulate)}}) +
                            (types.output != types.inputs ? " ->f32" : "");
  const std::size_t cs = std::size_t(n) * m;
  const auto a = rounded(random_values(std::size_t(n) * k, rng), types.inputs);
  const auto b = rounded(random_values(std::size_t(k) * m, rng), types.inputs);
  const auto c0 = rounded(random_values(cs, rng), types.output);
  Tensor a_d(a, types.inputs), b_d(b, types.inputs), c_tuned(c0, types.output), c_first(c0, types.output);
  const auto product = [&](GemmHandle& gemm, Tensor& c) {
    gpu::matmul(gemm, {.a = a_d.get(), .b = b_d.get(), .c = c.get()}, {.n = n, .k = k, .m = m}, types, accumulate,
                stream.get());
  };
  product(tuned, c_tuned);
  product(first, c_first);
  stream.sync();
  report.compare("matmul autotuned", shape, types.inputs, "C vs first", c_tuned.download(), c_first.download(),
                 tolerance(types.inputs, kF32));
  const cublasLtMatmulAlgo_t chosen = tuned.last_algorithm();
  const std::size_t plans = tuned.cached_plans();
  Tensor c_again(c0, types.output);
  product(tuned, c_again);
  stream.sync();
  report.compare("matmul autotuned again", shape, types.inputs, "same algo",
                 std::vector<float>{float(same_algorithm(chosen, tuned.last_algorithm()) && tuned.cached_plans() == plans)},
                 std::vector<float>{1.0f}, 0);
  report.compare_bits("matmul autotuned again", shape, types.inputs, "C", c_again.download(), c_tuned.download());
}

/// The epilogues whose trials must leave the caller's tensors alone: a residual read as C, the GELU
/// aux and the bias gradient written beside D. Compared where both handles ran them fused.
void check_tuned_epilogues(Report& report, GemmHandle& tuned, GemmHandle& first, const Stream& stream,
                           std::mt19937& rng, DType t) {
  const int n = 256, in = 512, out = 384;
  const std::string shape = shape_name({{"n", n}, {"in", in}, {"out", out}});
  const std::size_t xs = std::size_t(n) * in, ws = std::size_t(in) * out, ys = std::size_t(n) * out;
  const double tol = tolerance(t, kF32);
  const auto x = rounded(random_values(xs, rng), t), w = rounded(random_values(ws, rng, -0.3f, 0.3f), t);
  const auto residual = rounded(random_values(ys, rng), t), bias = random_values(std::size_t(out), rng);
  const auto dw0 = random_values(ws, rng);
  Tensor x_d(x, t), w_d(w, t), r_d(residual, t), b_d(bias, DType::F32);
  const auto* b_f = static_cast<const float*>(b_d.get());

  Tensor y1(ys, t), y2(ys, t);
  const auto residual_sum = [&](GemmHandle& gemm, Tensor& y) {
    return gpu::linear_bias(gemm, {.x = x_d.get(), .w = w_d.get(), .bias = b_f, .residual = r_d.get(), .y = y.get()},
                            {.n = n, .in = in, .out = out}, t, stream.get());
  };
  if (residual_sum(tuned, y1) && residual_sum(first, y2)) {
    stream.sync();
    report.compare("linear_bias +res autotuned", shape, t, "y vs first", y1.download(), y2.download(), tol);
    report.compare_bits("linear_bias +res autotuned", shape, t, "residual kept", r_d.download(), residual);
  }

  Tensor pre1(ys, t), pre2(ys, t), g1(ys, t), g2(ys, t);
  const auto gelu = [&](GemmHandle& gemm, Tensor& pre, Tensor& y) {
    return gpu::linear_bias_gelu(gemm, {.x = x_d.get(), .w = w_d.get(), .bias = b_f, .pre = pre.get(), .y = y.get()},
                                 {.n = n, .in = in, .out = out}, t, stream.get());
  };
  if (gelu(tuned, pre1, g1) && gelu(first, pre2, g2)) {
    stream.sync();
    report.compare("linear_bias_gelu autotuned", shape, t, "pre vs first", pre1.download(), pre2.download(), tol);
    report.compare("linear_bias_gelu autotuned", shape, t, "y vs first", g1.download(), g2.download(), tol);
  }

  // dW (in×out) += xᵀ·dy with dy = the residual (n×out), and its column sums.
  Tensor dw1(dw0, DType::F32), dw2(dw0, DType::F32), db1(std::size_t(out), DType::F32), db2(std::size_t(out), DType::F32);
  const auto bgrad = [&](GemmHandle& gemm, Tensor& dw, Tensor& db) {
    return gpu::matmul_at_bgrad(
        gemm, {.x = x_d.get(), .dy = r_d.get(), .dw = dw.get(), .dbias = static_cast<float*>(db.get())},
        {.n = n, .in = in, .out = out}, {t, DType::F32}, true, stream.get());
  };
  if (bgrad(tuned, dw1, db1) && bgrad(first, dw2, db2)) {
    stream.sync();
    report.compare("matmul_at_bgrad autotuned", shape, t, "dW (+=) vs 1st", dw1.download(), dw2.download(), tol);
    report.compare("matmul_at_bgrad autotuned", shape, t, "db vs first", db1.download(), db2.download(), tol);
  }
}

}  // namespace

void check_gemm_autotune(Report& report) {
  GemmHandle tuned(kWorkspace, 0, true), first(kWorkspace, 0, false);
  Stream stream;
  std::mt19937 rng(11);
  const GemmTypes f32{DType::F32, DType::F32}, bf16{DType::BF16, DType::BF16}, mixed{DType::BF16, DType::F32};
  check_tuned_matmul(report, tuned, first, stream, rng, 256, 512, 384, bf16, false);
  check_tuned_matmul(report, tuned, first, stream, rng, 1024, 1024, 1024, bf16, false);
  check_tuned_matmul(report, tuned, first, stream, rng, 512, 256, 1024, mixed, true);
  check_tuned_matmul(report, tuned, first, stream, rng, 64, 128, 96, f32, true);
  for (const DType t : {DType::F32, DType::BF16}) check_tuned_epilogues(report, tuned, first, stream, rng, t);
  // Where cuBLASLt offered one answer there was nothing to time; these shapes get several on
  // Ampere and Hopper. The handle with autotuning off never times.
  std::printf("autotuning: %zu of %zu plans chosen by timing\n", tuned.tuned_plans(), tuned.cached_plans());
  report.compare("gemm autotune", "all shapes", DType::F32, "timed any", std::vector<float>{float(tuned.tuned_plans() > 0)},
                 std::vector<float>{1.0f}, 0);
  report.compare("gemm autotune off", "all shapes", DType::F32, "timed none", std::vector<float>{float(first.tuned_plans())},
                 std::vector<float>{0.0f}, 0);
}

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
