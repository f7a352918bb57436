// tune: the pruned search keeps what the exhaustive one finds, its bounds never exceed what the
// simulator reports, it never does worse than compare, and it says why when nothing fits. sweep's
// --grid syntax.
//
// The searches run on spaces of a few hundred candidates: the analytic ones pinned (TuneSearch::pins,
// as --fix pins them) to 4 microbatches and one vocabulary mode or schedule, with every other knob free.
// Each space's exhaustive search runs once, and every test that compares with it reuses it.
#include <algorithm>
#include <map>
#include <set>
#include <tuple>

#include "config_files.h"
#include "helpers.h"
#include "parallel_shape.h"
#include "simulate_config.h"
#include "sweep.h"
#include "tune.h"
#include "tune_knobs.h"

using namespace pipesim;
using namespace pipesim::testing;

namespace {

/// Small configs: the runtime's tiny GPT under the analytic model, the same with a sequence long
/// enough that tune tries context parallelism (each rank keeps 4096 tokens or more), and a pipeline
/// with explicit per-device costs (tens of candidates: its pp, tp and micro-batch stay fixed).
Config small_config(const std::string& name) {
  // No reserved memory: the caps the tests set are what the tensors may use.
  if (name == "tiny") return shipped_config("tiny.json", {"hardware.reserved_gib=0"});
  if (name == "long") return shipped_config("tiny.json", {"hardware.reserved_gib=0", "model.seq_len=8192"});
  return parse_or_fail(explicit_json(4, 8, 2, 1.0, 2.0, "1f1b", 1e6), {"hardware.memory_gib=1", "hardware.reserved_gib=0"});
}

std::vector<Pin> parse_pins(const std::vector<std::string>& fixes) {
  std::vector<Pin> pins;
  for (const std::string& fix : fixes) {
    Result<Pin> pin = parse_pin(fix);
    if (!pin.ok()) FAIL(pin.error().message);
    pins.push_back(pin.value());
  }
  return pins;
}

/// What keeps each analytic space to a few hundred candidates: tiny's at 4 GPUs, at 8, and the long
/// sequence's. The other knobs vary: pp, tp, dp, cp,
/// sequence parallelism, the micro-batch, chunks, recomputation, ZeRO, and the schedule or the
/// vocabulary mode. 4 microbatches keep refusals in the space (DualPipeV needs m >= 2 pp,
/// interleaved-1f1b a multiple of pp). The vocabulary mode is a vocabulary-parallel one at 4 GPUs (the
/// bounds' logits shard) and redistribute at 8 (its layer splits, up to three per layout: recomputation
/// stays none there); the long sequence keeps every mode and pins the schedule instead. FP8 is tried on
/// and off at 4 GPUs (936 candidates) and pinned off elsewhere.
std::vector<Pin> space_pins(const std::string& name, int gpus) {
  if (name == "tiny" && gpus == 4) return parse_pins({"m=4", "vocab=vocab-2"});
  if (name == "tiny" && gpus == 8) return parse_pins({"m=4", "vocab=redistribute", "recompute=none", "fp8=none"});
  if (name == "long") return parse_pins({"m=4", "schedule=1f1b", "fp8=none"});
  return {};  // explicit costs: tens of candidates already
}

TuneResult tune_or_fail(const Config& config, const TuneSearch& search) {
  Result<TuneResult> result = tune(config, search);
  if (!result.ok()) FAIL(result.error().message);
  return std::move(result).value();
}

/// The space's exhaustive search: every candidate simulated, fastest first; by default under no memory
/// cap, so that each one the schedule runs is a row. Run once per config, GPU count and cap. (zb-auto
/// fills what the device has, so a cap changes its runs, not only which of them fit.)
const TuneResult& exhaustive(const std::string& name, int gpus, double memory_gib = 1e6) {
  static std::map<std::tuple<std::string, int, double>, TuneResult> searches;
  auto it = searches.find({name, gpus, memory_gib});
  if (it == searches.end()) {
    Config capped = small_config(name);
    capped.hardware.memory_gib = memory_gib;
    TuneResult all =
        tune_or_fail(capped, {.gpus = gpus, .top = 1'000'000, .prune = false, .pins = space_pins(name, gpus)});
    if (memory_gib == 1e6) REQUIRE(all.rows.size() == all.simulated);  // every run fits: none is left out of the rows
    it = searches.emplace(std::tuple(name, gpus, memory_gib), std::move(all)).first;
  }
  return it->second;
}

/// Candidate and iteration time of each row: what "the same top K" means.
using Ranking = std::vector<std::pair<std::size_t, TimeNs>>;
Ranking ranking(const TuneResult& result) {
  Ranking rows;
  for (const TuneRow& row : result.rows) rows.emplace_back(row.candidate, row.report.metrics.iteration_ns);
  return rows;
}

/// What the exhaustive search finds under `config`'s memory cap: its fastest `top` rows that fit there
/// (a row fits when its peak is at most the cap, as simulate decides).
Ranking exhaustive_top(const TuneResult& all, const Config& config, std::size_t top) {
  Ranking rows;
  for (const TuneRow& row : all.rows)
    if (max_peak(row.report) <= memory_capacity_bytes(config.hardware) && rows.size() < top)
      rows.emplace_back(row.candidate, row.report.metrics.iteration_ns);
  return rows;
}

/// The space as the pinned search sees it: TuneRow::candidate indexes it.
std::vector<Candidate> pinned_space(const Config& config, int gpus, const std::vector<Pin>& pins) {
  Result<std::vector<Candidate>> space = pin_space(config, tune_space(config, gpus), pins, gpus);
  if (!space.ok()) FAIL(space.error().message);
  return std::move(space).value();
}

}  // namespace

