#include "sweep.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <optional>

#include "config_json.h"
#include "files.h"
#include "json_text.h"
#include "simulate_config.h"
#include "spellcheck.h"
#include "worker_pool.h"

namespace pipesim {
namespace {

constexpr std::size_t kMaxPoints = 1'000'000;
/// Points simulated between two hand-overs of their rows: enough to keep every worker busy, few enough
/// that their reports take a few megabytes.
constexpr std::size_t kBatch = 4096;
constexpr const char* kGridUsage = "give key.path=v1,v2,... with keys as --set takes them (e.g. --grid parallel.pp=2,4,8)";

/// Values split at the commas outside brackets, braces and quotes.
std::vector<std::string> split_values(const std::string& list) {
  std::vector<std::string> values(1);
  int depth = 0;
  bool quoted = false;
  for (char c : list) {
    if (c == '"') quoted = !quoted;
    if (!quoted && (c == '[' || c == '{')) ++depth;
    if (!quoted && (c == ']' || c == '}')) --depth;
    if (c == ',' && depth == 0 && !quoted)
      values.emplace_back();
    else
      values.back() += c;
  }
  return values;
}

SweepRow evaluate(std::string_view text, const std::string& source, const std::vector<std::string>& overrides) {
  Result<Config> config = parse_config(text, source, overrides);
  if (!config.ok()) return {std::nullopt, config.error().message};
  Result<SimulatedRun> run = simulate_config(config.value());
  if (!run.ok()) return {std::nullopt, run.error().message};
  return {std::move(run.value().report), ""};
}


}  // namespace

Result<GridAxis> parse_grid(const std::string& argument) {
  const std::size_t eq = argument.find('=');
  if (eq == std::string::npos || eq == 0)
    return Error{fmt::format("--grid '{}': no {}; {}", abbreviate(argument), eq ? "'=' after the key" : "key before '='",
                             kGridUsage)};
  GridAxis axis{argument.substr(0, eq), {}};
  if (eq + 1 == argument.size())
    return Error{fmt::format("--grid '{}': no values after '='; {}", abbreviate(argument), kGridUsage)};
  axis.values = split_values(argument.substr(eq + 1));
  for (std::size_t i = 0; i < axis.values.size(); ++i)
    if (axis.values[i].empty())
      return Error{fmt::format("--grid '{}': value {} is empty; {}", abbreviate(argument), i + 1, kGridUsage)};
  return axis;
}

Result<std::vector<GridAxis>> parse_grids(const std::vector<std::string>& arguments, std::string_view config_text,
                                          const std::string& source, const std::vector<std::string>& overrides) {
  if (arguments.empty()) return Error{"--grid: required; " + std::string(kGridUsage)};
  std::vector<GridAxis> axes;
  std::size_t points = 1;
  for (const std::string& argument : arguments) {
    Result<GridAxis> axis = parse_grid(argument);
    if (!axis.ok()) return axis.error();
    const std::string& key = axis.value().key;
    for (const GridAxis& earlier : axes)
      if (earlier.key == key)
        return Error{fmt::format("--grid: key '{}' is given twice; put all its values in one --grid", abbreviate(key))};
    std::vector<std::string> probe = overrides;
    probe.push_back(key + "=" + axis.value().values.front());
    if (std::optional<Error> e = key_error(config_text, source, probe))
      return Error{fmt::format("--grid '{}': {}; use a key as --set takes it (docs/config.md lists them)",
                               abbreviate(argument), e->message)};
    points *= axis.value().values.size();
    if (points > kMaxPoints)
      return Error{fmt::format("--grid: more than {} points; sweep fewer values", kMaxPoints)};
    axes.push_back(std::move(axis).value());
  }
  return axes;
}

std::size_t point_count(const std::vector<GridAxis>& axes) {
  std::size_t count = 1;
  for (const GridAxis& axis : axes) count *= axis.values.size();  // parse_grids caps it
  return count;
}

std::vector<std::string> grid_point(const std::vector<GridAxis>& axes, std::size_t index) {
  std::vector<std::string> point(axes.size());
  for (std::size_t a = axes.size(); a-- > 0;) {  // the last axis varies fastest
    const std::vector<std::string>& values = axes[a].values;
    point[a] = axes[a].key + "=" + values[index % values.size()];
    index /= values.size();
  }
  return point;
}

std::vector<std::vector<std::string>> grid_points(const std::vector<GridAxis>& axes) {
  std::vector<std::vector<std::string>> points;
  for (std::size_t i = 0; i < point_count(axes); ++i) points.push_back(grid_point(axes, i));
  return points;
}

void sweep(std::string_view config_text, const std::string& source, const std::vector<std::string>& overrides,
           const std::vector<GridAxis>& axes, bool show_progress,
           const std::function<void(std::size_t index, SweepRow&& row)>& row_done) {
  const std::size_t count = point_count(axes);
  ProgressBar progress(count, show_progress);
  std::vector<SweepRow> rows;
  for (std::size_t first = 0; first < count; first += kBatch) {
    rows.assign(std::min(kBatch, count - first), SweepRow{});
    parallel_for(rows.size(), [&](std::size_t k) {
      std::vector<std::string> point_overrides = overrides;
      for (std::string& setting : grid_point(axes, first + k)) point_overrides.push_back(std::move(setting));
      rows[k] = evaluate(config_text, source, point_overrides);
      progress.advance(1, rows[k].report ? rows[k].report->metrics.tokens_per_s : 0);
    });
    for (std::size_t k = 0; k < rows.size(); ++k) row_done(first + k, std::move(rows[k]));
  }
}

SweepTable::SweepTable(const std::vector<GridAxis>& axes, Format format, std::function<void(std::string_view)> out)
    : axes_(axes), format_(format), out_(std::move(out)) {}

std::vector<std::string> SweepTable::grid_cells(std::size_t index) const {
  std::vector<std::string> cells = grid_point(axes_, index);
  for (std::size_t a = 0; a < axes_.size(); ++a) cells[a].erase(0, axes_[a].key.size() + 1);
  return cells;
}

void SweepTable::add(std::size_t index, const SweepRow& row) {
  if (row.report && !first_) {
    first_ = row.report;
    first_index_ = index;
  }
  failed_ |= !row.report;
  const std::vector<std::string> values = grid_cells(index);
  if (format_ == Format::Json) {
    nlohmann::ordered_json object;
    for (std::size_t a = 0; a < axes_.size(); ++a) {  // as --set reads it: JSON when it parses
      const nlohmann::ordered_json parsed = nlohmann::ordered_json::parse(values[a], nullptr, false);
      object[axes_[a].key] = parsed.is_discarded() ? nlohmann::ordered_json(values[a]) : parsed;
    }
    if (row.report)
      object.update(comparison_json(*row.report, *first_, index == first_index_));
    else
      object["error"] = row.error;
    // As the array's element: one level deeper than the object alone (its strings hold no line breaks).
    std::string text = index == 0 ? "[\n  " : ",\n  ";
    for (char c : json_text(object, 2)) {
      text += c;
      if (c == '\n') text += "  ";
    }
    out_(text);
    return;
  }
  std::vector<std::string> cells = values;
  const std::vector<std::string> run =
      row.report ? comparison_cells(*row.report, *first_) : std::vector<std::string>(comparison_columns().size());
  cells.insert(cells.end(), run.begin(), run.end());
  if (format_ == Format::Csv) {  // one shape for scripts: the error column always
    if (index == 0) {
      std::vector<std::string> header;
      for (const Column& column : columns(true)) header.push_back(column.name);
      out_(csv_line(header));
    }
    cells.push_back(row.error);
    out_(csv_line(cells));
    return;
  }
  cells.push_back(row.error);
  for (const std::string& cell : cells) cell_ends_.push_back((text_ += cell).size());
}

void SweepTable::finish() {
  if (format_ == Format::Json) {
    out_("\n]\n");
    return;
  }
  if (format_ == Format::Csv) return;
  // A table for people shows the error column only when a point failed.
  const std::size_t width = columns(true).size();
  const auto row = [&](std::size_t i) {
    std::vector<std::string> cells;
    for (std::size_t c = i * width; c < (i + 1) * width - (failed_ ? 0 : 1); ++c) {
      const std::size_t begin = c == 0 ? 0 : cell_ends_[c - 1];
      cells.push_back(text_.substr(begin, cell_ends_[c] - begin));
    }
    return cells;
  };
  write_table(columns(failed_), cell_ends_.size() / width, row, format_, out_);
  if (first_)
    out_(reference_line(fmt::format("row {} ({})", first_index_ + 1, fmt::join(grid_point(axes_, first_index_), ", ")),
                        format_));
}

std::vector<Column> SweepTable::columns(bool with_errors) const {
  std::vector<Column> columns;
  for (const GridAxis& axis : axes_) columns.push_back({axis.key, true});
  const std::vector<Column> compared = comparison_columns();
  columns.insert(columns.end(), compared.begin(), compared.end());
  if (with_errors) columns.push_back({"error", true});
  return columns;
}

}  // namespace pipesim
