// Properties every generated graph and every simulation must have, over ranges of p and m:
// the graph validates; no op starts before its dependencies end; a stream runs one op at a time in
// program order; a SEND and its RECV run together; every op runs -- and starts no later than these
// rules allow (the max-plus expression docs/ir.md gives, checked op by op).
#include <algorithm>
#include <tuple>

#include "helpers.h"
#include "two_threads.h"

using namespace pipesim;
using namespace pipesim::testing;

namespace {

void check_timeline(const TaskGraph& graph, const std::vector<TimeNs>& durations, const Timeline& t) {
  for (std::size_t i = 0; i < graph.size(); ++i) {
    const TaskId id = TaskId(i);
    INFO(graph.describe(id));
    REQUIRE(t.start[i] >= 0);
    REQUIRE(t.end[i] >= t.start[i] + durations[i]);
    for (TaskId dep : graph.deps(id)) REQUIRE(t.end[std::size_t(dep)] <= t.start[i]);
    const Task& task = graph.task(id);
    if (task.partner != kNoTask) {
      REQUIRE(t.start[std::size_t(task.partner)] == t.start[i]);
      REQUIRE(t.end[std::size_t(task.partner)] == t.end[i]);
    }
  }
  // When each op is ready: its stream's previous op and its dependencies have ended.
  std::vector<TimeNs> ready(graph.size(), 0);
  for (std::size_t s = 0; s < graph.stream_count(); ++s) {
    const auto order = graph.stream(s);
    for (std::size_t k = 1; k < order.size(); ++k) {
      INFO(graph.describe(order[k - 1]) << " then " << graph.describe(order[k]));
      REQUIRE(t.end[std::size_t(order[k - 1])] <= t.start[std::size_t(order[k])]);
      ready[std::size_t(order[k])] = t.end[std::size_t(order[k - 1])];
    }
  }
  for (std::size_t i = 0; i < graph.size(); ++i)
    for (TaskId dep : graph.deps(TaskId(i))) ready[i] = std::max(ready[i], t.end[std::size_t(dep)]);
  // No later than that: an op starts when the last of its rendezvous (itself, its partner, or its
  // collective's members) is ready, and ends the longest of their durations later.
  for (std::size_t i = 0; i < graph.size(); ++i) {
    const Task& task = graph.task(TaskId(i));
    std::vector<TaskId> rendezvous{TaskId(i)};
    if (task.partner != kNoTask) rendezvous.push_back(task.partner);
    if (task.group >= 0) rendezvous = graph.group_of(TaskId(i)).members;
    TimeNs last_ready = 0, longest = 0;
    for (TaskId r : rendezvous) {
      last_ready = std::max(last_ready, ready[std::size_t(r)]);
      longest = std::max(longest, durations[std::size_t(r)]);
    }
    INFO(graph.describe(TaskId(i)));
    REQUIRE(t.start[i] == last_ready);
    REQUIRE(t.end[i] == last_ready + longest);
  }
}

}  // namespace

TEST_CASE("every schedule's graph validates and simulates within the IR's rules") {
  const std::string schedule = GENERATE(from_range(schedule_names()));
  const std::string vocab = GENERATE(from_range(vocab_mode_names()));
  const int p = GENERATE(1, 2, 3, 4, 5, 8);
  const int m = GENERATE(1, 2, 3, 4, 6, 8, 16);
  CAPTURE(schedule, vocab, p, m);
  // Analytic costs: unequal stages (head, embedding), real links, so ties are rare and varied.
  Config config = parse_or_fail(fmt::format(R"json({{
    "model": {{"layers": {}, "hidden": 256, "heads": 8, "seq_len": 128, "vocab": 32000}},
    "parallel": {{"pp": {}, "microbatches": {}, "chunks": 2, "dp": 2}},
    "schedule": {{"name": "{}", "vocab": "{}"}},
    "hardware": {{"preset": "a100-80gb", "gpus_per_node": 2}}
  }})json",
                                            4 * p, p, m, schedule, vocab));
  Result<Plan> plan = make_plan(config);
  if (schedule == "interleaved-1f1b" && m % p != 0) {
    REQUIRE_FALSE(plan.ok());
    CHECK(plan.error().message ==
          fmt::format("parallel.microbatches: interleaved-1f1b needs a multiple of pp ({}), got {}; use {}", p, m,
                      (m / p + 1) * p));
    return;
  }
  if (schedule == "dualpipe-v" && m < 2 * p) {
    REQUIRE_FALSE(plan.ok());
    CHECK(plan.error().message ==
          fmt::format("parallel.microbatches: dualpipe-v needs at least 2 x pp ({}) microbatches, got {}; use {}", 2 * p,
                      m, 2 * p));
    return;
  }
  if (!plan.ok()) FAIL(plan.error().message);
  const Plan& pl = plan.value();
  const std::vector<TimeNs> durations = op_durations(*make_cost_model(pl.config, pl.layout), pl.graph);
  Result<Timeline> timeline = simulate(pl.graph, durations);
  if (!timeline.ok()) FAIL(timeline.error().message);
  check_timeline(pl.graph, durations, timeline.value());
  const RunMetrics metrics = compute_metrics(pl.config, pl.graph, timeline.value(), pl.static_bytes);
  for (const DeviceMetrics& d : metrics.devices) {
    CHECK(d.bubble_fraction >= 0);
    CHECK(d.bubble_fraction < 1);
    CHECK(d.exposed_comm_ns <= d.comm_ns);
  }
}

