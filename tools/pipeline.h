#pragma once
/// The path every CLI command shares: config -> plan -> durations -> simulation -> metrics.
#include "config.h"
#include "plan.h"
#include "report.h"
#include "status.h"
#include "timeline.h"

namespace pipesim {

struct SimulatedRun {
  Plan plan;
  Timeline timeline;
  RunReport report;
};

/// Errors name the config source and the field to change. `custom` replaces the schedule generator.
Result<SimulatedRun> simulate_config(const Config& config, const CustomSchedule* custom = nullptr);

}  // namespace pipesim
