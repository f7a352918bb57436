#include "pipeline.h"

#include <fmt/format.h>

#include "cost_model.h"
#include "metrics.h"
#include "simulator.h"

namespace pipesim {

Result<SimulatedRun> simulate_config(const Config& config, const CustomSchedule* custom,
                                     const std::optional<ExplicitCosts>& timing) {
  Result<Plan> plan = make_plan(config, custom);
  if (!plan.ok()) return Error{fmt::format("{}: {}", config.source, plan.error().message)};
  SimulatedRun run{std::move(plan).value(), {}, {}};
  Config timed = run.plan.config;
  if (timing) timed.costs = timing;
  const std::unique_ptr<CostModel> costs = make_cost_model(timed, run.plan.layout);
  Result<Timeline> timeline = simulate(run.plan.graph, op_durations(*costs, run.plan.graph));
  if (!timeline.ok()) return Error{fmt::format("{}: {}", config.source, timeline.error().message)};
  run.timeline = std::move(timeline).value();
  const RunMetrics metrics = compute_metrics(run.plan.config, run.plan.graph, run.timeline, run.plan.static_bytes);
  run.report = make_report(run.plan, std::string(costs->source()), metrics);
  return run;
}

}  // namespace pipesim