TEST_CASE("the pruned search keeps exactly the exhaustive search's top K") {
  const std::string name = GENERATE("tiny", "explicit");
  const int gpus = GENERATE(4, 8);
  CAPTURE(name, gpus);
  Config config = small_config(name);
  const std::vector<Pin> pins = space_pins(name, gpus);
  const TuneResult& all = exhaustive(name, gpus);
  CHECK(all.pruned() == 0);
  if (name == "tiny") CHECK(all.refused > 0);  // refused candidates are counted, never ranked
  // A cap at the median peak of every run: about half the candidates fit.
  std::vector<Bytes> peaks;
  for (const TuneRow& row : all.rows) peaks.push_back(max_peak(row.report));
  std::nth_element(peaks.begin(), peaks.begin() + std::ptrdiff_t(peaks.size() / 2), peaks.end());
  const double median_gib = double(peaks[peaks.size() / 2]) / double(1 << 30);
  for (const std::size_t top : {1, 5})
  for (const double memory_gib : {config.hardware.memory_gib, median_gib}) {
    CAPTURE(top, memory_gib);
    config.hardware.memory_gib = memory_gib;
    // Small batches move the bar often, so the bounds get to prune.
    const TuneResult pruned = tune_or_fail(config, {.gpus = gpus, .top = top, .prune = true, .batch = 4, .pins = pins});
    const Ranking expected = exhaustive_top(exhaustive(name, gpus, memory_gib), config, top);
    CHECK(expected.size() == top);
    CHECK(ranking(pruned) == expected);
    CHECK(pruned.evaluated == pruned.simulated + pruned.pruned() + pruned.refused);
    CHECK(pruned.evaluated == all.evaluated);
    // Explicit costs keep pp and tp, and give every schedule the same compute: no time bound separates
    // them. The analytic space has both, so there the bounds must prune, and under the median cap
    // the memory bounds too.
    if (name == "tiny") CHECK(pruned.pruned_by_time > 0);
    if (name == "tiny") CHECK(pruned.simulated < all.simulated);
    if (name == "tiny" && memory_gib == median_gib) CHECK(pruned.pruned_by_memory > 0);
  }
}

TEST_CASE("a pinned search keeps exactly the exhaustive search's top K among the candidates with that value") {
  const Config config = small_config("tiny");
  const std::vector<Pin> pins = space_pins("tiny", 4);
  const TuneResult& all = exhaustive("tiny", 4);
  for (const std::string fix : {"pp=2", "parallel.pp=2", "mbs=1", "schedule=zb-v", "recompute=full", "zero_stage=3",
                                "pp=1,4", "schedule=zb-v,1f1b", "zero=0,3"}) {
    CAPTURE(fix);
    Result<Pin> pin = parse_pin(fix);
    REQUIRE(pin.ok());
    const std::vector<std::string>& values = pin.value().values;
    std::vector<std::pair<std::string, TimeNs>> expected, got;
    for (const TuneRow& row : all.rows)
      if (std::ranges::count(values, knob_value(row.config, pin.value().knob)) == 1 && expected.size() < 5)
        expected.emplace_back(row.changes, row.report.metrics.iteration_ns);
    std::vector<Pin> more = pins;
    more.push_back(pin.value());
    const TuneResult pinned = tune_or_fail(config, {.gpus = 4, .top = 5, .pins = more});
    for (const TuneRow& row : pinned.rows) got.emplace_back(row.changes, row.report.metrics.iteration_ns);
    CHECK(got == expected);
    CHECK(expected.size() == 5);
    CHECK(pinned.evaluated < all.evaluated);
  }
  // A number as the user may write it is compared as a number.
  REQUIRE(parse_pin("parallel.pp=02").ok());
  CHECK(parse_pin("parallel.pp=02").value().values == std::vector<std::string>{"2"});
  // A list, each value read the same way, once each.
  REQUIRE(parse_pin("sp=true,off,on").ok());
  CHECK(parse_pin("sp=true,off,on").value().values == std::vector<std::string>{"on", "off"});
  CHECK(parse_pin("pp=2,,4").error().message ==
        "--fix 'pp=2,,4': an empty value; give values between the commas, e.g. --fix pp=4,8");
  CHECK(parse_pin("pp=2,x").error().message == "--fix 'pp=2,x': pp takes a whole number, got 'x'");
  CHECK(parse_pin("parallel.pp=02").value().knob == Knob::Pp);
}

