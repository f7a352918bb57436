#pragma once
/// One rank's part of the model: the transformer layers of the virtual stages it holds, plus the
/// vocabulary layers where the layout puts them (whole on the first/last stage in `baseline`, a row
/// shard of the embedding and the LM head on every device in the vocabulary-parallel modes). Weights
/// come from the same seeded generator as the single-device model, so they are the same numbers.
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "backend.h"
#include "cpu/model.h"
#include "cpu/vocab.h"
#include "layout.h"

namespace pipesim::runtime {

struct RankParams {
  std::map<int, cpu::Layer> layers;  ///< by global layer index
  std::vector<float> embedding;      ///< shard rows (vocabulary-parallel) or the whole table (first stage), or empty
  std::vector<float> head;           ///< likewise for the LM head (last stage)
  std::vector<float> final_gain, final_bias;  ///< final LayerNorm, on the last stage's device
  /// Floats held.
  std::size_t count() const;
};

struct RankModel {
  ModelShape shape;
  cpu::VocabShard shard;  ///< rows of `embedding`/`head` (the whole vocabulary in baseline)
  OwnedPart owned;        ///< what this rank's optimizer updates (and keeps moments of)
  int tp_rank = 0, tp = 1;  ///< its part of each layer (cpu::split_layer); the rest is whole on every rank
  /// Its expert-parallel rank and group: the routed experts of each MoE layer it holds (cpu::expert_part).
  int ep_rank = 0, ep = 1;
  /// Its expert-tensor-parallel rank and group: the slice of each of those experts it holds.
  int etp_rank = 0, etp = 1;
  /// Under ZeRO, what its optimizer updates of the routed experts' maps (sharded over the expert
  /// data-parallel group); `owned` is for every other tensor.
  OwnedPart expert_owned;
  /// Tied embeddings, both on this rank: the LM head is `embedding` (and its gradient the
  /// embedding's), and `head` holds nothing.
  bool tied = false;
  RankParams params, grads;
  /// Adam's first and second moments of the owned part of each tensor, made (zeros) by its first step.
  RankParams moment1, moment2;
  bool has_moments = false;

  /// Weights, gradients and the optimizer's moments, fp32.
  std::size_t state_bytes() const;
  /// Update `step` (1 on the first) of the owned part of every tensor, then zeroes the gradients for
  /// the next step.
  void optimizer_step(const OptimizerSettings& settings, int step);
  /// For each of tensors_of's tensors, the part this rank's optimizer updates.
  std::vector<OwnedPart> owned_parts() const;
};

/// Every tensor of a rank's parameters (or of its gradients), in one fixed order: what a
/// data-parallel collective moves, tensor by tensor.
std::vector<std::vector<float>*> tensors_of(RankParams& p);
/// Where tensors_of puts the embedding and the LM head: after every layer's tensors, fourth and third
/// from the end (the final norm's gain and bias last).
constexpr std::size_t kEmbeddingFromEnd = 4, kHeadFromEnd = 3;

/// The virtual stage of each of tensors_of's tensors on pipeline device `device`, in its order: a
/// layer's stage; the embedding's and the LM head's where a stage holds them whole (baseline), -1 for
/// their vocabulary shards; the final norm's, the last stage.
std::vector<int> tensor_stages(const Layout& layout, int device);

ModelShape model_shape(const Config& config);
/// Where a rank's part of the model comes from: its pipeline device, its tensor-parallel rank, and
/// under ZeRO the part of each tensor its optimizer updates.
struct RankPart {
  int device = 0;
  int tp_rank = 0, tp = 1;
  OwnedPart owned;
  int ep_rank = 0, ep = 1;  ///< under expert parallelism, which routed experts it holds
  int etp_rank = 0, etp = 1;  ///< under expert tensor parallelism, which slice of each of them
  OwnedPart expert_owned = {};  ///< under ZeRO, its part of the routed experts' maps
};
RankModel make_rank_model(const ModelShape& shape, const Layout& layout, const RankPart& part, std::uint64_t seed);

/// For each of tensors_of's tensors on pipeline device `device`, in its order, whether it is a MoE
/// layer's routed experts' map (cpu::routed_expert_tensor): under expert parallelism, summed over
/// the expert data-parallel group only.
std::vector<bool> routed_expert_tensors(const Layout& layout, int device);
/// Whether tensor `index` of tensor_names is a layer's routed experts' map.
bool routed_expert_model_tensor(std::size_t index);

/// Names of the model's tensors: embedding, head, final norm's gain and bias, then each layer's
/// (cpu::Layer::tensors' order). HostGradient::tensor indexes this list.
std::vector<std::string> tensor_names(const ModelShape& shape);
/// Tensor `index` of tensor_names in a whole model.
std::span<const float> model_tensor(const cpu::Model& model, std::size_t index);
/// The gradients `model` holds (of the owned part of each tensor), as Backend::gradients returns them;
/// what every tensor-parallel rank holds whole, from rank 0 only; under expert parallelism the
/// routed experts' maps as the block of the whole tensor that its experts are, from the first
/// tensor-parallel rank that holds them.
std::vector<HostGradient> host_gradients(const RankModel& model);

}  // namespace pipesim::runtime
