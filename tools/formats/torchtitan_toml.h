#pragma once
/// A torchtitan job TOML for a plan, and a pipesim config from one. Sections and keys as torchtitan's
/// TOML job configs name them (torchtitan/config/job_config.py up to the release that replaced TOML
/// files with Python config registries; docs/frameworks.md), schedules by the names of
/// torch.distributed.pipelining.
#include <optional>
#include <string>
#include <vector>

#include "config.h"
#include "megatron_args.h"
#include "status.h"

namespace pipesim {

/// The job TOML: [job], [model] (llama3 and its flavor where the shape is one of torchtitan's, else
/// "custom" with the shape in a comment), [training], [parallelism], [activation_checkpoint],
/// [compile]. The config must be one torchtitan runs (frameworks.h); `what` names it in the header.
std::string torchtitan_toml(const Config& config, const std::vector<int>& layers_per_stage, const std::string& what);

/// A pipesim config's JSON from a job TOML. `model`: a config whose model block is used where the
/// TOML's flavor is not one pipesim knows (llama3 8B, 70B, 405B).
Result<ImportedConfig> config_from_torchtitan(const std::string& text, const std::string& source,
                                              const std::optional<ModelConfig>& model);

}  // namespace pipesim
