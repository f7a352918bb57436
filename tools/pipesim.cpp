// pipesim command line: argument parsing only; the commands live in commands.cpp.
#include <CLI/CLI.hpp>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fcntl.h>
#include <map>
#include <new>

#include "cli_validators.h"
#include "commands.h"
#include "spellcheck.h"

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
  command->add_option("config", config, "JSON config file")->required()->check(pipesim::kNonEmpty);
  command->add_option("--schedule", schedule, "schedule name (default: the config's schedule.name)")
      ->check(pipesim::kNonEmpty);
  command->add_option("--vocab", vocab, "vocabulary mode (default: the config's schedule.vocab)")
      ->check(pipesim::kNonEmpty);
  command->add_option("--set", overrides, "override a config field: key.path=value (repeatable)");
}

/// A first argument that is neither an option nor a command: name it, with a did-you-mean.
bool unknown_command(const CLI::App& app, int argc, char** argv) {
  if (argc < 2 || argv[1][0] == '-') return false;
  std::vector<std::string> names;
  for (const CLI::App* command : app.get_subcommands({})) names.push_back(command->get_name());
  if (std::find(names.begin(), names.end(), argv[1]) != names.end()) return false;
  std::fprintf(stderr, "pipesim: error: unknown command '%s'%s Commands: %s\n", pipesim::abbreviate(argv[1]).c_str(),
               pipesim::did_you_mean(argv[1], names).c_str(), CLI::detail::join(names, ", ").c_str());
  return true;
}

