#include "model_math.h"

#include <algorithm>

#include "parallel_shape.h"

namespace pipesim {
namespace {
double bsh(const ModelConfig& m) { return double(m.micro_batch_size) * m.seq_len * m.hidden; }
/// Matrices of the MLP: 2 (GPT) or 3 (SwiGLU).
double mlp_matrices(const ModelConfig& m) { return m.mlp == MlpKind::SwiGlu ? 3.0 : 2.0; }
}  // namespace

LayerKind layer_kind(const ModelConfig& m, int layer) {
  if (!m.has_experts()) return LayerKind::Dense;
  const bool moe = m.moe_layer_pattern.empty() ? layer % m.moe_layer_freq == 0
                                               : m.moe_layer_pattern[std::size_t(layer)] != 0;
  return moe ? LayerKind::Moe : LayerKind::Dense;
}

int moe_layer_count(const ModelConfig& m, int first, int count) {
  int moe = 0;
  for (int l = first; l < first + count; ++l) moe += layer_kind(m, l) == LayerKind::Moe;
  return moe;
}

std::vector<AttentionLinear> attention_linears(const ModelConfig& m) {
  using Split = AttentionLinear::Split;
  const AttentionWidths w = attention_widths(m);
  const double h = m.hidden;
  if (!m.latent_attention()) return {{w.query + w.key + w.value, h, Split::Column}, {h, w.output, Split::Row}};
  std::vector<AttentionLinear> linears;
  if (m.q_lora_rank > 0) linears.insert(linears.end(), {{double(m.q_lora_rank), h, Split::None}, {w.query, double(m.q_lora_rank), Split::Column}});
  else linears.push_back({w.query, h, Split::Column});
  linears.insert(linears.end(), {{double(m.kv_lora_rank + m.qk_rope_head_dim), h, Split::None},
                                 {double(m.heads) * (m.qk_nope_head_dim + m.v_head_dim), double(m.kv_lora_rank), Split::Column},
                                 {h, w.output, Split::Row}});
  return linears;
}

AttentionWidths attention_widths(const ModelConfig& m) {
  if (m.latent_attention()) {
    const double qk = double(m.heads) * (m.qk_nope_head_dim + m.qk_rope_head_dim), v = double(m.heads) * m.v_head_dim;
    return {qk, qk, v, v};
  }
  const double d = m.head_channels();
  return {m.heads * d, m.key_value_heads() * d, m.key_value_heads() * d, m.heads * d};
}

namespace {
/// FLOPs of the attention's linear maps per token.
double attention_flops_per_token(const ModelConfig& m) {
  double flops = 0;
  for (const AttentionLinear& l : attention_linears(m)) flops += 2 * l.out * l.in;
  return flops;
}
/// FLOPs of an MLP of width f per token: 2 per multiply-add of each of its matrices.
double mlp_flops_per_token(const ModelConfig& m, double f) { return 2.0 * mlp_matrices(m) * m.hidden * f; }
}  // namespace

double layer_gemm_flops(const ModelConfig& m, LayerKind kind) {
  const double tokens = double(m.micro_batch_size) * m.seq_len, attention = attention_flops_per_token(m);
  if (kind == LayerKind::Dense) return tokens * (attention + mlp_flops_per_token(m, m.ffn_hidden));
  const double router = 2.0 * m.hidden * m.num_experts;
  return tokens * (attention + router + m.moe_router_topk * mlp_flops_per_token(m, m.expert_ffn_hidden()) +
                   mlp_flops_per_token(m, m.moe_shared_expert_intermediate_size));
}

double model_layers_gemm_flops(const ModelConfig& m) {
  const int moe = moe_layer_count(m, 0, m.layers);
  return (m.layers - moe) * layer_gemm_flops(m) + moe * layer_gemm_flops(m, LayerKind::Moe);
}

double layer_attention_flops(const ModelConfig& m) {
  const AttentionWidths w = attention_widths(m);
  return 2.0 * m.micro_batch_size * m.seq_len * m.seq_len * (w.query + w.output);  // QKᵀ and P·V
}

namespace {
/// An MLP of width f: SwiGLU's three matrices; GPT's two with their biases (f + h).
double mlp_params(const ModelConfig& m, double f) {
  const double h = m.hidden;
  if (f <= 0) return 0;
  return m.mlp == MlpKind::SwiGlu ? 3 * h * f : 2 * h * f + f + h;
}
}  // namespace

LayerParams layer_param_parts(const ModelConfig& m, LayerKind kind) {
  const double h = m.hidden;
  // Attention's weights and the norms: Llama's two RMSNorm gains (and MLA's norms of its two latents);
  // GPT's QKV and projection biases and two LayerNorms (gain and bias).
  double attention = 0;
  for (const AttentionLinear& l : attention_linears(m)) attention += l.out * l.in;
  const AttentionWidths w = attention_widths(m);
  attention += m.mlp == MlpKind::SwiGlu ? 2 * h + m.q_lora_rank + m.kv_lora_rank : w.query + w.key + w.value + h + 4 * h;
  if (kind == LayerKind::Dense) return {attention + mlp_params(m, m.ffn_hidden), 0, 0};  // GPT, g = 1: 12h² + 13h at f = 4h
  return {attention + mlp_params(m, m.moe_shared_expert_intermediate_size),
          m.num_experts * mlp_params(m, m.expert_ffn_hidden()), h * m.num_experts};
}

double layer_params(const ModelConfig& m, LayerKind kind) { return layer_param_parts(m, kind).total(); }

double model_layer_params(const ModelConfig& m) {
  const int moe = moe_layer_count(m, 0, m.layers);
  return (m.layers - moe) * layer_params(m) + moe * layer_params(m, LayerKind::Moe);
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

double moe_load(const ModelConfig& m) { return std::min(m.moe_imbalance, m.moe_capacity_factor.value_or(m.moe_imbalance)); }

double moe_activation_bytes(const Config& c) {
  const ModelConfig& m = c.model;
  const double h = m.hidden, f = m.expert_ffn_hidden(), etp = c.parallel.expert_tp();
  const double fp8 = c.precision.fp8 != Fp8Format::None ? 1 : 0;
  // In Korthikanti's 2-byte units per routed copy: its permuted input (etp ranks' tokens gathered),
  // the expert's inner activations; FP8 keeps the two linear inputs in one byte.
  const double copy = 2 * h * etp + 2 * mlp_matrices(m) * f - fp8 * (h * etp + f);
  const double local_tokens = rank_tokens(c) / c.parallel.tp;  // MoE needs sequence parallelism with tp > 1
  return local_tokens * (4.0 * m.num_experts + m.moe_router_topk * moe_load(m) * copy * element_scale(c));
}

std::vector<LayerProduct> op_checkpoint_products(const ModelConfig& m) {
  using Split = AttentionLinear::Split;
  const AttentionWidths w = attention_widths(m);
  const double h = m.hidden, f = m.ffn_hidden;
  std::vector<LayerProduct> products{{w.query, h, Split::Column}, {w.key, h, Split::Column},
                                     {w.value, h, Split::Column}, {h, w.output, Split::Row}};
  if (m.mlp == MlpKind::SwiGlu) products.push_back({f, h, Split::Column});  // the gate; the up follows
  products.insert(products.end(), {{f, h, Split::Column}, {h, f, Split::Row}});
  for (std::size_t i = 0; i < products.size(); ++i) products[i].saved = i % 2 == 0;
  return products;
}

double op_checkpoint_bytes(const Config& c) {
  const ModelConfig& m = c.model;
  const double t = c.parallel.tp;
  const bool sp = c.parallel.sequence_parallel;
  // The layer's input (split under sequence parallelism) and attention's output.
  double per_token = m.hidden / (sp ? t : 1) + attention_widths(m).output / t;
  for (const LayerProduct& p : op_checkpoint_products(m)) {
    const bool column = p.split == AttentionLinear::Split::Column;
    if (p.saved) per_token += column ? p.out / t : p.out;  // a row-parallel product's partial sums, whole
    // The policy saves reduce-scatters' outputs: sequence parallelism's after each row-parallel product.
    if (!column && sp && t > 1) per_token += p.out / t;
  }
  constexpr double kSoftmaxStatBytes = 4;  // flash attention's log-sum-exp, fp32
  return rank_tokens(c) * (per_token * c.precision.activation_bytes + m.heads / t * kSoftmaxStatBytes);
}

double layer_activation_bytes(const Config& c, LayerKind kind) {
  const ModelConfig& m = c.model;
  if (c.training.recompute_granularity == Recompute::SelectiveOp && kind == LayerKind::Dense)
    return op_checkpoint_bytes(c);
  const double mlp_width = kind == LayerKind::Dense ? m.ffn_hidden : m.moe_shared_expert_intermediate_size;
  const AttentionWidths w = attention_widths(m);
  const double t = c.parallel.tp, f_over_h = mlp_width / m.hidden;
  // Q, K, V and the projection's input, in 2-byte units per hidden unit: 8 for multi-head attention.
  const double attention = 2 * (w.query + w.key + w.value + w.output) / m.hidden;
  // Under FP8, Transformer Engine keeps the linear layers' inputs for their weight gradients in FP8,
  // one byte: the inputs of QKV and the MLP (1 + 1 less), of the projection (1) and of the MLP's
  // second matrix (f/h).
  const double fp8 = c.precision.fp8 != Fp8Format::None ? 1 : 0;
  const double whole = 4 + 2 + 2 + 1 + 1 - 2 * fp8;                                // norms, linear inputs, masks
  const double split = attention + 2 * mlp_matrices(m) * f_over_h - fp8 * (1 + f_over_h);  // Q, K, V, proj.; MLP
  const double per_token = c.parallel.sequence_parallel ? (whole + split) / t : whole + split / t;
  const double scores = c.training.recompute_granularity == Recompute::Selective ? 0 : layer_score_bytes(c);
  return rank_bsh(c) * per_token * element_scale(c) + scores + (kind == LayerKind::Moe ? moe_activation_bytes(c) : 0);
}

double head_forward_flops(const ModelConfig& m) { return 2.0 * bsh(m) * m.vocab; }

double vocab_params(const ModelConfig& m) { return double(m.vocab) * m.hidden; }

double paper_iteration_flops(const Config& c) {
  // The paper's 3·(2BSHV + L·(8BSH² + 4BS²H + 4BSHF)), with each layer's GEMMs as the model has them.
  const ModelConfig& m = c.model;
  const double microbatches = double(c.parallel.microbatches) * c.parallel.dp;
  return 3.0 * microbatches * (head_forward_flops(m) + model_layers_gemm_flops(m) + m.layers * layer_attention_flops(m));
}

}  // namespace pipesim
