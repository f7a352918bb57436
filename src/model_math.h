#pragma once
/// Closed-form figures of a GPT-style decoder (docs/cost-model.md): FLOPs, parameters and activation
/// bytes, per microbatch. What the parallel layout makes of them (tokens per rank, ZeRO, per-device
/// parameters and memory) is in parallel_shape.h. FLOPs count 2 per multiply-add. Sources: Narayanan et al. 2021 (FLOPs),
/// Korthikanti et al. 2022 (activations), Yeung et al. 2025 Table 4 (vocabulary layers).
#include <vector>

#include "config.h"
#include "units.h"

namespace pipesim {

/// A transformer layer: dense (one MLP) or mixture-of-experts (a router, num_experts routed MLPs of
/// which each token uses moe_router_topk, and the shared experts).
enum class LayerKind { Dense, Moe };
/// The kind of layer `layer` (0-based, model order): MoE where the model has experts and
/// moe_layer_freq or moe_layer_pattern says so.
LayerKind layer_kind(const ModelConfig& m, int layer);
/// MoE layers among layers [first, first + count).
int moe_layer_count(const ModelConfig& m, int first, int count);

/// One linear map of a layer's attention, in features: `out` by `in` weights, and how tensor
/// parallelism splits it (column-parallel: its outputs; row-parallel: its inputs; or not at all, as
/// Megatron-Core keeps MLA's down-projections).
struct AttentionLinear {
  enum class Split { Column, Row, None };
  double out, in;
  Split split;
};
/// The attention's linear maps: the fused QKV projection and the output projection; under multi-head
/// latent attention the query's down- and up-projection (or one, without q_lora_rank), the key/value
/// down-projection (with the shared rotary key) and up-projection, and the output projection.
std::vector<AttentionLinear> attention_linears(const ModelConfig& m);
/// Channels per token, over all heads, of the queries, the keys and the values attention reads, and
/// of its output (the output projection's input): heads · head_channels for queries and output,
/// kv_heads · head_channels for keys and values (grouped-query attention); under MLA every head has
/// its own key (qk_nope + qk_rope channels, as its query) and value (v_head_dim).
struct AttentionWidths {
  double query, key, value, output;
};
AttentionWidths attention_widths(const ModelConfig& m);

/// GEMM FLOPs of one transformer layer's forward (QKV, projection, MLP): 8bsh² + 4bshf for GPT;
/// with g = kv_heads/heads (grouped-query attention) the K and V projections shrink to g·h columns,
/// 4bsh²(1 + g), and a SwiGLU MLP has three matrices, 6bshf. A MoE layer replaces the MLP with the
/// router (2bsh·E), top-k routed experts (k times an MLP of moe_ffn_hidden_size) and the shared experts
/// (an MLP of their width): model FLOPs, which the busiest expert's imbalance does not change.
double layer_gemm_flops(const ModelConfig& m, LayerKind kind = LayerKind::Dense);
/// layer_gemm_flops summed over every layer of the model.
double model_layers_gemm_flops(const ModelConfig& m);
/// Attention-score FLOPs of one layer's forward (QKᵀ and PV): 4bs²h.
double layer_attention_flops(const ModelConfig& m);
/// Parameters of one transformer layer: GPT 4h² + 2hf + 9h + f (= 12h² + 13h when f = 4h); with
/// grouped-query attention 2h²(1 + g) for the attention weights; SwiGLU 3hf for the MLP and, as in
/// Llama, no biases and two RMSNorm gains (2h). A MoE layer: the same attention and norms, num_experts
/// MLPs of moe_ffn_hidden_size, the shared experts' MLP and the router's h·E.
double layer_params(const ModelConfig& m, LayerKind kind = LayerKind::Dense);
/// One layer's parameters by how a layout splits them: over tp (attention, norms, a dense or shared
/// MLP), over ep·etp (the routed experts) or not at all (the router, as Megatron-Core keeps it).
struct LayerParams {
  double tensor_parallel = 0, experts = 0, replicated = 0;
  double total() const { return tensor_parallel + experts + replicated; }
};
LayerParams layer_param_parts(const ModelConfig& m, LayerKind kind);
/// Every transformer layer's parameters.
double model_layer_params(const ModelConfig& m);
/// Activation bytes one layer keeps for its backward on one tensor- and context-parallel rank, without
/// full recomputation (Korthikanti et al. 2022, Table 2), per microbatch. Per token and hidden unit at
/// 2-byte activations: 10 that tensor parallelism leaves whole (the two norms' inputs 4, the inputs
/// of QKV and of the MLP 2 + 2, two dropout masks 1 + 1) and 24 that it splits (Q, K, V and the
/// projection's input 8 — 4 + 4g with grouped-query attention, K and V shrinking to g = kv/heads —
/// and the MLP's inner activations 16, SwiGLU's 6f/h), plus the score matrices 5·a·s/h, split too,
/// unless flash attention or selective recomputation drops them. Sequence parallelism splits the
/// 10 as well: 34/t. Under Recompute::SelectiveOp, op_checkpoint_bytes. Context parallelism gives
/// each rank s/cp of the tokens. A MoE layer keeps, in
/// place of the MLP's inner activations, per token of the rank's sequence-parallel share: the router's
/// fp32 logits (4E bytes) and, for each of its top-k copies (× the busiest expert's imbalance), the
/// permuted input (all-gathered over etp) and the expert's inner activations; the shared experts keep
/// a dense MLP's (moe_activation_bytes).
double layer_activation_bytes(const Config& c, LayerKind kind = LayerKind::Dense);
/// The expert part of a MoE layer's activations on one rank (above).
double moe_activation_bytes(const Config& c);
/// Routed token copies the busiest expert rank processes per token of the mean, at most the capacity
/// factor (tokens past it are dropped): min(moe_imbalance, moe_capacity_factor).
double moe_load(const ModelConfig& m);
/// One matrix product of a dense layer's forward as PyTorch runs it op by op (torchtitan's Llama: the
/// query, key and value projections as three products, SwiGLU's gate and up as two), in forward
/// order: `out` by `in` features, its tensor-parallel split, and whether torchtitan's per-op
/// checkpointing policy saves its output. The policy (torchtitan/distributed/activation_checkpoint.py,
/// `_get_custom_policy`) saves every matrix product but every second one, counting from the layer's
/// first: q, v and the MLP's first are kept, k and the output projection rerun; SwiGLU's up is rerun
/// and its down kept, GELU's second matrix rerun.
struct LayerProduct {
  double out, in;
  AttentionLinear::Split split;
  bool saved = true;
};
/// A dense layer's products, multi-head or grouped-query attention (Recompute::SelectiveOp).
std::vector<LayerProduct> op_checkpoint_products(const ModelConfig& m);
/// Activation bytes one dense layer keeps under Recompute::SelectiveOp on one rank, per microbatch:
/// its input (split under sequence parallelism), flash attention's output and fp32 softmax
/// statistics (one a head and token), the outputs of the products the policy saves (column-parallel
/// ones split over tp, row-parallel ones the whole partial sums each rank computes) and, under
/// sequence parallelism, the reduce-scatters' outputs after the row-parallel products.
double op_checkpoint_bytes(const Config& c);
/// The part of layer_activation_bytes that selective recomputation drops: the score matrices
/// (0 under flash attention, whose backward recomputes them already).
double layer_score_bytes(const Config& c);
/// LM-head GEMM FLOPs of the forward: 2·b·s·h·V.
double head_forward_flops(const ModelConfig& m);
/// Parameters of the LM head or of the embedding (untied): V·h.
double vocab_params(const ModelConfig& m);
/// FLOPs of one iteration as the Vocabulary Parallelism paper counts them for MFU:
/// 3·(2·B·S·H·V + L·(8·B·S·H² + 4·B·S²·H + 4·B·S·H·F)), B the global batch.
double paper_iteration_flops(const Config& c);

}  // namespace pipesim
