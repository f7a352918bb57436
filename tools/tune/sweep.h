#pragma once
/// `pipesim sweep`: the Cartesian product of --grid values, each point a set of --set overrides,
/// one row each (docs/tune.md).
#include <functional>
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

/// How many points the grids make: the product of their value counts.
std::size_t point_count(const std::vector<GridAxis>& axes);
/// Point `index` in grid order (the first --grid varies slowest), as one "key=value" per axis.
std::vector<std::string> grid_point(const std::vector<GridAxis>& axes, std::size_t index);
/// Every point in grid order.
std::vector<std::vector<std::string>> grid_points(const std::vector<GridAxis>& axes);

/// One point's result: its report, or why it could not run.
struct SweepRow {
  std::optional<RunReport> report;
  std::string error;
};

/// Every point simulated on the worker pool (worker_pool.h), a batch of points at a time; each batch's
/// rows go to `row_done` in grid order, on the calling thread, before the next batch starts. A sweep
/// so holds a batch of reports, never all of them (a million points would take gigabytes). A progress
/// bar on standard error when `show_progress`.
void sweep(std::string_view config_text, const std::string& source, const std::vector<std::string>& overrides,
           const std::vector<GridAxis>& axes, bool show_progress,
           const std::function<void(std::size_t index, SweepRow&& row)>& row_done);

/// The rows with one column per grid axis, as `format` asks, written to `out` as the rows come: CSV and
/// JSON a row at a time, text and Markdown (whose column widths depend on every row) at finish().
class SweepTable {
 public:
  SweepTable(const std::vector<GridAxis>& axes, Format format, std::function<void(std::string_view)> out);
  /// Row `index` (in grid order: each index once, in increasing order).
  void add(std::size_t index, const SweepRow& row);
  /// Writes what is left.
  void finish();
  /// Whether any point ran (some failing is what a sweep finds out; all failing is a mistake).
  bool any_ran() const { return first_.has_value(); }

 private:
  std::vector<std::string> grid_cells(std::size_t index) const;  ///< the grid values of row `index`
  std::vector<Column> columns(bool with_errors) const;

  const std::vector<GridAxis>& axes_;
  const Format format_;
  const std::function<void(std::string_view)> out_;
  std::optional<RunReport> first_;  ///< the first row that ran: the others' speedup and memory are against it
  std::size_t first_index_ = 0;     ///< with first_: its row
  bool failed_ = false;             ///< a point could not run
  /// Text and Markdown, until finish(): every row's cells, the error last, one after another (a million
  /// rows of cells as strings of their own would take a gigabyte), and where each cell ends.
  std::string text_;
  std::vector<std::size_t> cell_ends_;
};

}  // namespace pipesim
