// `pipesim bench`: how fast large graphs are built and simulated, and how much memory it takes.
#include <fmt/format.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>

#include "commands.h"
#include "cost_model.h"
#include "plan.h"
#include "simulate_config.h"
#include "simulator.h"
#include "validate.h"

namespace pipesim {
namespace {

struct BenchOptions {
  bool quick = false;  ///< smaller graphs, for a smoke test
};

struct Case {
  std::string schedule;
  int pp, microbatches, chunks;
};

Config bench_config(const Case& c) {
  Config config;
  config.source = "bench";
  config.model = {.layers = c.pp * c.chunks * 2, .hidden = 4096, .heads = 32, .ffn_hidden = 16384, .seq_len = 4096,
                  .vocab = 128000, .micro_batch_size = 1};
  config.parallel = {.pp = c.pp, .tp = 1, .dp = 1, .microbatches = c.microbatches, .chunks = c.chunks};
  config.schedule.name = c.schedule;
  config.hardware = *hardware_preset("h100-sxm");
  // Unequal, non-round costs so no two events tie by accident of the numbers.
  config.costs = ExplicitCosts{{1.1}, {2.3}, {0.0}, 0.013, 1e9, 0, 0};
  return config;
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

double peak_rss_mib() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return double(usage.ru_maxrss) / 1024.0;  // Linux reports KiB
}

/// Builds, then simulates `repeats` times and keeps the fastest simulation (least disturbed).
bool measure(const Case& c, int repeats) {
  const auto build_start = std::chrono::steady_clock::now();
  // As `simulate` builds, but with the structure checks on this thread (`simulate` runs them beside
  // the simulation); the simulation below proves the graph runs to its end.
  Result<Plan> plan = make_plan(bench_config(c), nullptr, Validation::ByCaller);
  if (plan.ok())
    if (Status s = validate_structure(plan.value().graph, plan.value().layout, c.microbatches); !s.ok())
      plan = s.error();
  const double build_s = seconds_since(build_start);
  if (!plan.ok()) {
    fmt::print(stderr, "pipesim: error: bench {}: {}\n", c.schedule, plan.error().message);
    return false;
  }
  const Plan& p = plan.value();
  const std::vector<TimeNs> durations = op_durations(*p.costs, p.graph);
  double best = 1e30;
  TimeNs makespan = 0;
  for (int r = 0; r < repeats; ++r) {
    std::vector<TimeNs> copy = durations;  // the simulation writes its end times over it
    const auto start = std::chrono::steady_clock::now();
    Result<Timeline> timeline = simulate(p.graph, std::move(copy));
    best = std::min(best, seconds_since(start));
    if (!timeline.ok()) {
      fmt::print(stderr, "pipesim: error: bench {}: {}\n", c.schedule, timeline.error().message);
      return false;
    }
    makespan = *std::max_element(timeline.value().end.begin(), timeline.value().end.end());
  }
  const double tasks = double(p.graph.size());
  fmt::print("{:<17} {:>4} {:>6} {:>3} {:>10.0f} {:>10.1f} {:>10.1f} {:>9.0f} {:>8.1f} {:>8.0f} {:>9.1f} {:>12.3f}\n",
             c.schedule, c.pp, c.microbatches, p.config.parallel.chunks, tasks, build_s * 1e3, best * 1e3,
             build_s / tasks * 1e9, best / tasks * 1e9, double(p.graph.memory_bytes()) / tasks, peak_rss_mib(),
             makespan / 1e6);
  std::fflush(stdout);
  return true;
}

ExitStatus run_bench(const BenchOptions& options) {
  share_one_heap();
  // Every schedule at four sizes, doubling m: equal ns per op down a schedule's rows means cost
  // linear in the number of ops.
  const int p = options.quick ? 8 : 64, largest = options.quick ? 128 : 1024;
  const int repeats = options.quick ? 1 : 5;
  fmt::print("graph building (generate + assemble + validate; large V schedules' candidate orders on two threads) and "
             "simulation (the best of {}), per op\n",
             repeats);
  fmt::print("{:<17} {:>4} {:>6} {:>3} {:>10} {:>10} {:>10} {:>9} {:>8} {:>8} {:>9} {:>12}\n", "schedule", "p", "m", "v",
             "ops", "build_ms", "sim_ms", "build_ns", "sim_ns", "graph_B", "rss_mib", "makespan_ms");
  for (const std::string& schedule : schedule_names())
    for (int m = largest / 8; m <= largest; m *= 2)
      if (!measure({schedule, p, m, 2}, repeats)) return ExitStatus::Failure;
  return ExitStatus::Success;
}

}  // namespace

void define_bench(CLI::App& bch, ExitStatus& status) {
  auto o = std::make_shared<BenchOptions>();
  bch.add_flag("--quick", o->quick, "smaller graphs (a smoke test)");
  bch.callback([o, &status] { status = run_bench(*o); });
}

}  // namespace pipesim
