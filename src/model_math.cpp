#include "model_math.h"

#include "parallel_shape.h"

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

namespace {
/// Tokens × hidden of one microbatch on one context-parallel rank, and the factor that scales
/// Korthikanti's 2-byte terms to the configured activation size.
double rank_bsh(const Config& c) { return rank_tokens(c) * c.model.hidden; }
double element_scale(const Config& c) { return c.precision.activation_bytes / 2.0; }
}  // namespace

double layer_score_bytes(const Config& c) {
  const ModelConfig& m = c.model;
  if (c.precision.flash_attention) return 0;
  return rank_bsh(c) * 5.0 * m.heads * double(m.seq_len) / m.hidden / c.parallel.tp;
}

double layer_activation_bytes(const Config& c) {
  const ModelConfig& m = c.model;
  const double t = c.parallel.tp, g = kv_fraction(m), f_over_h = double(m.ffn_hidden) / m.hidden;
  // Under FP8, Transformer Engine keeps the linear layers' inputs for their weight gradients in FP8,
  // one byte: the inputs of QKV and the MLP (1 + 1 less), of the projection (1) and of the MLP's
  // second matrix (f/h).
  const double fp8 = c.precision.fp8 != Fp8Format::None ? 1 : 0;
  const double whole = 4 + 2 + 2 + 1 + 1 - 2 * fp8;                                // norms, linear inputs, masks
  const double split = (4 + 4 * g) + 2 * mlp_matrices(m) * f_over_h - fp8 * (1 + f_over_h);  // Q, K, V, proj.; MLP
  const double per_token = c.parallel.sequence_parallel ? (whole + split) / t : whole + split / t;
  const double scores = c.training.recompute_granularity == Recompute::Selective ? 0 : layer_score_bytes(c);
  return rank_bsh(c) * per_token * element_scale(c) + scores;
}

double head_forward_flops(const ModelConfig& m) { return 2.0 * bsh(m) * m.vocab; }

double vocab_params(const ModelConfig& m) { return double(m.vocab) * m.hidden; }

double paper_iteration_flops(const Config& c) {
  // The paper's 3·(2BSHV + L·(8BSH² + 4BS²H + 4BSHF)), with each layer's GEMMs as the model has them.
  const ModelConfig& m = c.model;
  const double microbatches = double(c.parallel.microbatches) * c.parallel.dp;
  return 3.0 * microbatches * (head_forward_flops(m) + m.layers * (layer_gemm_flops(m) + layer_attention_flops(m)));
}

}  // namespace pipesim
