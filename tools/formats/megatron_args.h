#pragma once
/// Megatron-LM's pretrain_gpt.py arguments for a plan, and a pipesim config from them. Names as
/// NVIDIA/Megatron-LM defines them (megatron/training/arguments.py, and the dataclass fields of
/// megatron/core/model_parallel_config.py and transformer/transformer_config.py that become
/// --dashed-names; docs/frameworks.md).
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "config.h"
#include "status.h"

namespace pipesim {

/// One argument per line ("--name value" or "--name"), after comment lines ("# ...") that say where
/// the plan came from and how many GPUs it launches on. `layers_per_stage`: the split the plan runs,
/// one count per device (a redistribute split becomes --decoder-first/last-pipeline-num-layers).
/// The config must be one Megatron-LM runs (frameworks.h); `what` names it in the first comment.
std::string megatron_arguments(const Config& config, const std::vector<int>& layers_per_stage, const std::string& what);

/// What an arguments file gave, as a pipesim config's JSON, and the arguments pipesim does not model
/// (data, optimiser, logging ...), which it ignores. `gpus`: the world size, which arguments do not
/// carry; without it the "launch on N GPUs" comment megatron_arguments writes, or else an error.
struct ImportedConfig {
  nlohmann::json config;
  std::vector<std::string> ignored;
};
Result<ImportedConfig> config_from_megatron(const std::string& text, const std::string& source,
                                            std::optional<int> gpus);

}  // namespace pipesim
