#pragma once
/// A decoder-only transformer in fp32 on the CPU (docs/runtime.md, "What runs"), in one of two layer families:
/// - GPT: input embedding, L × (pre-LayerNorm, causal attention, residual, LayerNorm, MLP with GELU,
///   residual), final LayerNorm, untied LM head, softmax cross-entropy; every linear map has a bias.
/// - Llama: the same skeleton with RMSNorm (gain only) for every norm, rotary position embeddings on
///   q and k, a SwiGLU MLP down(silu(gate(x)) · up(x)) and no biases.
/// Both take grouped-query attention (kv_heads < heads). A Llama layer that shape.moe_layer marks runs
/// a mixture-of-experts MLP (moe.h) in place of the dense one. Parameters come from a counter-based
/// generator keyed by (seed, tensor, index), so any partition of the model over devices builds the
/// same model.
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "model_shape.h"
#include "moe.h"
#include "tensor_parallel.h"

namespace pipesim::cpu {

/// The shape is the runtime's (model_shape.h): the one a Job carries to every backend. The CPU model
/// reads it as it is. tied_embeddings: make_model's head is then a copy of its embedding.
using runtime::LayerFamily;
using runtime::LayerPart;
using runtime::ModelShape;
/// A tensor-parallel group (tensor_parallel.h: how a layer splits over it, what each collective
/// does), the runtime's: the CPU layers call it on host fp32 buffers.
using runtime::TensorParallel;

/// The weights of one transformer layer, in a fixed order (so that gradients share the type). Llama
/// uses the same slots: ln1/ln2 gains are its two RMSNorm gains, fc1.weight is the fused gate and up
/// projection (hidden × 2·ffn, each row [gate | up]), fc2.weight the down projection; its biases
/// (ln*_bias, *_bias) stay empty. A mixture-of-experts layer leaves fc1 and fc2 empty and holds its
/// MLP in the last five (moe.h's MoeWeights), which a dense layer leaves empty: every layer has the
/// same list, so that a rank's tensors line up with the model's (and with the CUDA backend's) in one
/// order whatever kind its layers are.
struct Layer {
  std::vector<float> ln1_gain, ln1_bias, qkv_weight, qkv_bias, proj_weight, proj_bias;
  std::vector<float> ln2_gain, ln2_bias, fc1_weight, fc1_bias, fc2_weight, fc2_bias;
  std::vector<float> router_weight, expert_fc1_weight, expert_fc2_weight, shared_fc1_weight, shared_fc2_weight;
  /// Whether this is a mixture-of-experts layer (it has a router).
  bool moe() const { return !router_weight.empty(); }
  std::vector<std::vector<float>*> tensors();
  std::vector<const std::vector<float>*> tensors() const;
};

/// The names of Layer::tensors(), in its order ("ln1.gain", "ln1.bias", "qkv.weight", ...), to name a
/// tensor in a report or a gradient check.
std::vector<std::string> layer_tensor_names();

/// Activations one layer keeps from its forward for its backward. The same fields serve both
/// families: for Llama, ln1/ln2 are RMSNorm outputs and mean1/mean2 stay empty, qkv is after the
/// rotary embedding (the backward needs no pre-rotation copy: the rotation is linear), fc1 is the
/// fused [gate | up] (n × 2·ffn) and gelu holds silu(gate)·up (n × ffn), the MLP's activation. A
/// mixture-of-experts layer keeps its routed experts' in `moe`, its shared expert's in fc1 and gelu,
/// and in ln2 this rank's rows only when it has no shared expert (which reads all of them).
struct LayerCache {
  std::vector<float> input, ln1, mean1, rstd1, qkv, probs, attention, middle, ln2, mean2, rstd2, fc1, gelu;
  MoeCache moe;
};

/// Layer `index` (model order) of the model of `seed`: a mixture-of-experts layer where
/// shape.moe_layer(index).
Layer make_layer(const ModelShape& shape, std::uint64_t seed, int index);

/// Rows of a layer's input and output on one rank: n, or n / size under sequence parallelism.
int layer_rows(const ModelShape& shape, const TensorParallel* tp);
/// Under sequence parallelism, sums over the group the gradients each rank holds a partial sum of
/// (the norms' gains and biases, a mixture-of-experts layer's router: over its rows; its routed
/// experts over the ranks that hold the same slice of them, this rank's being the slice-th of
/// `slices`, ep·etp: Job::expert_rank·etp + Job::expert_tp_rank):
/// once per step, before they are read.
void sum_partial_gradients(Layer& grad, TensorParallel& tp, int slice = 0, int slices = 1);

/// Rank `rank` of `ranks`' part of a whole layer (heads, key/value heads, ffn and a shared expert's
/// width divisible by ranks). A mixture-of-experts layer's router and routed experts stay whole
/// (expert_part splits the latter); its shared expert splits as the dense MLP does.
Layer split_layer(const ModelShape& shape, const Layer& whole, int rank, int ranks);
/// Rank `rank` of an expert-parallel group of `ranks`' part of a whole mixture-of-experts layer: the
/// routed experts [rank·E/ranks, (rank + 1)·E/ranks) of its two stacked expert maps, everything else
/// whole. A dense layer, or one rank, is returned whole.
/// With `etp` > 1, of each of those experts the etp_rank-th slice (expert_slice_elements), in expert
/// order.
Layer expert_part(const ModelShape& shape, const Layer& whole, int rank, int ranks, int etp_rank = 0, int etp = 1);
/// The elements of one expert's fused [gate | up] map (h × 2f) and of its down projection (f × h)
/// that rank `rank` of an expert-tensor-parallel group of `ranks` holds: the columns of its share of
/// the width of each of gate and up, and those rows.
std::vector<std::vector<std::size_t>> expert_slice_elements(const ModelShape& shape, int rank, int ranks);
/// Whether tensor `index` of Layer::tensors() is one of the routed experts' maps: what an
/// expert-parallel group splits and the expert data-parallel group, not every replica, reduces.
bool routed_expert_tensor(std::size_t index);
/// For each tensor of Layer::tensors() (its order), which elements of the whole tensor rank `rank` of
/// `ranks` holds, in the order its part holds them; empty where it holds the whole tensor.
std::vector<std::vector<std::size_t>> split_elements(const ModelShape& shape, int rank, int ranks);
/// Zero-filled, the shapes of make_layer's layer `index`: a gradient accumulator.
Layer zero_layer(const ModelShape& shape, int index = 0);
/// With `tp`, `w` is this rank's part of the layer (split_layer) and x and y have layer_rows rows; a
/// mixture-of-experts layer needs sequence parallelism then, and routes this rank's rows (moe.h).
/// With `ep`, a mixture-of-experts layer's `w` holds this rank's routed experts only (expert_part)
/// and its tokens go to the group's ranks and back (moe.h). With `etp` (the tensor-parallel group, at
/// etp = tp), of each of them its slice, which the group's ranks run on every row they received.
void layer_forward(const ModelShape& shape, const Layer& w, std::span<const float> x, std::span<float> y,
                   LayerCache& cache, TensorParallel* tp = nullptr, ExpertParallel* ep = nullptr,
                   TensorParallel* etp = nullptr);
/// What a layer's weight-gradient pass needs when it runs apart from the input-gradient pass (a W op
/// split off B): the input and output gradient of each of the four linear maps (a mixture-of-experts
/// layer's router and routed experts keep theirs in `moe`, its shared expert in fc1_dy and fc2_dy).
struct DeferredWeightGrad {
  std::vector<float> fc2_dy, fc1_dy, proj_dy, qkv_dy;
  MoeDeferred moe;
};

/// Writes dx and adds the weight gradients into `grad`. With `deferred`, the four linear maps'
/// weight and bias gradients are left for layer_weight_backward (the norms' parameters, which come
/// out of the same kernel as dx, are still added here). A mixture-of-experts layer's load-balancing loss
/// enters the objective weighted `aux_loss_weight`: the weight the caller gives this microbatch's
/// loss (1 for one microbatch alone).
void layer_backward(const ModelShape& shape, const Layer& w, const LayerCache& cache, std::span<const float> dy,
                    std::span<float> dx, Layer& grad, DeferredWeightGrad* deferred = nullptr, TensorParallel* tp = nullptr,
                    float aux_loss_weight = 1.0f, ExpertParallel* ep = nullptr, TensorParallel* etp = nullptr);
/// The weight gradients layer_backward deferred; `ranks`: the tensor-parallel group's size, `rank`
/// this rank's in it.
void layer_weight_backward(const ModelShape& shape, const LayerCache& cache, const DeferredWeightGrad& deferred,
                           Layer& grad, int ranks = 1, int rank = 0);

/// The whole model on one device: the reference a pipeline must reproduce.
struct Model {
  std::vector<float> embedding;  ///< vocab × hidden
  std::vector<Layer> layers;
  std::vector<float> final_gain, final_bias;  ///< the final norm (final_bias empty for Llama)
  std::vector<float> head;       ///< vocab × hidden; tied, the embedding's numbers
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
