#pragma once
/// The model the runtime runs, as every part of it reads the shape: the Job (job.h) carries it across
/// the seam to a backend, and the CPU model (cpu/model.h) computes it. Plain data and the widths that
/// follow from it; the config field each comes from is in model_shape(Config) (partition.h).
#include <cstddef>
#include <vector>

namespace pipesim::runtime {

/// GPT: LayerNorm, GELU MLP, biases on every linear map. Llama: RMSNorm, rotary position embeddings
/// on q and k, a SwiGLU MLP, no biases.
enum class LayerFamily { Gpt, Llama };

struct ModelShape {
  int layers = 0, hidden = 0, heads = 0, ffn = 0, vocab = 0;
  int batch = 1, seq = 0;  ///< one microbatch
  /// Key/value heads: 0 (or heads) is multi-head attention; fewer is grouped-query attention, and
  /// must divide heads.
  int kv_heads = 0;
  LayerFamily family = LayerFamily::Gpt;
  float rope_theta = 10000;  ///< RoPE's base (Llama only); needs an even head width
  /// The LM head is the embedding's transpose (one V × h matrix): a rank that holds both holds it
  /// once.
  bool tied_embeddings = false;
  /// Mixture of experts (Llama family): each layer that moe_layers marks replaces the dense MLP by a
  /// router over `experts` SwiGLU experts of width expert_ffn, of which each token takes
  /// router_topk, plus a shared SwiGLU expert of width shared_expert_ffn (0: none). 0 experts: every
  /// layer is dense.
  int experts = 0, router_topk = 0, expert_ffn = 0, shared_expert_ffn = 0;
  std::vector<bool> moe_layers{};  ///< by layer index (model order)
  /// The load-balancing loss's weight in the objective (Megatron-LM's --moe-aux-loss-coeff, which the
  /// config does not carry): its gradient reaches the routers; the reported loss is the LM loss alone.
  float moe_aux_loss_coeff = 0.01f;
  int tokens() const { return batch * seq; }
  int key_value_heads() const { return kv_heads > 0 ? kv_heads : heads; }
  int head_width() const { return hidden / heads; }
  /// A fused QKV row: [q: hidden | k: kv·d | v: kv·d]; 3·hidden for multi-head attention.
  int qkv_width() const { return hidden + 2 * key_value_heads() * head_width(); }
  /// fc1's output: ffn for GPT, the fused [gate | up] of 2·ffn for Llama.
  int fc1_width() const { return family == LayerFamily::Llama ? 2 * ffn : ffn; }
  /// Whether layer `layer` (model order) is a mixture-of-experts layer.
  bool moe_layer(int layer) const {
    return experts > 0 && layer >= 0 && std::size_t(layer) < moe_layers.size() && moe_layers[std::size_t(layer)];
  }
};

/// The widths of one tensor-parallel rank's part of a layer, split over `ranks` as Megatron splits
/// it (its query and key/value heads, its slice of the FFN); the whole layer on one rank. The CPU
/// model and the CUDA backend both compute on these.
struct LayerPart {
  int heads, kv_heads;
  int attention;  ///< the attention output's width: heads · head width
  int qkv, ffn, fc1;
  LayerPart(const ModelShape& s, int ranks)
      : heads(s.heads / ranks), kv_heads(s.key_value_heads() / ranks), attention(s.hidden / ranks),
        qkv(s.qkv_width() / ranks), ffn(s.ffn / ranks), fc1(s.fc1_width() / ranks) {}
};

}  // namespace pipesim::runtime
