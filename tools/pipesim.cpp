// pipesim command line: argument parsing only; the commands live in commands.cpp.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <map>
#include <new>

#include "commands.h"

namespace {

const std::map<std::string, pipesim::Format> kFormats = {{"text", pipesim::Format::Text},
                                                         {"json", pipesim::Format::Json},
                                                         {"csv", pipesim::Format::Csv},
                                                         {"markdown", pipesim::Format::Markdown}};

/// --format NAME, restricted to `names`, stored into `format` once parsed.
void add_format_option(CLI::App* command, pipesim::Format& format, const std::vector<std::string>& names) {
  command
      ->add_option_function<std::string>(
          "--format", [&format](const std::string& name) { format = kFormats.at(name); },
          "output format: " + CLI::detail::join(names, ", "))
      ->check(CLI::IsMember(names));
}

/// The positional config and --schedule, --vocab, --set, shared by simulate and export.
void add_selection_options(CLI::App* command, std::string& config, std::string& schedule, std::string& vocab,
                           std::vector<std::string>& overrides) {
  command->add_option("config", config, "JSON config file")->required();
  command->add_option("--schedule", schedule, "schedule name (default: the config's schedule.name)");
  command->add_option("--vocab", vocab, "vocabulary mode (default: the config's schedule.vocab)");
  command->add_option("--set", overrides, "override a config field: key.path=value (repeatable)");
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"pipesim: generate, simulate and compare pipeline-parallel training schedules"};
  app.require_subcommand(1);
  pipesim::ExitStatus status = pipesim::ExitStatus::Success;

  pipesim::SimulateOptions simulate;
  CLI::App* sim = app.add_subcommand("simulate", "simulate one schedule on one config");
  add_selection_options(sim, simulate.config, simulate.schedule, simulate.vocab, simulate.overrides);
  add_format_option(sim, simulate.format, {"text", "json"});
  sim->add_option("--trace", simulate.trace, "write a Chrome trace (open in ui.perfetto.dev)");
  sim->add_option("--svg", simulate.svg, "write an SVG timeline (compute and collectives per device)");
  sim->add_option("--schedule-file", simulate.schedule_file,
                  "run per-rank orders from a PyTorch compute-only CSV (0F0,0I0,0W0,...) instead of a schedule")
      ->excludes("--schedule");
  sim->add_option("--profile", simulate.profile,
                  "time the schedule with measured op times from `pipesim run --profile FILE` (the schedule is still "
                  "planned with the config's costs, as `run` executes it)");
  sim->add_flag("--replan", simulate.replan,
                "with --profile: plan the schedule with the measured costs too (what it would be for that machine)")
      ->needs("--profile");
  sim->callback([&] { status = pipesim::run_simulate(simulate); });

