#pragma once
/// Closed-form figures of a GPT-style decoder (DESIGN.md §4): FLOPs, parameters and activation
/// bytes, per microbatch. FLOPs count 2 per multiply-add. Sources: Narayanan et al. 2021 (FLOPs),
/// Korthikanti et al. 2022 (activations), Yeung et al. 2025 Table 4 (vocabulary layers).
#include "config.h"
#include "units.h"

namespace pipesim {

/// GEMM FLOPs of one transformer layer's forward (QKV, projection, MLP): 8bsh² + 4bshf for GPT;
/// with g = kv_heads/heads (grouped-query attention) the K and V projections shrink to g·h columns,
/// 4bsh²(1 + g), and a SwiGLU MLP has three matrices, 6bshf.
double layer_gemm_flops(const ModelConfig& m);
/// Attention-score FLOPs of one layer's forward (QKᵀ and PV): 4bs²h.
double layer_attention_flops(const ModelConfig& m);
/// Parameters of one transformer layer: GPT 4h² + 2hf + 9h + f (= 12h² + 13h when f = 4h); with
/// grouped-query attention 2h²(1 + g) for the attention weights; SwiGLU 3hf for the MLP and, as in
/// Llama, no biases and two RMSNorm gains (2h).
double layer_params(const ModelConfig& m);
/// Activation bytes one layer keeps for backward (Korthikanti et al.): s·b·h·(34 + 5·a·s/h) at 2-byte
/// precision for GPT with f = 4h, without the score term under flash attention, divided by the
/// tensor-parallel degree. Term by term (bytes per token and hidden unit): attention 11 (7 + 4g with
/// grouped-query attention: K and V shrink), MLP 3 + 4f/h (SwiGLU: 3 + 6f/h, gate and up outputs
/// both kept), LayerNorms 4.
double layer_activation_bytes(const ModelConfig& m, const PrecisionConfig& p, int tp);
/// LM-head GEMM FLOPs of the forward: 2·b·s·h·V.
double head_forward_flops(const ModelConfig& m);
/// Parameters of the LM head or of the embedding (untied): V·h.
double vocab_params(const ModelConfig& m);
/// Bytes per parameter held on a device: weights + gradients + optimizer states (sharded over dp
/// with a distributed optimizer).
double bytes_per_param(const PrecisionConfig& p, int dp);
/// FLOPs of one iteration as the Vocabulary Parallelism paper counts them for MFU:
/// 3·(2·B·S·H·V + L·(8·B·S·H² + 4·B·S²·H + 4·B·S·H·F)), B the global batch.
double paper_iteration_flops(const Config& c);

}  // namespace pipesim
