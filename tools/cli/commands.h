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

/// Says on standard error that the command wrote `path` ("pipesim: wrote run.svg"), with `use` (what the
/// file is for, what to run on it) in parentheses when given: every command names each file it writes
/// once, alike, and keeps standard output for what it prints.
void note_written(const std::string& path, const std::string& use = "");

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
void define_import(CLI::App& command, ExitStatus& status);
void define_bench(CLI::App& command, ExitStatus& status);

}  // namespace pipesim
