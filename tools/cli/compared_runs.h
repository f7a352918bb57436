#pragma once
/// compare's runs, shared by `compare` (which prints their table) and `report` (which also draws each):
/// every config × schedule × vocabulary mode, in that order, so both show the same rows.
#include <CLI/CLI.hpp>
#include <functional>
#include <string>
#include <vector>

#include "report.h"
#include "simulate_config.h"
#include "status.h"

namespace pipesim {

struct CompareSelection {
  std::vector<std::string> configs;
  std::vector<std::string> schedules;  ///< empty: every schedule that accepts the config
  std::vector<std::string> vocab;      ///< empty: every vocabulary mode
  std::vector<std::string> overrides;  ///< --set
};

/// The configs (positional), --schedules, --vocab and --set, as compare and report take them.
void add_compare_selection(CLI::App& command, CompareSelection& selection);

/// Simulates the selection and returns one report per run. `each` sees every run while its plan and
/// timeline are alive (report draws them there, so that no more than one plan is held at a time). With
/// no --schedules, a schedule that refuses a config is skipped with a note on stderr; `progress` draws
/// a progress line there. Errors: a config that does not load, a named schedule that cannot run, or
/// nothing that ran.
Result<std::vector<RunReport>> compare_runs(const CompareSelection& selection, bool progress,
                                            const std::function<void(const SimulatedRun&)>& each = {});

}  // namespace pipesim
