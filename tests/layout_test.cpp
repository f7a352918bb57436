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
  baseline_config.schedule.vocab = VocabMode::Baseline;
  const Plan baseline = plan_or_fail(baseline_config);
  CHECK(baseline.layout.stages.back().layers == 4);
  CHECK(redistributed.layout.stages.back().layers < 4);
  // ... and it is faster: the last stage no longer holds up the pipeline.
  CHECK(simulate_or_fail(config).metrics.iteration_ns < simulate_or_fail(baseline_config).metrics.iteration_ns);
}

TEST_CASE("a layer split gives one count per virtual stage, or one per device spread over its chunks") {
  const Placement placement = GENERATE(Placement::Loop, Placement::V);
  const int chunks = placement == Placement::V ? 2 : GENERATE(1, 2, 3);
  const std::vector<int> per_device{7, 4, 3, 0};
  CAPTURE(placement == Placement::V, chunks);
  const std::optional<std::vector<int>> split = split_per_stage(per_device, 4, chunks, placement);
  REQUIRE(split);
  REQUIRE(split->size() == std::size_t(4 * chunks));
  for (int d = 0; d < 4; ++d) {
    const int n = per_device[std::size_t(d)];
    for (int c = 0; c < chunks; ++c)  // the device's earlier chunks (in model order) take the remainder
      CHECK((*split)[std::size_t(stage_of(placement, 4, d, c))] == n / chunks + (c < n % chunks ? 1 : 0));
  }
  // One per virtual stage is taken as given; any other length is neither form.
  std::vector<int> per_stage(std::size_t(4 * chunks), 1);
  per_stage.front() = 2;
  CHECK(split_per_stage(per_stage, 4, chunks, placement) == per_stage);
  CHECK_FALSE(split_per_stage({1, 2, 3}, 4, chunks, placement));
  CHECK_FALSE(split_per_stage(std::vector<int>(std::size_t(4 * chunks + 1), 1), 4, chunks, placement));
}

TEST_CASE("redistribute lays out a per-device split over interleaved and V chunks") {
  const std::string config = R"json({
    "model": {"layers": 16, "hidden": 64, "heads": 4, "seq_len": 32, "vocab": 1000},
    "parallel": {"pp": 4, "microbatches": 8, "chunks": 2},
    "schedule": {"vocab": "redistribute", "layers_per_stage": [5, 5, 4, 2]}
  })json";
  // Loop: device d holds stages d and 4 + d; V: stages d and 7 - d.
  const std::pair<std::string, std::vector<int>> cases[] = {{"1f1b", {5, 5, 4, 2}},
                                                            {"interleaved-1f1b", {3, 3, 2, 1, 2, 2, 2, 1}},
                                                            {"zb-v", {3, 3, 2, 1, 1, 2, 2, 2}}};
  for (const auto& [schedule, expected] : cases) {
    CAPTURE(schedule);
    const Plan plan = plan_or_fail(parse_or_fail(config, {"schedule.name=" + schedule}));
    std::vector<int> layers;
    for (const VirtualStage& s : plan.layout.stages) layers.push_back(s.layers);
    CHECK(layers == expected);
  }
}

TEST_CASE("a layer split of neither length names the lengths this schedule takes, and why") {
  const std::string config = R"json({
    "model": {"layers": 16, "hidden": 64, "heads": 4, "seq_len": 32, "vocab": 1000},
    "parallel": {"pp": 4, "microbatches": 8, "chunks": 2},
    "schedule": {"vocab": "redistribute", "layers_per_stage": [6, 5, 5]}
  })json";
  const std::pair<std::string, std::string> cases[] = {
      {"1f1b", "1f1b runs one stage per device, so on 4 devices (pp) it takes 4, one per device; give 4 counts or "
               "\"auto\""},
      {"interleaved-1f1b", "interleaved-1f1b runs parallel.chunks = 2 stages per device, so on 4 devices (pp) it "
                           "takes 4 (one per device, spread over its chunks) or 8 (one per virtual stage); give 4 or "
                           "8 counts or \"auto\""},
      {"zb-v", "zb-v always runs 2 stages per device, so on 4 devices (pp) it takes 4 (one per device, spread over "
               "its chunks) or 8 (one per virtual stage); give 4 or 8 counts or \"auto\""}};
  for (const auto& [schedule, why] : cases) {
    const Result<Plan> plan = make_plan(parse_or_fail(config, {"schedule.name=" + schedule}));
    REQUIRE_FALSE(plan.ok());
    CHECK(plan.error().message == "schedule.layers_per_stage: has 3 entries; " + why);
  }
}

TEST_CASE("redistribute may leave the first and last virtual stage the embedding and the LM head alone") {
  // Llama 3 405B's layout (docs/config.md): one layer a chunk, and the first and last chunk hold no
  // transformer layer. 6 layers fill 8 virtual stages that way, and the balanced split finds it.
  const std::string config = R"json({
    "model": {"layers": 6, "hidden": 64, "heads": 4, "seq_len": 32, "vocab": 1000},
    "parallel": {"pp": 4, "microbatches": 8, "chunks": 2},
    "schedule": {"name": "interleaved-1f1b", "vocab": "redistribute", "layers_per_stage": "auto"}
  })json";
  const Simulated run = simulate_or_fail(parse_or_fail(config));
  std::vector<int> layers;
  for (const VirtualStage& s : run.plan.layout.stages) layers.push_back(s.layers);
  CHECK(layers == std::vector<int>{0, 1, 1, 1, 1, 1, 1, 0});
  CHECK(run.plan.layout.stages.front().has_embedding);
  CHECK(run.plan.layout.stages.back().has_head);
  CHECK(run.metrics.iteration_ns > 0);

  // Every other mode needs a layer on every stage, and redistribute one on every stage but those two.
  const std::pair<std::vector<std::string>, std::string> refused[] = {
      {{"schedule.vocab=baseline"}, "so pp 4 needs 8; use parallel.pp of at most 3 or at least 8 layers"},
      {{"model.layers=5"}, "so pp 4 needs 6; use parallel.pp of at most 3 or at least 6 layers"}};
  for (const auto& [overrides, why] : refused) {
    CAPTURE(overrides);
    const Result<Config> parsed = parse_config(config, "test.json", overrides);
    REQUIRE_FALSE(parsed.ok());
    CHECK_THAT(parsed.error().message, Catch::Matchers::EndsWith(why));
  }
}