TEST_CASE("the search's result does not depend on its batches or its threads' timing") {
  const Config config = small_config("tiny");
  const std::vector<Pin> pins = space_pins("tiny", 4);
  const TuneResult first = tune_or_fail(config, {.gpus = 4, .top = 7, .batch = 1, .pins = pins});
  CHECK(ranking(first) == exhaustive_top(exhaustive("tiny", 4), config, 7));
  for (const std::size_t batch : {3, 16, 1000}) {
    const TuneResult again = tune_or_fail(config, {.gpus = 4, .top = 7, .batch = batch, .pins = pins});
    CHECK(ranking(again) == ranking(first));
  }
  for (int run = 0; run < 3; ++run) {
    const TuneResult same = tune_or_fail(config, {.gpus = 4, .top = 7, .batch = 16, .pins = pins});
    CHECK(same.pruned() == tune_or_fail(config, {.gpus = 4, .top = 7, .batch = 16, .pins = pins}).pruned());
  }
}

TEST_CASE("the lower bounds never exceed the simulated peak memory and iteration time") {
  const std::string name = GENERATE("tiny", "explicit", "long");
  const int gpus = GENERATE(4, 8);
  if (name == "long" && gpus != 4) return;  // cp 2 needs no more GPUs
  CAPTURE(name, gpus);
  const Config config = small_config(name);
  const std::vector<Candidate> space = pinned_space(config, gpus, space_pins(name, gpus));
  REQUIRE(space.size() > 40);
  // Context and sequence parallelism are among the knobs the bounds must hold for.
  const auto has = [&](auto predicate) { return std::any_of(space.begin(), space.end(), predicate); };
  CHECK(has([](const Candidate& c) { return c.parallel.cp == 2; }) == (name == "long"));
  CHECK(has([](const Candidate& c) { return c.parallel.tp > 1 && !c.parallel.sequence_parallel; }) == (name != "explicit"));
  // Every candidate the simulator runs is a row of the exhaustive search, its report the simulator's.
  const TuneResult& all = exhaustive(name, gpus);
  REQUIRE(all.evaluated == space.size());
  std::vector<bool> simulated(space.size(), false);
  for (const TuneRow& row : all.rows) {
    simulated[row.candidate] = true;
    const Candidate& candidate = space[row.candidate];
    const Result<LowerBounds> bounds = lower_bounds(row.config);
    const ParallelConfig& p = candidate.parallel;
    INFO(candidate.schedule << " / " << vocab_mode_name(candidate.vocab) << ", pp " << p.pp << " tp " << p.tp << " dp " << p.dp << " cp "
                            << p.cp << " m " << p.microbatches << " x " << candidate.micro_batch_size << " chunks "
                            << p.chunks << " " << candidate.split_change);
    REQUIRE(bounds.ok());
    const RunMetrics& metrics = row.report.metrics;
    REQUIRE(bounds.value().memory_bytes.size() == metrics.devices.size());
    for (const DeviceMetrics& d : metrics.devices) {
      CHECK(bounds.value().memory_bytes[std::size_t(d.rank)] <= d.peak_memory_bytes);
      CHECK(bounds.value().memory_bytes[std::size_t(d.rank)] > d.static_bytes);  // it counts activations too
    }
    CHECK(bounds.value().iteration_ns <= metrics.iteration_ns);
    CHECK(bounds.value().iteration_ns > 0);
  }
  CHECK(all.rows.size() > space.size() / 2);
  // The rest were refused, by the bounds' checks or by the schedule: the simulator refuses them too,
  // so a bound that fails never hides a run.
  for (std::size_t i = 0; i < space.size(); ++i)
    if (!simulated[i]) CHECK_FALSE(simulate_config(apply_candidate(config, space[i])).ok());
}

