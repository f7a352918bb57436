#pragma once
/// Where the model lives: which virtual stages each device holds, which layers each virtual stage
/// holds, and which stages carry the vocabulary layers.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "config.h"
#include "status.h"

namespace pipesim {

/// How virtual stages map to devices. Loop: stage s on device s mod p (interleaved 1F1B).
/// V: chunk 0 of device i is stage i, chunk 1 is stage 2p-1-i (V-Half, ZB-V, ...).
enum class Placement { Loop, V };

/// The virtual stage that `device` holds as its `chunk` under `placement`, on `devices` devices.
int stage_of(Placement placement, int devices, int device, int chunk);

/// Where the vocabulary layers (embedding, LM head + loss) run.
enum class VocabPlacement {
  OnStages,    ///< embedding inside stage 0's F/B, LM head inside the last stage's
  Vocab1,      ///< split over all devices as S/T/IF/IB passes; two barriers (Algorithm 1)
  Vocab2,      ///< split over all devices; one barrier (Algorithm 2)
  Interlaced,  ///< split over all devices, computed synchronously, tensor-parallel style
};

struct VirtualStage {
  int device = 0;
  int chunk = 0;
  int first_layer = 0;
  int layers = 0;
  bool has_embedding = false;  ///< input layer (token embedding) runs in this stage's F/B
  bool has_head = false;       ///< LM head + softmax cross-entropy runs in this stage's F/B
};

struct Layout {
  int devices = 0;
  int chunks = 1;
  Placement placement = Placement::Loop;
  std::vector<VirtualStage> stages;  ///< indexed by virtual stage, in model order
  VocabPlacement vocab = VocabPlacement::OnStages;
  /// The vocabulary as laid out: split over the devices, it is padded to a multiple of them.
  int padded_vocab = 0;

  int stage_count() const { return static_cast<int>(stages.size()); }
  /// The virtual stage a device holds as its `chunk`.
  int stage_of(int device, int chunk) const;
};

/// Relative cost of the pieces a stage can hold (any unit; only ratios matter), used to balance.
struct StageWeights {
  double layer = 1;
  double embedding = 0;
  double head = 0;
};

/// Virtual stages that may hold no transformer layer: under `redistribute` the first may hold the
/// embedding alone and the last the LM head and loss alone (as Llama 3 ran its 405B, and Megatron-LM's
/// --account-for-embedding/loss-in-pipeline-split lay it out); under every other mode, none.
int vocabulary_only_stages(VocabMode vocab);
/// The fewest transformer layers that fill `stages` virtual stages: one a stage, less those above.
std::int64_t fewest_layers(VocabMode vocab, std::int64_t stages);

/// How transformer layers are split over virtual stages.
enum class LayerSplit {
  Even,      ///< as equal as possible; earlier stages take the remainder
  Explicit,  ///< config.schedule.layers_per_stage, through split_per_stage
  Balanced,  ///< minimise the slowest stage given StageWeights ("auto")
};

/// A user's layer split (config.schedule.layers_per_stage) as one count per virtual stage, in model
/// order. It may give a count per virtual stage (devices x chunks, taken as is) or a count per device,
/// spread evenly over the device's chunks in model order (its earlier chunks take the remainder), so
/// that one split fits every schedule on the same devices. nullopt for any other length.
std::optional<std::vector<int>> split_per_stage(const std::vector<int>& split, int devices, int chunks,
                                                Placement placement);

Result<Layout> make_layout(const Config& config, Placement placement, LayerSplit split, const StageWeights& weights,
                           VocabPlacement vocab = VocabPlacement::OnStages);

/// The split that minimises max over stages of (layers·layer + embedding/head extras); ties keep
/// layers early. Exposed for tests.
std::vector<int> balanced_split(int layers, int stages, const StageWeights& weights);

}  // namespace pipesim
