#pragma once
// The pipesim binary as a user runs it, for the end-to-end tests: its path is in $PIPESIM, the
// shipped configs under $PIPESIM_SOURCE (tests/meson.build sets both).
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

namespace pipesim::testing::cli {

struct Output {
  int exit_code;
  std::string text;  ///< stdout, and stderr when asked
};

/// Runs a shell command line; its exit status is -1 when a signal ended it.
inline Output run_command(const std::string& line, bool with_stderr = false) {
  const std::string command = line + (with_stderr ? " 2>&1" : " 2>/dev/null");
  FILE* pipe = popen(command.c_str(), "r");
  REQUIRE(pipe);
  std::string text;
  char buffer[4096];
  while (std::size_t n = std::fread(buffer, 1, sizeof buffer, pipe)) text.append(buffer, n);
  const int status = pclose(pipe);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, text};
}

/// The pipesim binary ($PIPESIM).
inline std::string pipesim_binary() {
  const char* binary = std::getenv("PIPESIM");
  REQUIRE(binary);
  return binary;
}

/// Runs the pipesim binary with `args`.
inline Output run(const std::string& args, bool with_stderr = false) {
  return run_command(pipesim_binary() + " " + args, with_stderr);
}

/// Runs pipesim with `args` and its standard output redirected by `redirect`; returns its standard error.
inline Output run_stderr(const std::string& args, const std::string& redirect = ">/dev/null") {
  return run_command("(" + pipesim_binary() + " " + args + " " + redirect + ")", true);
}

/// configs/NAME as shipped.
inline std::string config(const std::string& name) {
  return std::string(std::getenv("PIPESIM_SOURCE")) + "/configs/" + name;
}

/// A folder of this test process's own under the system's temporary folder.
inline std::filesystem::path scratch_dir() {
  const auto dir = std::filesystem::temp_directory_path() / ("pipesim-cli-test-" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  return dir;
}

}  // namespace pipesim::testing::cli
