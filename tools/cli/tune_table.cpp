#include "tune_table.h"

#include <fmt/format.h>

#include <algorithm>
#include <utility>

#include "parallel_shape.h"

namespace pipesim {
namespace {

/// Where compare's column `name` is among its columns.
std::ptrdiff_t comparison_index(std::string_view name) {
  const std::vector<Column> columns = comparison_columns();
  return std::find_if(columns.begin(), columns.end(), [&](const Column& c) { return c.name == name; }) - columns.begin();
}

/// One row in tune_columns' order, from compare's cells of the run and its per-GPU cells ("-" for a
/// run that cannot run). Inserted from the right, so each index is still compare's.
std::vector<std::string> tune_cells(const std::string& rank, std::vector<std::string> compared, const Config& config,
                                    const std::string& changes, const std::string& tokens_per_gpu,
                                    const std::string& speedup_per_gpu) {
  compared.insert(compared.begin() + comparison_index("speedup") + 1, speedup_per_gpu);
  compared.insert(compared.begin() + comparison_index("tokens_per_s") + 1, tokens_per_gpu);
  const std::vector<std::string> knobs = knob_cells(config);
  compared.insert(compared.begin() + comparison_index("vocab") + 1, knobs.begin(), knobs.end());
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

/// The per-GPU cells of a run against the reference, as compare writes tokens/s and speedup.
std::pair<std::string, std::string> per_gpu_cells(const RunReport& report, const RunReport& reference) {
  return {fmt::format("{:.0f}", tokens_per_s_per_gpu(report)), fmt::format("{:.3f}", speedup_per_gpu(report, reference))};
}

}  // namespace

double tokens_per_s_per_gpu(const RunReport& report) {
  return report.metrics.tokens_per_s / gpu_count(report.parallel);
}

double speedup_per_gpu(const RunReport& report, const RunReport& reference) {
  return tokens_per_s_per_gpu(report) / tokens_per_s_per_gpu(reference);
}

std::string yours_changes(const TuneResult& r) {
  if (!r.yours) return "yours, which cannot run: " + r.yours_error;
  const RunMetrics& m = r.yours->metrics;
  if (m.fits_in_memory) return "yours";
  const auto gib = [](Bytes b) { return double(b) / double(1ull << 30); };
  return fmt::format("yours, which does not fit: {} GiB on its fullest device, over {:.2f} GiB",
                     memory_cell(gib(max_peak(*r.yours))), gib(m.memory_capacity_bytes));
}

std::vector<Column> tune_columns(const Config& config) {
  std::vector<Column> columns = comparison_columns();
  columns.insert(columns.begin() + comparison_index("speedup") + 1, {"speedup_per_gpu"});
  columns.insert(columns.begin() + comparison_index("tokens_per_s") + 1, {"tokens_per_s_per_gpu"});
  std::vector<Column> knobs;
  for (const Knob knob : shown_knobs(config.model.has_experts())) knobs.push_back({std::string(knob_name(knob)), knob == Knob::Recompute});
  columns.insert(columns.begin() + comparison_index("vocab") + 1, knobs.begin(), knobs.end());
  columns.insert(columns.begin(), {"rank", false});
  columns.push_back({"changes", true});
  return columns;
}

std::vector<std::vector<std::string>> tune_table_rows(const Config& config, const TuneResult& r,
                                                      const RunReport& reference) {
  const auto [yours_tokens, yours_speedup] =
      r.yours ? per_gpu_cells(*r.yours, *r.yours) : std::pair<std::string, std::string>{"-", "-"};
  std::vector<std::vector<std::string>> cells{
      tune_cells("-", yours_cells(config, r), config, yours_changes(r), yours_tokens, yours_speedup)};
  for (std::size_t i = 0; i < r.rows.size(); ++i) {
    const TuneRow& row = r.rows[i];
    const auto [tokens, speedup] = per_gpu_cells(row.report, reference);
    cells.push_back(tune_cells(std::to_string(i + 1), comparison_cells(row.report, reference), row.config, row.changes,
                               tokens, speedup));
  }
  return cells;
}

const RunReport& tune_reference(const TuneResult& r) { return r.yours ? *r.yours : r.rows.front().report; }

std::string tune_reference_name(const TuneResult& r) {
  return r.yours ? "yours (the config as given)" : "rank 1 (the fastest; yours cannot run)";
}

}  // namespace pipesim
