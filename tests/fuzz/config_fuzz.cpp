// libFuzzer target: config text -> parse -> plan -> durations -> simulation -> metrics, the path
// every `pipesim simulate` takes. Built and run by tools/fuzz.sh (clang, ASan + UBSan).
#include <cstdint>
#include <string_view>

#include "config_json.h"
#include "cost_model.h"
#include "metrics.h"
#include "plan.h"
#include "simulator.h"
#include "sizes.h"

namespace {

/// Larger plans are valid but take milliseconds each; the sizes themselves are checked by
/// check_sizes (tests/sizes_test.cpp), so here they would only slow the search down.
constexpr std::int64_t kMaxTasks = 20'000;
constexpr std::int64_t kMaxSplitWork = 1 << 16;  ///< layers x virtual stages for the balanced split

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace pipesim;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  Result<Config> config = parse_config(text, "fuzz.json");
  if (!config.ok()) return 0;
  const Config& c = config.value();
  const std::optional<std::int64_t> tasks = estimated_tasks(c);
  if (!tasks || *tasks > kMaxTasks) return 0;
  if (std::int64_t(c.model.layers) * c.parallel.pp * c.parallel.chunks > kMaxSplitWork) return 0;
  Result<Plan> plan = make_plan(c);
  if (!plan.ok()) return 0;
  const Plan& p = plan.value();
  const std::vector<TimeNs> durations = op_durations(*make_cost_model(p.config, p.layout), p.graph);
  Result<Timeline> timeline = simulate(p.graph, durations);
  if (!timeline.ok()) return 0;
  const RunMetrics metrics = compute_metrics(p.config, p.graph, timeline.value(), p.static_bytes);
  // A plan that built and simulated must report sane numbers: these are the "silent wrong results".
  for (const DeviceMetrics& d : metrics.devices)
    if (d.static_bytes < 0 || d.peak_activation_bytes < 0 || d.busy_ns < 0) __builtin_trap();
  if (metrics.iteration_ns < 0) __builtin_trap();
  return 0;
}