TEST_CASE("the simulator is deterministic") {
  // Large enough for the two-thread paths (two_threads.h): from kOpsWorthAThread ops the graph's
  // construction, its structure checks, the op durations, the simulation and the metrics split their
  // work over two threads, and from an eighth of that in stage-microbatches the schedule generators
  // and the vocabulary passes do. The three schedules take those paths through different generators
  // (ZB-V's greedy search, V-Half's blocks, DualPipeV's moved and unmoved graphs side by side).
  const auto [schedule, vocab] = GENERATE(table<std::string, std::string>(
      {{"zb-v", "vocab-1"}, {"v-half", "vocab-2"}, {"dualpipe-v", "vocab-1"}}));
  CAPTURE(schedule, vocab);
  Config config = parse_or_fail(explicit_json(8, 512, 2, 1.5, 2.5, schedule));
  config.schedule.vocab = *vocab_mode_named(vocab);
  const Simulated a = simulate_or_fail(config), b = simulate_or_fail(config);
  REQUIRE(a.plan.graph.size() >= kOpsWorthAThread);
  REQUIRE(std::size_t(a.plan.layout.stage_count()) * std::size_t(config.parallel.microbatches) >= kOpsWorthAThread / 8);
  // The same graph, op by op: what each op is, its work, and its dependencies.
  REQUIRE(b.plan.graph.size() == a.plan.graph.size());
  std::size_t differing_ops = 0;
  for (std::size_t i = 0; i < a.plan.graph.size(); ++i) {
    const TaskId id = TaskId(i);
    const Task &x = a.plan.graph.task(id), &y = b.plan.graph.task(id);
    const auto fields = [](const Task& t) {
      return std::tie(t.kind, t.payload, t.lane, t.chunk, t.device, t.stage, t.microbatch, t.peer, t.partner, t.group);
    };
    const auto dx = a.plan.graph.deps(id), dy = b.plan.graph.deps(id);
    if (fields(x) != fields(y) || !(a.plan.graph.work_of(x) == b.plan.graph.work_of(y)) ||
        !std::equal(dx.begin(), dx.end(), dy.begin(), dy.end())) {
      if (differing_ops++ == 0) UNSCOPED_INFO("first differing op: " << a.plan.graph.describe(id) << " / " << b.plan.graph.describe(id));
    }
  }
  CHECK(differing_ops == 0);
  CHECK(a.durations == b.durations);
  CHECK(a.timeline.start == b.timeline.start);
  CHECK(a.timeline.end == b.timeline.end);
  CHECK(a.metrics.iteration_ns == b.metrics.iteration_ns);
  REQUIRE(b.metrics.devices.size() == a.metrics.devices.size());
  for (std::size_t d = 0; d < a.metrics.devices.size(); ++d) {
    const DeviceMetrics &x = a.metrics.devices[d], &y = b.metrics.devices[d];
    CAPTURE(d);
    CHECK(x.busy_ns == y.busy_ns);
    CHECK(x.peak_activation_bytes == y.peak_activation_bytes);
    CHECK(x.peak_op == y.peak_op);
    CHECK(x.peak_time_ns == y.peak_time_ns);
    CHECK(x.comm_ns == y.comm_ns);
    CHECK(x.exposed_comm_ns == y.exposed_comm_ns);
  }
}

TEST_CASE("every (stage, microbatch) gets one F and one B on its stage's device, F first") {
  const std::string schedule = GENERATE(from_range(schedule_names()));
  const int p = GENERATE(2, 4);
  const int m = GENERATE(8, 12);  // dualpipe-v needs m >= 2p
  CAPTURE(schedule, p, m);
  const Plan plan = plan_or_fail(parse_or_fail(explicit_json(p, m, 2, 1, 2, schedule)));
  const int stages = plan.layout.stage_count();
  std::vector<int> forwards(std::size_t(stages * m)), backwards(std::size_t(stages * m));
  for (int d = 0; d < p; ++d)
    for (TaskId id : plan.graph.stream_order(d, Stream::Compute)) {
      const Task& t = plan.graph.task(id);
      if (t.kind != OpKind::F && t.kind != OpKind::B) continue;
      CHECK(plan.layout.stages[std::size_t(t.stage)].device == d);
      auto& count = t.kind == OpKind::F ? forwards : backwards;
      ++count[std::size_t(t.stage * m + t.microbatch)];
      if (t.kind == OpKind::B) CHECK(forwards[std::size_t(t.stage * m + t.microbatch)] == 1);
    }
  for (int k = 0; k < stages * m; ++k) {
    CHECK(forwards[std::size_t(k)] == 1);
    CHECK(backwards[std::size_t(k)] == 1);
  }
}