  pipesim::RunOptions run;
  CLI::App* rn = app.add_subcommand(
      "run", "execute the schedule with real math on CPU threads or GPUs (or MPI processes: mpirun -np N pipesim run ...)");
  add_selection_options(rn, run.config, run.schedule, run.vocab, run.overrides);
  add_format_option(rn, run.format, {"text", "json"});
  rn->add_option("--ranks", run.ranks, "pipeline devices, one rank each (default: parallel.pp; under MPI: -np)")
      ->check(CLI::Range(1, 64));
  rn->add_option("--schedule-file", run.schedule_file,
                 "run per-rank orders from a PyTorch compute-only CSV (0F0,0I0,0W0,...) instead of a schedule")
      ->excludes("--schedule");
  rn->add_option("--backend", run.backend, "cpu (threads or MPI processes) or cuda (GPUs: in-process ranks share "
                 "the GPUs present; under mpirun, one process per GPU over NCCL) (default cpu)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  rn->add_option("--dtype", run.dtype, "fp32 or bf16 weights and activations (bf16: cuda only; default fp32)")
      ->check(CLI::IsMember({"fp32", "bf16"}));
  rn->add_option("--steps", run.steps, "training steps (default 1)")->check(CLI::Range(1, 1000000));
  rn->add_flag("--check", run.check,
               "compare the first step with a single-device reference: loss and max gradient relative error");
  rn->add_option("--loss-tol", run.loss_tolerance,
                 "--check fails when the loss's relative error exceeds this (default 1e-5; bf16: 1e-2)")
      ->check(CLI::NonNegativeNumber);
  rn->add_option("--grad-tol", run.grad_tolerance,
                 "--check fails when a gradient's relative error exceeds this (default 1e-4; bf16: 0, not checked)")
      ->check(CLI::NonNegativeNumber);
  rn->add_option("--trace", run.trace, "write the measured Chrome trace of the last step (open in ui.perfetto.dev)");
  rn->add_option("--profile", run.profile, "write measured op times for `pipesim simulate --profile`");
  rn->add_option("--seed", run.seed, "seed of the weights and the data (default 1234)");
  rn->add_option("--lr", run.learning_rate, "SGD learning rate (default 0.1)")->check(CLI::PositiveNumber);
  rn->add_option("--timeout", run.timeout_s, "seconds without progress after which a rank ends the run (default 60)")
      ->check(CLI::PositiveNumber);
  rn->add_option("--inject-fault", run.inject_fault,
                 "make a rank fail (RANK:KIND:MICROBATCH, e.g. 1:B:2) or hang (2:F:0:hang) in the first step, to "
                 "test fault handling");
  rn->callback([&] { status = pipesim::run_run(run); });

  pipesim::CalibrateOptions calibrate;
  CLI::App* cal = app.add_subcommand("calibrate", "fit the hardware's efficiencies to measured op times");
  cal->add_option("profiles", calibrate.profiles, "`pipesim run --profile` files, or {\"ops\": [{name, flops, bytes, ms}]}")
      ->required();
  cal->add_option("-o,--output", calibrate.output, "the hardware file to write (configs name it: hardware.file)")
      ->required();
  cal->add_option("--preset", calibrate.preset, "the preset whose peak and bandwidth are scaled (default h100-sxm)");
  cal->callback([&] { status = pipesim::run_calibrate(calibrate); });

  pipesim::CompareOptions compare;
  CLI::App* cmp = app.add_subcommand("compare", "simulate schedules x vocabulary modes side by side");
  cmp->add_option("configs", compare.configs, "JSON config files")->required();
  cmp->add_option("--schedules", compare.schedules, "comma-separated schedules (default: all that fit)")
      ->delimiter(',');
  cmp->add_option("--vocab", compare.vocab, "comma-separated vocabulary modes (default: all)")->delimiter(',');
  cmp->add_option("--set", compare.overrides, "override a config field: key.path=value (repeatable)");
  add_format_option(cmp, compare.format, {"text", "csv", "json", "markdown"});
  cmp->callback([&] { status = pipesim::run_compare(compare); });

  app.add_subcommand("list", "list schedules, vocabulary modes and hardware presets")->callback([&] {
    status = pipesim::run_list();
  });

  pipesim::ExportOptions export_options;
  CLI::App* exp = app.add_subcommand("export", "write a generated schedule for PyTorch's torch.distributed.pipelining");
  add_selection_options(exp, export_options.config, export_options.schedule, export_options.vocab,
                        export_options.overrides);
  exp->add_option("--format", "pytorch-csv: one row per rank, actions like 0F0, 1I3, 2W1 (the only format)")
      ->check(CLI::IsMember({"pytorch-csv"}));
  exp->add_option("-o,--output", export_options.output, "write to a new file instead of standard output");
  exp->callback([&] { status = pipesim::run_export(export_options); });

  pipesim::BenchOptions bench;
  CLI::App* bch = app.add_subcommand("bench", "measure graph building and simulation speed on large pipelines");
  bch->add_flag("--quick", bench.quick, "smaller graphs (a smoke test)");
  bch->callback([&] { status = pipesim::run_bench(bench); });

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const std::bad_alloc&) {
    std::fputs("pipesim: error: out of memory; try fewer microbatches or pipeline stages\n", stderr);
    return static_cast<int>(pipesim::ExitStatus::Failure);
  }
  return static_cast<int>(status);
}
