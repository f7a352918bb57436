#pragma once
/// The CLI's commands: each file of tools/cli/ defines one (its options and what it runs); main.cpp
/// lists them in a table and only parses and dispatches.
#include <CLI/CLI.hpp>
#include <string>

namespace pipesim {

/// Process exit codes, chosen in one place.
enum class ExitStatus : int {
  Success = 0,
  Failure = 1,  ///< bad input (config, names, files) or a schedule that cannot run
};

/// Prints "pipesim: error: MESSAGE" and returns the failure status.
ExitStatus fail(const std::string& message);

/// Adds a command's options to its subcommand, and a callback that runs it and sets `status`.
using DefineCommand = void (*)(CLI::App& command, ExitStatus& status);

void define_simulate(CLI::App& command, ExitStatus& status);
void define_run(CLI::App& command, ExitStatus& status);
void define_calibrate(CLI::App& command, ExitStatus& status);
void define_compare(CLI::App& command, ExitStatus& status);
void define_report(CLI::App& command, ExitStatus& status);
void define_tune(CLI::App& command, ExitStatus& status);
void define_sweep(CLI::App& command, ExitStatus& status);
void define_list(CLI::App& command, ExitStatus& status);
void define_export(CLI::App& command, ExitStatus& status);
void define_bench(CLI::App& command, ExitStatus& status);

}  // namespace pipesim
