#pragma once
/// tune's table: compare's columns with each row's rank, knobs and `changes`, under the config as
/// given (yours). Shared by `tune` (which prints it) and `report` (which shows it in the page).
#include <string>
#include <vector>

#include "report.h"
#include "tune.h"

namespace pipesim {

/// A run's tokens/s per GPU: its tokens/s ÷ its pp·tp·dp·cp GPUs. `tune --gpus` ranks rows on another
/// GPU count than yours, whose total speedup then mixes the two counts; per GPU it does not.
double tokens_per_s_per_gpu(const RunReport& report);
/// The run's tokens/s per GPU ÷ the reference's.
double speedup_per_gpu(const RunReport& report, const RunReport& reference);

/// rank, compare's name columns (config, schedule, vocab), the knobs, compare's numbers with
/// tokens_per_s_per_gpu after tokens_per_s and speedup_per_gpu after speedup, changes.
std::vector<Column> tune_columns(const Config& config);

/// Yours first (rank "-"), then every row of `r` ranked from 1, measured against `reference`.
std::vector<std::vector<std::string>> tune_table_rows(const Config& config, const TuneResult& r,
                                                      const RunReport& reference);

/// The `changes` cell of the config as given: "yours", and why when it does not fit or cannot run.
std::string yours_changes(const TuneResult& r);

/// What the rows are measured against: yours, or the fastest row when yours cannot run.
const RunReport& tune_reference(const TuneResult& r);
/// The reference as the line under the table names it.
std::string tune_reference_name(const TuneResult& r);

}  // namespace pipesim
