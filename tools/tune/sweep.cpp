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

std::string format_sweep(const std::vector<GridAxis>& axes, const std::vector<std::vector<std::string>>& points,
                         const std::vector<SweepRow>& rows, Format format) {
  if (format == Format::Json) {
    nlohmann::ordered_json all = nlohmann::ordered_json::array();
    for (std::size_t i = 0; i < rows.size(); ++i) {
      nlohmann::ordered_json row;
      for (std::size_t a = 0; a < axes.size(); ++a) {  // as --set reads it: JSON when it parses
        const std::string value = points[i][a].substr(axes[a].key.size() + 1);
        const nlohmann::ordered_json parsed = nlohmann::ordered_json::parse(value, nullptr, false);
        row[axes[a].key] = parsed.is_discarded() ? nlohmann::ordered_json(value) : parsed;
      }
      if (rows[i].report)
        row.update(run_json(*rows[i].report));
      else
        row["error"] = rows[i].error;
      all.push_back(row);
    }
    return json_text(all, 2) + "\n";
  }
  std::vector<Column> columns;
  for (const GridAxis& axis : axes) columns.push_back({axis.key, true});
  const std::vector<Column> compared = comparison_columns();
  columns.insert(columns.end(), compared.begin(), compared.end());
  const auto first = std::find_if(rows.begin(), rows.end(), [](const SweepRow& r) { return r.report.has_value(); });
  // CSV keeps one shape for scripts; a table for people shows the column only when a point failed.
  const bool errors = format == Format::Csv ||
                      std::any_of(rows.begin(), rows.end(), [](const SweepRow& r) { return !r.report.has_value(); });
  if (errors) columns.push_back({"error", true});
  std::vector<std::vector<std::string>> cells;
  for (std::size_t i = 0; i < rows.size(); ++i) {
    std::vector<std::string> row;
    for (std::size_t a = 0; a < axes.size(); ++a) row.push_back(points[i][a].substr(axes[a].key.size() + 1));
    const std::vector<std::string> run =
        rows[i].report ? comparison_cells(*rows[i].report, *first->report) : std::vector<std::string>(compared.size());
    row.insert(row.end(), run.begin(), run.end());
    if (errors) row.push_back(rows[i].error);
    cells.push_back(std::move(row));
  }
  return format_table(columns, cells, format);
}

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

std::vector<std::vector<std::string>> grid_points(const std::vector<GridAxis>& axes) {
  std::vector<std::vector<std::string>> points{{}};
  for (const GridAxis& axis : axes) {
    std::vector<std::vector<std::string>> longer;
    for (const std::vector<std::string>& point : points)
      for (const std::string& value : axis.values) {
        longer.push_back(point);
        longer.back().push_back(axis.key + "=" + value);
      }
    points = std::move(longer);
  }
  return points;
}


std::vector<SweepRow> sweep(std::string_view config_text, const std::string& source,
                            const std::vector<std::string>& overrides, const std::vector<std::vector<std::string>>& points,
                            bool show_progress) {
  std::vector<SweepRow> rows(points.size());
  ProgressBar progress(points.size(), show_progress);
  parallel_for(points.size(), [&](std::size_t i) {
    std::vector<std::string> point_overrides = overrides;
    point_overrides.insert(point_overrides.end(), points[i].begin(), points[i].end());
    rows[i] = evaluate(config_text, source, point_overrides);
    progress.advance(1, rows[i].report ? rows[i].report->metrics.tokens_per_s : 0);
  });
  return rows;
}

}  // namespace pipesim
