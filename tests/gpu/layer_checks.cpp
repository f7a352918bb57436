// LayerNorm, GELU, bias, residual, conversion and optimizer kernels against the CPU runtime; the
// fused residual add and LayerNorm against the unfused pair.
#include <cmath>
#include <tuple>

#include "cpu/kernels.h"
#include "cuda/kernels.h"
#include "harness.h"

namespace pipesim::cuda_test {
namespace {

namespace gpu = runtime::cuda;

void check_layernorm(Report& report, const Stream& stream, std::mt19937& rng, int n, int h, DType t) {
  const std::string shape = shape_name({{"n", n}, {"h", h}});
  const std::size_t size = std::size_t(n) * h;
  const auto x = rounded(random_values(size, rng, -2, 3), t), dy = rounded(random_values(size, rng), t);
  const auto dx0 = rounded(random_values(size, rng), t);
  const auto gamma = random_values(std::size_t(h), rng, 0.5f, 1.5f), beta = random_values(std::size_t(h), rng);
  const auto dgamma0 = random_values(std::size_t(h), rng), dbeta0 = random_values(std::size_t(h), rng);
  std::vector<float> y(size), mean(static_cast<std::size_t>(n)), rstd(static_cast<std::size_t>(n)), dx = dx0, dgamma = dgamma0, dbeta = dbeta0;
  cpu::layernorm_forward(x, gamma, beta, y, mean, rstd, n, h);
  cpu::layernorm_backward(x, gamma, mean, rstd, dy, dx, dgamma, dbeta, n, h);

  Tensor x_d(x, t), dy_d(dy, t), y_d(size, t), dx_d(dx0, t);
  Tensor gamma_d(gamma, DType::F32), beta_d(beta, DType::F32), mean_d(std::size_t(n), DType::F32),
      rstd_d(std::size_t(n), DType::F32), dgamma_d(dgamma0, DType::F32), dbeta_d(dbeta0, DType::F32);
  const auto f = [](Tensor& tensor) { return static_cast<float*>(tensor.get()); };
  gpu::layernorm_forward({.x = x_d.get(), .gamma = f(gamma_d), .beta = f(beta_d), .y = y_d.get(), .mean = f(mean_d),
                          .rstd = f(rstd_d)},
                         {.n = n, .h = h}, t, stream.get());
  gpu::layernorm_backward({.x = x_d.get(), .gamma = f(gamma_d), .mean = f(mean_d), .rstd = f(rstd_d), .dy = dy_d.get(),
                           .dx = dx_d.get(), .dgamma = f(dgamma_d), .dbeta = f(dbeta_d)},
                          {.n = n, .h = h}, t, stream.get());
  stream.sync();
  const double tol = tolerance(t, kF32);
  report.compare("layernorm_forward", shape, t, "y", y_d.download(), y, tol);
  report.compare("layernorm_forward", shape, t, "mean", mean_d.download(), mean, tol);
  report.compare("layernorm_forward", shape, t, "rstd", rstd_d.download(), rstd, tol);
  report.compare("layernorm_backward", shape, t, "dx (+=)", dx_d.download(), dx, tol);
  report.compare("layernorm_backward", shape, t, "dgamma (+=)", dgamma_d.download(), dgamma, tol);
  report.compare("layernorm_backward", shape, t, "dbeta (+=)", dbeta_d.download(), dbeta, tol);

  // A second backward from the same state gives the same bits.
  const auto first_dgamma = dgamma_d.download(), first_dx = dx_d.download();
  Tensor dx2(dx0, t), dgamma2(dgamma0, DType::F32), dbeta2(dbeta0, DType::F32);
  gpu::layernorm_backward({.x = x_d.get(), .gamma = f(gamma_d), .mean = f(mean_d), .rstd = f(rstd_d), .dy = dy_d.get(),
                           .dx = dx2.get(), .dgamma = f(dgamma2), .dbeta = f(dbeta2)},
                          {.n = n, .h = h}, t, stream.get());
  stream.sync();
  report.compare_bits("layernorm_backward rerun", shape, t, "dgamma", dgamma2.download(), first_dgamma);
  report.compare_bits("layernorm_backward rerun", shape, t, "dx", dx2.download(), first_dx);
}

/// add_layernorm_forward against add() then layernorm_forward on the device: the sum exactly (one
/// rounding, the same), the norm within the type's tolerance; `in_place` writes the sum over x, as
/// the backend does.
void check_add_layernorm(Report& report, const Stream& stream, std::mt19937& rng, int n, int h, DType t,
                         bool in_place) {
  const std::string shape = shape_name({{"n", n}, {"h", h}}) + (in_place ? " in place" : "");
  const std::size_t size = std::size_t(n) * h;
  const auto x = rounded(random_values(size, rng, -2, 3), t), residual = rounded(random_values(size, rng), t);
  const auto gamma = random_values(std::size_t(h), rng, 0.5f, 1.5f), beta = random_values(std::size_t(h), rng);
  const auto f = [](Tensor& tensor) { return static_cast<float*>(tensor.get()); };
  Tensor r_d(residual, t), gamma_d(gamma, DType::F32), beta_d(beta, DType::F32);

  Tensor x_u(x, t), sum_u(size, t), y_u(size, t), mean_u(std::size_t(n), DType::F32), rstd_u(std::size_t(n), DType::F32);
  gpu::add(x_u.get(), r_d.get(), sum_u.get(), size, t, stream.get());
  gpu::layernorm_forward({.x = sum_u.get(), .gamma = f(gamma_d), .beta = f(beta_d), .y = y_u.get(), .mean = f(mean_u),
                          .rstd = f(rstd_u)},
                         {.n = n, .h = h}, t, stream.get());

  Tensor x_f(x, t), sum_f(size, t), y_f(size, t), mean_f(std::size_t(n), DType::F32), rstd_f(std::size_t(n), DType::F32);
  Tensor& sum = in_place ? x_f : sum_f;
  gpu::add_layernorm_forward({.x = x_f.get(), .residual = r_d.get(), .sum = sum.get(), .gamma = f(gamma_d),
                              .beta = f(beta_d), .y = y_f.get(), .mean = f(mean_f), .rstd = f(rstd_f)},
                             {.n = n, .h = h}, t, stream.get());
  stream.sync();
  const double tol = tolerance(t, kF32);
  report.compare_bits("add_layernorm_forward", shape, t, "sum", sum.download(), sum_u.download());
  report.compare("add_layernorm_forward", shape, t, "y vs unfused", y_f.download(), y_u.download(), tol);
  report.compare("add_layernorm_forward", shape, t, "mean", mean_f.download(), mean_u.download(), tol);
  report.compare("add_layernorm_forward", shape, t, "rstd", rstd_f.download(), rstd_u.download(), tol);
  report.compare_bits("add_layernorm_forward", shape, t, "residual kept", r_d.download(), residual);
}

void check_gelu(Report& report, const Stream& stream, std::mt19937& rng, std::size_t count, DType t) {
  const std::string shape = "count=" + std::to_string(count);
  const auto x = rounded(random_values(count, rng, -4, 4), t), dy = rounded(random_values(count, rng), t);
  const auto dx0 = rounded(random_values(count, rng), t);
  std::vector<float> y(count), dx = dx0;
  cpu::gelu_forward(x, y);
  cpu::gelu_backward(x, dy, dx);
  Tensor x_d(x, t), y_d(count, t), dy_d(dy, t), dx_d(dx0, t);
  gpu::gelu_forward(x_d.get(), y_d.get(), count, t, stream.get());
  gpu::gelu_backward(x_d.get(), dy_d.get(), dx_d.get(), count, t, stream.get());
  stream.sync();
  report.compare("gelu_forward", shape, t, "y", y_d.download(), y, tolerance(t, kF32));
  report.compare("gelu_backward", shape, t, "dx (+=)", dx_d.download(), dx, tolerance(t, kF32));
}

/// bias_add, bias_grad and add against loops written out here (the CPU runtime inlines them).
void check_bias_and_add(Report& report, const Stream& stream, std::mt19937& rng, int n, int m, DType t) {
  const std::string shape = shape_name({{"n", n}, {"m", m}});
  const std::size_t size = std::size_t(n) * m;
  const auto y0 = rounded(random_values(size, rng), t), other = rounded(random_values(size, rng), t);
  const auto bias = random_values(std::size_t(m), rng), dbias0 = random_values(std::size_t(m), rng);
  std::vector<float> y = y0, dbias = dbias0, sum(size);
  for (std::size_t i = 0; i < size; ++i) y[i] += bias[i % std::size_t(m)], sum[i] = y0[i] + other[i];
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < m; ++j) dbias[std::size_t(j)] += y0[std::size_t(i) * m + j];
  Tensor y_d(y0, t), other_d(other, t), sum_d(size, t), bias_d(bias, DType::F32), dbias_d(dbias0, DType::F32);
  gpu::bias_grad(y_d.get(), static_cast<float*>(dbias_d.get()), n, m, t, stream.get());
  gpu::add(y_d.get(), other_d.get(), sum_d.get(), size, t, stream.get());
  gpu::bias_add(y_d.get(), static_cast<const float*>(bias_d.get()), n, m, t, stream.get());
  stream.sync();
  report.compare("bias_add", shape, t, "y (+=)", y_d.download(), y, tolerance(t, kF32));
  report.compare("bias_grad", shape, t, "dbias (+=)", dbias_d.download(), dbias, tolerance(t, kF32));
  report.compare("add", shape, t, "out", sum_d.download(), rounded(sum, t), tolerance(t, kF32));
}

void check_convert(Report& report, const Stream& stream, std::mt19937& rng) {
  const auto x = random_values(1000, rng, -100, 100);
  Tensor x_d(x, DType::F32), bf(x.size(), DType::BF16), back(x.size(), DType::F32);
  gpu::convert(x_d.get(), DType::F32, bf.get(), DType::BF16, x.size(), stream.get());
  gpu::convert(bf.get(), DType::BF16, back.get(), DType::F32, x.size(), stream.get());
  stream.sync();
  report.compare_bits("convert f32->bf16->f32", "count=1000", DType::BF16, "round trip", back.download(),
                      rounded(x, DType::BF16));
}

void check_optimizers(Report& report, const Stream& stream, std::mt19937& rng) {
  const std::size_t count = 777;
  const auto w0 = random_values(count, rng), g0 = random_values(count, rng);
  const float lr = 0.1f;
  std::vector<float> sgd = w0, adam = w0, m(count), v(count);
  const gpu::AdamParams p{0.01f, 0.9f, 0.999f, 1e-8f, 0.01f};
  for (std::size_t i = 0; i < count; ++i) {
    sgd[i] -= lr * g0[i];
    for (int step = 1; step <= 2; ++step) {  // the same gradient twice (the kernel zeroes it, the test re-uploads)
      m[i] = p.beta1 * m[i] + (1 - p.beta1) * g0[i];
      v[i] = p.beta2 * v[i] + (1 - p.beta2) * g0[i] * g0[i];
      const double m_hat = m[i] / (1 - std::pow(double(p.beta1), step));
      const double v_hat = v[i] / (1 - std::pow(double(p.beta2), step));
      adam[i] -= float(p.learning_rate * (m_hat / (std::sqrt(v_hat) + p.epsilon) + p.weight_decay * adam[i]));
    }
  }
  Tensor w_d(w0, DType::F32), g_d(g0, DType::F32), aw_d(w0, DType::F32), m_d(count, DType::F32), v_d(count, DType::F32);
  const auto f = [](Tensor& tensor) { return static_cast<float*>(tensor.get()); };
  gpu::sgd_step(f(w_d), f(g_d), count, lr, stream.get());
  stream.sync();
  report.compare("sgd_step", "count=777", DType::F32, "w", w_d.download(), sgd, kF32);
  report.compare_bits("sgd_step", "count=777", DType::F32, "g zeroed", g_d.download(), std::vector<float>(count));
  for (int step = 1; step <= 2; ++step) {
    Tensor grad(g0, DType::F32);
    gpu::adam_step({.w = f(aw_d), .g = f(grad), .m = f(m_d), .v = f(v_d)}, count, p, step, stream.get());
    stream.sync();
  }
  report.compare("adam_step x2", "count=777", DType::F32, "w", aw_d.download(), adam, kF32);
  report.compare("adam_step x2", "count=777", DType::F32, "m", m_d.download(), m, kF32);
}

}  // namespace

void check_layer_kernels(Report& report) {
  Stream stream;
  std::mt19937 rng(2);
  for (const DType t : {DType::F32, DType::BF16}) {
    for (const auto& [n, h] : {std::pair{5, 16}, {67, 256}, {130, 1000}}) check_layernorm(report, stream, rng, n, h, t);
    for (const std::size_t count : {std::size_t(1), std::size_t(4097)}) check_gelu(report, stream, rng, count, t);
    for (const auto& [n, m] : {std::pair{3, 7}, {200, 96}}) check_bias_and_add(report, stream, rng, n, m, t);
  }
  check_convert(report, stream, rng);
  check_optimizers(report, stream, rng);
  std::mt19937 fused_rng(12);  // its own: the checks above keep their inputs
  for (const DType t : {DType::F32, DType::BF16})
    for (const auto& [n, h, in_place] : {std::tuple{5, 16, false}, {67, 256, true}, {130, 4096, false}})
      check_add_layernorm(report, stream, fused_rng, n, h, t, in_place);
}

}  // namespace pipesim::cuda_test
