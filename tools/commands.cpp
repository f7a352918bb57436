#include "commands.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <optional>

#include "chrome_trace.h"
#include "cli_support.h"
#include "files.h"
#include "measured.h"
#include "pipeline.h"
#include "plan.h"
#include "schedule_csv.h"
#include "svg_timeline.h"

namespace pipesim {

ExitStatus run_simulate(const SimulateOptions& o) {
  share_one_heap();
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
    if (Status s = write_output_file(o.trace, chrome_trace(r.plan.graph, r.timeline, r.plan.static_bytes, title),
                                     kTraceGenerator);
        !s.ok())
      return fail(s.error().message);
  }
  if (!o.svg.empty()) {
    const SimulatedRun& r = run.value();
    const std::string title = fmt::format("{}: {} / {}", o.config, r.report.schedule, r.report.vocab);
    if (Status s = write_output_file(o.svg, svg_timeline(r.plan.graph, r.timeline, title), kSvgGenerator); !s.ok())
      return fail(s.error().message);
  }
  fmt::print("{}", format_run(run.value().report, o.format));
  if (!o.trace.empty() && o.format != Format::Json) fmt::print("\ntrace written to {} (open in ui.perfetto.dev)\n", o.trace);
  return ExitStatus::Success;
}

ExitStatus run_compare(const CompareOptions& o) {
  share_one_heap();
  if (Status s = check_names("--schedules", o.schedules, schedule_names()); !s.ok()) return fail(s.error().message);
  if (Status s = check_names("--vocab", o.vocab, vocab_mode_names()); !s.ok()) return fail(s.error().message);
  const bool every_schedule = o.schedules.empty();
  const std::vector<std::string> schedules = every_schedule ? schedule_names() : o.schedules;
  const std::vector<std::string> modes = o.vocab.empty() ? vocab_mode_names() : o.vocab;
  const bool show_progress = isatty(fileno(stderr)) && o.format == Format::Text;
  const std::size_t total = o.configs.size() * schedules.size() * modes.size();
  std::vector<RunReport> reports;
  for (const std::string& path : o.configs) {
    Result<Config> config = load_config(path, o.overrides);
    if (!config.ok()) return fail(config.error().message);
    for (const std::string& schedule : schedules)
      for (const std::string& mode : modes) {
        if (show_progress) fmt::print(stderr, "\r[{}/{}] {} {} {}\033[K", reports.size() + 1, total, path, schedule, mode);
        Config c = config.value();
        c.schedule.name = schedule;
        c.schedule.vocab = mode;
        Result<SimulatedRun> run = simulate_config(c);
        if (!run.ok()) {
          // With no --schedules, schedules that refuse this config are skipped, not fatal.
          if (!every_schedule) return fail(run.error().message);
          fmt::print(stderr, "{}note: skipped {} / {}: {}\n", show_progress ? "\r\033[K" : "", schedule, mode,
                     run.error().message);
          continue;
        }
        reports.push_back(std::move(run.value().report));
      }
  }
  if (show_progress) fmt::print(stderr, "\r\033[K");
  if (reports.empty()) return fail("no schedule could run these configs (see the notes above)");
  fmt::print("{}", format_comparison(reports, o.format));
  return ExitStatus::Success;
}

ExitStatus run_export(const ExportOptions& o) {
  share_one_heap();
  Result<Config> config = load_selected_config(o.config, o.overrides, o.schedule, o.vocab);
  if (!config.ok()) return fail(config.error().message);
  Result<Plan> plan = plan_within_memory(config.value());
  if (!plan.ok()) return fail(plan.error().message);
  const std::string csv = schedule_csv(plan.value().graph);
  if (o.output.empty()) {
    fmt::print("{}", csv);
    return ExitStatus::Success;
  }
  if (Status s = write_output_file(o.output, csv, ""); !s.ok()) return fail(s.error().message);
  return ExitStatus::Success;
}

ExitStatus run_list() {
  fmt::print("schedules:\n");
  for (const ScheduleInfo& s : schedules()) fmt::print("  {:<18} {}\n", s.name, s.description);
  fmt::print("\nvocabulary modes:\n");
  for (const VocabModeInfo& m : vocab_modes()) fmt::print("  {:<18} {}\n", m.name, m.description);
  fmt::print("\nhardware presets:\n");
  for (const std::string& name : hardware_preset_names()) {
    const HardwareConfig h = *hardware_preset(name);
    fmt::print("  {:<18} {:.0f} TFLOP/s, {:.0f} GB/s HBM, {:.1f} GiB, {:.0f} GB/s intra-node, {:.0f} GB/s inter-node\n",
               name, h.peak_tflops, h.hbm_gbps, h.memory_gib, h.intra_node_gbps, h.inter_node_gbps);
  }
  return ExitStatus::Success;
}

}  // namespace pipesim