TEST_CASE("tune's best fitting row is never worse than compare's, whose points are all in its space") {
  const std::string name = GENERATE("default.json", "tiny.json", "examples/split-backward.json");
  CAPTURE(name);
  const Config config = source_config(name);
  double best = 0;
  for (const std::string& schedule : schedule_names())
    for (const std::string& vocab : vocab_mode_names()) {  // what compare runs
      Config c = config;
      c.schedule.name = schedule;
      c.schedule.vocab = *vocab_mode_named(vocab);
      if (const Result<SimulatedRun> run = simulate_config(c); run.ok() && run.value().report.metrics.fits_in_memory)
        best = std::max(best, run.value().report.metrics.tokens_per_s);
    }
  REQUIRE(best > 0);
  // Compare varies the schedule and the vocabulary mode only (and with them chunks and the split):
  // the search pinned to the config's other knobs holds every point of it.
  std::vector<Pin> pins;
  for (const Knob knob : {Knob::Pp, Knob::Tp, Knob::Dp, Knob::Cp, Knob::SequenceParallel, Knob::Microbatches,
                          Knob::MicroBatchSize, Knob::Recompute, Knob::ZeroStage})
    pins.push_back({knob, {knob_value(config, knob)}, fmt::format("{}={}", knob_name(knob), knob_value(config, knob))});
  const TuneResult result = tune_or_fail(config, {.pins = pins});
  REQUIRE(!result.rows.empty());
  CHECK(result.rows.front().report.metrics.tokens_per_s >= best);
  CHECK(result.rows.size() <= 10);
  // One candidate is the config itself: nothing changed.
  const std::vector<Candidate> space =
      pinned_space(config, config.parallel.pp * config.parallel.tp * config.parallel.dp, pins);
  CHECK(std::any_of(space.begin(), space.end(), [&](const Candidate& c) {
    return c.schedule == config.schedule.name && c.vocab == config.schedule.vocab && describe_changes(config, c) == "none";
  }));
}

TEST_CASE("changes name what differs from the config") {
  const Config config = source_config("default.json");  // pp 8, tp 1, dp 1, 32 x 1, 1f1b, baseline
  Candidate c{{.pp = 4, .tp = 1, .dp = 2, .microbatches = 8, .chunks = 4}, 2, "interleaved-1f1b", VocabMode::Vocab2, {}, "", {}, Recompute::None, RecomputeMethod::Uniform, 1, 0};
  CHECK(describe_changes(config, c) ==
        "pp 8→4, dp 1→2, m 32→8, mbs 1→2, chunks 2→4, schedule interleaved-1f1b, vocab vocab-2");
  c = {{.pp = 8, .tp = 1, .dp = 1, .microbatches = 32, .chunks = 1}, 1, "1f1b", VocabMode::Redistribute,
       {5, 4, 4, 4, 4, 4, 4, 3}, "1 layer s7→s6", {}, Recompute::None, RecomputeMethod::Uniform, 1, 0};
  CHECK(describe_changes(config, c) == "vocab redistribute, 1 layer s7→s6");
  c = {{.pp = 8, .tp = 1, .dp = 1, .microbatches = 32, .chunks = 1}, 1, "1f1b", VocabMode::Baseline, {}, "", {}, Recompute::None, RecomputeMethod::Uniform, 1, 0};
  CHECK(describe_changes(config, c) == "none");  // 1f1b runs one chunk whatever parallel.chunks says
}

TEST_CASE("every candidate keeps the global batch, and the space holds each redistribute split once") {
  const Config config = source_config("default.json");
  const ParallelConfig& given = config.parallel;
  const std::int64_t global = std::int64_t(given.microbatches) * config.model.micro_batch_size * given.dp;
  const std::vector<Candidate> space = tune_space(config, 64);
  for (const Candidate& c : space) {
    CHECK(std::int64_t(c.parallel.microbatches) * c.micro_batch_size * c.parallel.dp == global);
    CHECK(c.parallel.pp * c.parallel.tp * c.parallel.dp * c.parallel.cp == 64);
    CHECK(c.parallel.tp <= config.hardware.gpus_per_node);
    CHECK(config.model.heads % c.parallel.tp == 0);
  }
  // For one shape and schedule: auto, and auto with one layer moved to a neighbouring stage, each once.
  std::vector<Candidate> splits;
  std::copy_if(space.begin(), space.end(), std::back_inserter(splits), [](const Candidate& c) {
    return c.schedule == "1f1b" && c.vocab == VocabMode::Redistribute && c.parallel.pp == 8 && c.parallel.tp == 8 &&
           c.parallel.sequence_parallel && c.micro_batch_size == 1 && c.recompute == Recompute::None &&
           c.zero_stage == 0 && c.fp8 == Fp8Format::None;
  });
  REQUIRE(splits.size() >= 2);
  CHECK(splits[0].layers_per_stage.empty());
  const std::vector<int> auto_split = balanced_split(32, 8, stage_weights(apply_candidate(config, splits[0])));
  for (std::size_t i = 1; i < splits.size(); ++i) {
    const std::vector<int>& moved = splits[i].layers_per_stage;
    REQUIRE(moved.size() == auto_split.size());
    std::vector<int> difference, stages;
    for (std::size_t s = 0; s < moved.size(); ++s)
      if (moved[s] != auto_split[s]) difference.push_back(moved[s] - auto_split[s]), stages.push_back(int(s));
    CHECK((difference == std::vector{-1, 1} || difference == std::vector{1, -1}));
    CHECK((stages.size() == 2 && stages[1] == stages[0] + 1));
    for (std::size_t j = 1; j < i; ++j) CHECK(splits[j].layers_per_stage != moved);
  }
}

