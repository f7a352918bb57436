#pragma once
// Shared test fixtures: configs are written as the user would write them (JSON), then parsed.
#include <fmt/format.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "config_files.h"
#include "config_json.h"
#include "cost_model.h"
#include "metrics.h"
#include "plan.h"
#include "simulator.h"

namespace pipesim::testing {

/// A pipeline with explicit costs: F and B per device (ms), no communication cost.
inline std::string explicit_json(int p, int m, int v, double forward_ms, double backward_ms,
                                 const std::string& schedule = "1f1b", double activation_bytes = 1000) {
  return fmt::format(R"json({{
    "model": {{"layers": {}, "hidden": 64, "heads": 4, "seq_len": 32, "vocab": 1000}},
    "parallel": {{"pp": {}, "microbatches": {}, "chunks": {}}},
    "schedule": {{"name": "{}"}},
    "training": {{"overlap_p2p_comm": true}},
    "costs": {{"forward_ms": {}, "backward_ms": {}, "p2p_ms": 0, "activation_bytes": {}}}
  }})json",
                     p * v * 2, p, m, v, schedule, forward_ms, backward_ms, activation_bytes);
}

/// A file of PyTorch 2.11's schedules, as tests/fixtures/torch-2.11/ keeps them.
inline std::string fixture(const std::string& name) {
  const char* root = std::getenv("PIPESIM_SOURCE");
  std::ifstream in(std::string(root ? root : ".") + "/tests/fixtures/torch-2.11/" + name);
  REQUIRE(in.good());
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

/// configs/NAME as shipped, with --set style overrides.
inline Config shipped_config(const std::string& name, const std::vector<std::string>& overrides = {}) {
  const char* root = std::getenv("PIPESIM_SOURCE");
  REQUIRE(root);
  std::ifstream file(std::string(root) + "/configs/" + name);
  std::stringstream text;
  text << file.rdbuf();
  Result<Config> config = parse_config(text.str(), "configs/" + name, overrides);
  if (!config.ok()) FAIL(config.error().message);
  return config.value();
}

/// configs/NAME by its full path, so that the Hugging Face file it names is found from any folder.
inline Config source_config(const std::string& name, const std::vector<std::string>& overrides = {}) {
  const char* root = std::getenv("PIPESIM_SOURCE");
  REQUIRE(root);
  Result<Config> config = load_config(std::string(root) + "/configs/" + name, overrides);
  if (!config.ok()) FAIL(config.error().message);
  return config.value();
}

inline Config parse_or_fail(const std::string& json, const std::vector<std::string>& overrides = {}) {
  Result<Config> config = parse_config(json, "test.json", overrides);
  if (!config.ok()) FAIL(config.error().message);
  return config.value();
}

inline Plan plan_or_fail(const Config& config) {
  Result<Plan> plan = make_plan(config);
  if (!plan.ok()) FAIL(plan.error().message);
  return std::move(plan).value();
}

struct Simulated {
  Plan plan;
  std::vector<TimeNs> durations;
  Timeline timeline;
  RunMetrics metrics;
};

inline Simulated simulate_or_fail(const Config& config) {
  Simulated s{plan_or_fail(config), {}, {}, {}};
  s.durations = op_durations(*make_cost_model(s.plan.config, s.plan.layout), s.plan.graph);
  Result<Timeline> timeline = simulate(s.plan.graph, s.durations);
  if (!timeline.ok()) FAIL(timeline.error().message);
  s.timeline = std::move(timeline).value();
  s.metrics = compute_metrics(s.plan.config, s.plan.graph, s.timeline, s.plan.static_bytes);
  return s;
}

}  // namespace pipesim::testing

/// Catch2 prints a vocabulary mode as configs spell it.
template <>
struct Catch::StringMaker<pipesim::VocabMode> {
  static std::string convert(pipesim::VocabMode mode) { return std::string(pipesim::vocab_mode_name(mode)); }
};
