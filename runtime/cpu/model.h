#pragma once
/// A GPT-style decoder in fp32 on the CPU (DESIGN.md §8): input embedding, L × (pre-LayerNorm,
/// causal multi-head attention, residual, LayerNorm, MLP with GELU, residual), final LayerNorm,
/// untied LM head, softmax cross-entropy. Parameters come from a counter-based generator keyed by
/// (seed, tensor, index), so any partition of the model over devices builds the same model.
#include <cstdint>
#include <span>
#include <vector>

namespace pipesim::cpu {

struct ModelShape {
  int layers = 0, hidden = 0, heads = 0, ffn = 0, vocab = 0;
  int batch = 1, seq = 0;  ///< one microbatch
  int tokens() const { return batch * seq; }
};

/// The weights of one transformer layer, in a fixed order (so that gradients share the type).
struct Layer {
  std::vector<float> ln1_gain, ln1_bias, qkv_weight, qkv_bias, proj_weight, proj_bias;
  std::vector<float> ln2_gain, ln2_bias, fc1_weight, fc1_bias, fc2_weight, fc2_bias;
  std::vector<std::vector<float>*> tensors();
  std::vector<const std::vector<float>*> tensors() const;
};

/// Activations one layer keeps from its forward for its backward.
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
/// weight and bias gradients are left for layer_weight_backward (LayerNorm parameters, which come
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
  std::vector<float> final_gain, final_bias;
  std::vector<float> head;       ///< vocab × hidden (untied)
};
Model make_model(const ModelShape& shape, std::uint64_t seed);
/// Rows [first, first + rows) of make_model's embedding and LM head: one device's vocabulary shard.
std::vector<float> embedding_rows(const ModelShape& shape, std::uint64_t seed, int first, int rows);
std::vector<float> head_rows(const ModelShape& shape, std::uint64_t seed, int first, int rows);
Model zero_model(const ModelShape& shape);
/// One microbatch forward and backward; returns the mean loss and adds the gradients into `grad`.
double reference_step(const ModelShape& shape, const Model& model, std::span<const int> tokens,
                      std::span<const int> targets, Model& grad);

}  // namespace pipesim::cpu
