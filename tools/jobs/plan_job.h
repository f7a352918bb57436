#pragma once
/// From the planner to the runtime: what the runtime executes of a plan. The runtime never sees a
/// Plan (docs/architecture.md); this is the one place that makes its Job from one.
#include "job.h"
#include "plan.h"

namespace pipesim {

/// What the runtime executes of a plan: its graph, layout and model shape (borrowed from `plan`,
/// which must outlive the job), its microbatches, training settings and parallel sizes.
runtime::Job job_of(const Plan& plan);

}  // namespace pipesim
