#include "compared_runs.h"

#include <fmt/format.h>

#include "config_files.h"
#include "options.h"
#include "plan.h"

namespace pipesim {

void add_compare_selection(CLI::App& command, CompareSelection& o) {
  command.add_option("configs", o.configs, "JSON config files")->required();
  command.add_option("--schedules", o.schedules, "comma-separated schedules (default: all that fit)")->delimiter(',');
  command.add_option("--vocab", o.vocab, "comma-separated vocabulary modes (default: all)")->delimiter(',');
  command.add_option("--set", o.overrides, "override a config field: key.path=value (repeatable)");
}

Result<std::vector<RunReport>> compare_runs(const CompareSelection& o, bool progress,
                                            const std::function<void(const SimulatedRun&)>& each) {
  if (Status s = check_names("--schedules", o.schedules, schedule_names(), schedule_did_you_mean); !s.ok()) return s.error();
  if (Status s = check_names("--vocab", o.vocab, vocab_mode_names()); !s.ok()) return s.error();
  const bool every_schedule = o.schedules.empty();
  const std::vector<std::string> schedules = every_schedule ? schedule_names() : o.schedules;
  const std::vector<std::string> modes = o.vocab.empty() ? vocab_mode_names() : o.vocab;
  const std::size_t total = o.configs.size() * schedules.size() * modes.size();
  std::vector<RunReport> reports;
  for (const std::string& path : o.configs) {
    Result<Config> config = load_config(path, o.overrides);
    if (!config.ok()) return config.error();
    for (const std::string& schedule : schedules)
      for (const std::string& mode : modes) {
        if (progress) fmt::print(stderr, "\r[{}/{}] {} {} {}\033[K", reports.size() + 1, total, path, schedule, mode);
        Config c = config.value();
        c.schedule.name = schedule;
        c.schedule.vocab = *vocab_mode_named(mode);  // a known name: checked above
        Result<SimulatedRun> run = simulate_config(c);
        if (!run.ok()) {
          // With no --schedules, schedules that refuse this config are skipped, not fatal.
          if (!every_schedule) return run.error();
          fmt::print(stderr, "{}note: skipped {} / {}: {}\n", progress ? "\r\033[K" : "", schedule, mode,
                     run.error().message);
          continue;
        }
        if (each) each(run.value());
        reports.push_back(std::move(run.value().report));
      }
  }
  if (progress) fmt::print(stderr, "\r\033[K");
  if (reports.empty()) return Error{"no schedule could run these configs (see the notes above)"};
  return reports;
}

}  // namespace pipesim
