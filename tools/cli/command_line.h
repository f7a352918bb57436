#pragma once
/// pipesim's command line as a function: the command table, parsing and dispatch, with every error
/// one line on standard error. main.cpp adds only what belongs to the process (SIGPIPE, the
/// last-resort handler), so tests and the argument-vector fuzz target drive the same code in-process.

namespace pipesim {

/// How far a command line goes.
enum class Dispatch {
  Run,        ///< the command runs, as `pipesim` does
  ParseOnly,  ///< options are parsed and checked (and --help, --version written), the command does not run
};

/// Parses argv (argv[0] the program name) and, with Dispatch::Run, runs the command it names. Returns
/// the process exit status; an exception that leaves it is a bug (main reports it as an internal error).
int run_command_line(int argc, char** argv, Dispatch dispatch);

}  // namespace pipesim
