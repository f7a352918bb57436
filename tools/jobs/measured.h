#pragma once
/// A runtime measurement in the simulator's terms: the same report (metrics, JSON shape) with the
/// measured timeline and memory, and a profile of measured per-op times (profile.h) that `simulate
/// --profile` takes as its cost source -- which is how the simulator is checked against real runs.
#include <nlohmann/json.hpp>
#include <string>

#include "executor.h"
#include "plan.h"
#include "plan_job.h"
#include "profile.h"
#include "report.h"

namespace pipesim {

/// Metrics from the measured timeline; memory is what the runtime held (fp32 weights, gradients and
/// live activations), not the cost model's estimate. MFU is not reported: it is defined against the
/// config's GPU, which a CPU run does not use.
RunReport measured_report(const Plan& plan, const runtime::RunResult& result, const std::string& backend);

/// The measured last step as explicit costs: compute ops averaged per device and scaled to an even
/// share of the layers (as the `costs` block defines them); communication ops by the fastest one
/// seen, since the others include waiting for peers.
ExplicitCosts measured_costs(const Plan& plan, const runtime::RunResult& result);

/// measured_costs as a profile (profile_json).
nlohmann::ordered_json measured_profile(const Plan& plan, const runtime::RunResult& result);

}  // namespace pipesim
