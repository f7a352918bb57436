// Out of memory, end to end: pipesim under a cap on its address space (`ulimit -v`), where its
// allocations fail, says so in one line. A sanitizer build reserves more address space than the cap
// allows before main runs, so pipesim cannot start under it: this test then exits 77 before any test
// runs, which Meson reports as SKIP.
#define CATCH_CONFIG_RUNNER
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "cli_helpers.h"

using namespace pipesim::testing::cli;

namespace {

/// The cap, in KiB as `ulimit -v` takes it: room for pipesim to start and read a config, not for the
/// inputs below.
const std::string kLimit = "ulimit -v 400000 && ";

}  // namespace

TEST_CASE("out of memory is one line, with advice only where it applies") {
  const std::string limited = kLimit + pipesim_binary() + " ";
  const std::string large = "simulate " + config("default.json") + " --set parallel.microbatches=131072";
  const Output plan = run_command("(" + limited + large + " >/dev/null)", true);
  CHECK(plan.exit_code == 1);
  CHECK_THAT(plan.text, Catch::EndsWith("pipesim: error: out of memory; try fewer microbatches or pipeline stages\n"));
  // calibrate's size is its profiles: no advice about pipeline stages.
  const auto dir = scratch_dir();
  std::string ops = R"({"ops": [)";
  for (int i = 0; i < 600'000; ++i) ops += R"({"flops": 1e9, "bytes": 1e6, "ms": 0.1}, )";
  std::ofstream(dir / "ops.json") << ops << R"({"flops": 1e9, "bytes": 1e6, "ms": 0.1}]})";
  const Output fit = run_command("(" + limited + "calibrate " + (dir / "ops.json").string() + " >/dev/null)", true);
  CHECK(fit.exit_code == 1);
  CHECK(fit.text == "pipesim: error: out of memory\n");
  std::filesystem::remove_all(dir);
}

int main(int argc, char** argv) {
  const char* binary = std::getenv("PIPESIM");
  if (!binary || !*binary) {
    std::printf("PIPESIM is not set: run this test through meson test\n");
    return 1;
  }
  // pipesim that does not start at all is a failure; one that starts only without the cap, a skip.
  const std::string list = std::string(binary) + " list >/dev/null 2>&1";
  const auto runs = [](const std::string& command) {
    const int status = std::system(command.c_str());
    return WIFEXITED(status) && WEXITSTATUS(status) == 0;
  };
  if (!runs(list)) {
    std::printf("%s list fails without a cap on its address space\n", binary);
    return 1;
  }
  if (!runs(kLimit + list)) {
    std::printf("skipped: pipesim does not start within 400 MB of address space (ulimit -v 400000); a sanitizer "
                "build reserves more before main runs\n");
    return 77;
  }
  return Catch::Session().run(argc, argv);
}
