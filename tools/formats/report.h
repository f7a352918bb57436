#pragma once
/// One run's results as the user sees them: JSON (the stable shape), text, CSV and Markdown.
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "metrics.h"
#include "plan.h"

namespace pipesim {

struct RunReport {
  std::string config;  ///< config source (file name)
  std::string schedule;
  std::string vocab;
  std::string cost_source;  ///< analytic, explicit, or measured (...)
  /// MFU is the model's FLOPs against the config's GPU over the cost model's time: it has no meaning
  /// for a measured run (another GPU, perhaps) or explicit costs (times the user gave), and reads n/a.
  bool mfu_defined = true;
  ParallelConfig parallel;
  TrainingConfig training;  ///< recomputation, ZeRO and overlaps, as planned
  Fp8Format fp8 = Fp8Format::None;
  std::vector<int> layers_per_stage;
  int vocab_padding = 0;  ///< rows added so the vocabulary splits evenly over the devices
  std::vector<std::string> peak_ops;  ///< per device: the op at which memory peaked
  RunMetrics metrics;
};

/// A memory amount (GiB or MiB) as a table shows it: two decimals from 1 up; below, three significant
/// digits (0.0123, 0.500), so that a small model's memory never reads 0.00. 0 is "0.00".
std::string memory_cell(double amount);

/// The run's MFU as a table shows it: a percentage with `decimals` digits, or n/a (see mfu_defined).
std::string mfu_cell(const RunReport& report, int decimals);

/// The largest device's peak memory (static + activations): the run's `peak_memory_bytes`.
Bytes max_peak(const RunReport& report);

RunReport make_report(const Plan& plan, const std::string& cost_source, const RunMetrics& metrics);

enum class Format { Text, Json, Csv, Markdown };

/// simulate: one object (JSON) or a readable summary with a per-device table (text).
std::string format_run(const RunReport& report, Format format);
/// The JSON object of one run, keys in documented order (what `simulate --format json` prints).
nlohmann::ordered_json run_json(const RunReport& report);
/// compare: one row per run, speedup and memory against the first row (the reference), which a line
/// under the table (text, Markdown) or each object's `reference` (JSON) names.
std::string format_comparison(const std::vector<RunReport>& reports, Format format);

/// The run's tokens/s over the reference's: a throughput ratio, which holds when rows run different
/// batches (an iteration-time ratio does not).
double speedup(const RunReport& report, const RunReport& reference);
/// A run's object in a comparison's JSON: run_json with its `speedup` against the reference and
/// whether it is the `reference`.
nlohmann::ordered_json comparison_json(const RunReport& report, const RunReport& reference, bool is_reference);
/// compare's reference as the line under its table names it: "row 1 (c.json, 1f1b, baseline)".
std::string comparison_reference(const RunReport& reference);
/// The line under a comparison table (text, Markdown; empty for CSV and JSON) saying what speedup and
/// mem_vs_first are measured against: `reference` names the row, e.g. "row 1 (c.json, 1f1b, baseline)".
std::string reference_line(const std::string& reference, Format format);

/// One column of a table: its name, and whether it holds names (left-aligned) or numbers.
struct Column {
  std::string name;
  bool left = false;
};
/// Aligned text, Markdown or CSV (a cell with a comma, quote or line break quoted, as RFC 4180 says);
/// every row has one cell per column. Not for JSON: callers build their own objects.
std::string format_table(const std::vector<Column>& columns, const std::vector<std::vector<std::string>>& rows,
                         Format format);
/// The same, with the rows produced on demand, each twice (for the column widths, then to write it),
/// and written to `out` a line at a time: for tables too large to hold as cells (a sweep's).
void write_table(const std::vector<Column>& columns, std::size_t row_count,
                 const std::function<std::vector<std::string>(std::size_t)>& row, Format format,
                 const std::function<void(std::string_view)>& out);
/// One line of CSV, as format_table writes each row.
std::string csv_line(const std::vector<std::string>& cells);
/// compare's columns, and one run's cells in them (speedup and memory against `reference`), for
/// commands that print compare's table with columns of their own around it (tune, sweep).
std::vector<Column> comparison_columns();
std::vector<std::string> comparison_cells(const RunReport& report, const RunReport& reference);

}  // namespace pipesim
