// `pipesim tune` as a command: options in, the search's rows out as compare's table with a
// `changes` column, or JSON with the search's counts.
#include <fmt/format.h>
#include <unistd.h>

#include <cstdio>
#include <nlohmann/json.hpp>

#include "cli_support.h"
#include "tune.h"

namespace pipesim {

ExitStatus run_tune(const TuneOptions& o) {
  Result<Config> config = load_config(o.config, o.overrides);
  if (!config.ok()) return fail(config.error().message);
  if (o.memory_gib > 0) config.value().hardware.memory_gib = o.memory_gib;
  const bool text = o.format == Format::Text;
  const TuneSearch search{.gpus = o.gpus, .top = std::size_t(o.top), .progress = text && isatty(fileno(stderr))};
  Result<TuneResult> searched = tune(config.value(), search);
  if (!searched.ok()) return fail(searched.error().message);
  const TuneResult& r = searched.value();
  if (o.format == Format::Json) {
    nlohmann::ordered_json results = nlohmann::ordered_json::array();
    for (const TuneRow& row : r.rows) {
      nlohmann::ordered_json result = run_json(row.report);
      result["changes"] = row.changes;
      results.push_back(std::move(result));
    }
    const nlohmann::ordered_json out = {{"evaluated", r.evaluated}, {"pruned", r.pruned()},   {"simulated", r.simulated},
                                        {"refused", r.refused},     {"seconds", r.seconds},   {"results", results}};
    fmt::print("{}\n", out.dump(2));
    return ExitStatus::Success;
  }
  std::vector<Column> columns = comparison_columns();
  columns.push_back({"changes", true});
  std::vector<std::vector<std::string>> cells;
  for (const TuneRow& row : r.rows) {
    cells.push_back(comparison_cells(row.report, r.rows.front().report));
    cells.back().push_back(row.changes);
  }
  fmt::print("{}", format_table(columns, cells, o.format));
  if (text)
    fmt::print(stderr,
               "pipesim: note: tune: {} configurations in {:.1f} s: {} simulated, {} pruned ({} cannot fit, {} cannot "
               "reach the top {}), {} refused by the config checks or the schedule\n",
               r.evaluated, r.seconds, r.simulated, r.pruned(), r.pruned_by_memory, r.pruned_by_time, o.top, r.refused);
  return ExitStatus::Success;
}

}  // namespace pipesim
