#include "model_math.h"

namespace pipesim {
namespace {
double bsh(const ModelConfig& m) { return double(m.micro_batch_size) * m.seq_len * m.hidden; }
}  // namespace

double layer_gemm_flops(const ModelConfig& m) {
  return bsh(m) * (8.0 * m.hidden + 4.0 * m.ffn_hidden);
}

double layer_attention_flops(const ModelConfig& m) { return 4.0 * bsh(m) * m.seq_len; }

double layer_params(const ModelConfig& m) {
  const double h = m.hidden, f = m.ffn_hidden;
  return 4 * h * h + 2 * h * f + 9 * h + f;
}

double layer_activation_bytes(const ModelConfig& m, const PrecisionConfig& p, int tp) {
  // Korthikanti's 34 is for 2-byte activations; scale it with the configured element size.
  const double per_token = 34.0 * p.activation_bytes / 2.0 +
                           (p.flash_attention ? 0.0 : 5.0 * m.heads * double(m.seq_len) / m.hidden);
  return bsh(m) * per_token / tp;
}

double head_forward_flops(const ModelConfig& m) { return 2.0 * bsh(m) * m.vocab; }

double vocab_params(const ModelConfig& m) { return double(m.vocab) * m.hidden; }

double bytes_per_param(const PrecisionConfig& p, int dp) {
  return p.param_bytes + p.grad_bytes + p.optimizer_bytes / (p.distributed_optimizer ? dp : 1);
}

double paper_iteration_flops(const Config& c) {
  const ModelConfig& m = c.model;
  const double B = double(m.micro_batch_size) * c.parallel.microbatches * c.parallel.dp;
  const double S = m.seq_len, H = m.hidden, V = m.vocab, F = m.ffn_hidden, L = m.layers;
  return 3.0 * (2 * B * S * H * V + L * (8 * B * S * H * H + 4 * B * S * S * H + 4 * B * S * H * F));
}

}  // namespace pipesim
