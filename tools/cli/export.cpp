// `pipesim export`: a generated schedule as PyTorch's compute-only CSV, or the plan as Megatron-LM's
// arguments or a torchtitan job file.
#include <fmt/format.h>

#include "commands.h"
#include "config_files.h"
#include "files.h"
#include "frameworks.h"
#include "megatron_args.h"
#include "options.h"
#include "plan.h"
#include "schedule_csv.h"
#include "simulate_config.h"
#include "torchtitan_toml.h"

namespace pipesim {
namespace {

struct ExportOptions {
  std::string config;
  std::string schedule;  ///< empty: the config's
  std::string vocab;     ///< empty: the config's
  std::vector<std::string> overrides;
  std::string output;    ///< empty: standard output
  std::string format = "pytorch-csv";
  bool nearest = false;  ///< write the nearest plan the framework runs instead of refusing
};

/// What each written file starts with, so that export replaces its own files and no other.
constexpr std::string_view kMegatronMarker = "# pretrain_gpt.py arguments for";
constexpr std::string_view kTorchtitanMarker = "# torchtitan job config for";

ExitStatus write_text(const ExportOptions& o, const std::string& text, std::string_view marker) {
  if (o.output.empty()) {
    fmt::print("{}", text);
    return ExitStatus::Success;
  }
  if (Status s = write_output_file(o.output, text, std::string(marker)); !s.ok()) return fail(s.error().message);
  note_written(o.output);
  return ExitStatus::Success;
}

/// The layers of each virtual stage as `config` plans them.
Result<std::vector<int>> planned_split(const Config& config) {
  Config copy = config;
  Result<PlannedLayout> planned = plan_layout(copy);
  if (!planned.ok()) return planned.error();
  std::vector<int> split;
  for (const VirtualStage& stage : planned.value().layout.stages) split.push_back(stage.layers);
  return split;
}

/// The plan as a framework's launch file: refused, naming each field the framework cannot run, unless
/// --nearest asks for the nearest plan it runs (the changes go to standard error).
ExitStatus export_for_framework(const ExportOptions& o, Config config, Framework framework) {
  const std::string name = framework == Framework::Megatron ? "Megatron-LM" : "torchtitan";
  // torchtitan's job file names a model flavour, and pipesim writes its Llama 3 ones: no nearest plan
  // keeps the model.
  const ModelConfig& m = config.model;
  if (framework == Framework::Torchtitan && (m.has_experts() || m.latent_attention() || m.head_dim > 0))
    return fail(fmt::format("export --format torchtitan: {}: pipesim writes torchtitan's llama3 model only, and this "
                            "model has {}; export --format megatron carries it",
                            config.source, m.has_experts() ? "experts (model.num_experts)"
                                           : m.latent_attention() ? "latent attention (model.kv_lora_rank)"
                                                                  : "heads of their own width (model.head_dim)"));
  Result<std::vector<int>> split = planned_split(config);
  if (!split.ok()) return fail(split.error().message);
  std::vector<Unsupported> problems = unsupported(framework, config, split.value());
  if (!problems.empty() && !o.nearest) {
    std::string list;
    for (const Unsupported& u : problems) list += fmt::format("\n  {}: {} ({})", u.field, u.reason, u.nearest);
    return fail(fmt::format("export --format {}: {} cannot run this plan:{}\npass --nearest to write the nearest plan "
                            "it runs (the values in parentheses)",
                            framework_name(framework), name, list));
  }
  std::vector<std::string> changes;
  config = nearest_runnable(framework, std::move(config), split.value(), changes);
  for (const std::string& change : changes) fmt::print(stderr, "pipesim: note: export: {}\n", change);
  if (!changes.empty() && !(split = planned_split(config)).ok()) return fail(split.error().message);
  const std::string what = fmt::format("{}: schedule {}, vocab {}{}", config.source, config.schedule.name,
                                       vocab_mode_name(config.schedule.vocab),
                                       changes.empty() ? "" : fmt::format(" (the nearest plan {} runs)", name));
  if (framework == Framework::Megatron) return write_text(o, megatron_arguments(config, split.value(), what), kMegatronMarker);
  return write_text(o, torchtitan_toml(config, split.value(), what), kTorchtitanMarker);
}

ExitStatus run_export(const ExportOptions& o) {
  share_one_heap();
  Result<Config> config = load_selected_config(o.config, o.overrides, o.schedule, o.vocab);
  if (!config.ok()) return fail(config.error().message);
  if (o.format != "pytorch-csv") return export_for_framework(o, config.value(), *framework_named(o.format));
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
  return write_text(o, csv, "");
}

}  // namespace

void define_export(CLI::App& exp, ExitStatus& status) {
  auto o = std::make_shared<ExportOptions>();
  add_selection_options(exp, o->config, o->schedule, o->vocab, o->overrides);
  exp.add_option("--format", o->format,
                 "pytorch-csv (default): the schedule, one row per rank, actions like 0F0, 1I3, 2W1; megatron: "
                 "pretrain_gpt.py's arguments for the plan; torchtitan: a job TOML for it")
      ->check(one_of({"pytorch-csv", "megatron", "torchtitan"}));
  exp.add_flag("--nearest", o->nearest,
               "for megatron and torchtitan: where the plan uses what the framework cannot run, write the nearest "
               "plan it runs and say what changed, instead of refusing");
  exp.add_option("-o,--output", o->output, "write to a new file instead of standard output")->check(kNonEmpty);
  exp.callback([o, &status] { status = run_export(*o); });
}

}  // namespace pipesim
