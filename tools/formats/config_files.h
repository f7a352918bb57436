#pragma once
/// Reading a config file (with --set overrides and the --schedule/--vocab selection) and a schedule
/// file, as every command does.
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "config.h"
#include "custom_schedule.h"
#include "status.h"

namespace pipesim {

Result<Config> load_config(const std::string& path, const std::vector<std::string>& overrides);

/// Checks names given on the command line against a table: an unknown one is refused with the closest
/// names (`suggest`'s sentence; did_you_mean when none is given) and every known one.
Status check_names(const std::string& flag, const std::vector<std::string>& names, const std::vector<std::string>& known,
                   const std::function<std::string(const std::string&)>& suggest = {});

/// The config with --schedule and --vocab (when given) applied, after checking their names.
Result<Config> load_selected_config(const std::string& path, const std::vector<std::string>& overrides,
                                    const std::string& schedule, const std::string& vocab);

/// A PyTorch compute-only CSV schedule (--schedule-file) for `config`'s pp and microbatches; none
/// when `path` is empty.
Result<std::optional<CustomSchedule>> load_schedule_file(const std::string& path, const Config& config);

}  // namespace pipesim
