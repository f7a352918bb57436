// Layer placement: loop and V placement, and the "auto" split that minimises the slowest stage.
#include <numeric>

#include "helpers.h"

using namespace pipesim;
using namespace pipesim::testing;

namespace {

double slowest(const std::vector<int>& split, const StageWeights& w) {
  double worst = 0;
  for (std::size_t s = 0; s < split.size(); ++s)
    worst = std::max(worst, split[s] * w.layer + (s == 0 ? w.embedding : 0) + (s + 1 == split.size() ? w.head : 0));
  return worst;
}

/// Every split of `layers` over `stages` (compositions), for brute force on small cases.
void for_each_split(int layers, int stages, std::vector<int>& prefix, const std::function<void(const std::vector<int>&)>& f) {
  if (int(prefix.size()) == stages - 1) {
    prefix.push_back(layers);
    f(prefix);
    prefix.pop_back();
    return;
  }
  for (int n = 0; n <= layers; ++n) {
    prefix.push_back(n);
    for_each_split(layers - n, stages, prefix, f);
    prefix.pop_back();
  }
}

}  // namespace

TEST_CASE("loop placement puts stage c*p + d on device d; V placement folds chunk 1 back") {
  Layout loop{4, 2, Placement::Loop, {}}, v{4, 2, Placement::V, {}};
  for (int d = 0; d < 4; ++d) {
    CHECK(loop.stage_of(d, 0) == d);
    CHECK(loop.stage_of(d, 1) == 4 + d);
    CHECK(v.stage_of(d, 0) == d);
    CHECK(v.stage_of(d, 1) == 7 - d);
  }
}

TEST_CASE("the auto split is optimal for the slowest stage (brute force on small cases)") {
  const int layers = GENERATE(4, 7, 10);
  const int stages = GENERATE(2, 3, 4);
  const double head = GENERATE(0.0, 0.5, 1.7, 4.0);
  const double embedding = GENERATE(0.0, 0.3);
  const StageWeights w{1.0, embedding, head};
  CAPTURE(layers, stages, head, embedding);
  const std::vector<int> split = balanced_split(layers, stages, w);
  REQUIRE(int(split.size()) == stages);
  CHECK(std::accumulate(split.begin(), split.end(), 0) == layers);
  double best = 1e300;
  std::vector<int> prefix;
  for_each_split(layers, stages, prefix, [&](const std::vector<int>& s) { best = std::min(best, slowest(s, w)); });
  CHECK(slowest(split, w) == Approx(best));
}

TEST_CASE("redistribute moves layers off the stage holding a large LM head") {
  const Config config = parse_or_fail(R"json({
    "model": {"layers": 32, "hidden": 4096, "heads": 32, "seq_len": 4096, "vocab": 256000},
    "parallel": {"pp": 8, "microbatches": 32},
    "schedule": {"vocab": "redistribute"},
    "hardware": {"preset": "a100-80gb"}
  })json");
  const Plan redistributed = plan_or_fail(config);
  Config baseline_config = config;
  baseline_config.schedule.vocab = "baseline";
  const Plan baseline = plan_or_fail(baseline_config);
  CHECK(baseline.layout.stages.back().layers == 4);
  CHECK(redistributed.layout.stages.back().layers < 4);
  // ... and it is faster: the last stage no longer holds up the pipeline.
  CHECK(simulate_or_fail(config).metrics.iteration_ns < simulate_or_fail(baseline_config).metrics.iteration_ns);
}