TEST_CASE("tune splits training.global_batch_size as the config reader does: the same space, each candidate valid") {
  // tiny.json: 8 microbatches of 2 on dp 1, so a global batch of 16 sequences either way.
  const Config counted = small_config("tiny");
  const Config given = shipped_config("tiny.json", {"hardware.reserved_gib=0", "training.global_batch_size=16"});
  REQUIRE(given.parallel.microbatches == 16 / (2 * 1));
  const std::vector<Candidate> space = tune_space(given, 4);
  CHECK(space.size() == tune_space(counted, 4).size());
  std::set<std::pair<int, int>> shapes;  // (dp, micro_batch_size)
  for (const Candidate& c : space) {
    const Config applied = apply_candidate(given, c);
    CHECK(applied.training.global_batch_size == 16);
    CHECK(global_batch_size(applied) == 16);
    CHECK(!check_config(applied));  // microbatches agree with the global batch
    shapes.emplace(c.parallel.dp, c.micro_batch_size);
  }
  // Every split of 16 sequences over dp 1, 2 and 4 (the divisors of 4 GPUs) into whole micro-batches.
  CHECK(shapes == std::set<std::pair<int, int>>{{1, 1}, {1, 2}, {1, 4}, {1, 8}, {1, 16}, {2, 1}, {2, 2}, {2, 4},
                                                {2, 8}, {4, 1}, {4, 2}, {4, 4}});
}

TEST_CASE("sweep keeps training.global_batch_size as its grid varies dp and the micro-batch, and refuses what does not split") {
  const std::string text = explicit_json(4, 8, 1, 1.0, 2.0);  // 8 microbatches of 1 on dp 1
  const std::vector<GridAxis> axes{{"parallel.dp", {"1", "2", "3"}}, {"model.micro_batch_size", {"1", "2"}}};
  std::vector<std::string> errors;
  sweep(text, "c.json", {"training.global_batch_size=8"}, axes, false, [&](std::size_t index, SweepRow&& row) {
    const int dp = index / 2 + 1, mbs = index % 2 + 1;
    if (dp == 3) {
      CHECK(!row.report);
      errors.push_back(row.error);
      return;
    }
    REQUIRE(row.report);
    CHECK(row.report->parallel.dp == dp);
    CHECK(row.report->parallel.microbatches == 8 / (mbs * dp));
  });
  CHECK(errors == std::vector<std::string>{
                      "c.json: training.global_batch_size (from --set): 8 sequences do not split over dp 3 (parallel.dp) "
                      "in micro-batches of 1 (model.micro_batch_size): the global batch must be a multiple of 1 x 3 = 3; "
                      "use 6 or 9",
                      "c.json: training.global_batch_size (from --set): 8 sequences do not split over dp 3 (parallel.dp) "
                      "in micro-batches of 2 (model.micro_batch_size): the global batch must be a multiple of 2 x 3 = 6; "
                      "use 6 or 12"});
}

TEST_CASE("with explicit costs, pp, tp and the micro-batch stay the config's: the costs are times of those") {
  const Config config = small_config("explicit");  // pp 4, tp 1, 8 microbatches of 1
  const std::vector<Candidate> space = tune_space(config, 8);
  REQUIRE(!space.empty());
  for (const Candidate& c : space) {
    CHECK(c.parallel.pp == 4);
    CHECK(c.parallel.tp == 1);
    CHECK(c.parallel.dp == 2);
    CHECK(c.micro_batch_size == 1);
    CHECK(c.parallel.microbatches == 4);
  }
  const Result<TuneResult> none = tune(config, {.gpus = 6});
  REQUIRE(!none.ok());
  CHECK_THAT(none.error().message, Catch::Contains("(explicit costs: pp 4 and tp 1, the config's); choose another --gpus"));
}

