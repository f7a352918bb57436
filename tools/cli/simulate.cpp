// `pipesim simulate`: one schedule on one config, with its trace, SVG timeline and memory plot, or
// measured profile.
#include <fmt/format.h>

#include <optional>

#include "chrome_trace.h"
#include "commands.h"
#include "config_files.h"
#include "files.h"
#include "measured.h"
#include "options.h"
#include "simulate_config.h"
#include "svg_memory.h"
#include "svg_timeline.h"

namespace pipesim {
namespace {

struct SimulateOptions {
  std::string config;
  std::string schedule;  ///< empty: the config's
  std::string vocab;     ///< empty: the config's
  std::vector<std::string> overrides;
  Format format = Format::Text;
  std::string trace;          ///< empty: no trace
  std::string svg;            ///< empty: no picture
  std::string memory_svg;     ///< empty: no memory plot
  std::string schedule_file;  ///< a PyTorch compute-only CSV to run instead of a generated schedule
  std::string profile;        ///< measured costs from `pipesim run --profile` to use instead of the config's
  bool replan = false;        ///< with a profile: plan with its costs too, not only time the config's plan
};

ExitStatus run_simulate(const SimulateOptions& o) {
  share_one_heap();
  if (Status s = check_distinct_outputs({{"--trace", o.trace}, {"--svg", o.svg}, {"--memory-svg", o.memory_svg}}); !s.ok())
    return fail(s.error().message);
  Result<Config> config = load_selected_config(o.config, o.overrides, o.schedule, o.vocab);
  if (!config.ok()) return fail(config.error().message);
  std::optional<ExplicitCosts> timing;  // the profile's costs, when the plan keeps the config's
  if (!o.profile.empty()) {
    Result<std::string> text = read_text_file(o.profile);
    if (!text.ok()) return fail(text.error().message);
    Result<Config> profiled = apply_profile(config.value(), text.value(), o.profile);
    if (!profiled.ok()) return fail(profiled.error().message);
    if (o.replan)
      config = std::move(profiled);
    else
      timing = profiled.value().costs;
  }
  Result<std::optional<CustomSchedule>> custom = load_schedule_file(o.schedule_file, config.value());
  if (!custom.ok()) return fail(custom.error().message);
  Result<SimulatedRun> run = simulate_config(config.value(), custom.value() ? &*custom.value() : nullptr, timing);
  if (!run.ok()) return fail(run.error().message);
  if (!o.trace.empty()) {
    const SimulatedRun& r = run.value();
    const std::string title = fmt::format("{} {} {} (simulated)", o.config, r.report.schedule, r.report.vocab);
    if (Status s = write_chrome_trace_file(o.trace, r.plan.graph, r.timeline, r.plan.static_bytes, title); !s.ok())
      return fail(s.error().message);
    note_written(o.trace, "open it in ui.perfetto.dev");
  }
  if (!o.svg.empty()) {
    const SimulatedRun& r = run.value();
    const std::string title = fmt::format("{}: {} / {}", o.config, r.report.schedule, r.report.vocab);
    if (Status s = write_output_file(o.svg, svg_document(svg_timeline(r.plan.graph, r.timeline, title)), kSvgGenerator);
        !s.ok())
      return fail(s.error().message);
    note_written(o.svg);
  }
  if (!o.memory_svg.empty()) {
    const SimulatedRun& r = run.value();
    const std::string title = fmt::format("{}: {} / {}", o.config, r.report.schedule, r.report.vocab);
    const std::string plot =
        svg_memory(r.plan.graph, r.timeline, r.plan.static_bytes, r.report.metrics.memory_capacity_bytes, title);
    if (Status s = write_output_file(o.memory_svg, svg_document(plot), kSvgGenerator); !s.ok())
      return fail(s.error().message);
    note_written(o.memory_svg);
  }
  fmt::print("{}", format_run(run.value().report, o.format));
  return ExitStatus::Success;
}

}  // namespace

void define_simulate(CLI::App& sim, ExitStatus& status) {
  auto o = std::make_shared<SimulateOptions>();
  add_selection_options(sim, o->config, o->schedule, o->vocab, o->overrides);
  add_format_option(sim, o->format, {"text", "json"});
  sim.add_option("--trace", o->trace, "write a Chrome trace (open in ui.perfetto.dev)")->check(kNonEmpty);
  sim.add_option("--svg", o->svg, "write an SVG timeline (compute and collectives per device, a time axis in ms)")
      ->check(kNonEmpty);
  sim.add_option("--memory-svg", o->memory_svg,
                 "write an SVG plot of each device's memory over the iteration, with the capacity")
      ->check(kNonEmpty);
  sim.add_option("--schedule-file", o->schedule_file,
                 "run per-rank orders from a PyTorch compute-only CSV (0F0,0I0,0W0,...) instead of a schedule")
      ->excludes("--schedule")
      ->check(kNonEmpty);
  sim.add_option("--profile", o->profile,
                 "time the schedule with measured op times from `pipesim run --profile FILE` (the schedule is still "
                 "planned with the config's costs, as `run` executes it)")
      ->check(kNonEmpty);
  sim.add_flag("--replan", o->replan,
               "with --profile: plan the schedule with the measured costs too (what it would be for that machine)")
      ->needs("--profile");
  sim.callback([o, &status] { status = run_simulate(*o); });
}

}  // namespace pipesim
