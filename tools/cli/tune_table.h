#pragma once
/// tune's table: compare's columns with each row's rank, knobs and `changes`, under the config as
/// given (yours). Shared by `tune` (which prints it) and `report` (which shows it in the page).
#include <string>
#include <vector>

#include "report.h"
#include "tune.h"

namespace pipesim {

/// rank, compare's name columns (config, schedule, vocab), the knobs, compare's numbers, changes.
std::vector<Column> tune_columns();

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
