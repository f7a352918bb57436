// Lower bounds on a config's peak memory and iteration time, from its layout and the cost model
// alone: `tune` skips what they show cannot fit or cannot win, without building the graph.
#include <fmt/format.h>

#include <algorithm>

#include "cost_model.h"
#include "plan.h"
#include "tune.h"

namespace pipesim {

Result<LowerBounds> lower_bounds(const Config& requested) {
  Config config = requested;
  Result<PlannedLayout> planned = plan_layout(config);
  if (!planned.ok()) return Error{fmt::format("{}: {}", config.source, planned.error().message)};
  const Layout& layout = planned.value().layout;
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
