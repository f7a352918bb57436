#pragma once
/// The path every CLI command shares: config -> plan -> durations -> simulation -> metrics.
#include <optional>

#include "config.h"
#include "plan.h"
#include "report.h"
#include "status.h"
#include "timeline.h"

namespace pipesim {

/// For commands that make one plan at a time (simulate, compare, export, bench): its helper threads
/// (src/two_threads.h) allocate from the main thread's heap, so that what one phase frees the next
/// reuses, whichever thread ran it (glibc would give each thread an arena of its own, whose freed
/// pages no other thread's allocations take: up to a fifth more memory touched on a V schedule).
/// Call before any thread starts; glibc fixes its arena count at the first thread's first
/// allocation. Commands running plans on a worker pool (tune, sweep) or ranks as threads (run) keep
/// an arena per thread.
void share_one_heap();

struct SimulatedRun {
  Plan plan;
  Timeline timeline;
  RunReport report;
};

/// make_plan, refused up front when its estimated size exceeds this machine's memory (before the
/// graph grows until the kernel ends the process). Errors name the config source and the field.
Result<Plan> plan_within_memory(const Config& config, const CustomSchedule* custom = nullptr,
                                Validation validation = Validation::InPlan);

/// Errors name the config source and the field to change. `custom` replaces the schedule generator.
/// With `timing`, the plan is made with the config's own costs and timed with these (a measured
/// profile): the prediction for the graph a run of this config executes.
Result<SimulatedRun> simulate_config(const Config& config, const CustomSchedule* custom = nullptr,
                                     const std::optional<ExplicitCosts>& timing = std::nullopt);

}  // namespace pipesim
