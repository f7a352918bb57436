// libFuzzer target: what reaches a config besides its own text. The first byte picks the surface:
// 0, the rest is `--set` arguments, one per line; 1, a hardware file; 2, a Hugging Face config.json
// (both named by a config, read through a file as `pipesim` reads them). Every outcome but a crash,
// a hang or a sanitizer report is fine: the parse must end in a config or in an error.
// Built and run by tools/fuzz.sh (clang, ASan + UBSan).
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <vector>

#include "config_files.h"
#include "config_json.h"
#include "plan.h"
#include "sizes.h"

namespace {

const char* kBase = R"({"model": {"layers": 4, "hidden": 64, "heads": 4, "seq_len": 64, "vocab": 512},
                        "parallel": {"pp": 2, "microbatches": 4}})";

/// A folder of this process's own for the included files.
const std::string& folder() {
  static const std::string dir = [] {
    std::string d = "/tmp/pipesim-fuzz-" + std::to_string(getpid());
    std::filesystem::create_directories(d);
    std::ofstream(d + "/hardware.json") << R"({"model": {"layers": 4, "hidden": 64, "heads": 4, "seq_len": 64,
      "vocab": 512}, "parallel": {"pp": 2, "microbatches": 4}, "hardware": {"file": "hw.json"}})";
    std::ofstream(d + "/hf.json") << R"({"model": {"hf_config": "hf-config.json", "seq_len": 64},
      "parallel": {"pp": 2, "microbatches": 4}})";
    return d;
  }();
  return dir;
}

/// Plans what parsed, when it is small: the values must also survive the planner's arithmetic.
void plan_small(const pipesim::Result<pipesim::Config>& config) {
  if (!config.ok()) return;
  const std::optional<std::int64_t> tasks = pipesim::estimated_tasks(config.value());
  if (tasks && *tasks <= 5'000 && config.value().model.layers <= 64) (void)pipesim::make_plan(config.value());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace pipesim;
  if (size == 0) return 0;
  const std::string_view rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  switch (data[0] % 3) {
    case 0: {
      std::vector<std::string> settings;
      std::size_t start = 0;
      for (std::size_t end; (end = rest.find('\n', start)) != std::string_view::npos; start = end + 1)
        settings.emplace_back(rest.substr(start, end - start));
      settings.emplace_back(rest.substr(start));
      plan_small(parse_config(kBase, "fuzz.json", settings));
      return 0;
    }
    case 1:
    case 2: {
      const bool hardware = data[0] % 3 == 1;
      std::ofstream(folder() + (hardware ? "/hw.json" : "/hf-config.json"), std::ios::binary | std::ios::trunc) << rest;
      plan_small(load_config(folder() + (hardware ? "/hardware.json" : "/hf.json"), {}));
      return 0;
    }
  }
  return 0;
}