/// Output that never reached its file (a full disk, a closed pipe) is a failure, not a success.
int finish_output(int status) {
  if (std::fflush(stdout) == 0 && !std::ferror(stdout)) return status;
  std::fprintf(stderr, "pipesim: error: cannot write to standard output: %s\n", std::strerror(errno));
  return static_cast<int>(pipesim::ExitStatus::Failure);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"pipesim: generate, simulate and compare pipeline-parallel training schedules"};
  app.require_subcommand(1);
  // Usage errors read like every other error: one line, the option named, the fix after it.
  app.failure_message([](const CLI::App*, const CLI::Error& e) {
    return "pipesim: error: " + std::string(e.what()) + " (see pipesim --help)\n";
  });
  pipesim::ExitStatus status = pipesim::ExitStatus::Success;

  pipesim::SimulateOptions simulate;
  CLI::App* sim = app.add_subcommand("simulate", "simulate one schedule on one config");
  add_selection_options(sim, simulate.config, simulate.schedule, simulate.vocab, simulate.overrides);
  add_format_option(sim, simulate.format, {"text", "json"});
  sim->add_option("--trace", simulate.trace, "write a Chrome trace (open in ui.perfetto.dev)")->check(pipesim::kNonEmpty);
  sim->add_option("--svg", simulate.svg, "write an SVG timeline (compute and collectives per device)")
      ->check(pipesim::kNonEmpty);
  sim->add_option("--schedule-file", simulate.schedule_file,
                  "run per-rank orders from a PyTorch compute-only CSV (0F0,0I0,0W0,...) instead of a schedule")
      ->excludes("--schedule")
      ->check(pipesim::kNonEmpty);
  sim->add_option("--profile", simulate.profile,
                  "time the schedule with measured op times from `pipesim run --profile FILE` (the schedule is still "
                  "planned with the config's costs, as `run` executes it)")
      ->check(pipesim::kNonEmpty);
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
      ->excludes("--schedule")
      ->check(pipesim::kNonEmpty);
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
      ->check(pipesim::finite_from(0, 1e6));
  rn->add_option("--grad-tol", run.grad_tolerance,
                 "--check fails when a gradient's relative error exceeds this (default 1e-4; bf16: 0, not checked)")
      ->check(pipesim::finite_from(0, 1e6));
  rn->add_option("--trace", run.trace, "write the measured Chrome trace of the last step (open in ui.perfetto.dev)")
      ->check(pipesim::kNonEmpty);
  rn->add_option("--profile", run.profile, "write measured op times for `pipesim simulate --profile`")
      ->check(pipesim::kNonEmpty);
  rn->add_option("--seed", run.seed, "seed of the weights and the data (default 1234)")->check(pipesim::kUint64);
  // Larger steps only diverge; NaN would train nothing and still exit 0.
  rn->add_option("--lr", run.learning_rate, "SGD learning rate (default 0.1)")->check(pipesim::finite_in(0, 100));
  rn->add_option("--timeout", run.timeout_s, "seconds without progress after which a rank ends the run (default 60)")
      ->check(pipesim::finite_in(0, 1e6));  // NaN would never time out
  rn->add_option("--inject-fault", run.inject_fault,
                 "make a rank fail (RANK:KIND:MICROBATCH, e.g. 1:B:2) or hang (2:F:0:hang) in the first step, to "
                 "test fault handling")
      ->check(pipesim::kNonEmpty);
  rn->callback([&] { status = pipesim::run_run(run); });

  pipesim::CalibrateOptions calibrate;
  CLI::App* cal = app.add_subcommand("calibrate", "fit the hardware's efficiencies to measured op times");
  cal->add_option("profiles", calibrate.profiles, "`pipesim run --profile` files, tools/measure-ops.py output, or {\"ops\": [{name, flops, bytes, ms}]}")
      ->required();
  cal->add_option("-o,--output", calibrate.output,
                  "the hardware file to write (configs name it: hardware.file); without it, only the errors are printed");
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

  pipesim::TuneOptions tune;
  CLI::App* tn = app.add_subcommand(
      "tune", "search schedule x vocabulary x (pp, tp, dp) x chunks x layer split for the fastest configs that fit");
  tn->add_option("config", tune.config, "JSON config file")->required()->check(pipesim::kNonEmpty);
  tn->add_option("--set", tune.overrides, "override a config field: key.path=value (repeatable)");
  tn->add_option("--memory-gib", tune.memory_gib, "device memory a config must fit in (default: hardware.memory_gib)")
      ->check(pipesim::finite_in(0, 1e9));
  tn->add_option("--gpus", tune.gpus, "GPUs to factor into pp x tp x dp (default: the config's pp x tp x dp)")
      ->check(CLI::Range(1, 1 << 24));
  tn->add_option("--top", tune.top, "rows to print, fastest first (default 10)")->check(CLI::Range(1, 1000000));
  add_format_option(tn, tune.format, {"text", "csv", "json", "markdown"});
  tn->callback([&] { status = pipesim::run_tune(tune); });

  pipesim::SweepOptions sweep;
  CLI::App* swp = app.add_subcommand("sweep", "simulate every point of a grid of --set values, one row each");
  swp->add_option("config", sweep.config, "JSON config file")->required()->check(pipesim::kNonEmpty);
  swp->add_option("--grid", sweep.grids,
                  "key.path=v1,v2,...: a --set key and its values; the rows are the product of the grids (repeatable)")
      ->required();
  swp->add_option("--set", sweep.overrides, "override a config field at every point: key.path=value (repeatable)");
  add_format_option(swp, sweep.format, {"text", "csv", "json", "markdown"});
  swp->callback([&] { status = pipesim::run_sweep(sweep); });

  app.add_subcommand("list", "list schedules, vocabulary modes and hardware presets")->callback([&] {
    status = pipesim::run_list();
  });

  pipesim::ExportOptions export_options;
  CLI::App* exp = app.add_subcommand("export", "write a generated schedule for PyTorch's torch.distributed.pipelining");
  add_selection_options(exp, export_options.config, export_options.schedule, export_options.vocab,
                        export_options.overrides);
  exp->add_option("--format", "pytorch-csv: one row per rank, actions like 0F0, 1I3, 2W1 (the only format)")
      ->check(CLI::IsMember({"pytorch-csv"}));
  exp->add_option("-o,--output", export_options.output, "write to a new file instead of standard output")
      ->check(pipesim::kNonEmpty);
  exp->callback([&] { status = pipesim::run_export(export_options); });

  pipesim::BenchOptions bench;
  CLI::App* bch = app.add_subcommand("bench", "measure graph building and simulation speed on large pipelines");
  bch->add_flag("--quick", bench.quick, "smaller graphs (a smoke test)");
  bch->callback([&] { status = pipesim::run_bench(bench); });

  const int failure = static_cast<int>(pipesim::ExitStatus::Failure);
  if (fcntl(STDOUT_FILENO, F_GETFD) < 0) {  // closed: a file opened later would take its place
    std::fputs("pipesim: error: standard output is closed; redirect it to a file or /dev/null\n", stderr);
    return failure;
  }
  if (unknown_command(app, argc, argv)) return failure;
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : failure;  // --help is a success; every usage error is status 1, as documented
  } catch (const std::bad_alloc&) {
    std::fputs("pipesim: error: out of memory; try fewer microbatches or pipeline stages\n", stderr);
    return failure;
  } catch (const std::system_error& e) {  // fmt::print reports a failed write so
    std::fprintf(stderr, "pipesim: error: cannot write to standard output: %s\n", e.what());
    return failure;
  }
  return finish_output(static_cast<int>(status));
}
