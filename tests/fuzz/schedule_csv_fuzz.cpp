// libFuzzer target: a PyTorch compute-only schedule CSV (`--schedule-file`) -> parse -> plan ->
// simulation. The first two bytes pick the pipeline devices (1-8) and microbatches (1-16).
#include <fmt/format.h>

#include <cstdint>
#include <string_view>

#include "config_json.h"
#include "cost_model.h"
#include "plan.h"
#include "schedule_csv.h"
#include "simulator.h"

namespace {

pipesim::Config fuzz_config(int devices, int microbatches) {
  const std::string text = fmt::format(R"json({{
    "model": {{"layers": 64, "hidden": 64, "heads": 4, "seq_len": 32, "vocab": 1000}},
    "parallel": {{"pp": {}, "microbatches": {}}},
    "costs": {{"forward_ms": 1.1, "backward_ms": 2.3, "weight_ms": 0.7, "p2p_ms": 0.01}}
  }})json",
                                       devices, microbatches);
  return pipesim::parse_config(text, "fuzz.json").value();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace pipesim;
  if (size < 2) return 0;
  const int devices = 1 + data[0] % 8, microbatches = 1 + data[1] % 16;
  const std::string_view text(reinterpret_cast<const char*>(data) + 2, size - 2);
  Result<CustomSchedule> schedule = parse_schedule_csv(text, "fuzz.csv", devices, microbatches);
  if (!schedule.ok()) return 0;
  Config config = fuzz_config(devices, microbatches);
  config.parallel.chunks = schedule.value().chunks;
  for (const std::string vocab : {"baseline", "vocab-1"}) {
    config.schedule.vocab = *vocab_mode_named(vocab);
    Result<Plan> plan = make_plan(config, &schedule.value());
    if (!plan.ok()) continue;
    const Plan& p = plan.value();
    (void)simulate(p.graph, op_durations(*make_cost_model(p.config, p.layout), p.graph));
  }
  return 0;
}
