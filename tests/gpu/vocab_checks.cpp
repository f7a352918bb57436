// The output layer: full-vocabulary cross-entropy, and the vocabulary-parallel shard passes (S, the
// barrier's local terms, T) against runtime/cpu/vocab.h, with one shard left empty.
#include <algorithm>
#include <cmath>
#include <limits>

#include "cpu/kernels.h"
#include "cpu/vocab.h"
#include "cuda/kernels.h"
#include "cuda/vocab.h"
#include "harness.h"

namespace pipesim::cuda_test {
namespace {

namespace gpu = runtime::cuda;

float* f(Tensor& t) { return static_cast<float*>(t.get()); }

std::vector<int> random_tokens(std::size_t n, int vocab, std::mt19937& rng) {
  std::uniform_int_distribution<int> token(0, vocab - 1);
  std::vector<int> tokens(n);
  for (int& t : tokens) t = token(rng);
  return tokens;
}

/// Device ints (the token and target lists).
runtime::cuda::DeviceBuffer<int> ints(const std::vector<int>& host) { return runtime::cuda::DeviceBuffer<int>(std::span<const int>(host)); }

void check_cross_entropy(Report& report, const Stream& stream, std::mt19937& rng, int n, int vocab, DType t) {
  const std::string shape = shape_name({{"n", n}, {"vocab", vocab}});
  const auto logits = random_values(std::size_t(n) * vocab, rng, -5, 5);
  const auto targets = random_tokens(std::size_t(n), vocab, rng);
  std::vector<float> dlogits(logits.size());
  const double loss = cpu::cross_entropy(logits, targets, dlogits, n, vocab);
  Tensor logits_d(logits, DType::F32), dlogits_d(logits.size(), t);
  auto targets_d = ints(targets);
  runtime::cuda::DeviceBuffer<double> loss_d(1);
  gpu::cross_entropy({.logits = f(logits_d), .targets = targets_d.get(), .dlogits = dlogits_d.get(),
                      .loss = loss_d.get()},
                     n, vocab, t, stream.get());
  stream.sync();
  report.compare("cross_entropy", shape, t, "dlogits", dlogits_d.download(), dlogits, tolerance(t, kF32));
  report.compare("cross_entropy", shape, t, "mean loss", std::vector<float>{float(loss_d.download()[0])},
                 std::vector<float>{float(loss)}, kF32);
}

/// The global M, S and z a pipeline's all-reduces would produce, from every shard's CPU results.
struct Global {
  std::vector<float> max, sum_exp, target;
};

/// One shard's S-pass results, the CPU's.
struct Local {
  std::vector<float> logits, max, sum_exp, target;
};

/// What every shard's checks read: X, the whole LM head W and the targets, and X and the targets on
/// the device.
struct Inputs {
  int n, h;
  DType t;
  const std::vector<float>& x;
  const std::vector<float>& w;
  const std::vector<int>& targets;
  const void* x_d;
  const int* targets_d;
  /// W_i: the shard's rows of W.
  std::vector<float> rows_of(cpu::VocabShard s) const {
    return std::vector<float>(w.begin() + std::ptrdiff_t(s.first) * h,
                              w.begin() + std::ptrdiff_t(s.first + s.rows) * h);
  }
  std::string shape(cpu::VocabShard s) const {
    return shape_name({{"n", n}, {"h", h}, {"first", s.first}, {"rows", s.rows}});
  }
};

/// The S pass on shard `s`; returns the CPU's results.
Local check_output_logits(Report& report, const Stream& stream, gpu::GemmHandle& gemm, const Inputs& in,
                          cpu::VocabShard s) {
  const int n = in.n, h = in.h;
  const DType t = in.t;
  const std::string shape = in.shape(s);
  const std::vector<float> w_i = in.rows_of(s);
  Local l{std::vector<float>(std::size_t(n) * s.rows), std::vector<float>(static_cast<std::size_t>(n)),
          std::vector<float>(static_cast<std::size_t>(n)), std::vector<float>(static_cast<std::size_t>(n))};
  cpu::output_logits(in.x, w_i, in.targets, s, n, h, l.logits, l.max, l.sum_exp, l.target);
  Tensor w_d(w_i, t), logits_d(l.logits.size(), DType::F32), max_d(std::size_t(n), DType::F32),
      sum_d(std::size_t(n), DType::F32), target_d(std::size_t(n), DType::F32);
  gpu::output_logits(gemm,
                     {.x = in.x_d, .w = w_d.get(), .targets = in.targets_d, .logits = f(logits_d), .max = f(max_d),
                      .sum_exp = f(sum_d), .target_logit = f(target_d)},
                     s, {.n = n, .h = h}, t, stream.get());
  stream.sync();
  const double tol = tolerance(t, kF32);
  report.compare("output_logits", shape, t, "logits", logits_d.download(), l.logits, tol);
  report.compare("output_logits", shape, t, "max", max_d.download(), l.max, tol);
  report.compare("output_logits", shape, t, "sum_exp", sum_d.download(), l.sum_exp, tol);
  report.compare("output_logits", shape, t, "target_logit", target_d.download(), l.target, tol);
  return l;
}

/// Algorithm 2's terms and the T pass on shard `s`, from its S-pass results `l` and the global M and S
/// (on the device in gmax_d and gsum_d).
void check_shard_backward(Report& report, const Stream& stream, std::mt19937& rng, gpu::GemmHandle& gemm,
                          const Inputs& in, cpu::VocabShard s, const Local& l, const Global& global, Tensor& gmax_d,
                          Tensor& gsum_d) {
  const int n = in.n, h = in.h;
  const DType t = in.t;
  const float g = 1.0f / float(n);
  const std::string shape = in.shape(s);
  const std::vector<float> w_i = in.rows_of(s);
  std::vector<float> a(std::size_t(n) * h), y(a.size()), scaled(static_cast<std::size_t>(n)), share(a.size());
  cpu::output_input_grad_terms(l.logits, l.max, l.sum_exp, w_i, in.targets, s, n, h, a, y);
  cpu::rescale_sum_exp(l.max, l.sum_exp, global.max, scaled);
  cpu::input_grad_share(scaled, global.sum_exp, a, y, g, n, h, share);
  const auto dw0 = random_values(w_i.size(), rng);
  std::vector<float> dw = dw0, dx(a.size());
  cpu::output_backward(l.logits, global.max, global.sum_exp, in.targets, s, g, in.x, w_i, n, h, dw, dx);

  Tensor w_d(w_i, t), logits_d(l.logits, DType::F32), max_d(l.max, DType::F32), sum_d(l.sum_exp, DType::F32);
  Tensor a_d(a.size(), t), y_d(a.size(), t), scaled_d(std::size_t(n), DType::F32), share_d(a.size(), t);
  Tensor dw_d(dw0, DType::F32), dx_d(dx.size(), t);
  gpu::output_input_grad_terms(gemm,
                               {.logits = f(logits_d), .max = f(max_d), .sum_exp = f(sum_d), .w = w_d.get(),
                                .targets = in.targets_d, .a = a_d.get(), .y = y_d.get()},
                               s, {.n = n, .h = h}, t, stream.get());
  gpu::rescale_sum_exp(f(max_d), f(sum_d), f(gmax_d), f(scaled_d), n, stream.get());
  gpu::input_grad_share({.scaled_sum_exp = f(scaled_d), .global_sum_exp = f(gsum_d), .a = a_d.get(), .y = y_d.get(),
                         .dx = share_d.get()},
                        g, {.n = n, .h = h}, t, stream.get());
  gpu::output_backward(gemm,
                       {.logits = f(logits_d), .global_max = f(gmax_d), .global_sum_exp = f(gsum_d),
                        .targets = in.targets_d, .x = in.x_d, .w = w_d.get(), .dw = f(dw_d), .dx = dx_d.get()},
                       s, g, {.n = n, .h = h}, t, stream.get());
  stream.sync();
  const double tol = tolerance(t, kF32);
  report.compare("output_input_grad_terms", shape, t, "A", a_d.download(), a, tol);
  report.compare_bits("output_input_grad_terms", shape, t, "Y (gather)", y_d.download(), y);
  report.compare("rescale_sum_exp", shape, t, "scaled", scaled_d.download(), scaled, tol);
  report.compare("input_grad_share", shape, t, "dx share", share_d.download(), share, tol);
  report.compare("output_backward", shape, t, "dW (+=)", dw_d.download(), dw, tol);
  report.compare("output_backward", shape, t, "dX", dx_d.download(), dx, tol);
}

void check_shards(Report& report, const Stream& stream, std::mt19937& rng, DType t) {
  const int n = 37, h = 48, vocab = 100;
  const cpu::VocabShard shards[] = {{0, 64}, {64, 36}, {100, 0}};  // the last is empty (padding)
  const auto x = rounded(random_values(std::size_t(n) * h, rng), t);
  const auto w = rounded(random_values(std::size_t(vocab) * h, rng), t);
  const auto targets = random_tokens(std::size_t(n), vocab, rng);
  auto targets_d = ints(targets);
  Tensor x_d(x, t);
  const Inputs in{n, h, t, x, w, targets, x_d.get(), targets_d.get()};
  gpu::GemmHandle gemm;
  Global global{std::vector<float>(std::size_t(n), -std::numeric_limits<float>::infinity()),
                std::vector<float>(static_cast<std::size_t>(n)), std::vector<float>(static_cast<std::size_t>(n))};
  std::vector<Local> local;
  for (const cpu::VocabShard& s : shards) {  // S pass
    Local l = check_output_logits(report, stream, gemm, in, s);
    for (std::size_t i = 0; i < std::size_t(n); ++i) global.max[i] = std::max(global.max[i], l.max[i]);
    local.push_back(std::move(l));
  }
  for (const Local& l : local)
    for (std::size_t i = 0; i < std::size_t(n); ++i) {
      global.sum_exp[i] += l.sum_exp[i] == 0 ? 0.0f : float(l.sum_exp[i] * std::exp(double(l.max[i]) - global.max[i]));
      global.target[i] += l.target[i];
    }
  Tensor gmax_d(global.max, DType::F32), gsum_d(global.sum_exp, DType::F32), gtarget_d(global.target, DType::F32);
  runtime::cuda::DeviceBuffer<double> loss_d(1);
  gpu::loss_sum(f(gmax_d), f(gsum_d), f(gtarget_d), n, loss_d.get(), stream.get());
  stream.sync();
  report.compare("loss_sum", "n=37", DType::F32, "loss", std::vector<float>{float(loss_d.download()[0])},
                 std::vector<float>{float(cpu::loss_sum(global.max, global.sum_exp, global.target))}, kF32);

  for (std::size_t k = 0; k < std::size(shards); ++k)  // Algorithm 2's terms and the T pass
    check_shard_backward(report, stream, rng, gemm, in, shards[k], local[k], global, gmax_d, gsum_d);
}

void check_embedding_case(Report& report, const Stream& stream, std::mt19937& rng, int first, int rows, DType t) {
  const int n = 300, h = 40, vocab = 50;  // 300 tokens over 50 rows: every row repeats
  const std::string shape = shape_name({{"n", n}, {"h", h}, {"first", first}, {"rows", rows}});
  const auto table = random_values(std::size_t(rows) * h, rng);
  const auto tokens = random_tokens(std::size_t(n), vocab, rng);
  const auto dout = rounded(random_values(std::size_t(n) * h, rng), t), dtable0 = random_values(table.size(), rng);
  std::vector<float> out(std::size_t(n) * h), dtable = dtable0;
  cpu::embedding_forward(table, tokens, out, h, first, rows);
  cpu::embedding_backward(tokens, dout, dtable, h, first, rows);
  Tensor table_d(table, DType::F32), out_d(out.size(), t), dout_d(dout, t), dtable_d(dtable0, DType::F32);
  auto tokens_d = ints(tokens);
  const gpu::VocabShard shard{.first = first, .rows = rows};
  gpu::embedding_forward({.table = f(table_d), .tokens = tokens_d.get(), .out = out_d.get()}, {.n = n, .h = h}, shard,
                         t, stream.get());
  gpu::embedding_backward({.tokens = tokens_d.get(), .dout = dout_d.get(), .dtable = f(dtable_d)}, {.n = n, .h = h},
                          shard, t, stream.get());
  stream.sync();
  report.compare_bits("embedding_forward", shape, t, "out", out_d.download(), rounded(out, t));
  const auto first_dtable = dtable_d.download();
  report.compare("embedding_backward", shape, t, "dtable (+=)", first_dtable, dtable, kF32);
  Tensor again(dtable0, DType::F32);
  gpu::embedding_backward({.tokens = tokens_d.get(), .dout = dout_d.get(), .dtable = f(again)}, {.n = n, .h = h},
                          shard, t, stream.get());
  stream.sync();
  report.compare_bits("embedding_backward rerun", shape, t, "dtable", again.download(), first_dtable);
}

}  // namespace

void check_vocab(Report& report) {
  Stream stream;
  std::mt19937 rng(4);
  for (const DType t : {DType::F32, DType::BF16}) {
    check_cross_entropy(report, stream, rng, 7, 50, t);
    check_cross_entropy(report, stream, rng, 33, 1000, t);
    check_shards(report, stream, rng, t);
  }
}

void check_embedding(Report& report) {
  Stream stream;
  std::mt19937 rng(5);
  for (const DType t : {DType::F32, DType::BF16})
    for (const auto& [first, rows] : {std::pair{0, 50}, {20, 17}, {50, 0}})
      check_embedding_case(report, stream, rng, first, rows, t);
}

}  // namespace pipesim::cuda_test
