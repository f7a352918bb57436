#pragma once
/// A decoder-only transformer in fp32 on the CPU (DESIGN.md §8), in one of two layer families:
/// - GPT: input embedding, L × (pre-LayerNorm, causal attention, residual, LayerNorm, MLP with GELU,
///   residual), final LayerNorm, untied LM head, softmax cross-entropy; every linear map has a bias.
/// - Llama: the same skeleton with RMSNorm (gain only) for every norm, rotary position embeddings on
///   q and k, a SwiGLU MLP down(silu(gate(x)) · up(x)) and no biases.
/// Both take grouped-query attention (kv_heads < heads). Parameters come from a counter-based
/// generator keyed by (seed, tensor, index), so any partition of the model over devices builds the
/// same model.
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace pipesim::cpu {

enum class LayerFamily { Gpt, Llama };

struct ModelShape {
  int layers = 0, hidden = 0, heads = 0, ffn = 0, vocab = 0;
  int batch = 1, seq = 0;  ///< one microbatch
  /// Key/value heads: 0 (or heads) is multi-head attention; fewer is grouped-query attention, and
  /// must divide heads.
  int kv_heads = 0;
  LayerFamily family = LayerFamily::Gpt;
  float rope_theta = 10000;  ///< RoPE's base (Llama only); needs an even head width
  int tokens() const { return batch * seq; }
  int key_value_heads() const { return kv_heads > 0 ? kv_heads : heads; }
  int head_width() const { return hidden / heads; }
  /// A fused QKV row: [q: hidden | k: kv·d | v: kv·d]; 3·hidden for multi-head attention.
  int qkv_width() const { return hidden + 2 * key_value_heads() * head_width(); }
  /// fc1's output: ffn for GPT, the fused [gate | up] of 2·ffn for Llama.
  int fc1_width() const { return family == LayerFamily::Llama ? 2 * ffn : ffn; }
};

/// The weights of one transformer layer, in a fixed order (so that gradients share the type). Llama
/// uses the same slots: ln1/ln2 gains are its two RMSNorm gains, fc1.weight is the fused gate and up
/// projection (hidden × 2·ffn, each row [gate | up]), fc2.weight the down projection; its biases
/// (ln*_bias, *_bias) stay empty.
struct Layer {
  std::vector<float> ln1_gain, ln1_bias, qkv_weight, qkv_bias, proj_weight, proj_bias;
  std::vector<float> ln2_gain, ln2_bias, fc1_weight, fc1_bias, fc2_weight, fc2_bias;
  std::vector<std::vector<float>*> tensors();
  std::vector<const std::vector<float>*> tensors() const;
};

/// The names of Layer::tensors(), in its order ("ln1.gain", "ln1.bias", "qkv.weight", ...), to name a
/// tensor in a report or a gradient check.
std::vector<std::string> layer_tensor_names();

/// Activations one layer keeps from its forward for its backward. The same fields serve both
/// families: for Llama, ln1/ln2 are RMSNorm outputs and mean1/mean2 stay empty, qkv is after the
/// rotary embedding (the backward needs no pre-rotation copy: the rotation is linear), fc1 is the
/// fused [gate | up] (n × 2·ffn) and gelu holds silu(gate)·up (n × ffn), the MLP's activation.
struct LayerCache {
  std::vector<float> input, ln1, mean1, rstd1, qkv, probs, attention, middle, ln2, mean2, rstd2, fc1, gelu;
};

Layer make_layer(const ModelShape& shape, std::uint64_t seed, int index);
/// Zero-filled, the shapes of make_layer's: a gradient accumulator.
Layer zero_layer(const ModelShape& shape);
void layer_forward(const ModelShape& shape, const Layer& w, std::span<const float> x, std::span<float> y,
                   LayerCache& cache);
/// What a layer's weight-gradient pass needs when it runs apart from the input-gradient pass (a W op
/// split off B): the input and output gradient of each of the four linear maps.
struct DeferredWeightGrad {
  std::vector<float> fc2_dy, fc1_dy, proj_dy, qkv_dy;
};

/// Writes dx and adds the weight gradients into `grad`. With `deferred`, the four linear maps'
/// weight and bias gradients are left for layer_weight_backward (the norms' parameters, which come
/// out of the same kernel as dx, are still added here).
void layer_backward(const ModelShape& shape, const Layer& w, const LayerCache& cache, std::span<const float> dy,
                    std::span<float> dx, Layer& grad, DeferredWeightGrad* deferred = nullptr);
/// The weight gradients layer_backward deferred.
void layer_weight_backward(const ModelShape& shape, const LayerCache& cache, const DeferredWeightGrad& deferred,
                           Layer& grad);

/// The whole model on one device: the reference a pipeline must reproduce.
struct Model {
  std::vector<float> embedding;  ///< vocab × hidden
  std::vector<Layer> layers;
  std::vector<float> final_gain, final_bias;  ///< the final norm (final_bias empty for Llama)
  std::vector<float> head;       ///< vocab × hidden (untied)
};
Model make_model(const ModelShape& shape, std::uint64_t seed);
/// Rows [first, first + rows) of make_model's embedding and LM head: one device's vocabulary shard.
std::vector<float> embedding_rows(const ModelShape& shape, std::uint64_t seed, int first, int rows);
std::vector<float> head_rows(const ModelShape& shape, std::uint64_t seed, int first, int rows);
Model zero_model(const ModelShape& shape);
/// The family's norm over n rows of width shape.hidden (LayerNorm for GPT, RMSNorm for Llama, which takes no
/// bias, writes no mean and leaves `dbias` as it is): every norm of a layer and the final one, so
/// that a backend need not switch on the family.
void norm_forward(const ModelShape& shape, std::span<const float> gain, std::span<const float> bias,
                  std::span<const float> x, std::span<float> y, std::span<float> mean, std::span<float> rstd, int n);
void norm_backward(const ModelShape& shape, std::span<const float> gain, std::span<const float> x,
                   std::span<const float> mean, std::span<const float> rstd, std::span<const float> dy,
                   std::span<float> dx, std::span<float> dgain, std::span<float> dbias, int n);
/// One microbatch forward and backward; returns the mean loss and adds the gradients into `grad`.
double reference_step(const ModelShape& shape, const Model& model, std::span<const int> tokens,
                      std::span<const int> targets, Model& grad);

}  // namespace pipesim::cpu
