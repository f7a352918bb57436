// `pipesim tune` as a command: options in, the search's rows out as compare's table with a
// `changes` column under the config as given (yours, their reference), or JSON with the search's counts.
#include <fmt/format.h>
#include <unistd.h>

#include <cstdio>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "config_files.h"
#include "json_text.h"
#include "options.h"
#include "tune.h"

namespace pipesim {
namespace {

/// `pipesim tune`: the fastest configurations that fit, at the config's GPU count and global batch.
struct TuneOptions {
  std::string config;
  std::vector<std::string> overrides;
  double memory_gib = 0;  ///< 0: the config's hardware.memory_gib
  int gpus = 0;           ///< 0: the config's pp x tp x dp
  int top = 10;
  Format format = Format::Text;
};

/// The `changes` cell of the config as given: "yours", and why when it does not fit or cannot run.
std::string yours_changes(const TuneResult& r) {
  if (!r.yours) return "yours, which cannot run: " + r.yours_error;
  const RunMetrics& m = r.yours->metrics;
  if (m.fits_in_memory) return "yours";
  const auto gib = [](Bytes b) { return double(b) / double(1ull << 30); };
  return fmt::format("yours, which does not fit: {} GiB on its fullest device, over {:.2f} GiB",
                     memory_cell(gib(max_peak(*r.yours))), gib(m.memory_capacity_bytes));
}

/// The config as given as a row of compare's cells: its run against itself, or only its names when it
/// cannot run.
std::vector<std::string> yours_cells(const Config& config, const TuneResult& r) {
  if (r.yours) return comparison_cells(*r.yours, *r.yours);
  std::vector<std::string> cells(comparison_columns().size(), "-");
  cells[0] = config.source, cells[1] = config.schedule.name, cells[2] = config.schedule.vocab;
  return cells;
}

nlohmann::ordered_json yours_json(const Config& config, const TuneResult& r) {
  nlohmann::ordered_json yours;
  if (r.yours) {
    yours = comparison_json(*r.yours, *r.yours, true);
  } else {
    yours = {{"config", config.source}, {"schedule", config.schedule.name}, {"vocab", config.schedule.vocab},
             {"error", r.yours_error}};
  }
  yours["changes"] = yours_changes(r);
  return yours;
}

ExitStatus run_tune(const TuneOptions& o) {
  Result<Config> config = load_config(o.config, o.overrides);
  if (!config.ok()) return fail(config.error().message);
  if (o.memory_gib > 0) config.value().hardware.memory_gib = o.memory_gib;
  const bool text = o.format == Format::Text;
  const TuneSearch search{.gpus = o.gpus, .top = std::size_t(o.top), .progress = text && isatty(fileno(stderr))};
  Result<TuneResult> searched = tune(config.value(), search);
  if (!searched.ok()) return fail(searched.error().message);
  const TuneResult& r = searched.value();
  // The rows are measured against the config as given; against the fastest when it cannot run.
  const RunReport& reference = r.yours ? *r.yours : r.rows.front().report;
  if (o.format == Format::Json) {
    nlohmann::ordered_json results = nlohmann::ordered_json::array();
    for (const TuneRow& row : r.rows) {
      nlohmann::ordered_json result = comparison_json(row.report, reference, &row.report == &reference);
      result["changes"] = row.changes;
      results.push_back(std::move(result));
    }
    const nlohmann::ordered_json out = {{"evaluated", r.evaluated},
                                        {"pruned", r.pruned()},
                                        {"simulated", r.simulated},
                                        {"refused", r.refused},
                                        {"seconds", r.seconds},
                                        {"reference", r.yours ? "yours" : "results[0]"},
                                        {"yours", yours_json(config.value(), r)},
                                        {"results", results}};
    fmt::print("{}\n", json_text(out, 2));
    return ExitStatus::Success;
  }
  std::vector<Column> columns = comparison_columns();
  columns.push_back({"changes", true});
  std::vector<std::vector<std::string>> cells{yours_cells(config.value(), r)};
  cells.back().push_back(yours_changes(r));
  for (const TuneRow& row : r.rows) {
    cells.push_back(comparison_cells(row.report, reference));
    cells.back().push_back(row.changes);
  }
  const char* named = r.yours ? "yours (the config as given)" : "row 2 (the fastest; yours cannot run)";
  fmt::print("{}{}", format_table(columns, cells, o.format), reference_line(named, o.format));
  if (text)
    fmt::print(stderr,
               "pipesim: note: tune: {} configurations in {:.1f} s: {} simulated, {} pruned ({} cannot fit, {} cannot "
               "reach the top {}), {} refused by the config checks or the schedule\n",
               r.evaluated, r.seconds, r.simulated, r.pruned(), r.pruned_by_memory, r.pruned_by_time, o.top, r.refused);
  return ExitStatus::Success;
}

}  // namespace

void define_tune(CLI::App& tn, ExitStatus& status) {
  auto o = std::make_shared<TuneOptions>();
  tn.add_option("config", o->config, "JSON config file")->required()->check(kNonEmpty);
  tn.add_option("--set", o->overrides, "override a config field: key.path=value (repeatable)");
  tn.add_option("--memory-gib", o->memory_gib, "device memory a config must fit in (default: hardware.memory_gib)")
      ->check(finite_in(0, 1e9));
  tn.add_option("--gpus", o->gpus, "GPUs to factor into pp x tp x dp (default: the config's pp x tp x dp)")
      ->check(whole_from(1, 1 << 24));
  tn.add_option("--top", o->top, "rows to print, fastest first (default 10)")->check(whole_from(1, 1000000));
  add_format_option(tn, o->format, {"text", "csv", "json", "markdown"});
  tn.callback([o, &status] { status = run_tune(*o); });
}

}  // namespace pipesim
