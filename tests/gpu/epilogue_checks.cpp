// The fused linear-layer GEMMs (cuBLASLt epilogues) against the CPU runtime's unfused products and
// kernels, and the vectorised element-wise kernels against their own one-element-a-thread path.
#include <algorithm>
#include <cstdio>

#include "cpu/kernels.h"
#include "cuda/gemm.h"
#include "cuda/kernels.h"
#include "harness.h"

namespace pipesim::cuda_test {
namespace {

namespace gpu = runtime::cuda;
using runtime::cuda::GemmHandle;

/// cuBLASLt's GELU epilogue evaluates tanh its own way: in fp32 it is held to this, not kF32 (which
/// is why the backend keeps GELU in its own kernels in fp32 runs).
constexpr double kGeluEpilogueF32 = 1e-3;

/// Whether cuBLASLt ran the epilogue or the call fell back; only a fused call has results to check.
bool fused(const char* kernel, const std::string& shape, DType t, bool ran) {
  std::printf("%-26s %-30s %-5s %s\n", kernel, shape.c_str(), std::string(runtime::cuda::dtype_name(t)).c_str(),
              ran ? "fused (cuBLASLt epilogue)" : "NOT FUSED: cuBLASLt has no such epilogue here, callers fall back");
  return ran;
}

float* f32(Tensor& t) { return static_cast<float*>(t.get()); }

struct Shape {
  int n, in, out;
};

void check_linear(Report& report, GemmHandle& gemm, const Stream& stream, std::mt19937& rng, Shape s, DType t) {
  const std::string shape = shape_name({{"n", s.n}, {"in", s.in}, {"out", s.out}});
  const std::size_t xs = std::size_t(s.n) * s.in, ws = std::size_t(s.in) * s.out, ys = std::size_t(s.n) * s.out;
  const auto x = rounded(random_values(xs, rng), t), w = rounded(random_values(ws, rng), t);
  const auto residual = rounded(random_values(ys, rng), t);
  const auto bias = random_values(std::size_t(s.out), rng);
  const double tol = tolerance(t, kF32);
  Tensor x_d(x, t), w_d(w, t), r_d(residual, t), b_d(bias, DType::F32), y_d(ys, t), yr_d(ys, t);

  std::vector<float> y(ys);
  cpu::matmul(x, w, y, s.n, s.in, s.out);
  for (std::size_t i = 0; i < ys; ++i) y[i] += bias[i % std::size_t(s.out)];
  std::vector<float> yr = y;
  for (std::size_t i = 0; i < ys; ++i) yr[i] += residual[i];

  if (fused("linear_bias", shape, t,
            gpu::linear_bias(gemm,
                             {.x = x_d.get(), .w = w_d.get(), .bias = f32(b_d), .residual = nullptr, .y = y_d.get()},
                             {.n = s.n, .in = s.in, .out = s.out}, t, stream.get()))) {
    stream.sync();
    report.compare("linear_bias", shape, t, "y", y_d.download(), y, tol);
  }
  if (fused("linear_bias +residual", shape, t,
            gpu::linear_bias(gemm,
                             {.x = x_d.get(), .w = w_d.get(), .bias = f32(b_d), .residual = r_d.get(), .y = yr_d.get()},
                             {.n = s.n, .in = s.in, .out = s.out}, t, stream.get()))) {
    stream.sync();
    report.compare("linear_bias +residual", shape, t, "y", yr_d.download(), yr, tol);
    report.compare_bits("linear_bias +residual", shape, t, "residual kept", r_d.download(), residual);
  }
}

void check_gelu_pair(Report& report, GemmHandle& gemm, const Stream& stream, std::mt19937& rng, Shape s, DType t) {
  const std::string shape = shape_name({{"n", s.n}, {"in", s.in}, {"out", s.out}});
  const std::size_t xs = std::size_t(s.n) * s.in, ws = std::size_t(s.in) * s.out, ys = std::size_t(s.n) * s.out;
  const auto x = rounded(random_values(xs, rng), t), w = rounded(random_values(ws, rng, -0.3f, 0.3f), t);
  const auto bias = random_values(std::size_t(s.out), rng);
  const double tol = tolerance(t, kF32), gelu_tol = tolerance(t, kGeluEpilogueF32);
  Tensor x_d(x, t), w_d(w, t), b_d(bias, DType::F32), pre_d(ys, t), y_d(ys, t);

  // Forward: pre = x·W + b, y = gelu(pre).
  std::vector<float> pre(ys), y(ys);
  cpu::matmul(x, w, pre, s.n, s.in, s.out);
  for (std::size_t i = 0; i < ys; ++i) pre[i] += bias[i % std::size_t(s.out)];
  if (fused("linear_bias_gelu", shape, t,
            gpu::linear_bias_gelu(
                gemm, {.x = x_d.get(), .w = w_d.get(), .bias = f32(b_d), .pre = pre_d.get(), .y = y_d.get()},
                {.n = s.n, .in = s.in, .out = s.out}, t, stream.get()))) {
    stream.sync();
    report.compare("linear_bias_gelu", shape, t, "pre (aux)", pre_d.download(), pre, tol);
    // GELU of what the device kept: in bf16 the aux is rounded, the output is not rounded twice.
    cpu::gelu_forward(pre, y);
    report.compare("linear_bias_gelu", shape, t, "y = gelu", y_d.download(), y, gelu_tol);
  }

  // Backward through the layer after the GELU: dy (n×out2), W2 (out×out2) → dpre (n×out).
  const int out2 = 40;
  const std::size_t dys = std::size_t(s.n) * out2, w2s = std::size_t(s.out) * out2;
  const auto dy = rounded(random_values(dys, rng), t), w2 = rounded(random_values(w2s, rng), t);
  const auto pre_in = rounded(random_values(ys, rng, -3, 3), t);
  Tensor dy_d(dy, t), w2_d(w2, t), pre_in_d(pre_in, t), dpre_d(ys, t);
  std::vector<float> dgelu(ys), dpre(ys);
  cpu::matmul_bt(dy, w2, dgelu, s.n, out2, s.out);
  cpu::gelu_backward(pre_in, dgelu, dpre);
  if (fused("matmul_bt_dgelu", shape, t,
            gpu::matmul_bt_dgelu(gemm, {.dy = dy_d.get(), .w = w2_d.get(), .pre = pre_in_d.get(), .dx = dpre_d.get()},
                                 {.n = s.n, .in = s.out, .out = out2}, t, stream.get()))) {
    stream.sync();
    report.compare("matmul_bt_dgelu", shape, t, "dx", dpre_d.download(), dpre, gelu_tol);
  }
}

void check_bias_grad(Report& report, GemmHandle& gemm, const Stream& stream, std::mt19937& rng, Shape s, DType t) {
  const std::string shape = shape_name({{"n", s.n}, {"in", s.in}, {"out", s.out}});
  const std::size_t xs = std::size_t(s.n) * s.in, dys = std::size_t(s.n) * s.out, ws = std::size_t(s.in) * s.out;
  const auto x = rounded(random_values(xs, rng), t), dy = rounded(random_values(dys, rng), t);
  const auto dw0 = random_values(ws, rng);
  std::vector<float> dw = dw0, db(std::size_t(s.out));
  cpu::matmul_at(x, dy, dw, s.n, s.in, s.out);
  for (int i = 0; i < s.n; ++i)
    for (int j = 0; j < s.out; ++j) db[std::size_t(j)] += dy[std::size_t(i) * s.out + j];
  const gpu::GemmTypes types{t, DType::F32};
  Tensor x_d(x, t), dy_d(dy, t), dw_d(dw0, DType::F32), db_d(std::size_t(s.out), DType::F32);
  if (!fused("matmul_at_bgrad", shape, t,
             gpu::matmul_at_bgrad(gemm, {.x = x_d.get(), .dy = dy_d.get(), .dw = dw_d.get(), .dbias = f32(db_d)},
                                  {.n = s.n, .in = s.in, .out = s.out}, types, true, stream.get())))
    return;
  stream.sync();
  const double tol = tolerance(t, kF32);
  report.compare("matmul_at_bgrad", shape, t, "dW (+=)", dw_d.download(), dw, tol);
  report.compare("matmul_at_bgrad", shape, t, "db", db_d.download(), db, tol);
  // The bias gradient is a reduction: a rerun must give the same bits.
  const auto first_db = db_d.download(), first_dw = dw_d.download();
  Tensor dw2(dw0, DType::F32), db2(std::size_t(s.out), DType::F32);
  gpu::matmul_at_bgrad(gemm, {.x = x_d.get(), .dy = dy_d.get(), .dw = dw2.get(), .dbias = f32(db2)},
                       {.n = s.n, .in = s.in, .out = s.out}, types, true, stream.get());
  stream.sync();
  report.compare_bits("matmul_at_bgrad rerun", shape, t, "db", db2.download(), first_db);
  report.compare_bits("matmul_at_bgrad rerun", shape, t, "dW", dw2.download(), first_dw);
}

/// The element-wise kernels on 16-byte-aligned tensors (packs) and on tensors one element off
/// (every element alone) give the same bits.
void check_vector_paths(Report& report, const Stream& stream, std::mt19937& rng, DType t) {
  const std::size_t count = 1029;  // not a whole number of packs: the tail runs too
  const std::string shape = "count=" + std::to_string(count);
  const auto x = rounded(random_values(count, rng, -4, 4), t), dy = rounded(random_values(count, rng), t);
  const auto dx0 = rounded(random_values(count, rng), t);
  // The same values `offset` elements into a tensor of count + 1.
  const auto placed = [count](const std::vector<float>& values, std::size_t offset) {
    std::vector<float> out(count + 1, 0.0f);
    std::copy(values.begin(), values.end(), out.begin() + std::ptrdiff_t(offset));
    return out;
  };
  const std::size_t element = runtime::cuda::element_size(t);
  const auto at = [&](Tensor& tensor, std::size_t offset) {
    return static_cast<std::byte*>(tensor.get()) + offset * element;
  };
  std::vector<float> results[2][3];
  for (const std::size_t offset : {std::size_t(0), std::size_t(1)}) {
    Tensor x_d(placed(x, offset), t), dy_d(placed(dy, offset), t), dx_d(placed(dx0, offset), t), y_d(count + 1, t),
        sum_d(count + 1, t);
    gpu::gelu_forward(at(x_d, offset), at(y_d, offset), count, t, stream.get());
    gpu::gelu_backward(at(x_d, offset), at(dy_d, offset), at(dx_d, offset), count, t, stream.get());
    gpu::add(at(x_d, offset), at(dy_d, offset), at(sum_d, offset), count, t, stream.get());
    stream.sync();
    Tensor* outputs[3] = {&y_d, &dx_d, &sum_d};
    for (int k = 0; k < 3; ++k) {
      const auto all = outputs[k]->download();
      results[offset][k].assign(all.begin() + std::ptrdiff_t(offset), all.begin() + std::ptrdiff_t(offset + count));
    }
  }
  const char* names[3] = {"gelu_forward", "gelu_backward", "add"};
  for (int k = 0; k < 3; ++k)
    report.compare_bits(std::string(names[k]) + " packed/single", shape, t, "out", results[0][k], results[1][k]);
}

}  // namespace

void check_gemm_epilogues(Report& report) {
  GemmHandle gemm;
  Stream stream;
  std::mt19937 rng(5);
  for (const DType t : {DType::F32, DType::BF16}) {
    // Aligned shapes like the layer's, and an odd one (where an epilogue may fall back).
    for (const Shape s : {Shape{64, 96, 128}, Shape{256, 512, 384}, Shape{37, 19, 24}}) {
      check_linear(report, gemm, stream, rng, s, t);
      check_gelu_pair(report, gemm, stream, rng, s, t);
      check_bias_grad(report, gemm, stream, rng, s, t);
    }
    check_vector_paths(report, stream, rng, t);
  }
}

}  // namespace pipesim::cuda_test
