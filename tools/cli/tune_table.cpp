#include "tune_table.h"

#include <fmt/format.h>

#include <algorithm>

namespace pipesim {
namespace {

/// One row in tune_columns' order, from compare's cells of the run.
std::vector<std::string> tune_cells(const std::string& rank, std::vector<std::string> compared, const Config& config,
                                    const std::string& changes) {
  const std::vector<Column> columns = comparison_columns();
  const auto after_names = std::find_if(columns.begin(), columns.end(), [](const Column& c) { return c.name == "vocab"; }) -
                           columns.begin() + 1;
  const std::vector<std::string> knobs = knob_cells(config);
  compared.insert(compared.begin() + after_names, knobs.begin(), knobs.end());
  compared.insert(compared.begin(), rank);
  compared.push_back(changes);
  return compared;
}

/// The config as given as a row of compare's cells: its run against itself, or only its names when it
/// cannot run.
std::vector<std::string> yours_cells(const Config& config, const TuneResult& r) {
  if (r.yours) return comparison_cells(*r.yours, *r.yours);
  std::vector<std::string> cells(comparison_columns().size(), "-");
  cells[0] = config.source, cells[1] = config.schedule.name, cells[2] = vocab_mode_name(config.schedule.vocab);
  return cells;
}

}  // namespace

std::string yours_changes(const TuneResult& r) {
  if (!r.yours) return "yours, which cannot run: " + r.yours_error;
  const RunMetrics& m = r.yours->metrics;
  if (m.fits_in_memory) return "yours";
  const auto gib = [](Bytes b) { return double(b) / double(1ull << 30); };
  return fmt::format("yours, which does not fit: {} GiB on its fullest device, over {:.2f} GiB",
                     memory_cell(gib(max_peak(*r.yours))), gib(m.memory_capacity_bytes));
}

std::vector<Column> tune_columns() {
  std::vector<Column> columns = comparison_columns();
  const auto after_names =
      std::find_if(columns.begin(), columns.end(), [](const Column& c) { return c.name == "vocab"; }) + 1;
  std::vector<Column> knobs;
  for (const Knob knob : shown_knobs()) knobs.push_back({std::string(knob_name(knob)), knob == Knob::Recompute});
  columns.insert(after_names, knobs.begin(), knobs.end());
  columns.insert(columns.begin(), {"rank", false});
  columns.push_back({"changes", true});
  return columns;
}

std::vector<std::vector<std::string>> tune_table_rows(const Config& config, const TuneResult& r,
                                                      const RunReport& reference) {
  std::vector<std::vector<std::string>> cells{tune_cells("-", yours_cells(config, r), config, yours_changes(r))};
  for (std::size_t i = 0; i < r.rows.size(); ++i) {
    const TuneRow& row = r.rows[i];
    cells.push_back(tune_cells(std::to_string(i + 1), comparison_cells(row.report, reference), row.config, row.changes));
  }
  return cells;
}

const RunReport& tune_reference(const TuneResult& r) { return r.yours ? *r.yours : r.rows.front().report; }

std::string tune_reference_name(const TuneResult& r) {
  return r.yours ? "yours (the config as given)" : "rank 1 (the fastest; yours cannot run)";
}

}  // namespace pipesim