TEST_CASE("when nothing fits, tune names the smallest peak memory, its device, its candidate and the cap") {
  Config config = small_config("tiny");
  const std::vector<Pin> pins = space_pins("tiny", 4);
  // The run with the smallest peak, as the exhaustive search finds it: ties go to the first in the
  // space's order, and the device named is its fullest (the first of those).
  const TuneResult& all = exhaustive("tiny", 4);
  const auto least = std::min_element(all.rows.begin(), all.rows.end(), [](const TuneRow& a, const TuneRow& b) {
    return std::pair(max_peak(a.report), a.candidate) < std::pair(max_peak(b.report), b.candidate);
  });
  const Bytes peak = max_peak(least->report);
  const std::vector<DeviceMetrics>& devices = least->report.metrics.devices;
  const auto device = std::find_if(devices.begin(), devices.end(),
                                   [&](const DeviceMetrics& d) { return d.peak_memory_bytes == peak; });
  const Candidate c = pinned_space(config, 4, pins)[least->candidate];
  const std::string named = fmt::format(
      "the smallest peak memory of any candidate is {:.2f} MiB, on device {}, for {} / {}, pp {} tp {} dp {}{}, "
      "m {} x {}",
      double(peak) / double(1 << 20), device->rank, c.schedule, vocab_mode_name(c.vocab), c.parallel.pp, c.parallel.tp, c.parallel.dp,
      c.parallel.tp == 1 ? "" : c.parallel.sequence_parallel ? ", sp on" : ", sp off", c.parallel.microbatches,
      c.micro_batch_size);
  SECTION("every bound is over the cap: the smallest peak is still simulated, not a bound") {
    config.hardware.memory_gib = 1e-6;
    const Result<TuneResult> result = tune(config, {.pins = pins});
    REQUIRE(!result.ok());
    CHECK_THAT(result.error().message, Catch::StartsWith("configs/tiny.json: nothing fits in 0.00 GiB per device "
                                                         "(hardware.memory_gib, or --memory-gib): " + named));
    CHECK_THAT(result.error().message,
               Catch::EndsWith("; raise --memory-gib to at least 0.01 or give more --gpus than 4, or drop a --fix"));
    // Without pruning nothing is left to a bound: the same run is named.
    CHECK(result.error().message == tune(config, {.prune = false, .pins = pins}).error().message);
  }
  SECTION("a cap one byte under the smallest simulated peak: that run is named") {
    config.hardware.memory_gib = double(peak - 1) / double(1 << 30);
    const Result<TuneResult> result = tune(config, {.pins = pins});
    REQUIRE(!result.ok());
    CHECK_THAT(result.error().message, Catch::Contains(named));  // pruning changes nothing here either
  }
  SECTION("a search without --fix suggests more GPUs only") {
    Config costs = small_config("explicit");  // pp 4 and dp 1: 4 GPUs
    costs.hardware.memory_gib = 1e-6;
    const Result<TuneResult> result = tune(costs, {});
    REQUIRE(!result.ok());
    CHECK_THAT(result.error().message, Catch::StartsWith("test.json: nothing fits in 0.00 GiB per device "));
    CHECK_THAT(result.error().message, Catch::EndsWith(" or give more --gpus than 4"));
  }
}

TEST_CASE("--grid values split at commas outside brackets and quotes") {
  const Result<GridAxis> axis = parse_grid(R"(schedule.layers_per_stage=[5,5,4,2],"auto",[4,4,4,4])");
  REQUIRE(axis.ok());
  CHECK(axis.value().key == "schedule.layers_per_stage");
  CHECK(axis.value().values == std::vector<std::string>{"[5,5,4,2]", "\"auto\"", "[4,4,4,4]"});
  const std::vector<std::vector<std::string>> points =
      grid_points({{"parallel.pp", {"2", "4"}}, {"schedule.name", {"1f1b", "gpipe", "zb-v"}}});
  REQUIRE(points.size() == 6);
  CHECK(points[0] == std::vector<std::string>{"parallel.pp=2", "schedule.name=1f1b"});
  CHECK(points[1] == std::vector<std::string>{"parallel.pp=2", "schedule.name=gpipe"});  // the last grid varies fastest
  CHECK(points[5] == std::vector<std::string>{"parallel.pp=4", "schedule.name=zb-v"});
}

