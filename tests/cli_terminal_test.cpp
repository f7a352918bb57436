// tune's progress bar on a terminal: pipesim under a pseudo-terminal (Python's pty module) draws it
// for text output and not for JSON. Without python3 (3.9 or later) or a pseudo-terminal to open, it
// exits 77 before any test runs, which Meson reports as SKIP. cli_tune_test checks the piped half.
#define CATCH_CONFIG_RUNNER
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "cli_helpers.h"

using namespace pipesim::testing::cli;

TEST_CASE("tune draws its progress bar on a terminal for text output only") {
  const std::string args = "tune " + config("default.json") + " --gpus 16 --fix fp8=none";  // FP8 would only double it
  // A pseudo-terminal on every stream (the terminal turns each "\n" into "\r\n"; the bar starts with "\r[").
  const auto dir = scratch_dir();
  // Not pty.py: the script's own folder comes first on Python's path, and `import pty` would find it.
  std::ofstream(dir / "terminal.py") << R"py(import os, pty, sys
pid, fd = pty.fork()
if pid == 0:
    os.execv(sys.argv[1], sys.argv[1:])
out = b""
while True:
    try:
        data = os.read(fd, 65536)
    except OSError:
        break
    if not data:
        break
    out += data
_, status = os.waitpid(pid, 0)
sys.stdout.buffer.write(out)
sys.exit(os.waitstatus_to_exitcode(status))
)py";
  const std::string terminal = "python3 " + (dir / "terminal.py").string() + " " + std::getenv("PIPESIM") + " " + args;
  const Output text = run_command(terminal + " --format text");
  CHECK(text.exit_code == 0);
  CHECK(text.text.find("\r[0/") != std::string::npos);
  CHECK(text.text.find(" tokens/s\033[K") != std::string::npos);
  CHECK(text.text.find("\r\033[Krank ") != std::string::npos);  // cleared before the table
  const Output json_out = run_command(terminal + " --format json");
  CHECK(json_out.exit_code == 0);
  CHECK(json_out.text.find("\r[") == std::string::npos);
  std::filesystem::remove_all(dir);
}

int main(int argc, char** argv) {
  // What terminal.py needs: pty.fork() (a pseudo-terminal opens) and os.waitstatus_to_exitcode (3.9).
  const int status = std::system("python3 -c 'import os, pty; m, s = pty.openpty(); os.close(m); os.close(s); "
                                 "os.waitstatus_to_exitcode' >/dev/null 2>&1");
  if (status != 0) {
    std::printf("skipped: no python3 (3.9 or later) that opens a pseudo-terminal with its pty module\n");
    return 77;
  }
  return Catch::Session().run(argc, argv);
}
