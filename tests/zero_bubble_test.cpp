// The zero-bubble paper's schedules -- ZB-H2 and the automatic scheduler (zb-1p, zb-2p, zb-auto) --
// against its own figures: Table 5's bubble rates from Table 9's op times (configs/paper/zero-bubble-*),
// and the memory each promises (docs/schedules.md).
#include <algorithm>
#include <array>

#include "helpers.h"

using namespace pipesim;
using namespace pipesim::testing;

namespace {

/// Qi et al., "Zero Bubble Pipeline Parallelism" (ICLR 2024), Table 5: bubble rates of 1F1B, ZB-H1,
/// ZB-H2, ZB-1p and ZB-2p as the paper computed them from its Table 9 times, with its bubble rate
/// (cost - m(F + B + W)) / cost, cost the longest stage span.
struct PaperRow {
  const char* config;
  std::array<double, 5> bubble;  ///< 1f1b, zb-h1, zb-h2, zb-1p, zb-2p
};
constexpr std::array<const char*, 5> kSchedules = {"1f1b", "zb-h1", "zb-h2", "zb-1p", "zb-2p"};
constexpr std::array<PaperRow, 12> kTable5 = {{
    {"zero-bubble-1.5b-m24.json", {0.2431, 0.1585, 0.1083, 0.1585, 0.0433}},
    {"zero-bubble-1.5b-m32.json", {0.1985, 0.1242, 0.0837, 0.1242, 0.0039}},
    {"zero-bubble-1.5b-m64.json", {0.1240, 0.0674, 0.0444, 0.0674, 0.0026}},
    {"zero-bubble-6.2b-m24.json", {0.2347, 0.1323, 0.0698, 0.1323, 0.0029}},
    {"zero-bubble-6.2b-m32.json", {0.1898, 0.1045, 0.0559, 0.1045, 0.0022}},
    {"zero-bubble-6.2b-m64.json", {0.1091, 0.0554, 0.0294, 0.0554, 0.0010}},
    {"zero-bubble-14.6b-m48.json", {0.2552, 0.1397, 0.0672, 0.1397, 0.0066}},
    {"zero-bubble-14.6b-m64.json", {0.2082, 0.1088, 0.0516, 0.1088, 0.0054}},
    {"zero-bubble-14.6b-m128.json", {0.1251, 0.0576, 0.0266, 0.0576, 0.0028}},
    {"zero-bubble-28.3b-m96.json", {0.2646, 0.1421, 0.0641, 0.1421, 0.0038}},
    {"zero-bubble-28.3b-m128.json", {0.2168, 0.1106, 0.0490, 0.1106, 0.0029}},
    {"zero-bubble-28.3b-m256.json", {0.1352, 0.0594, 0.0257, 0.0594, 0.0018}},
}};

Simulated simulate_paper(const std::string& config, const std::string& schedule, std::vector<std::string> sets = {}) {
  sets.push_back("schedule.name=" + schedule);
  return simulate_or_fail(shipped_config("paper/" + config, sets));
}

Bytes largest_activation(const RunMetrics& metrics) {
  Bytes most = 0;
  for (const DeviceMetrics& d : metrics.devices) most = std::max(most, d.peak_activation_bytes);
  return most;
}

}  // namespace

TEST_CASE("Table 5 of the zero-bubble paper: every schedule's bubble rate within 1 point of the paper's") {
  // Every stage does the same work, so pipesim's bubble -- the mean over devices of 1 - busy / iteration,
  // the iteration the longest device span under post-validation -- is the paper's rate.
  const PaperRow& row = GENERATE(from_range(kTable5));
  for (std::size_t s = 0; s < kSchedules.size(); ++s) {
    CAPTURE(row.config, kSchedules[s]);
    const Simulated run = simulate_paper(row.config, kSchedules[s]);
    CHECK(std::abs(run.metrics.bubble_fraction - row.bubble[s]) < 0.01);
  }
}

TEST_CASE("ZB-2p holds at most twice 1F1B's peak activations, ZB-1p and ZB-H1 no more than 1F1B's, ZB-H2 2p - 1") {
  const PaperRow& row = GENERATE(kTable5[0], kTable5[6]);
  CAPTURE(row.config);
  const Bytes one_f_one_b = largest_activation(simulate_paper(row.config, "1f1b").metrics);
  const Bytes per_microbatch = one_f_one_b / simulate_paper(row.config, "1f1b").plan.config.parallel.pp;
  CHECK(largest_activation(simulate_paper(row.config, "zb-2p").metrics) <= 2 * one_f_one_b);
  CHECK(largest_activation(simulate_paper(row.config, "zb-1p").metrics) <= one_f_one_b);
  CHECK(largest_activation(simulate_paper(row.config, "zb-h1").metrics) <= one_f_one_b);
  CHECK(largest_activation(simulate_paper(row.config, "zb-h2").metrics) == 2 * one_f_one_b - per_microbatch);
}

