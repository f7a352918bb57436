#pragma once
/// What the training frameworks a plan is carried into can run: Megatron-LM, torchtitan and plain
/// PyTorch (torch.distributed.pipelining). `tune --framework` keeps the candidates a framework runs,
/// and `export` refuses what it cannot run, or writes the nearest plan it can with the changes named
/// (docs/frameworks.md says where each rule comes from in the framework's source).
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "config.h"

namespace pipesim {

enum class Framework { Any, Megatron, Torchtitan, Pytorch };

std::string_view framework_name(Framework framework);
/// "any", "megatron", "torchtitan" or "pytorch"; nullopt otherwise.
std::optional<Framework> framework_named(std::string_view name);
std::vector<std::string> framework_names();

/// One thing in a config that a framework cannot run.
struct Unsupported {
  std::string field;   ///< the config field, e.g. "schedule.name"
  std::string reason;  ///< what the framework lacks, e.g. "Megatron-LM runs 1f1b and interleaved-1f1b"
  std::string nearest; ///< the value the nearest runnable plan takes, e.g. "1f1b"
};

/// What in `config` the framework cannot run; empty when it runs all of it. `layers_per_stage` is the
/// split the plan runs (one count per device, from the planned layout): frameworks that split layers
/// unevenly only at the ends are checked against it.
std::vector<Unsupported> unsupported(Framework framework, const Config& config, const std::vector<int>& layers_per_stage);

/// Whether a split over virtual stages (model order) is Megatron-LM's with the input embedding and the
/// loss each counted as a layer (--account-for-embedding-in-pipeline-split and
/// --account-for-loss-in-pipeline-split): k layers a stage, k - 1 on the first and on the last.
bool accounts_for_vocabulary(const std::vector<int>& split);

/// `config` with every unsupported field set to its nearest runnable value, and one line per change.
Config nearest_runnable(Framework framework, Config config, const std::vector<int>& layers_per_stage,
                        std::vector<std::string>& changes);

/// `config` with what the framework decides for itself whatever the config says: how its pipeline
/// transfers meet compute (synchronous in Megatron-LM's 1F1B, overlapped in PyTorch's pipelining),
/// and Megatron-Core's fused kernels.
/// `tune --framework` searches from it.
Config as_run_by(Framework framework, Config config);

}  // namespace pipesim
