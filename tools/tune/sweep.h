#pragma once
/// `pipesim sweep`: the Cartesian product of --grid values, each point a set of --set overrides,
/// one row each (docs/tune.md).
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "report.h"
#include "status.h"

namespace pipesim {

/// One --grid: a --set key and the values it takes, in the order given.
struct GridAxis {
  std::string key;
  std::vector<std::string> values;
};

/// `key.path=v1,v2,...`. Commas inside brackets, braces or quotes belong to their value, so a
/// value can be a list: --grid schedule.layers_per_stage=[5,5,4,2],[4,4,4,4].
Result<GridAxis> parse_grid(const std::string& argument);

/// Every --grid argument, checked against the config: a key the config does not know is an error
/// naming --grid (not a row error at every point), as is a key given twice or too many points.
Result<std::vector<GridAxis>> parse_grids(const std::vector<std::string>& arguments, std::string_view config_text,
                                          const std::string& source, const std::vector<std::string>& overrides);

/// The points in grid order (the first --grid varies slowest), each as one "key=value" per axis.
std::vector<std::vector<std::string>> grid_points(const std::vector<GridAxis>& axes);

/// One point's result: its report, or why it could not run.
struct SweepRow {
  std::optional<RunReport> report;
  std::string error;
};

/// Every point simulated on the worker pool (worker_pool.h), rows in grid order; a progress bar on
/// standard error when `show_progress`.
std::vector<SweepRow> sweep(std::string_view config_text, const std::string& source,
                            const std::vector<std::string>& overrides, const std::vector<std::vector<std::string>>& points,
                            bool show_progress);

/// The rows with one column per grid axis, as `format` asks.
std::string format_sweep(const std::vector<GridAxis>& axes, const std::vector<std::vector<std::string>>& points,
                         const std::vector<SweepRow>& rows, Format format);

}  // namespace pipesim
