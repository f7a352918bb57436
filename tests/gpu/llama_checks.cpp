// The Llama family's kernels (RMSNorm, RoPE, SwiGLU) against the CPU runtime's; the fused residual
// add and RMSNorm against the unfused pair.
#include <tuple>

#include "cpu/llama_kernels.h"
#include "cuda/kernels.h"
#include "cuda/llama_kernels.h"
#include "harness.h"

namespace pipesim::cuda_test {
namespace {

namespace gpu = runtime::cuda;

float* f32(Tensor& tensor) { return static_cast<float*>(tensor.get()); }

void check_rmsnorm(Report& report, const Stream& stream, std::mt19937& rng, int n, int h, DType t) {
  const std::string shape = shape_name({{"n", n}, {"h", h}});
  const std::size_t size = std::size_t(n) * h;
  const auto x = rounded(random_values(size, rng, -2, 3), t), dy = rounded(random_values(size, rng), t);
  const auto dx0 = rounded(random_values(size, rng), t);
  const auto gain = random_values(std::size_t(h), rng, 0.5f, 1.5f), dgain0 = random_values(std::size_t(h), rng);
  std::vector<float> y(size), rstd(static_cast<std::size_t>(n)), dx = dx0, dgain = dgain0;
  cpu::rmsnorm_forward(x, gain, y, rstd, n, h);
  cpu::rmsnorm_backward(x, gain, rstd, dy, dx, dgain, n, h);

  Tensor x_d(x, t), dy_d(dy, t), y_d(size, t), dx_d(dx0, t);
  Tensor gain_d(gain, DType::F32), rstd_d(std::size_t(n), DType::F32), dgain_d(dgain0, DType::F32);
  gpu::rmsnorm_forward({.x = x_d.get(), .gain = f32(gain_d), .y = y_d.get(), .rstd = f32(rstd_d)}, {.n = n, .h = h}, t,
                       stream.get());
  gpu::rmsnorm_backward({.x = x_d.get(), .gain = f32(gain_d), .rstd = f32(rstd_d), .dy = dy_d.get(), .dx = dx_d.get(),
                         .dgain = f32(dgain_d)},
                        {.n = n, .h = h}, t, stream.get());
  stream.sync();
  const double tol = tolerance(t, kF32);
  report.compare("rmsnorm_forward", shape, t, "y", y_d.download(), y, tol);
  report.compare("rmsnorm_forward", shape, t, "rstd", rstd_d.download(), rstd, tol);
  report.compare("rmsnorm_backward", shape, t, "dx (+=)", dx_d.download(), dx, tol);
  report.compare("rmsnorm_backward", shape, t, "dgain (+=)", dgain_d.download(), dgain, tol);

  // A second backward from the same state gives the same bits.
  Tensor dx2(dx0, t), dgain2(dgain0, DType::F32);
  gpu::rmsnorm_backward({.x = x_d.get(), .gain = f32(gain_d), .rstd = f32(rstd_d), .dy = dy_d.get(), .dx = dx2.get(),
                         .dgain = f32(dgain2)},
                        {.n = n, .h = h}, t, stream.get());
  stream.sync();
  report.compare_bits("rmsnorm_backward rerun", shape, t, "dgain", dgain2.download(), dgain_d.download());
  report.compare_bits("rmsnorm_backward rerun", shape, t, "dx", dx2.download(), dx_d.download());
}

/// add_rmsnorm_forward against add() then rmsnorm_forward on the device: the sum exactly, the norm
/// within the type's tolerance; `in_place` writes the sum over x, as the backend does.
void check_add_rmsnorm(Report& report, const Stream& stream, std::mt19937& rng, int n, int h, DType t, bool in_place) {
  const std::string shape = shape_name({{"n", n}, {"h", h}}) + (in_place ? " in place" : "");
  const std::size_t size = std::size_t(n) * h;
  const auto x = rounded(random_values(size, rng, -2, 3), t), residual = rounded(random_values(size, rng), t);
  const auto gain = random_values(std::size_t(h), rng, 0.5f, 1.5f);
  Tensor r_d(residual, t), gain_d(gain, DType::F32);

  Tensor x_u(x, t), sum_u(size, t), y_u(size, t), rstd_u(std::size_t(n), DType::F32);
  gpu::add(x_u.get(), r_d.get(), sum_u.get(), size, t, stream.get());
  gpu::rmsnorm_forward({.x = sum_u.get(), .gain = f32(gain_d), .y = y_u.get(), .rstd = f32(rstd_u)}, {.n = n, .h = h},
                       t, stream.get());

  Tensor x_f(x, t), sum_f(size, t), y_f(size, t), rstd_f(std::size_t(n), DType::F32);
  Tensor& sum = in_place ? x_f : sum_f;
  gpu::add_rmsnorm_forward({.x = x_f.get(), .residual = r_d.get(), .sum = sum.get(), .gain = f32(gain_d),
                            .y = y_f.get(), .rstd = f32(rstd_f)},
                           {.n = n, .h = h}, t, stream.get());
  stream.sync();
  const double tol = tolerance(t, kF32);
  report.compare_bits("add_rmsnorm_forward", shape, t, "sum", sum.download(), sum_u.download());
  report.compare("add_rmsnorm_forward", shape, t, "y vs unfused", y_f.download(), y_u.download(), tol);
  report.compare("add_rmsnorm_forward", shape, t, "rstd", rstd_f.download(), rstd_u.download(), tol);
  report.compare_bits("add_rmsnorm_forward", shape, t, "residual kept", r_d.download(), residual);
}

/// A fused QKV's q and k heads rotated (heads + kv_heads of width d in rows of (heads + 2·kv_heads)·d),
/// forward then backward; long sequences check the angles at large positions.
void check_rope(Report& report, const Stream& stream, std::mt19937& rng, int batch, int seq, int heads, int kv_heads,
                int d, float theta, DType t) {
  const std::string shape = shape_name({{"b", batch}, {"s", seq}, {"heads", heads}, {"kv", kv_heads}, {"d", d}});
  const int n = batch * seq, width = (heads + 2 * kv_heads) * d, rotated = heads + kv_heads;
  const gpu::RopeShape rope{.n = n, .seq = seq, .width = width, .heads = rotated, .d = d, .theta = theta};
  const auto x = rounded(random_values(std::size_t(n) * width, rng), t);
  std::vector<float> y = x;
  cpu::rope_forward(y, n, seq, width, rotated, d, theta);
  Tensor x_d(x, t);
  gpu::rope_forward(x_d.get(), rope, t, stream.get());
  stream.sync();
  const std::vector<float> y_d = x_d.download();
  report.compare("rope_forward", shape, t, "y (in place)", y_d, y, tolerance(t, kF32));

  // The backward from the device's forward output on both sides, so that bf16 rounding of the
  // forward does not count against the backward.
  std::vector<float> back = y_d;
  cpu::rope_backward(back, n, seq, width, rotated, d, theta);
  gpu::rope_backward(x_d.get(), rope, t, stream.get());
  stream.sync();
  report.compare("rope_backward", shape, t, "dx (in place)", x_d.download(), back, tolerance(t, kF32));
}

void check_swiglu(Report& report, const Stream& stream, std::mt19937& rng, int n, int f, DType t) {
  const std::string shape = shape_name({{"n", n}, {"f", f}});
  const std::size_t size = std::size_t(n) * f;
  const auto gate_up = rounded(random_values(2 * size, rng, -4, 4), t), dout = rounded(random_values(size, rng), t);
  const auto dgate_up0 = rounded(random_values(2 * size, rng), t);
  std::vector<float> out(size), dgate_up = dgate_up0;
  cpu::swiglu_forward(gate_up, out, n, f);
  cpu::swiglu_backward(gate_up, dout, dgate_up, n, f);
  Tensor gate_up_d(gate_up, t), out_d(size, t), dout_d(dout, t), dgate_up_d(dgate_up0, t);
  gpu::swiglu_forward(gate_up_d.get(), out_d.get(), n, f, t, stream.get());
  gpu::swiglu_backward(gate_up_d.get(), dout_d.get(), dgate_up_d.get(), n, f, t, stream.get());
  stream.sync();
  report.compare("swiglu_forward", shape, t, "out", out_d.download(), out, tolerance(t, kF32));
  report.compare("swiglu_backward", shape, t, "dgate_up (+=)", dgate_up_d.download(), dgate_up, tolerance(t, kF32));
}

}  // namespace

void check_llama_kernels(Report& report) {
  Stream stream;
  std::mt19937 rng(7);
  for (const DType t : {DType::F32, DType::BF16}) {
    for (const auto& [n, h] : {std::pair{5, 16}, {67, 256}, {130, 1000}}) check_rmsnorm(report, stream, rng, n, h, t);
    check_rope(report, stream, rng, 3, 5, 4, 2, 8, 10000, t);
    check_rope(report, stream, rng, 2, 4096, 4, 1, 128, 500000, t);  // Llama 3's theta, positions to 4095
    for (const auto& [n, f] : {std::pair{1, 1}, {67, 96}, {130, 1000}}) check_swiglu(report, stream, rng, n, f, t);
  }
  std::mt19937 fused_rng(13);  // its own: the checks above keep their inputs
  for (const DType t : {DType::F32, DType::BF16})
    for (const auto& [n, h, in_place] : {std::tuple{5, 16, false}, {67, 256, true}, {130, 4096, false}})
      check_add_rmsnorm(report, stream, fused_rng, n, h, t, in_place);
}

}  // namespace pipesim::cuda_test
