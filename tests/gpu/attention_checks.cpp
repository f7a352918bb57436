// Flash attention forward and backward against cpu::attention_forward/backward (which keep the full
// probability matrix), over odd sequence lengths and the head widths of each kernel instance; in
// bf16 also the cuBLASLt path (attention_gemm.h).
#include <algorithm>
#include <cmath>

#include "cpu/kernels.h"
#include "cuda/attention_gemm.h"
#include "cuda/kernels.h"
#include "harness.h"

namespace pipesim::cuda_test {
namespace {

namespace gpu = runtime::cuda;

struct Case {
  int batch, seq, h, heads;
  int kv_heads;  ///< key/value heads: heads for multi-head attention, fewer for grouped-query attention
  int width() const { return h + 2 * kv_heads * (h / heads); }  ///< a QKV row: [q | k | v]
  gpu::AttentionShape shape() const {
    return {.batch = batch, .seq = seq, .h = h, .heads = heads, .kv_heads = kv_heads};
  }
};

/// logsumexp of each causal score row, in double, in the kernels' layout ((b·heads + head)·seq + i).
std::vector<float> reference_lse(const std::vector<float>& qkv, const Case& c) {
  const int d = c.h / c.heads, group = c.heads / c.kv_heads;
  const std::size_t width = std::size_t(c.width());
  const double scale = 1.0 / std::sqrt(double(d));
  std::vector<float> lse(std::size_t(c.batch) * c.heads * c.seq);
  for (int b = 0; b < c.batch; ++b)
    for (int head = 0; head < c.heads; ++head)
      for (int i = 0; i < c.seq; ++i) {
        std::vector<double> scores(std::size_t(i) + 1);
        for (int j = 0; j <= i; ++j) {
          double dot = 0;
          for (int e = 0; e < d; ++e)
            dot += double(qkv[(std::size_t(b) * c.seq + i) * width + std::size_t(head) * d + e]) *
                   qkv[(std::size_t(b) * c.seq + j) * width + c.h + std::size_t(head / group) * d + e];
          scores[std::size_t(j)] = dot * scale;
        }
        const double max = *std::max_element(scores.begin(), scores.end());
        double sum = 0;
        for (const double s : scores) sum += std::exp(s - max);
        lse[(std::size_t(b) * c.heads + head) * c.seq + i] = float(max + std::log(sum));
      }
  return lse;
}

void run_case(Report& report, const Stream& stream, std::mt19937& rng, const Case& c, DType t) {
  const std::string shape =
      shape_name({{"b", c.batch}, {"s", c.seq}, {"h", c.h}, {"heads", c.heads}, {"kv", c.kv_heads}});
  const std::size_t n = std::size_t(c.batch) * c.seq, width = std::size_t(c.width());
  const auto qkv = rounded(random_values(n * width, rng, -2, 2), t);
  const auto dout = rounded(random_values(n * c.h, rng), t), dqkv0 = rounded(random_values(n * width, rng), t);
  std::vector<float> out(n * c.h), probs(std::size_t(c.batch) * c.heads * c.seq * c.seq), dqkv = dqkv0;
  cpu::attention_forward(qkv, out, probs, c.batch, c.seq, c.h, c.heads, c.kv_heads);
  // In bf16 the GPU backward's D = rowsum(dout∘out) reads the rounded output: within kBF16.
  cpu::attention_backward(qkv, probs, dout, dqkv, c.batch, c.seq, c.h, c.heads, c.kv_heads);

  Tensor qkv_d(qkv, t), out_d(n * c.h, t), dout_d(dout, t), dqkv_d(dqkv0, t);
  Tensor lse_d(std::size_t(c.batch) * c.heads * c.seq, DType::F32);
  auto* lse = static_cast<float*>(lse_d.get());
  gpu::attention_forward({.qkv = qkv_d.get(), .out = out_d.get(), .lse = lse}, c.shape(), t, stream.get());
  gpu::attention_backward({.qkv = qkv_d.get(), .out = out_d.get(), .lse = lse, .dout = dout_d.get(),
                           .dqkv = dqkv_d.get()},
                          c.shape(), t, stream.get());
  stream.sync();
  const double tol = tolerance(t, kAttentionF32);
  report.compare("attention_forward", shape, t, "out", out_d.download(), out, tol);
  report.compare("attention_forward", shape, t, "lse", lse_d.download(), reference_lse(qkv, c), tol);
  const auto first_dqkv = dqkv_d.download();
  report.compare("attention_backward", shape, t, "dqkv (+=)", first_dqkv, dqkv, tol);

  // The tensor-core path bf16 runs take, against the same reference: all heads in one call, and one
  // head a call (a workspace budget below one head's scores), as long sequences run. It takes
  // multi-head attention only.
  for (const std::size_t budget : {gpu::kAttentionWorkspaceBytes, std::size_t(1)}) {
    if (t != DType::BF16 || c.kv_heads != c.heads) break;
    const std::string name = budget == 1 ? " (a head a call)" : "";
    gpu::GemmHandle gemm;
    Tensor gemm_out(n * c.h, t), gemm_lse(std::size_t(c.batch) * c.heads * c.seq, DType::F32), gemm_dqkv(dqkv0, t);
    auto* lse_g = static_cast<float*>(gemm_lse.get());
    const gpu::AttentionShape mha{.batch = c.batch, .seq = c.seq, .h = c.h, .heads = c.heads};
    gpu::attention_forward_gemm(gemm, {.qkv = qkv_d.get(), .out = gemm_out.get(), .lse = lse_g}, mha, stream.get(),
                                budget);
    gpu::attention_backward_gemm(gemm,
                                 {.qkv = qkv_d.get(), .out = gemm_out.get(), .lse = lse_g, .dout = dout_d.get(),
                                  .dqkv = gemm_dqkv.get()},
                                 mha, stream.get(), budget);
    stream.sync();
    report.compare("attention_forward_gemm" + name, shape, t, "out", gemm_out.download(), out, tol);
    report.compare("attention_forward_gemm" + name, shape, t, "lse", gemm_lse.download(), reference_lse(qkv, c), tol);
    report.compare("attention_backward_gemm" + name, shape, t, "dqkv (+=)", gemm_dqkv.download(), dqkv, tol);
  }

  Tensor again(dqkv0, t);
  gpu::attention_backward({.qkv = qkv_d.get(), .out = out_d.get(), .lse = lse, .dout = dout_d.get(),
                           .dqkv = again.get()},
                          c.shape(), t, stream.get());
  stream.sync();
  report.compare_bits("attention_backward rerun", shape, t, "dqkv", again.download(), first_dqkv);
}

/// Head widths over 128 are refused with a message, not computed wrongly.
void check_refusal(Report& report) {
  bool refused = false;
  try {
    gpu::attention_forward({}, {.batch = 1, .seq = 4, .h = 256, .heads = 1}, DType::F32, nullptr);
  } catch (const gpu::CudaError&) {
    refused = true;
  }
  report.compare("attention_forward", "h=256 heads=1 (d=256)", DType::F32, "refused", std::vector<float>{float(refused)},
                 std::vector<float>{1.0f}, 0);
}

}  // namespace

void check_attention(Report& report) {
  Stream stream;
  std::mt19937 rng(3);
  // d = 8, 16, 48, 128 cover the 32/64/128 instances with partial head widths; seq 1, 31, 33, 70 cover
  // a single row, tiles partly filled and a causal boundary inside a tile. The last three are
  // grouped-query attention: two and four query heads per key/value head, and one key/value head.
  const Case cases[] = {{1, 1, 8, 1, 1},   {2, 31, 64, 4, 4},  {3, 33, 96, 2, 2},  {1, 70, 256, 2, 2},
                        {2, 45, 128, 1, 1}, {2, 33, 64, 4, 2}, {1, 70, 128, 8, 2}, {2, 40, 96, 3, 1}};
  for (const DType t : {DType::F32, DType::BF16})
    for (const Case& c : cases) run_case(report, stream, rng, c, t);
  check_refusal(report);
}

}  // namespace pipesim::cuda_test
