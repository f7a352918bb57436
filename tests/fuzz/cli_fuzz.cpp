// libFuzzer target: pipesim's command line, in-process (command_line.h). The input is split at NUL
// bytes into argument vectors after "pipesim". Every vector is parsed and checked; the cheap commands
// (list, simulate, compare, export) also run, in a folder of this process's own holding small inputs,
// when nothing can make them long or reach outside it. Every outcome but a crash, a hang, an exception
// out of run_command_line or a sanitizer report is fine. Built and run by tools/fuzz.sh, which keeps
// the target's standard output and error quiet (-close_fd_mask=3); its paths are absolute, since this
// target changes the working folder.
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "command_line.h"

namespace {

namespace fs = std::filesystem;

/// Past this many arguments a vector is only parsed: compare runs every schedule x vocabulary mode of
/// each config it is given.
constexpr std::size_t kMaxRunArguments = 12;

const char* kTiny = R"({"model": {"layers": 8, "hidden": 32, "heads": 4, "ffn_hidden": 128, "seq_len": 16,
  "vocab": 250, "micro_batch_size": 2}, "parallel": {"pp": 4, "microbatches": 8, "chunks": 2},
  "schedule": {"name": "1f1b", "vocab": "vocab-1"}, "hardware": {"preset": "h100-sxm"}})";

/// The inputs a run may name (seeds use these names), each with its text.
const std::vector<std::pair<std::string, std::string>>& fixtures() {
  static const std::vector<std::pair<std::string, std::string>> files = {
      {"c.json", kTiny},
      {"c\xff\xfe.json", kTiny},  // a name that is not UTF-8 reaches every report and trace
      {"h.json", R"({"model": {"layers": 4, "hidden": 64, "heads": 4, "seq_len": 64, "vocab": 512},
                     "parallel": {"pp": 2, "microbatches": 4}, "hardware": {"file": "hw.json"}})"},
      {"hw.json", R"({"peak_tflops": 500, "memory_gib": 40, "reserved_gib": 2})"},
      {"deep.json", std::string(100, '[') + std::string(100, ']')},
      // 1f1b on c.json, as export writes it
      {"s.csv", "0F0,0F1,0F2,0F3,0B0,0F4,0B1,0F5,0B2,0F6,0B3,0F7,0B4,0B5,0B6,0B7\n"
                "1F0,1F1,1F2,1B0,1F3,1B1,1F4,1B2,1F5,1B3,1F6,1B4,1F7,1B5,1B6,1B7\n"
                "2F0,2F1,2B0,2F2,2B1,2F3,2B2,2F4,2B3,2F5,2B4,2F6,2B5,2F7,2B6,2B7\n"
                "3F0,3B0,3F1,3B1,3F2,3B2,3F3,3B3,3F4,3B4,3F5,3B5,3F6,3B6,3F7,3B7\n"},
  };
  return files;
}

const fs::path& folder() {
  static const fs::path dir = fs::temp_directory_path() / ("pipesim-cli-fuzz-" + std::to_string(getpid()));
  return dir;
}

/// The folder, made the working folder with the fixtures in it; removed when the fuzzer exits.
bool enter_folder() {
  static const bool entered = [] {
    fs::create_directories(folder());
    for (const auto& [name, text] : fixtures())
      std::ofstream(folder() / name, std::ios::binary | std::ios::trunc) << text;
    fs::current_path(folder());
    std::atexit([] {
      std::error_code ignored;
      fs::remove_all(folder(), ignored);
    });
    return true;
  }();
  return entered;
}

/// Removes what a run wrote (outputs named by the input), so the folder stays small and each run
/// starts from the same files.
void remove_outputs() {
  std::vector<fs::path> written;
  for (const fs::directory_entry& entry : fs::directory_iterator(fs::current_path())) {
    const std::string name = entry.path().filename().string();
    if (std::none_of(fixtures().begin(), fixtures().end(), [&](const auto& f) { return f.first == name; }))
      written.push_back(entry.path());
  }
  for (const fs::path& path : written) fs::remove_all(path);
  for (const auto& [name, text] : fixtures())  // an output may not replace them, but be sure
    if (!fs::is_regular_file(name)) std::ofstream(name, std::ios::binary | std::ios::trunc) << text;
}

/// Whether the vector may run: a cheap command, no path outside the folder ('/'), and no --set or
/// --grid, which could make the tiny configs large (the overrides target covers --set values).
bool may_run(const std::vector<std::string>& arguments) {
  if (arguments.size() < 2 || arguments.size() > kMaxRunArguments) return false;
  const std::string& command = arguments[1];
  if (command != "list" && command != "simulate" && command != "compare" && command != "export") return false;
  return std::none_of(arguments.begin(), arguments.end(), [](const std::string& a) {
    return a.find('/') != std::string::npos || a.rfind("--set", 0) == 0 || a.rfind("--grid", 0) == 0;
  });
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (!enter_folder()) return 0;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  std::vector<std::string> arguments{"pipesim"};
  std::size_t start = 0;
  for (std::size_t end; (end = text.find('\0', start)) != std::string_view::npos; start = end + 1)
    arguments.emplace_back(text.substr(start, end - start));
  if (start < text.size()) arguments.emplace_back(text.substr(start));
  std::vector<char*> argv;
  for (std::string& argument : arguments) argv.push_back(argument.data());
  argv.push_back(nullptr);  // as the C runtime gives it
  const int argc = static_cast<int>(arguments.size());
  const bool run = may_run(arguments);
  const int status =
      pipesim::run_command_line(argc, argv.data(), run ? pipesim::Dispatch::Run : pipesim::Dispatch::ParseOnly);
  if (status != 0 && status != 1) __builtin_trap();  // documented: 0 success, 1 failure, nothing else
  if (run) remove_outputs();
  return 0;
}