TEST_CASE("a malformed --grid is an error that names --grid and the fix") {
  const std::string text = R"json({"model": {"layers": 4, "hidden": 64, "heads": 4, "seq_len": 32, "vocab": 100},
                                   "parallel": {"pp": 2, "microbatches": 4}})json";
  const std::string usage = "give key.path=v1,v2,... with keys as --set takes them (e.g. --grid parallel.pp=2,4,8)";
  const std::pair<std::vector<std::string>, std::string> cases[] = {
      {{"parallel.pp"}, "--grid 'parallel.pp': no '=' after the key; " + usage},
      {{"=2,4"}, "--grid '=2,4': no key before '='; " + usage},
      {{"parallel.pp="}, "--grid 'parallel.pp=': no values after '='; " + usage},
      {{"parallel.pp=2,,4"}, "--grid 'parallel.pp=2,,4': value 2 is empty; " + usage},
      {{"parallel.pp=2", "parallel.pp=4"}, "--grid: key 'parallel.pp' is given twice; put all its values in one --grid"},
      {{"parallel.ppp=2"},
       "--grid 'parallel.ppp=2': c.json: parallel.ppp (from --set): unknown key; did you mean 'pp'? Known keys here: pp, tp, "
       "dp, cp, microbatches, chunks, sequence_parallel, ep, etp; use a key as --set takes it (docs/config.md lists them)"},
      {{"paralel.pp=2"},
       "--grid 'paralel.pp=2': c.json: paralel (from --set): unknown key; did you mean 'parallel'? Known keys here: "
       "model, parallel, schedule, hardware, precision, training, costs, description; use a key as --set takes it "
       "(docs/config.md lists them)"},
      {{"parallel.pp.x=2"},
       "--grid 'parallel.pp.x=2': --set 'parallel.pp.x=2': 'parallel.pp' is not an object; use a key as --set takes it "
       "(docs/config.md lists them)"},
  };
  for (const auto& [grids, message] : cases) {
    const Result<std::vector<GridAxis>> axes = parse_grids(grids, text, "c.json", {});
    REQUIRE(!axes.ok());
    CHECK(axes.error().message == message);
  }
  // A value the config refuses is not a malformed grid: that point becomes a row with its error.
  CHECK(parse_grids({"parallel.pp=0,2"}, text, "c.json", {}).ok());
}

TEST_CASE("a sweep takes grids of up to a million points, the cap docs/tune.md gives, and names --grid past it") {
  const std::string text = R"json({"model": {"layers": 4, "hidden": 64, "heads": 4, "seq_len": 32, "vocab": 100},
                                   "parallel": {"pp": 2, "microbatches": 4}})json";
  const auto values = [](int count) {  // 1,2,...,count
    std::string list;
    for (int i = 1; i <= count; ++i) list += (i > 1 ? "," : "") + std::to_string(i);
    return list;
  };
  const std::string peak = "hardware.peak_tflops=" + values(1000), hbm = "hardware.hbm_gbps=" + values(1000);
  const Result<std::vector<GridAxis>> cap = parse_grids({peak, hbm}, text, "c.json", {});
  REQUIRE(cap.ok());
  CHECK(point_count(cap.value()) == 1'000'000);
  const Result<std::vector<GridAxis>> past =
      parse_grids({peak, "hardware.hbm_gbps=" + values(1001)}, text, "c.json", {});
  REQUIRE(!past.ok());
  CHECK(past.error().message == "--grid: more than 1000000 points; sweep fewer values");
}

TEST_CASE("an auto split's candidate carries the split the planner would balance, so it plans the same") {
  const Config config = source_config("default.json");
  std::size_t automatic = 0;
  for (const Candidate& c : tune_space(config, 16)) {
    if (c.vocab != VocabMode::Redistribute || !c.layers_per_stage.empty()) {
      CHECK(c.auto_split.empty());
      continue;
    }
    ++automatic;
    Config carried = apply_candidate(config, c), balanced = carried;
    balanced.schedule.layers_per_stage.clear();  // "auto": the planner balances it
    CHECK(carried.schedule.layers_per_stage == c.auto_split);
    const Result<PlannedLayout> a = plan_layout(carried), b = plan_layout(balanced);
    REQUIRE(a.ok() == b.ok());
    if (!a.ok()) continue;
    std::vector<int> layers_a, layers_b;
    for (const VirtualStage& s : a.value().layout.stages) layers_a.push_back(s.layers);
    for (const VirtualStage& s : b.value().layout.stages) layers_b.push_back(s.layers);
    CHECK(layers_a == layers_b);
  }
  CHECK(automatic > 10);
}

