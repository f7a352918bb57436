// `pipesim report`: compare's runs as one self-contained HTML page (the table, sortable, and each
// run's timeline and memory over time) and, with --tune, tune's answer for each config with its
// throughput-vs-memory scatter.
#include <fmt/format.h>
#include <unistd.h>

#include <cstdio>

#include "commands.h"
#include "compared_runs.h"
#include "config_files.h"
#include "html_report.h"
#include "options.h"
#include "output_file.h"
#include "svg_memory.h"
#include "svg_scatter.h"
#include "svg_timeline.h"
#include "tune.h"
#include "tune_table.h"

namespace pipesim {
namespace {

struct ReportOptions {
  CompareSelection selection;
  std::string output;
  bool tune = false;
  std::vector<std::string> fixes;  ///< --fix key=value, as tune takes them
  int gpus = 0;                    ///< 0: each config's pp x tp x dp
  int top = 10;
};

double gib(Bytes bytes) { return double(bytes) / double(1ull << 30); }

/// The scatter of tune's answer: yours (when it ran) and every row, at its peak memory and tokens/s.
std::string tune_scatter(const std::string& path, const TuneResult& r) {
  std::vector<ScatterPoint> points;
  if (r.yours)
    points.push_back({.memory_gib = gib(max_peak(*r.yours)),
                      .tokens_per_s = r.yours->metrics.tokens_per_s,
                      .label = "yours",
                      .detail = yours_changes(r),
                      .highlighted = true});
  for (std::size_t i = 0; i < r.rows.size(); ++i)
    points.push_back({.memory_gib = gib(max_peak(r.rows[i].report)),
                      .tokens_per_s = r.rows[i].report.metrics.tokens_per_s,
                      .label = std::to_string(i + 1),
                      .detail = fmt::format("rank {}: {}", i + 1, r.rows[i].changes),
                      .highlighted = false});
  const Bytes cap = r.rows.front().report.metrics.memory_capacity_bytes;
  return svg_scatter(points, gib(cap), fmt::format("{}: tokens/s against peak memory, tune's rows and yours", path));
}

/// tune on each config, as `pipesim tune CONFIG --top K --gpus N --fix ...` prints it.
Result<std::vector<HtmlTune>> tune_each(const ReportOptions& o, const std::vector<Pin>& pins) {
  std::vector<HtmlTune> tunes;
  for (const std::string& path : o.selection.configs) {
    Result<Config> config = load_config(path, o.selection.overrides);
    if (!config.ok()) return config.error();
    const TuneSearch search{
        .gpus = o.gpus, .top = std::size_t(o.top), .prune = true, .batch = 128, .progress = false, .pins = pins};
    Result<TuneResult> searched = tune(config.value(), search);
    if (!searched.ok()) return Error{"--tune: " + searched.error().message};
    const TuneResult& r = searched.value();
    tunes.push_back({.config = path,
                     .table = {.columns = tune_columns(config.value()),
                               .rows = tune_table_rows(config.value(), r, tune_reference(r)),
                               .reference = tune_reference_name(r)},
                     .scatter_svg = tune_scatter(path, r),
                     .summary = fmt::format("{} configurations: {} simulated, {} pruned, {} refused; the {} fastest "
                                            "that fit, under the config as given (yours)",
                                            r.evaluated, r.simulated, r.pruned(), r.refused, r.rows.size())});
  }
  return tunes;
}

ExitStatus run_report(const ReportOptions& o) {
  // tune's workers keep an arena per thread (simulate_config.h); compare alone shares one heap.
  if (!o.tune) share_one_heap();
  std::vector<Pin> pins;
  for (const std::string& fix : o.fixes) {
    Result<Pin> pin = parse_pin(fix);
    if (!pin.ok()) return fail(pin.error().message);
    pins.push_back(std::move(pin).value());
  }
  // An existing file that pipesim did not write is refused now, not after the simulations.
  Result<OutputFile> file = OutputFile::create(o.output, kHtmlReportMarker);
  if (!file.ok()) return fail(file.error().message);
  HtmlReport page{.configs = o.selection.configs, .comparison = {}, .runs = {}, .tunes = {}};
  const auto draw = [&page](const SimulatedRun& run) {
    const RunReport& r = run.report;
    const std::string heading = fmt::format("{}: {} / {}", r.config, r.schedule, r.vocab);
    page.runs.push_back({.heading = heading,
                         .timeline_svg = svg_timeline(run.plan.graph, run.timeline, heading),
                         .memory_svg = svg_memory(run.plan.graph, run.timeline, run.plan.static_bytes,
                                                  r.metrics.memory_capacity_bytes, heading)});
  };
  Result<std::vector<RunReport>> reports = compare_runs(o.selection, isatty(fileno(stderr)), draw);
  if (!reports.ok()) return fail(reports.error().message);
  const std::vector<RunReport>& runs = reports.value();
  page.comparison = {.columns = comparison_columns(), .rows = {}, .reference = comparison_reference(runs.front())};
  for (const RunReport& r : runs) page.comparison.rows.push_back(comparison_cells(r, runs.front()));
  if (o.tune) {
    Result<std::vector<HtmlTune>> tunes = tune_each(o, pins);
    if (!tunes.ok()) return fail(tunes.error().message);
    page.tunes = std::move(tunes).value();
  }
  const std::string html = html_report(page);
  if (Status s = file.value().write(html); !s.ok()) return fail(s.error().message);
  if (Status s = file.value().commit(); !s.ok()) return fail(s.error().message);
  note_written(o.output, fmt::format("{} run(s){}, {} KiB; open it in a browser, it needs no network", runs.size(),
                                     o.tune ? fmt::format(", tune of {} config(s)", page.tunes.size()) : "",
                                     (html.size() + 1023) / 1024));
  return ExitStatus::Success;
}

}  // namespace

void define_report(CLI::App& rp, ExitStatus& status) {
  auto o = std::make_shared<ReportOptions>();
  add_compare_selection(rp, o->selection);
  rp.add_option("-o,--output", o->output,
                "the HTML file to write (a new file, or a report pipesim wrote, which is replaced)")
      ->required()
      ->check(kNonEmpty);
  CLI::Option* tune = rp.add_flag("--tune", o->tune,
                                  "also tune each config (as `pipesim tune CONFIG`) and show its rows and a "
                                  "throughput-vs-memory scatter with the memory cap");
  rp.add_option("--fix", o->fixes, "with --tune: pin a knob, as tune's --fix (repeatable)")->needs(tune);
  rp.add_option("--gpus", o->gpus, "with --tune: GPUs to factor into pp x tp x dp (default: the config's)")
      ->check(whole_from(1, 1 << 24))
      ->needs(tune);
  rp.add_option("--top", o->top, "with --tune: rows to show, fastest first (default 10)")
      ->check(whole_from(1, 1000000))
      ->needs(tune);
  rp.callback([o, &status] { status = run_report(*o); });
}

}  // namespace pipesim
