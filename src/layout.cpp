#include "layout.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

namespace pipesim {
namespace {

std::vector<int> even_split(int layers, int stages) {
  std::vector<int> split(static_cast<std::size_t>(stages), layers / stages);
  for (int s = 0; s < layers % stages; ++s) ++split[static_cast<std::size_t>(s)];
  return split;
}

double extra_cost(int stage, int stages, const StageWeights& w) {
  return (stage == 0 ? w.embedding : 0.0) + (stage == stages - 1 ? w.head : 0.0);
}

/// Layers stage `s` may hold without exceeding `limit`; -1 when even zero layers exceed it.
int capacity(double limit, double extra, const StageWeights& w, int layers) {
  if (extra > limit * (1 + 1e-12)) return -1;
  // Compared as a double before it becomes an int: with layers far cheaper than the embedding or the
  // head, the quotient passes INT_MAX.
  const double fit = std::floor((limit - extra) / w.layer * (1 + 1e-12));
  if (!(fit < layers)) return layers;
  return fit < -1 ? -1 : static_cast<int>(fit);
}

}  // namespace

int stage_of(Placement placement, int devices, int device, int chunk) {
  if (placement == Placement::V && chunk % 2 == 1) return (chunk + 1) * devices - 1 - device;
  return chunk * devices + device;
}

int vocabulary_only_stages(VocabMode vocab) { return vocab == VocabMode::Redistribute ? 2 : 0; }

std::int64_t fewest_layers(VocabMode vocab, std::int64_t stages) {
  return std::max<std::int64_t>(1, stages - vocabulary_only_stages(vocab));
}

int Layout::stage_of(int device, int chunk) const { return pipesim::stage_of(placement, devices, device, chunk); }

std::optional<std::vector<int>> split_per_stage(const std::vector<int>& split, int devices, int chunks,
                                                Placement placement) {
  const std::size_t stages = std::size_t(devices) * std::size_t(chunks);
  if (split.size() == stages) return split;
  if (split.size() != std::size_t(devices)) return std::nullopt;
  std::vector<int> per_stage(stages);
  for (int device = 0; device < devices; ++device) {
    // Under both placements a device's chunks lie in model order: chunk c before chunk c + 1.
    const std::vector<int> spread = even_split(split[std::size_t(device)], chunks);
    for (int chunk = 0; chunk < chunks; ++chunk)
      per_stage[std::size_t(stage_of(placement, devices, device, chunk))] = spread[std::size_t(chunk)];
  }
  return per_stage;
}

std::vector<int> balanced_split(int layers, int stages, const StageWeights& w) {
  // Layers that cost nothing (so fast that they round to 0 ns) fit anywhere: every split is as good.
  if (!(w.layer > 0)) return even_split(layers, stages);
  // The optimum is one of the values n·layer + extra_s; take the smallest that fits all layers.
  std::vector<double> limits;
  for (int s = 0; s < stages; ++s)
    for (int n = 0; n <= layers; ++n) limits.push_back(n * w.layer + extra_cost(s, stages, w));
  std::sort(limits.begin(), limits.end());
  const auto fits = [&](double limit) {
    long total = 0;
    for (int s = 0; s < stages; ++s) {
      const int cap = capacity(limit, extra_cost(s, stages, w), w, layers);
      if (cap < 0) return false;
      total += cap;
    }
    return total >= layers;
  };
  const double limit = *std::partition_point(limits.begin(), limits.end(), [&](double l) { return !fits(l); });
  std::vector<int> split(static_cast<std::size_t>(stages));
  int surplus = -layers;
  for (int s = 0; s < stages; ++s) {
    split[static_cast<std::size_t>(s)] = capacity(limit, extra_cost(s, stages, w), w, layers);
    surplus += split[static_cast<std::size_t>(s)];
  }
  // Hand back the surplus from the most loaded stages, earliest first: the layers left over sit on
  // the later stages, which hold fewer microbatches' activations at once (in 1F1B stage s keeps p - s),
  // as Megatron-LM's layer redistribution in the Vocabulary Parallelism paper's code places them
  // (its baseline and redistributed runs peak alike: docs/vocabulary-parallelism.md).
  while (surplus-- > 0) {
    int worst = -1;
    double worst_cost = -1;
    for (int s = 0; s < stages; ++s) {
      const double cost = split[static_cast<std::size_t>(s)] * w.layer + extra_cost(s, stages, w);
      if (split[static_cast<std::size_t>(s)] > 0 && cost > worst_cost) worst = s, worst_cost = cost;
    }
    --split[static_cast<std::size_t>(worst)];
  }
  return split;
}

Result<Layout> make_layout(const Config& config, Placement placement, LayerSplit split, const StageWeights& weights,
                           VocabPlacement vocab) {
  Layout layout;
  layout.devices = config.parallel.pp;
  layout.chunks = config.parallel.chunks;
  layout.placement = placement;
  layout.vocab = vocab;
  const int shards = vocab == VocabPlacement::OnStages ? 1 : layout.devices;
  layout.padded_vocab = (config.model.vocab + shards - 1) / shards * shards;
  const int stage_count = layout.devices * layout.chunks;
  if (placement == Placement::V && layout.chunks != 2)
    return Error{"parallel.chunks: V placement needs exactly 2 chunks per device; set parallel.chunks to 2"};

  std::vector<int> layers;
  switch (split) {
    case LayerSplit::Even: layers = even_split(config.model.layers, stage_count); break;
    case LayerSplit::Explicit: {
      std::optional<std::vector<int>> per_stage =
          split_per_stage(config.schedule.layers_per_stage, layout.devices, layout.chunks, placement);
      if (!per_stage)
        return Error{fmt::format("schedule.layers_per_stage: has {} entries; give {} (one per device) or {} (one per "
                                 "virtual stage, pp {} x chunks {})",
                                 config.schedule.layers_per_stage.size(), layout.devices, stage_count, layout.devices,
                                 layout.chunks)};
      layers = std::move(per_stage).value();
      break;
    }
    case LayerSplit::Balanced: layers = balanced_split(config.model.layers, stage_count, weights); break;
  }

  layout.stages.resize(static_cast<std::size_t>(stage_count));
  for (int device = 0; device < layout.devices; ++device)
    for (int chunk = 0; chunk < layout.chunks; ++chunk) {
      VirtualStage& stage = layout.stages[static_cast<std::size_t>(layout.stage_of(device, chunk))];
      stage.device = device;
      stage.chunk = chunk;
    }
  int next_layer = 0;
  for (int s = 0; s < stage_count; ++s) {
    VirtualStage& stage = layout.stages[static_cast<std::size_t>(s)];
    stage.first_layer = next_layer;
    stage.layers = layers[static_cast<std::size_t>(s)];
    next_layer += stage.layers;
  }
  layout.stages.front().has_embedding = vocab == VocabPlacement::OnStages;
  layout.stages.back().has_head = vocab == VocabPlacement::OnStages;
  return layout;
}

}  // namespace pipesim
