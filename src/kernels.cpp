#include "kernels.h"

#include <algorithm>
#include <cmath>
#include <optional>

#include "model_math.h"
#include "parallel_shape.h"

namespace pipesim {
namespace {

/// A GEMM of an M×K by a K×N operand: its FLOPs, and each operand read and the result written once.
Kernel gemm(double m, double n, double k, double a_bytes, double b_bytes, double c_bytes) {
  return {2 * m * n * k, m * k * a_bytes + k * n * b_bytes + m * n * c_bytes, false, m, n};
}
/// The same on FP8 operands (Transformer Engine's FP8 GEMMs: one byte an input element).
Kernel fp8_gemm(double m, double n, double k, double c_bytes) {
  Kernel g = gemm(m, n, k, 1, 1, c_bytes);
  g.fp8 = true;
  return g;
}
/// A memory-bound kernel (norms, activation functions, casts, gathers): bytes moved, no GEMM FLOPs.
Kernel streaming(double bytes) { return {0, bytes, false, 0, 0}; }
/// A GEMM batched over heads and sequences: enough tiles to fill the SMs, so its fill is taken as 1.
Kernel batched_gemm(double flops, double bytes) { return {flops, bytes, false, 0, 0}; }
/// Fused (flash) causal attention: its matrix FLOPs, run at the attention efficiency of the kernel
/// the config names (precision.attention_kernel). Under context parallelism each call sees one
/// rank's share of the keys (ring attention's blocks).
Kernel fused_attention(const Config& c, double flops, double bytes) {
  constexpr double kQueryRows = 128;  // a block's query tile in cuDNN's and FlashAttention-2's kernels
  Kernel k{flops, bytes, true, 0, 0};
  k.attention_kernel = c.precision.attention_kernel;
  k.attention_keys = double(c.model.seq_len) / c.parallel.cp;
  k.attention_blocks = double(c.model.micro_batch_size) * c.model.heads / c.parallel.tp *
                       std::ceil(k.attention_keys / kQueryRows);
  return k;
}

void append(std::vector<Kernel>& to, const std::vector<Kernel>& kernels) { to.insert(to.end(), kernels.begin(), kernels.end()); }

/// Core attention's shape on one tensor- and context-parallel rank: its queries' tokens against
/// every key of the sequence, over heads/t heads.
struct AttentionShape {
  double tokens, keys, heads, act;  // act: bytes an element
  AttentionWidths width;            // on this rank
  /// FLOPs of QKᵀ and P·V, unmasked, over two: of either one where queries and values are as wide.
  double products() const { return tokens * keys * (width.query + width.output); }
  double scores() const { return tokens * keys * heads; }  // elements of the score matrix
  double score_bytes() const { return scores() * act; }
  double qkvo_bytes() const {  // Q, K, V and O once each
    return tokens * (width.query + width.key + width.value + width.output) * act;
  }
  /// One unfused product over the score matrix (QKᵀ, P·V or a gradient's): two of the four
  /// Q/K/V/O-sized operands and the matrix itself.
  Kernel score_product() const { return batched_gemm(products(), qkvo_bytes() / 2 + score_bytes()); }
};

AttentionShape attention_shape(const Config& c) {
  const ModelConfig& m = c.model;
  const double t = c.parallel.tp;
  const AttentionWidths w = attention_widths(m);
  return {rank_tokens(c), double(m.seq_len), m.heads / t, c.precision.activation_bytes,
          {w.query / t, w.key / t, w.value / t, w.output / t}};
}

/// Flash attention: one fused causal kernel, half of the unmasked products forward and 2.5× that
/// backward (five matrix products to two); Q, K, V, O (and dO, dQ, dK, dV) read or written once.
/// Without it, as Megatron-LM ran GPT before flash attention: QKᵀ and P·V as batched GEMMs over the
/// whole score matrix (masked, not skipped), and the fused scale-mask-softmax and the attention
/// dropout (a 1-byte mask) each reading and writing that matrix through HBM.
std::vector<Kernel> core_attention_forward(const Config& c) {
  const AttentionShape a = attention_shape(c);
  if (c.precision.flash_attention) return {fused_attention(c, a.products(), a.qkvo_bytes())};
  return {a.score_product(),                                  // S = QKᵀ
          streaming(2 * a.score_bytes()),                     // P = softmax(mask(S))
          streaming(2 * a.score_bytes() + a.scores()),        // dropout(P) and its mask
          a.score_product()};                                 // O = P·V
}

std::vector<Kernel> core_attention_backward(const Config& c) {
  const AttentionShape a = attention_shape(c);
  if (c.precision.flash_attention) return {fused_attention(c, 2.5 * a.products(), 2 * a.qkvo_bytes())};
  const Kernel product = a.score_product();
  return {product, product,                                   // dP = dO·Vᵀ, dV = Pᵀ·dO
          streaming(2 * a.score_bytes() + a.scores()),        // dropout's backward, through its mask
          streaming(3 * a.score_bytes()),                     // softmax's backward: P, dP in, dS out
          product, product};                                  // dQ = dS·K, dK = dSᵀ·Q
}

/// Bytes an element of a weight-gradient GEMM's output moves (training.grad_accumulation): read and
/// written in the main gradient's type when the GEMM adds into it; under DeepSpeed's and FSDP's
/// accumulation written once, a fresh gradient in the parameters' type, which main_gradient_add_bytes
/// then carries on.
double weight_gradient_output_bytes(const Config& c) {
  const PrecisionConfig& p = c.precision;
  return c.training.grad_accumulation == GradAccumulation::Fused ? 2 * p.grad_bytes : p.param_bytes;
}

/// A weight-gradient GEMM on W (weight_gradient_output_bytes for its output) and, unless the GEMM adds
/// into the main gradient itself, the kernels that carry each element of its output (rows × cols) on.
void add_weight_gradient(const Config& c, const Kernel& gemm, StageKernels& out) {
  out.weight.push_back(gemm);
  if (c.training.grad_accumulation != GradAccumulation::Fused)
    out.weight.push_back(streaming(gemm.rows * gemm.cols * main_gradient_add_bytes(c)));
}

/// A linear layer on one rank: `out` by `in` weights (column-parallel split out, row-parallel split
/// in) applied to `tokens` rows. `groups` > 1: a grouped GEMM over that many experts, each with
/// `tokens` rows, timed as one kernel whose tiles lie side by side.
struct Linear {
  double tokens, out, in;
  double groups = 1;
  int overlap_sms = 0;  ///< a row-parallel linear's forward under tp_comm_overlap (Kernel::overlap_sms)
};

/// A linear's GEMMs in F (Y = XWᵀ), B (dX = dY·W) and W (dW = dYᵀX, accumulated into the fp32 main
/// gradient). Under FP8, Transformer Engine casts each GEMM input to FP8 by one kernel that reads it
/// (bf16) and writes it and its transpose (for the weight gradient), 4 bytes an element: forward the
/// input X, backward the output gradient dY. The FP8 weights are cast once an iteration (optimizer
/// step, cost_model.cpp).
void add_linear(const Config& c, const Linear& l, StageKernels& out) {
  const PrecisionConfig& p = c.precision;
  const double act = p.activation_bytes, rows = l.tokens * l.groups;
  const auto widen = [&](Kernel k, double cols) {  // the groups' outputs side by side, for the tile fill
    k.cols = cols * l.groups;
    return k;
  };
  const bool fp8 = p.fp8 != Fp8Format::None;
  if (fp8) {
    out.forward.push_back(streaming(4 * rows * l.in));
    out.backward.push_back(streaming(4 * rows * l.out));
  }
  Kernel f = fp8 ? fp8_gemm(rows, l.out, l.in, act) : gemm(rows, l.out, l.in, act, p.param_bytes, act);
  Kernel b = fp8 ? fp8_gemm(rows, l.in, l.out, act) : gemm(rows, l.in, l.out, act, p.param_bytes, act);
  // W: into the fp32 main gradient (weight_gradient_output_bytes).
  const double w_out = weight_gradient_output_bytes(c);
  Kernel w = fp8 ? fp8_gemm(l.out * l.groups, l.in, l.tokens, w_out) : gemm(l.out * l.groups, l.in, l.tokens, act, act, w_out);
  f.rows = b.rows = l.tokens, w.rows = l.out;
  f.overlap_sms = l.overlap_sms;
  out.forward.push_back(widen(f, l.out));
  out.backward.push_back(widen(b, l.in));
  add_weight_gradient(c, widen(w, l.in), out);
}

/// The SM margin of a row-parallel linear's forward GEMM, whose output a tensor-parallel
/// reduce-scatter overlaps under tp_comm_overlap (Kernel::overlap_sms); 0 without the overlap.
int overlap_margin(const Config& c, int sms) { return c.training.tp_comm_overlap && c.parallel.tp > 1 ? sms : 0; }

/// A dense MLP of width f over `tokens`, split over tp: its two linears (gate and up together for
/// SwiGLU) and its activation function's memory-bound kernels, in elements per token: F: GELU one
/// fused kernel, 2f; SwiGLU as PyTorch runs it unfused, SiLU 2f and the product 3f. B: GELU 3f;
/// SwiGLU 13f (two products, SiLU's backward, the gate and up gradients copied into one). Fused
/// (training.kernels), SwiGLU is one kernel each way: gate and up in, the product out, 3f; gate, up
/// and the product's gradient in, the gate's and up's gradients out, 5f.
void add_mlp(const Config& c, double tokens, double f, double t, double groups, StageKernels& out,
             int overlap_sms = 0) {
  if (f <= 0) return;
  const double h = c.model.hidden, act = c.precision.activation_bytes;
  const bool swiglu = c.model.mlp == MlpKind::SwiGlu, fused = c.training.kernels == KernelProfile::Fused;
  add_linear(c, {tokens, (swiglu ? 2 : 1) * f / t, h, groups}, out);
  add_linear(c, {tokens, h, f / t, groups, overlap_sms}, out);
  const double forward = swiglu ? (fused ? 3 : 5) : 2, backward = swiglu ? (fused ? 5 : 13) : 3;
  out.forward.push_back(streaming(groups * tokens * forward * f / t * act));
  out.backward.push_back(streaming(groups * tokens * backward * f / t * act));
}

/// What the composite profile (training.kernels "composite") runs beyond eager's one kernel a norm:
/// torchtitan's RMSNorm of 2024 (`x.float()`, `pow(2)`, `mean`, `x * rsqrt(...)`, `type_as(x)`, `* weight`),
/// each step a kernel through HBM. In bytes an element, with a the activation's and 4 fp32's: a norm
/// moves a+4, 4+4, 4, 4+4, 4+a and a+a forward, 28 + 4a against a fused norm's 2a; its backward
/// (autograd's: the weight product's two gradients and sum 6a, the casts' a+4 and 4+a, x·r's two
/// gradients and sum 24, mean's expansion 4, pow's 2x·g 28, the two gradients of x added 12) 76 + 8a
/// against 3a (docs/cost-model.md, "Kernel profiles"). `norm_tokens`: the tokens a rank's norms see
/// (its sequence-parallel share).
void add_composite_norms(const Config& c, double norm_tokens, StageKernels& out) {
  const double act = c.precision.activation_bytes;
  constexpr double kNorms = 2;  // before attention and before the MLP
  out.forward.push_back(streaming(kNorms * norm_tokens * c.model.hidden * (28 + 2 * act)));
  out.backward.push_back(streaming(kNorms * norm_tokens * c.model.hidden * (76 + 5 * act)));
}

/// The rotary embedding as tensor ops (training.rotary_embedding "tensor_ops", torchtitan's
/// `apply_rotary_emb`: the queries and keys cast to fp32, multiplied as complex numbers, cast back):
/// (a+4) + (4+4) + (4+a) bytes an element of the rank's queries and keys each way. A fused kernel's
/// read and write of them is not counted.
void add_tensor_op_rope(const Config& c, const AttentionWidths& w, StageKernels& out) {
  const double rotated = rank_tokens(c) * (w.query + w.key) / c.parallel.tp * (16 + 2 * c.precision.activation_bytes);
  out.forward.push_back(streaming(rotated));
  out.backward.push_back(streaming(rotated));
}

/// A MoE layer's expert part on one rank (docs/cost-model.md, "Mixture of experts"): the router's GEMM
/// and top-k over the rank's sequence-parallel tokens; the permutation of their top-k copies into
/// expert order and back (each a read and a write of the copies, forward and backward); the routed
/// experts as grouped GEMMs over the num_experts/ep experts the rank holds, each taking its share of
/// the ep group's copies (gathered over etp) times the busiest expert's load; the shared experts as a
/// dense MLP over tp. The dispatch and combine all-to-alls are the cost model's (expert_exchange).
void add_experts(const Config& c, StageKernels& out) {
  const ModelConfig& m = c.model;
  const ParallelConfig& p = c.parallel;
  const double h = m.hidden, act = c.precision.activation_bytes, local = rank_tokens(c) / p.tp;
  const double copies = local * m.moe_router_topk, etp = p.expert_tp(), local_experts = double(m.num_experts) / p.ep;
  out.forward.push_back(gemm(local, m.num_experts, h, act, c.precision.param_bytes, 4));  // router logits, fp32
  out.forward.push_back(streaming(local * m.num_experts * 4 * 3));                        // softmax, top-k
  out.forward.push_back(streaming(2 * 2 * copies * h * act));                              // permute, un-permute
  out.backward.push_back(streaming(2 * 2 * copies * h * act + local * m.num_experts * 4 * 3));
  add_weight_gradient(c, gemm(m.num_experts, h, local, 4, act, weight_gradient_output_bytes(c)), out);
  add_mlp(c, copies * etp * moe_load(m) / local_experts, m.expert_ffn_hidden(), etp, local_experts, out);
  add_mlp(c, rank_tokens(c), m.moe_shared_expert_intermediate_size, p.tp, 1, out,
          overlap_margin(c, c.training.tp_comm_overlap_fc2_sms));
}

/// Sequence-first activations (training.activation_layout "sbh": Megatron-LM, NeMo) into a
/// FlashAttention kernel (precision.attention_kernel "flash2" or "flash1"), whose inputs are
/// batch-first: Transformer Engine's FlashAttention backend copies the queries, keys and values to
/// batch-first before the call and the output back after it (transformer_engine/pytorch/attention.py,
/// FlashAttention.forward: _PrepareQKVForFA or transpose(0, 1).contiguous(), every 1.x release), and
/// autograd copies their gradients back: each read and written once each way. cuDNN's fused attention
/// takes the sequence-first layout as it is.
double attention_layout_copy_bytes(const Config& c) {
  if (!c.precision.flash_attention || c.precision.attention_kernel == AttentionKernel::Cudnn ||
      c.training.activation_layout != ActivationLayout::SequenceFirst)
    return 0;
  const AttentionWidths w = attention_widths(c.model);
  return 2 * rank_tokens(c) * (w.query + w.key + w.value + w.output) / c.parallel.tp * c.precision.activation_bytes;
}

/// FlashAttention's variable-length kernels behind flash-attn's bert_padding (training.attention_unpadding,
/// flash_attn/bert_padding.py, every 2.x release): unpad_input gathers each of the queries, keys and
/// values into packed rows through torch.gather with its int64 row indices repeated over the row's
/// width (written, then read: 8 bytes an element each), and pad_input writes zeros and scatters the
/// output back into them. Backward, autograd gathers the output's gradient and scatters each input's
/// into zeros, its repeated indices made again. Bytes a pass, `forward` or not.
double attention_unpad_bytes(const Config& c, bool forward) {
  constexpr double kIndex = 8;
  const AttentionWidths w = attention_widths(c.model);
  const double a = c.precision.activation_bytes, inputs = w.query + w.key + w.value;
  const double per_token = forward ? (2 * kIndex + 2 * a) * inputs + 3 * a * w.output
                                   : (2 * kIndex + 3 * a) * inputs + 2 * a * w.output;
  return rank_tokens(c) * per_token / c.parallel.tp;
}

/// One decoder layer as a framework runs it (docs/cost-model.md): the attention's two linears (QKV,
/// projection) and fused causal attention, then a dense MLP or the experts; the memory-bound norms and
/// residual adds. A context-parallel rank runs s/cp of the tokens, its queries against every key.
void add_layer(const Config& c, LayerKind kind, StageKernels& out) {
  const ModelConfig& m = c.model;
  const double t = c.parallel.tp, tokens = rank_tokens(c), h = m.hidden, act = c.precision.activation_bytes;
  const int proj_margin = overlap_margin(c, c.training.tp_comm_overlap_proj_sms);
  for (const AttentionLinear& l : attention_linears(m)) {
    const bool row = l.split == AttentionLinear::Split::Row;
    add_linear(c, {tokens, l.split == AttentionLinear::Split::Column ? l.out / t : l.out, row ? l.in / t : l.in, 1,
                   row ? proj_margin : 0},
               out);
  }
  append(out.forward, core_attention_forward(c));
  append(out.backward, core_attention_backward(c));
  if (const double copy = attention_layout_copy_bytes(c); copy > 0) {
    out.forward.push_back(streaming(copy));
    out.backward.push_back(streaming(copy));
  }
  if (c.training.attention_unpadding) {
    out.forward.push_back(streaming(attention_unpad_bytes(c, true)));
    out.backward.push_back(streaming(attention_unpad_bytes(c, false)));
  }
  const int fc2_margin = overlap_margin(c, c.training.tp_comm_overlap_fc2_sms);
  if (kind == LayerKind::Dense) add_mlp(c, tokens, m.ffn_hidden, t, 1, out, fc2_margin);
  else add_experts(c, out);
  // The norms (read, write; backward read input and gradient, write gradient) and the residual sums
  // (forward each branch's output added to the stream: two read, one written, as Megatron-Core's fused
  // bias-dropout-add or an eager `x + f(x)` runs it; backward the two gradients of the stream summed),
  // in elements per token: 10h forward; 16h backward, which also counts attention's layout copies of
  // the gradients. On every token of every tensor-parallel rank unless sequence parallelism splits them.
  const double norms = c.parallel.sequence_parallel ? t : 1;
  out.forward.push_back(streaming(tokens * 10 * h / norms * act));
  out.backward.push_back(streaming(tokens * 16 * h / norms * act));
  const AttentionWidths w = attention_widths(m);
  if (c.training.kernels == KernelProfile::Composite) add_composite_norms(c, tokens / norms, out);
  if (c.training.rotary_embedding == RotaryEmbedding::TensorOps) add_tensor_op_rope(c, w, out);
  const double mlp_width = kind == LayerKind::Dense ? m.ffn_hidden : m.moe_shared_expert_intermediate_size;
  if (m.mlp == MlpKind::Gelu)  // GPT's biases: their gradients read each linear's output gradient
    out.weight.push_back(streaming(tokens * (w.query + w.key + w.value + 2 * h + mlp_width) / t * act));
}

/// The LM head with a PyTorch-style cross-entropy: logits in bf16, cast to fp32, log-softmax (read
/// twice, written once) — 18 bytes a logit forward; backward writes the one-hot gradient, runs the
/// log-softmax backward and casts back — 22 bytes a logit.
void add_head(const Config& c, StageKernels& out) {
  const ModelConfig& m = c.model;
  const PrecisionConfig& p = c.precision;
  const double tokens = rank_tokens(c), h = m.hidden, rows = double(m.vocab) / c.parallel.tp;
  const double act = p.activation_bytes;
  out.forward.push_back(gemm(tokens, rows, h, act, p.param_bytes, act));
  out.forward.push_back(streaming(18 * tokens * rows));
  out.backward.push_back(streaming(22 * tokens * rows));
  out.backward.push_back(gemm(tokens, h, rows, act, p.param_bytes, act));
  add_weight_gradient(c, gemm(rows, h, tokens, act, act, weight_gradient_output_bytes(c)), out);
}

/// The input embedding: a gather of b·s rows (read, write); its backward through embedding_backward_bytes.
void add_embedding(const Config& c, StageKernels& out) {
  const ModelConfig& m = c.model;
  const double t = c.parallel.tp;
  out.forward.push_back(streaming(2 * rank_tokens(c) * m.hidden / t * c.precision.param_bytes));
  out.weight.push_back(streaming(embedding_backward_bytes(c, m.vocab / t)));
  if (c.parallel.tp > 1) ++out.tp_allreduces_forward;  // vocab-parallel embedding sum
}

/// What a dense layer's backward reruns under per-op checkpointing (Recompute::SelectiveOp): the
/// products the policy does not save, and every memory-bound kernel of its forward (norms, the
/// activation function, casts: the policy saves none of their outputs). Flash attention's output is
/// saved, so attention is not rerun.
std::vector<Kernel> op_checkpoint_rerun(const Config& c, const StageKernels& layer) {
  const double t = c.parallel.tp, tokens = rank_tokens(c), act = c.precision.activation_bytes;
  std::vector<Kernel> rerun;
  for (const Kernel& k : layer.forward)
    if (k.flops == 0) rerun.push_back(k);
  for (const LayerProduct& p : op_checkpoint_products(c.model)) {
    if (p.saved) continue;
    const bool column = p.split == AttentionLinear::Split::Column;
    const double out = column ? p.out / t : p.out, in = column ? p.in : p.in / t;
    rerun.push_back(gemm(tokens, out, in, act, c.precision.param_bytes, act));
  }
  return rerun;
}

/// Tensor-parallel collectives the rerun repeats: torchtitan's policy saves reduce-scatters' outputs,
/// not all-gathers' or all-reduces', so under sequence parallelism the two all-gathers of the
/// attention's and the MLP's inputs (one all-reduce's ring time), without it both all-reduces.
int op_checkpoint_collectives(const Config& c) { return c.parallel.sequence_parallel ? 1 : 2; }

/// Batch-first sequence parallelism (training.activation_layout "bsh"): PyTorch's functional
/// collectives gather and scatter dimension 0, so gathering the sequence (dimension 1) ends in a
/// torch.cat of the whole gathered tensor and scattering it starts with one of the whole input
/// (torch/distributed/_functional_collectives.py, all_gather_tensor and reduce_scatter_tensor): the
/// rank's b·s·h activations read and written twice for each all-gather and reduce-scatter pair.
/// Async tensor parallelism (tp_comm_overlap) gathers into place and is not charged.
double sequence_parallel_copy_bytes(const Config& c) {
  const ParallelConfig& p = c.parallel;
  if (c.training.activation_layout != ActivationLayout::BatchFirst || !p.sequence_parallel || p.tp <= 1 ||
      c.training.tp_comm_overlap)
    return 0;
  return 4 * rank_tokens(c) * c.model.hidden * c.precision.activation_bytes;
}

/// FSDP2 (`fully_shard`) gathers a unit's weights into one buffer and copies them out into the
/// parameters on the compute stream (torch/distributed/_composable/fsdp/_fsdp_collectives.py,
/// foreach_all_gather_copy_out: the current stream waits for the all-gather, then
/// split_with_sizes_copy), before the unit's forward and, resharded after it, again before its
/// backward: each weight read and written in the parameters' type. FSDP1's flat parameter is a view of
/// its gathered buffer and Megatron-LM's gathers write into its parameters: neither copies.
bool copies_gathered_weights(const Config& c) {
  return c.training.zero_stage == 3 && c.training.grad_accumulation == GradAccumulation::Fsdp2 &&
         c.parallel.dp * c.parallel.cp > 1;
}

int tp_collectives(const Config& c, LayerKind kind) {
  // Attention's and the MLP's all-reduce (or all-gather and reduce-scatter); a MoE layer's routed
  // experts exchange tokens by all-to-all instead, its shared experts as a dense MLP.
  if (kind == LayerKind::Dense) return 2;
  return c.model.moe_shared_expert_intermediate_size > 0 ? 2 : 1;
}

}  // namespace

StageKernels stage_kernels(const Config& c, const VirtualStage& stage) {
  // A layer's kernels depend on its kind only: each kind's are built once and copied per layer (a
  // search asks this of every stage of hundreds of thousands of candidates).
  std::optional<StageKernels> layer_of[2];
  const auto layer = [&](LayerKind kind) -> const StageKernels& {
    std::optional<StageKernels>& built = layer_of[kind == LayerKind::Moe];
    if (!built) add_layer(c, kind, built.emplace());
    return *built;
  };
  StageKernels kernels;
  for (int l = stage.first_layer; l < stage.first_layer + stage.layers; ++l) {
    const LayerKind kind = layer_kind(c.model, l);
    const StageKernels& one = layer(kind);
    append(kernels.forward, one.forward);
    append(kernels.backward, one.backward);
    append(kernels.weight, one.weight);
    kernels.tp_allreduces_forward += tp_collectives(c, kind);
    kernels.expert_exchanges += kind == LayerKind::Moe;
  }
  kernels.tp_allreduces_backward = kernels.tp_allreduces_forward;
  // R: full recomputation runs the recomputed layers' forward again, collectives included; per-op
  // checkpointing what its policy did not save; selective recomputation only the score part of
  // attention, which flash attention's backward already redoes.
  const int recomputed = recomputed_layers(c.training, stage.layers);
  if (recomputed > 0) {
    for (int l = stage.first_layer; l < stage.first_layer + recomputed; ++l) {
      const LayerKind kind = layer_kind(c.model, l);
      append(kernels.recompute, layer(kind).forward);
      kernels.tp_allreduces_recompute += tp_collectives(c, kind);
      kernels.expert_exchanges_recompute += kind == LayerKind::Moe;
    }
  } else if (c.training.recompute_granularity == Recompute::SelectiveOp && stage.layers > 0) {
    const std::vector<Kernel> rerun = op_checkpoint_rerun(c, layer(LayerKind::Dense));
    for (int l = 0; l < stage.layers; ++l) append(kernels.recompute, rerun);
    kernels.tp_allreduces_recompute = stage.layers * op_checkpoint_collectives(c);
  } else if (c.training.recompute_granularity == Recompute::Selective && !c.precision.flash_attention) {
    for (int l = 0; l < stage.layers; ++l) append(kernels.recompute, core_attention_forward(c));
  }
  if (stage.has_head) add_head(c, kernels);
  if (stage.has_embedding) add_embedding(c, kernels);
  if (const double copy = sequence_parallel_copy_bytes(c); copy > 0) {
    // A pass without these collectives (a stage of no layers) gets no kernel, and so no launch.
    const auto add_copies = [copy](std::vector<Kernel>& pass, int collectives) {
      if (collectives > 0) pass.push_back(streaming(copy * collectives));
    };
    add_copies(kernels.forward, kernels.tp_allreduces_forward);
    add_copies(kernels.backward, kernels.tp_allreduces_backward);
    add_copies(kernels.recompute, kernels.tp_allreduces_recompute);
  }
  if (copies_gathered_weights(c)) {
    const Kernel copy = streaming(2 * c.precision.param_bytes * stage_params(c, stage));
    kernels.forward.push_back(copy);
    kernels.backward.push_back(copy);
  }
  return kernels;
}

double total(const std::vector<Kernel>& kernels, double Kernel::*field) {
  double sum = 0;
  for (const Kernel& kernel : kernels) sum += kernel.*field;
  return sum;
}

double seconds(const std::vector<Kernel>& kernels, const HardwareConfig& h) {
  double s = 0;
  for (const Kernel& kernel : kernels) s += kernel_seconds(kernel, h);
  return s;
}

// cuBLAS runs a GEMM as output tiles, one per SM at a time; 128×128 is its common bf16 tile on A100
// and H100. Past one wave the tail is balanced (stream-K, split-K), which the H100 measurements in
// docs/data show: over their shapes (all at least one wave) a per-wave model explains nothing.
// Split-K below one wave is not modelled, so the fill there is a lower bound (docs/cost-model.md).
double tile_fill(const Kernel& kernel, int sms) {
  if (kernel.rows <= 0 || kernel.cols <= 0 || sms <= 0) return 1;
  constexpr double kTile = 128;
  const double tiles = std::ceil(kernel.rows / kTile) * std::ceil(kernel.cols / kTile);
  return kernel.rows * kernel.cols / (kTile * kTile * std::max(tiles, double(sms)));
}

double main_gradient_add_bytes(const Config& c) {
  const PrecisionConfig& p = c.precision;
  switch (c.training.grad_accumulation) {
    case GradAccumulation::Fused: return p.param_bytes + 2 * p.grad_bytes;
    // DeepSpeed's update_hp_grads: hp_grad.add_(lp_grad.to(fp32)) writes an fp32 copy and reads it back.
    case GradAccumulation::DeepSpeed: return p.param_bytes + 2 * p.grad_bytes + 2 * 4;
    case GradAccumulation::Fsdp: {
      // torch/distributed/fsdp: autograd concatenates the views' gradients into the flat gradient
      // (SplitWithSizesBackward: read and write), _post_backward_hook casts it to the reduce dtype
      // (precision.grad_bytes) and the reduce-scatter hook divides it in place by the pre-divide
      // factor, which is above 1 on 2 GPUs and more.
      const double cast = p.grad_bytes == p.param_bytes ? 0 : p.param_bytes + p.grad_bytes;
      const double divide = c.parallel.dp * c.parallel.cp > 1 ? 2 * p.grad_bytes : 0;
      return 2 * p.param_bytes + cast + divide;
    }
    // torch/distributed/_composable/fsdp: foreach_reduce's chunk_cat copies the gradients into the
    // reduce-scatter's input in the reduce dtype; fp32 and bf16 are averaged by NCCL, not divided.
    case GradAccumulation::Fsdp2: return p.param_bytes + p.grad_bytes;
  }
  return p.param_bytes + 2 * p.grad_bytes;
}

double embedding_backward_bytes(const Config& c, double rows) {
  const PrecisionConfig& p = c.precision;
  const double h = c.model.hidden, tokens = rank_tokens(c) * h / c.parallel.tp;
  return tokens * (p.activation_bytes + 2 * p.param_bytes) + rows * h * (p.param_bytes + main_gradient_add_bytes(c));
}

namespace {
/// The efficiency a fused attention kernel runs at on `h`. FlashAttention-2 is "around 2× speedup
/// compared to FlashAttention", 50–73% of the A100's peak against 25–40% (Dao 2023, abstract and §1):
/// FlashAttention-1 at half of FlashAttention-2's efficiency on every GPU (on Hopper both run their
/// Ampere code).
double long_sequence_efficiency(AttentionKernel kernel, const HardwareConfig& h) {
  constexpr double kFlash2OverFlash1 = 2;
  switch (kernel) {
    case AttentionKernel::Cudnn: return h.attention_efficiency;
    case AttentionKernel::Flash2: return h.flash2_attention_efficiency;
    case AttentionKernel::Flash1: return h.flash2_attention_efficiency / kFlash2OverFlash1;
  }
  return h.attention_efficiency;
}

/// ... at its keys: a cost per query row that does not shrink with them (attention_overhead_tokens);
/// and over its grid of N blocks, N / (N + sms): about one block an SM of the last, ragged wave is
/// lost (fitted to fused attention timed alone on an H200, docs/cost-model.md).
double attention_efficiency(const Kernel& kernel, const HardwareConfig& h) {
  double efficiency = long_sequence_efficiency(kernel.attention_kernel, h);
  if (h.attention_overhead_tokens > 0)
    efficiency *= kernel.attention_keys / (kernel.attention_keys + h.attention_overhead_tokens);
  if (h.sms > 0 && kernel.attention_blocks > 0) efficiency *= kernel.attention_blocks / (kernel.attention_blocks + h.sms);
  return efficiency;
}
}  // namespace

double kernel_seconds(const Kernel& kernel, const HardwareConfig& h) {
  const double efficiency = kernel.attention ? attention_efficiency(kernel, h)
                            : kernel.fp8     ? h.fp8_efficiency * tile_fill(kernel, h.sms)
                                             : h.compute_efficiency * tile_fill(kernel, h.sms);
  const double peak = (kernel.fp8 ? h.peak_fp8_tflops : h.peak_tflops) * h.sustained_compute_fraction;
  return std::max(kernel.flops / (peak * 1e12 * efficiency), kernel.bytes / (h.hbm_gbps * 1e9 * h.hbm_efficiency)) +
         h.kernel_launch_us * 1e-6;
}

}  // namespace pipesim