TEST_CASE("sweep hands its rows over in grid order, a batch at a time, and the points are the grid's") {
  const std::string text = explicit_json(4, 8, 1, 1.0, 2.0);
  GridAxis pp{"parallel.pp", {}}, m{"parallel.microbatches", {"4", "8"}};
  for (int v = 1; v <= 2500; ++v) pp.values.push_back(std::to_string(-v));  // every point refused at once
  const std::vector<GridAxis> axes{pp, m};
  REQUIRE(point_count(axes) == 5000);
  const std::vector<std::vector<std::string>> points = grid_points(axes);
  for (const std::size_t i : {std::size_t(0), std::size_t(1), std::size_t(4097), std::size_t(4999)})
    CHECK(grid_point(axes, i) == points[i]);
  std::vector<std::size_t> seen;
  sweep(text, "c.json", {}, axes, false, [&](std::size_t index, SweepRow&& row) {
    seen.push_back(index);
    CHECK(!row.report);
    CHECK_THAT(row.error, Catch::Contains("parallel.pp (from --set): must be at least 1"));
  });
  REQUIRE(seen.size() == 5000);
  for (std::size_t i = 0; i < seen.size(); ++i) CHECK(seen[i] == i);
}

TEST_CASE("tune tries FP8 on and off where the GPU has FP8 tensor cores, and only there") {
  const Config h100 = source_config("default.json");
  REQUIRE(h100.hardware.peak_fp8_tflops > 0);
  std::set<Fp8Format> seen;
  for (const Candidate& c : tune_space(h100, 8)) seen.insert(c.fp8);
  CHECK(seen == std::set<Fp8Format>{Fp8Format::None, Fp8Format::Hybrid});
  // The config's own format is the one tried, and it comes first.
  const Config e4m3 = source_config("default.json", {"precision.fp8=e4m3"});
  const std::vector<Candidate> space = tune_space(e4m3, 8);
  CHECK(space.front().fp8 == Fp8Format::E4M3);
  CHECK(std::none_of(space.begin(), space.end(), [](const Candidate& c) { return c.fp8 == Fp8Format::Hybrid; }));
  const Config a100 = source_config("default.json", {"hardware.preset=a100-80gb"});
  for (const Candidate& c : tune_space(a100, 8)) CHECK(c.fp8 == Fp8Format::None);
  // `changes` names it.
  const Candidate off = tune_space(h100, 8).front();
  REQUIRE(off.fp8 == Fp8Format::None);
  Candidate on = off;
  on.fp8 = Fp8Format::Hybrid;
  CHECK(describe_changes(h100, on) == describe_changes(h100, off) + ", fp8 hybrid");
}

TEST_CASE("tune tries every expert parallelism a MoE model's layout allows, Megatron-Core's rule kept, and names it") {
  // Mixtral's 8 experts on 16 GPUs.
  const Config moe = source_config("mixtral-8x7b.json", {"parallel.pp=2", "parallel.ep=1", "parallel.chunks=1"});
  std::set<int> eps;
  for (const Candidate& c : tune_space(moe, 16)) {
    const ParallelConfig& p = c.parallel;
    eps.insert(p.ep);
    CHECK(moe.model.num_experts % p.ep == 0);
    CHECK((p.tp * p.cp * p.dp) % (p.ep * p.expert_tp()) == 0);
    CHECK((p.tp == 1 || p.sequence_parallel));
  }
  CHECK(eps == std::set<int>{1, 2, 4, 8});
  // Under tp 2, expert tensor parallelism 2 (following tp) and 1 are both tried.
  std::set<int> etps;
  for (const Candidate& c : tune_space(moe, 16))
    if (c.parallel.tp == 2) etps.insert(c.parallel.expert_tp());
  CHECK(etps == std::set<int>{1, 2});
  // A dense model's candidates keep theirs.
  for (const Candidate& c : tune_space(source_config("tiny.json"), 4)) CHECK(c.parallel.ep == 1);
  Candidate wider = tune_space(moe, 16).front();
  const std::string before = describe_changes(moe, wider);
  wider.parallel.ep = 8;
  CHECK(before.find("ep ") == std::string::npos);
  CHECK(describe_changes(moe, wider).find("dp 8→1, ep 1→8") != std::string::npos);
  // The table shows ep/etp after cp for a MoE model, and no ep column for a dense one.
  const std::vector<Knob> shown = shown_knobs(true);
  CHECK(std::find(shown.begin(), shown.end(), Knob::Ep) - shown.begin() == 4);
  CHECK(knob_cells(source_config("mixtral-8x7b.json"))[4] == "8/1");
  const std::vector<Knob> dense = shown_knobs(false);
  CHECK(std::find(dense.begin(), dense.end(), Knob::Ep) == dense.end());
  // Nor do a dense model's changes name etp, which follows tp there.
  const Config tiny = source_config("tiny.json");
  for (const Candidate& c : tune_space(tiny, 4))
    if (c.parallel.tp != tiny.parallel.tp) CHECK(describe_changes(tiny, c).find("etp") == std::string::npos);
}
