// `pipesim compare`: every config x schedule x vocabulary mode, one row each.
#include <fmt/format.h>
#include <unistd.h>

#include <cstdio>

#include "commands.h"
#include "config_files.h"
#include "options.h"
#include "plan.h"
#include "simulate_config.h"

namespace pipesim {
namespace {

struct CompareOptions {
  std::vector<std::string> configs;
  std::vector<std::string> schedules;  ///< empty: every schedule that accepts the config
  std::vector<std::string> vocab;      ///< empty: every vocabulary mode
  std::vector<std::string> overrides;
  Format format = Format::Text;
};

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

}  // namespace

void define_compare(CLI::App& cmp, ExitStatus& status) {
  auto o = std::make_shared<CompareOptions>();
  cmp.add_option("configs", o->configs, "JSON config files")->required();
  cmp.add_option("--schedules", o->schedules, "comma-separated schedules (default: all that fit)")->delimiter(',');
  cmp.add_option("--vocab", o->vocab, "comma-separated vocabulary modes (default: all)")->delimiter(',');
  cmp.add_option("--set", o->overrides, "override a config field: key.path=value (repeatable)");
  add_format_option(cmp, o->format, {"text", "csv", "json", "markdown"});
  cmp.callback([o, &status] { status = run_compare(*o); });
}

}  // namespace pipesim
