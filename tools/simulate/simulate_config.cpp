#include "simulate_config.h"

#include <fmt/format.h>

#include <mutex>
#include <set>
#include <string>
#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include "cost_model.h"
#include "metrics.h"
#include "parallel_shape.h"
#include "simulator.h"
#include "sizes.h"
#include "two_threads.h"
#include "validate.h"

namespace pipesim {
namespace {

constexpr std::int64_t kSlowPlanTasks = 20'000'000;

/// Whether the note on `source`'s slow plans is yet to be given: tune and sweep plan candidates of one
/// config on every core at once, and each would give the same note.
bool first_slow_plan_note(const std::string& source) {
  static std::mutex mutex;
  static std::set<std::string> noted;
  const std::lock_guard lock(mutex);
  return noted.insert(source).second;
}

}  // namespace

void share_one_heap() {
#if defined(__GLIBC__)
  mallopt(M_ARENA_MAX, 1);
#endif
}

Result<Plan> plan_within_memory(const Config& config, const CustomSchedule* custom, Validation validation) {
  if (std::optional<FieldError> e = check_plan_fits(config, host_memory_bytes()))
    return Error{fmt::format("{}: {}: {}", config.source, e->path, e->message)};
  // A plan that fits can still take minutes (about 2 s per million tasks): say so before starting.
  if (const std::int64_t tasks = estimated_tasks(config).value_or(0);
      tasks > kSlowPlanTasks && first_slow_plan_note(config.source))
    fmt::print(stderr, "pipesim: note: {}: about {} million tasks (~{:.1f} GiB); building and simulating may take "
               "minutes\n", config.source, tasks / 1'000'000, double(tasks * limits::kBytesPerTask) / double(1 << 30));
  Result<Plan> plan = make_plan(config, custom, validation);
  if (!plan.ok()) return Error{fmt::format("{}: {}", config.source, plan.error().message)};
  return plan;
}

Result<SimulatedRun> simulate_config(const Config& config, const CustomSchedule* custom,
                                     const std::optional<ExplicitCosts>& timing) {
  Result<Plan> plan = plan_within_memory(config, custom, Validation::ByCaller);
  if (!plan.ok()) return plan.error();
  SimulatedRun run{std::move(plan).value(), {}, {}};
  const Plan& p = run.plan;
  // The plan's own cost model, unless measured op times replace the config's costs.
  std::shared_ptr<const CostModel> costs = p.costs;
  if (timing) {
    Config timed = p.config;
    timed.costs = timing;
    costs = make_cost_model(timed, p.layout);
  }
  // Planning may have validated and simulated the graph already, under the config's own costs.
  const bool simulated = !timing && p.timeline;
  // Computed before the structure checks start (it runs in two halves itself).
  std::vector<TimeNs> durations = simulated ? std::vector<TimeNs>{} : op_durations(*costs, p.graph);
  // The structure checks only read the graph, and the simulator copes with any graph assemble
  // builds: on a large graph they run on a second thread during the simulation, which a failure
  // discards. Orderability is the simulation's own outcome (Validation).
  std::future<Status> structure = beside(!simulated && p.graph.size() >= kOpsWorthAThread, [&p, simulated] {
    return simulated ? Status::Ok() : validate_structure(p.graph, p.layout, p.config.parallel.microbatches);
  });
  Result<Timeline> timeline = simulated ? Result<Timeline>(*std::move(run.plan.timeline)) : simulate(p.graph, std::move(durations));
  run.plan.timeline.reset();
  const auto invalid = [&](const Error& why) {
    return Error{fmt::format("{}: {}", config.source, invalid_graph(p.config, why).message)};
  };
  if (Status s = structure.get(); !s.ok()) return invalid(s.error());
  if (!timeline.ok()) {
    // A graph that cannot run to its end: name the cycle, as make_plan's own check would have.
    if (Status s = check_orderable(p.graph); !s.ok()) return invalid(s.error());
    return Error{fmt::format("{}: {}", config.source, timeline.error().message)};
  }
  run.timeline = std::move(timeline).value();
  const RunMetrics metrics = compute_metrics(run.plan.config, run.plan.graph, run.timeline, run.plan.static_bytes);
  run.report = make_report(run.plan, std::string(costs->source()), metrics);
  if (timing) run.report.mfu_defined = false;  // measured op times, not the hardware's FLOP rate: no MFU
  return run;
}

}  // namespace pipesim
