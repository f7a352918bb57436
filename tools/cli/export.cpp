// `pipesim export`: a generated schedule as PyTorch's compute-only CSV.
#include <fmt/format.h>

#include "commands.h"
#include "config_files.h"
#include "files.h"
#include "options.h"
#include "schedule_csv.h"
#include "simulate_config.h"

namespace pipesim {
namespace {

struct ExportOptions {
  std::string config;
  std::string schedule;  ///< empty: the config's
  std::string vocab;     ///< empty: the config's
  std::vector<std::string> overrides;
  std::string output;    ///< empty: standard output
};

ExitStatus run_export(const ExportOptions& o) {
  share_one_heap();
  Result<Config> config = load_selected_config(o.config, o.overrides, o.schedule, o.vocab);
  if (!config.ok()) return fail(config.error().message);
  Result<Plan> plan = plan_within_memory(config.value());
  if (!plan.ok()) return fail(plan.error().message);
  const std::string csv = schedule_csv(plan.value().graph);
  // PyTorch's format has no recomputation action: there, activation checkpointing inside the stage's
  // module recomputes during its backward. The file keeps the schedule; the R ops go.
  if (plan.value().graph.has(OpKind::R))
    fmt::print(stderr, "pipesim: note: export: the R (recomputation) ops are not written: PyTorch recomputes inside "
                       "each B or I of a stage whose module uses activation checkpointing; importing this file with "
                       "the same training.recompute_granularity puts them back\n");
  // Nor has it vocabulary passes: the file holds the transformer stages' order, and the mode that
  // adds S, T, IF and IB (and their barriers) must be named again on import.
  if (const VocabMode vocab = plan.value().config.schedule.vocab; vocab != VocabMode::Baseline)
    fmt::print(stderr, "pipesim: note: export: vocabulary mode {0} is not in the file (PyTorch's format has no "
                       "vocabulary passes): import it with --vocab {0} to simulate the same schedule\n", vocab_mode_name(vocab));
  if (o.output.empty()) {
    fmt::print("{}", csv);
    return ExitStatus::Success;
  }
  if (Status s = write_output_file(o.output, csv, ""); !s.ok()) return fail(s.error().message);
  note_written(o.output);
  return ExitStatus::Success;
}

}  // namespace

void define_export(CLI::App& exp, ExitStatus& status) {
  auto o = std::make_shared<ExportOptions>();
  add_selection_options(exp, o->config, o->schedule, o->vocab, o->overrides);
  exp.add_option("--format", "pytorch-csv: one row per rank, actions like 0F0, 1I3, 2W1 (the only format)")
      ->check(one_of({"pytorch-csv"}));
  exp.add_option("-o,--output", o->output, "write to a new file instead of standard output")->check(kNonEmpty);
  exp.callback([o, &status] { status = run_export(*o); });
}

}  // namespace pipesim
