#include "model_math.h"

namespace pipesim {
namespace {
double bsh(const ModelConfig& m) { return double(m.micro_batch_size) * m.seq_len * m.hidden; }
/// g: the fraction of heads that have their own K and V.
double kv_fraction(const ModelConfig& m) { return double(m.key_value_heads()) / m.heads; }
/// Matrices of the MLP: 2 (GPT) or 3 (SwiGLU).
double mlp_matrices(const ModelConfig& m) { return m.mlp == MlpKind::SwiGlu ? 3.0 : 2.0; }
}  // namespace

double layer_gemm_flops(const ModelConfig& m) {
  return bsh(m) * (4.0 * m.hidden * (1 + kv_fraction(m)) + 2.0 * mlp_matrices(m) * m.ffn_hidden);
}

double layer_attention_flops(const ModelConfig& m) { return 4.0 * bsh(m) * m.seq_len; }

double layer_params(const ModelConfig& m) {
  const double h = m.hidden, f = m.ffn_hidden, g = kv_fraction(m);
  if (m.mlp == MlpKind::SwiGlu) return 2 * h * h * (1 + g) + 3 * h * f + 2 * h;
  return 2 * h * h * (1 + g) + 2 * h * f + (2 + 2 * g) * h + 5 * h + f;  // g = 1: 4h² + 2hf + 9h + f
}

double layer_activation_bytes(const ModelConfig& m, const PrecisionConfig& p, int tp) {
  const double g = kv_fraction(m), f_over_h = double(m.ffn_hidden) / m.hidden;
  const double attention = 7 + 4 * g, mlp = 3 + 2 * mlp_matrices(m) * f_over_h, norms = 4;
  // Korthikanti's terms are for 2-byte activations; scale them with the configured element size.
  const double per_token = (attention + mlp + norms) * p.activation_bytes / 2.0 +
                           (p.flash_attention ? 0.0 : 5.0 * m.heads * double(m.seq_len) / m.hidden);
  return bsh(m) * per_token / tp;
}

double head_forward_flops(const ModelConfig& m) { return 2.0 * bsh(m) * m.vocab; }

double vocab_params(const ModelConfig& m) { return double(m.vocab) * m.hidden; }

double bytes_per_param(const PrecisionConfig& p, int dp) {
  return p.param_bytes + p.grad_bytes + p.optimizer_bytes / (p.distributed_optimizer ? dp : 1);
}

double paper_iteration_flops(const Config& c) {
  // The paper's 3·(2BSHV + L·(8BSH² + 4BS²H + 4BSHF)), with each layer's GEMMs as the model has them.
  const ModelConfig& m = c.model;
  const double microbatches = double(c.parallel.microbatches) * c.parallel.dp;
  return 3.0 * microbatches * (head_forward_flops(m) + m.layers * (layer_gemm_flops(m) + layer_attention_flops(m)));
}

}  // namespace pipesim
