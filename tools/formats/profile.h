#pragma once
/// The profile `pipesim run --profile` writes and `simulate --profile` reads: a run's measured op times
/// as an explicit `costs` block, with the plan they were measured on (config, schedule, vocabulary
/// mode, layer split, model shape, pipeline and tensor-parallel sizes), so that a profile given to a
/// config of another shape is refused rather than timed.
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "config.h"
#include "plan.h"
#include "status.h"

namespace pipesim {

/// How every profile pipesim writes begins (profile_json's text with an indent of 2); a file that
/// begins so may be replaced by a new profile.
constexpr std::string_view kProfileGenerator = "{\n  \"generator\": \"pipesim run\"";

/// {"generator", "config", "schedule", "vocab", "layers_per_stage", "model", "pp", "tp", "costs": {...}}:
/// `costs`, measured on `plan`, as a profile. Of the costs only what a run measures is written: the
/// per-device compute times, the vocabulary layers' and the communication ops' times and the
/// optimizer's (no activation bytes).
nlohmann::ordered_json profile_json(const Plan& plan, const ExplicitCosts& costs);

/// The config with a profile's costs (and, for `redistribute`, its layer split) applied; refused,
/// naming `profile_path` and the field, when the profile measured another model or pipeline.
Result<Config> apply_profile(Config config, std::string_view profile_text, const std::string& profile_path);

}  // namespace pipesim