TEST_CASE("zb-auto takes its limit from schedule.memory_limit: 1x and 2x are zb-1p and zb-2p, more buys less bubble") {
  const std::string config = kTable5[0].config;
  const auto bubble = [&](const std::string& schedule, const std::string& limit) {
    return simulate_paper(config, schedule, {"schedule.memory_limit=" + limit}).metrics.bubble_fraction;
  };
  CHECK(bubble("zb-auto", "1") == bubble("zb-1p", "fit"));
  CHECK(bubble("zb-auto", "2") == bubble("zb-2p", "fit"));
  // 16 GiB is 2x here (1 GiB per microbatch, 8 stages). The heuristic's warm-up stops adding forwards
  // once they no longer shorten the wait for the first B, so all the device has buys no more than 2x.
  CHECK(bubble("zb-auto", "\"16 GiB\"") == bubble("zb-2p", "fit"));
  CHECK(bubble("zb-auto", "1.5") < bubble("zb-1p", "fit"));
  CHECK(bubble("zb-auto", "1.5") > bubble("zb-2p", "fit"));
  CHECK(bubble("zb-auto", "fit") <= bubble("zb-2p", "fit"));
}

TEST_CASE("zb-auto refuses a limit below one microbatch, naming the field") {
  Config config = shipped_config("paper/" + std::string(kTable5[0].config),
                                 {"schedule.name=zb-auto", "schedule.memory_limit=\"0.5 GiB\""});
  Result<Plan> plan = make_plan(config);
  REQUIRE_FALSE(plan.ok());
  CHECK_THAT(plan.error().message, Catch::Contains("schedule.memory_limit"));
  CHECK_THAT(plan.error().message, Catch::Contains("0.5 GiB"));
}

TEST_CASE("schedule.memory_limit: a multiple, GiB or fit; anything else is refused with the forms") {
  const std::string base = R"({"model": {"layers": 4, "hidden": 64, "heads": 4, "seq_len": 32, "vocab": 1000},
                               "parallel": {"pp": 2, "microbatches": 4}, "schedule": {"name": "zb-auto", "memory_limit": )";
  CHECK(parse_or_fail(base + "2}}").schedule.memory_limit == ActivationLimit{ActivationLimit::Unit::Times1F1B, 2});
  CHECK(parse_or_fail(base + "\"3 GiB\"}}").schedule.memory_limit ==
        ActivationLimit{ActivationLimit::Unit::Bytes, 3.0 * double(Bytes(1) << 30)});
  CHECK(parse_or_fail(base + "\"fit\"}}").schedule.memory_limit == ActivationLimit{});
  for (const char* bad : {"0", "-1", "\"3 GB\"", "\"lots\"", "true"}) {
    Result<Config> config = parse_config(base + bad + "}}", "test.json");
    REQUIRE_FALSE(config.ok());
    CHECK_THAT(config.error().message, Catch::Contains("schedule.memory_limit") && Catch::Contains("GiB"));
  }
}

TEST_CASE("zero-bubble schedules run every vocabulary mode, and under full recomputation") {
  const std::string schedule = GENERATE("zb-h2", "zb-1p", "zb-2p");
  const VocabMode vocab = GENERATE(VocabMode::Baseline, VocabMode::Redistribute, VocabMode::Vocab1, VocabMode::Vocab2,
                                   VocabMode::Interlaced);
  CAPTURE(schedule, vocab);
  const Simulated run = simulate_or_fail(shipped_config(
      "tiny.json", {"schedule.name=" + schedule, "schedule.vocab=" + std::string(vocab_mode_name(vocab)),
                    "parallel.microbatches=8"}));
  CHECK(run.metrics.iteration_ns > 0);
  const Simulated recomputed = simulate_or_fail(shipped_config(
      "tiny.json", {"schedule.name=" + schedule, "training.recompute_granularity=full", "parallel.microbatches=8"}));
  CHECK(recomputed.metrics.iteration_ns > 0);
}

TEST_CASE("ZB-H2 at F = B = W: no bubble in a device's span, and (p - 1) F more from a common start") {
  const int p = GENERATE(4, 8);
  const int m = GENERATE_COPY(2 * p, 4 * p);
  CAPTURE(p, m);
  const std::string json = fmt::format(R"({{
    "model": {{"layers": {}, "hidden": 64, "heads": 4, "seq_len": 32, "vocab": 1000}},
    "parallel": {{"pp": {}, "microbatches": {}}}, "schedule": {{"name": "zb-h2"}},
    "costs": {{"forward_ms": 2, "backward_ms": 2, "weight_ms": 2, "p2p_ms": 0, "activation_bytes": 1000}}}})",
                                       2 * p, p, m);
  const TimeNs unit = 2 * kNsPerMs;
  const Simulated common_start = simulate_or_fail(parse_or_fail(json));
  CHECK(common_start.metrics.iteration_ns == 3 * m * unit + (p - 1) * unit);
  const Simulated overlapping = simulate_or_fail(parse_or_fail(json, {"training.optimizer_post_validation=true"}));
  CHECK(overlapping.metrics.iteration_ns == 3 * m * unit);
  CHECK(overlapping.metrics.bubble_fraction == 0);
}
