// The command line as a function (tools/cli/command_line.h), in-process as the argument-vector fuzz
// target drives it: Dispatch::ParseOnly checks a vector as the program does but runs nothing.
#include <catch2/catch.hpp>
#include <filesystem>
#include <string>
#include <vector>

#include "cli_helpers.h"
#include "command_line.h"

using pipesim::Dispatch;
using pipesim::run_command_line;
using pipesim::testing::cli::config;
using pipesim::testing::cli::scratch_dir;

namespace {

/// `pipesim ARGUMENTS...` through run_command_line, as main calls it.
int command_line(std::vector<std::string> arguments, Dispatch dispatch) {
  arguments.insert(arguments.begin(), "pipesim");
  std::vector<char*> argv;
  for (std::string& argument : arguments) argv.push_back(argument.data());
  argv.push_back(nullptr);
  return run_command_line(static_cast<int>(arguments.size()), argv.data(), dispatch);
}

}  // namespace

TEST_CASE("Dispatch::ParseOnly checks a command line as the program does, and runs nothing") {
  const std::filesystem::path trace = scratch_dir() / "command-line-trace.json";
  std::filesystem::remove(trace);
  const std::vector<std::string> simulate = {"simulate", config("tiny.json"), "--format", "json", "--trace",
                                             trace.string()};

  CHECK(command_line(simulate, Dispatch::ParseOnly) == 0);
  CHECK_FALSE(std::filesystem::exists(trace));  // the command did not run
  CHECK(command_line(simulate, Dispatch::Run) == 0);
  CHECK(std::filesystem::exists(trace));
  std::filesystem::remove(trace);

  // Each command's options live as long as its callback: parsing alone must keep them (a sanitizer
  // build reports it if not). A profile that is not there is found only by running.
  const std::string missing = (scratch_dir() / "no-such-profile.json").string();
  CHECK(command_line({"calibrate", missing, "--preset", "h100-sxm"}, Dispatch::ParseOnly) == 0);
  CHECK(command_line({"calibrate", missing, "--preset", "h100-sxm"}, Dispatch::Run) == 1);
  CHECK(command_line({"sweep", config("tiny.json"), "--grid", "parallel.pp=1,2"}, Dispatch::ParseOnly) == 0);

  for (const Dispatch dispatch : {Dispatch::ParseOnly, Dispatch::Run}) {
    CHECK(command_line({"simulate"}, dispatch) == 1);                                            // no config
    CHECK(command_line({"simulte", config("tiny.json")}, dispatch) == 1);                        // unknown command
    CHECK(command_line({"run", config("tiny.json"), "--steps", "1.5"}, dispatch) == 1);          // not whole
    CHECK(command_line({"simulate", config("tiny.json"), "--trace", ""}, dispatch) == 1);        // empty path
    CHECK(command_line({"--version"}, dispatch) == 0);
  }
}
