// Lower bounds on a config's peak memory and iteration time, from its layout and the cost model
// alone: `tune` skips what they show cannot fit or cannot win, without building the graph.
#include <fmt/format.h>

#include <algorithm>

#include "cost_model.h"
#include "plan.h"
#include "tune.h"

namespace pipesim {
namespace {

const VocabModeInfo* find_vocab_mode(const std::string& name) {
  for (const VocabModeInfo& mode : vocab_modes())
    if (mode.name == name) return &mode;
  return nullptr;
}

/// The layout make_plan builds for `config` (the same chunk count, split and placement), or its error.
Result<Layout> planned_layout(Config& config) {
  const ScheduleInfo* schedule = find_schedule(config.schedule.name);
  const VocabModeInfo* mode = find_vocab_mode(config.schedule.vocab);
  if (!schedule || !mode) return Error{fmt::format("{}: unknown schedule or vocabulary mode", config.source)};
  if (schedule->chunks > 0) config.parallel.chunks = schedule->chunks;
  // make_plan's rule: only `redistribute` reads layers_per_stage; empty there means auto.
  const bool redistribute = config.schedule.vocab == "redistribute";
  if (!redistribute) config.schedule.layers_per_stage.clear();
  if (std::optional<FieldError> e = check_config(config))
    return Error{fmt::format("{}: {}: {}", config.source, e->path, e->message)};
  const LayerSplit split = !redistribute                               ? LayerSplit::Even
                           : config.schedule.layers_per_stage.empty() ? LayerSplit::Balanced
                                                                       : LayerSplit::Explicit;
  Result<Layout> layout = make_layout(config, schedule->placement, split, stage_weights(config), mode->placement);
  if (!layout.ok()) return Error{fmt::format("{}: {}", config.source, layout.error().message)};
  return layout;
}

}  // namespace

Result<LowerBounds> lower_bounds(const Config& requested) {
  Config config = requested;
  Result<Layout> planned = planned_layout(config);
  if (!planned.ok()) return planned.error();
  const Layout& layout = planned.value();
  const std::vector<StageWork> work = stage_work(config, layout);
  const std::unique_ptr<CostModel> costs = make_cost_model(config, layout);
  const int m = config.parallel.microbatches;

  LowerBounds bounds{static_memory_bytes(config, layout), 0};
  std::vector<Bytes> activations(std::size_t(layout.devices), 0);
  std::vector<TimeNs> compute(std::size_t(layout.devices), 0);
  for (int s = 0; s < layout.stage_count(); ++s) {
    const auto d = std::size_t(layout.stages[std::size_t(s)].device);
    // A microbatch's forward in a device's later stage starts before the backward of its earlier
    // stages can: both activations are alive then.
    activations[d] += work[std::size_t(s)].activation_bytes;
    const StageTimes& t = costs->stage(s);
    compute[d] = add_ns(compute[d], times_ns(m, add_ns(add_ns(t.forward, t.backward), t.weight)));
  }
  // The output pass keeps its logits shard from S to T on every device.
  const Bytes logits = layout.vocab == VocabPlacement::OnStages ? 0 : vocab_work(config, layout).s_activation_bytes;
  for (std::size_t d = 0; d < activations.size(); ++d) {
    bounds.memory_bytes[d] += std::max(activations[d], logits);
    // kUnrepresentableNs (-1) is refused by the simulator; as a bound it just prunes nothing.
    bounds.iteration_ns = std::max(bounds.iteration_ns, compute[d]);
  }
  return bounds;
}

}  // namespace pipesim
