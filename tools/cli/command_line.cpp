// pipesim's command line: a table of commands, argument parsing and dispatch. Each command's options
// and work are in its own file of this folder (commands.h); main.cpp adds the process-wide setup.
#include "command_line.h"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fcntl.h>
#include <new>
#include <system_error>
#include <unistd.h>

#include "commands.h"
#include "spellcheck.h"

namespace pipesim {
namespace {

/// Ends a parse under Dispatch::ParseOnly, where the command would start.
struct ParsedOnly {};

struct Command {
  const char* name;
  const char* help;
  DefineCommand define;
  const char* out_of_memory;  ///< what to make smaller when the command runs out of memory; "": nothing to say
};

/// What makes a plan large: the commands that simulate or run one say so when memory runs out.
constexpr const char* kSmallerPlan = "try fewer microbatches or pipeline stages";

/// In the order `pipesim --help` lists them.
constexpr std::array<Command, 11> kCommands{{
    {"simulate", "simulate one schedule on one config", define_simulate, kSmallerPlan},
    {"run", "execute the schedule with real math on CPU threads or GPUs (or MPI processes: mpirun -np N pipesim run ...)",
     define_run, kSmallerPlan},
    {"calibrate", "fit the hardware's efficiencies to measured op times", define_calibrate, ""},
    {"compare", "simulate schedules x vocabulary modes side by side", define_compare, kSmallerPlan},
    {"report", "write compare's table, each run's timeline and memory (and with --tune, tune's answer) as one HTML page",
     define_report, kSmallerPlan},
    {"tune",
     "search schedule x vocabulary x (pp, tp, dp, cp) x chunks x layer split x recomputation x ZeRO for the fastest "
     "configs that fit",
     define_tune, kSmallerPlan},
    {"sweep", "simulate every point of a grid of --set values, one row each", define_sweep,
     "sweep fewer points, or fewer microbatches or pipeline stages"},
    {"list", "list schedules, vocabulary modes and hardware presets", define_list, ""},
    {"export",
     "write a generated schedule for PyTorch's torch.distributed.pipelining, or the plan as Megatron-LM's arguments or a "
     "torchtitan job file",
     define_export, kSmallerPlan},
    {"import", "write a pipesim config from Megatron-LM's arguments or a torchtitan job file", define_import, ""},
    {"bench", "measure graph building and simulation speed on large pipelines", define_bench,
     "try bench --quick"},
}};

/// A first argument that is neither an option nor a command: name it, with a did-you-mean.
bool unknown_command(int argc, char** argv) {
  if (argc < 2 || argv[1][0] == '-') return false;
  std::vector<std::string> names;
  for (const Command& command : kCommands) names.push_back(command.name);
  if (std::find(names.begin(), names.end(), argv[1]) != names.end()) return false;
  std::fprintf(stderr, "pipesim: error: unknown command '%s'%s Commands: %s\n", abbreviate(argv[1]).c_str(),
               did_you_mean(argv[1], names).c_str(), CLI::detail::join(names, ", ").c_str());
  return true;
}

/// Output that never reached its file (a full disk) is a failure, not a success. A reader that stopped
/// reading (`pipesim export ... | head`) is not: what it took was written, so pipesim ends quietly.
int finish_output(int status) {
  if (std::fflush(stdout) == 0 && !std::ferror(stdout)) return status;
  if (errno == EPIPE) return status;
  std::fprintf(stderr, "pipesim: error: cannot write to standard output: %s\n", std::strerror(errno));
  return static_cast<int>(ExitStatus::Failure);
}

/// What to try when the command ran out of memory; empty when nothing the user gives makes it large.
const char* out_of_memory_hint(const CLI::App& app) {
  for (const CLI::App* command : app.get_subcommands())
    for (const Command& known : kCommands)
      if (command->get_name() == known.name) return known.out_of_memory;
  return "";
}

}  // namespace

int run_command_line(int argc, char** argv, Dispatch dispatch) {
  CLI::App app{"pipesim: generate, simulate and compare pipeline-parallel training schedules"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "pipesim " PIPESIM_VERSION, "Print pipesim's version and exit");
  // Usage errors read like every other error: one line, the option named, the fix after it.
  app.failure_message([](const CLI::App*, const CLI::Error& e) {
    return "pipesim: error: " + std::string(e.what()) + " (see pipesim --help)\n";
  });
  ExitStatus status = ExitStatus::Success;
  for (const Command& command : kCommands) command.define(*app.add_subcommand(command.name, command.help), status);
  // CLI11 calls this once every option is parsed and checked, before the command's callback. (Replacing
  // the commands' callbacks instead would free their options, which the callbacks own, mid-parse.)
  if (dispatch == Dispatch::ParseOnly) app.parse_complete_callback([] { throw ParsedOnly{}; });

  const int failure = static_cast<int>(ExitStatus::Failure);
  if (fcntl(STDOUT_FILENO, F_GETFD) < 0) {  // closed: a file opened later would take its place
    std::fputs("pipesim: error: standard output is closed; redirect it to a file or /dev/null\n", stderr);
    return failure;
  }
  if (unknown_command(argc, argv)) return failure;
  try {
    app.parse(argc, argv);
  } catch (const ParsedOnly&) {
    return finish_output(0);
  } catch (const CLI::ParseError& e) {
    // --help is a success once it is written; every usage error is status 1, as documented.
    return app.exit(e) == 0 ? finish_output(0) : failure;
  } catch (const std::bad_alloc&) {
    const std::string hint = out_of_memory_hint(app);
    std::fprintf(stderr, "pipesim: error: out of memory%s%s\n", hint.empty() ? "" : "; ", hint.c_str());
    return failure;
  } catch (const std::system_error& e) {  // fmt::print reports a failed write so
    if (e.code() == std::errc::broken_pipe) return finish_output(static_cast<int>(status));
    std::fprintf(stderr, "pipesim: error: cannot write to standard output: %s\n", e.what());
    return failure;
  }
  return finish_output(static_cast<int>(status));
}

}  // namespace pipesim
