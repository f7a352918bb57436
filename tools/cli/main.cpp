// pipesim's entry point: the process-wide setup around the command line (command_line.h).
#include <csignal>
#include <cstdio>
#include <exception>
#include <new>

#include "command_line.h"
#include "commands.h"

int main(int argc, char** argv) {
  // A closed pipe is an EPIPE error on the write (run_command_line ends quietly on it), not a signal that ends
  // the process with status 141.
  std::signal(SIGPIPE, SIG_IGN);
  try {
    return pipesim::run_command_line(argc, argv, pipesim::Dispatch::Run);
  } catch (const std::bad_alloc&) {  // before any command started (the command's own is caught in run_command_line)
    std::fputs("pipesim: error: out of memory\n", stderr);
  } catch (const std::exception& e) {  // a bug: say so in one line, never abort with a core dump
    std::fprintf(stderr, "pipesim: internal error: %s\n", e.what());
  } catch (...) {
    std::fputs("pipesim: internal error: an unknown exception\n", stderr);
  }
  return static_cast<int>(pipesim::ExitStatus::Failure);
}
