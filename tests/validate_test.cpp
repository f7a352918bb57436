// Validation and the simulator's deadlock detection on hand-built graphs: two devices, one stage
// each, so every expected message can be read off the construction. Also the graph's shared work
// records.
#include "helpers.h"
#include "validate.h"

using namespace pipesim;
using namespace pipesim::testing;

namespace {

Layout two_stage_layout() {
  Layout layout;
  layout.devices = 2;
  layout.stages = {{0, 0, 0, 1, true, false}, {1, 0, 1, 1, false, true}};
  return layout;
}

/// Builds a two-device pipeline by hand: `d1_order` is the compute order of device 1 as
/// (kind, microbatch); device 0 runs F for every microbatch, then B for every microbatch.
/// Activation RECVs on device 1 are issued in `recv_order`.
struct HandGraph {
  TaskGraphBuilder builder{2};
  std::vector<TaskId> f0, b0, f1, b1, act_send, act_recv, grad_send, grad_recv;

  HandGraph(int m, const std::vector<std::pair<OpKind, int>>& d1_order, const std::vector<int>& recv_order) {
    f0 = b0 = f1 = b1 = act_send = act_recv = grad_send = grad_recv = std::vector<TaskId>(std::size_t(m));
    for (int i = 0; i < m; ++i) f0[std::size_t(i)] = builder.add({.kind = OpKind::F, .chunk = 0, .device = 0, .stage = 0, .microbatch = i});
    for (int i = 0; i < m; ++i) b0[std::size_t(i)] = builder.add({.kind = OpKind::B, .chunk = 0, .device = 0, .stage = 0, .microbatch = i});
    for (auto [kind, i] : d1_order)
      (kind == OpKind::F ? f1 : b1)[std::size_t(i)] =
          builder.add({.kind = kind, .chunk = 0, .device = 1, .stage = 1, .microbatch = i});
    for (int i = 0; i < m; ++i)
      act_send[std::size_t(i)] = builder.add({.kind = OpKind::Send, .payload = Payload::Activation, .device = 0,
                                              .stage = 0, .microbatch = i, .peer = 1});
    for (int i : recv_order)
      act_recv[std::size_t(i)] = builder.add({.kind = OpKind::Recv, .payload = Payload::Activation, .device = 1,
                                              .stage = 0, .microbatch = i, .peer = 0});
    for (auto [kind, i] : d1_order)
      if (kind == OpKind::B)
        grad_send[std::size_t(i)] = builder.add({.kind = OpKind::Send, .payload = Payload::Gradient, .device = 1,
                                                 .stage = 1, .microbatch = i, .peer = 0});
    for (int i = 0; i < m; ++i)
      grad_recv[std::size_t(i)] = builder.add({.kind = OpKind::Recv, .payload = Payload::Gradient, .device = 0,
                                               .stage = 1, .microbatch = i, .peer = 1});
    for (std::size_t i = 0; i < std::size_t(m); ++i) {
      builder.pair(act_send[i], act_recv[i]);
      builder.pair(grad_send[i], grad_recv[i]);
      builder.depend(act_send[i], f0[i]);
      builder.depend(f1[i], act_recv[i]);
      builder.depend(b1[i], f1[i]);
      builder.depend(grad_send[i], b1[i]);
      builder.depend(b0[i], grad_recv[i]);
      builder.depend(b0[i], f0[i]);
    }
    for (int d = 0; d < 2; ++d) builder.add({.kind = OpKind::Optimizer, .device = d});
  }
  TaskGraph build() { return std::move(builder).build(); }
};

std::string validation_error(TaskGraph graph, int m) {
  const Status s = validate(graph, two_stage_layout(), m);
  return s.ok() ? "(valid)" : s.error().message;
}

}  // namespace

TEST_CASE("a well-formed hand-built graph validates and simulates") {
  HandGraph g(2, {{OpKind::F, 0}, {OpKind::B, 0}, {OpKind::F, 1}, {OpKind::B, 1}}, {0, 1});
  const TaskGraph graph = g.build();
  CHECK(validation_error(graph, 2) == "(valid)");
  CHECK(simulate(graph, std::vector<TimeNs>(graph.size(), 1)).ok());
}

TEST_CASE("the simulator takes durations whose total stays within 2^62 ns and names what does not") {
  HandGraph g(2, {{OpKind::F, 0}, {OpKind::B, 0}, {OpKind::F, 1}, {OpKind::B, 1}}, {0, 1});
  const TaskGraph graph = g.build();
  const auto error = [&](std::vector<TimeNs> durations) {
    const Result<Timeline> run = simulate(graph, durations);
    return run.ok() ? std::string("(ran)") : run.error().message;
  };
  std::vector<TimeNs> durations(graph.size(), 0);
  // Two ops of 2^61: a total of exactly 2^62, the most the end times may reach.
  durations[0] = durations[1] = TimeNs(1) << 61;
  CHECK(error(durations) == "(ran)");
  durations[1] += 1;
  CHECK(error(durations) ==
        "simulate: the ops' durations add up to over 146 years; check the hardware speeds, the costs and the model sizes");
  // Small durations, one negative: named, even where the others are far from any limit.
  std::fill(durations.begin(), durations.end(), 1000);
  durations[2] = -1;
  CHECK(error(durations) == "simulate: " + graph.describe(2) +
                                " has no valid duration (negative, NaN or over 146 years); check the hardware speeds, "
                                "the costs and the model sizes");
  durations[2] = 1000;
  CHECK(error(durations) == "(ran)");
}

TEST_CASE("sends and receives issued in different orders are a p2p order mismatch") {
  HandGraph g(2, {{OpKind::F, 1}, {OpKind::B, 1}, {OpKind::F, 0}, {OpKind::B, 0}}, {1, 0});
  CHECK(validation_error(g.build(), 2) ==
        "p2p order mismatch between device 0 and device 1: SEND number 1 on device 0 is SEND(d0->d1,act,s0,m0), but "
        "RECV number 1 on device 1 is RECV(d1<-d0,act,s0,m1); sends and receives between a pair must be issued in the "
        "same order");
}

TEST_CASE("a wait cycle through stream order is reported as a deadlock with every op on it") {
  // Device 1 computes microbatch 1 first, but its B(m0) -- which device 0's F(m1) waits for, through
  // device 0's compute stream -- sits behind F(m0) and F(m1) on device 1.
  HandGraph g(2, {{OpKind::F, 1}, {OpKind::F, 0}, {OpKind::B, 0}, {OpKind::B, 1}}, {0, 1});
  g.builder.depend(g.f0[1], g.b0[0]);  // device 0 runs F(m1) only after B(m0): a 1F1B-style order
  const TaskGraph graph = g.build();
  CHECK(validation_error(graph, 2) ==
        "deadlock: these ops wait on each other (a -> b: b needs a finished; a stream runs its ops in program order; a "
        "SEND and its RECV start together): B(d0,s0,m0) -> F(d0,s0,m1) -> "
        "SEND(d0->d1,act,s0,m1)+RECV(d1<-d0,act,s0,m1) -> F(d1,s1,m1) -[stream order]-> F(d1,s1,m0) -> "
        "B(d1,s1,m0) -> SEND(d1->d0,grad,s1,m0)+RECV(d0<-d1,grad,s1,m0) -> B(d0,s0,m0)");
  // The simulator, given the same graph, stops and names the stuck stream heads instead of hanging.
  Result<Timeline> run = simulate(graph, std::vector<TimeNs>(graph.size(), kNsPerMs));
  REQUIRE_FALSE(run.ok());
  CHECK(run.error().message ==
        "deadlock at t = 2.000000 ms: no op can start, but some have not run:\n"
        "  device 0 compute stream: F(d0,s0,m1) waits for B(d0,s0,m0)\n"
        "  device 0 send->d1 stream: SEND(d0->d1,act,s0,m1) waits for F(d0,s0,m1)\n"
        "  device 0 recv<-d1 stream: RECV(d0<-d1,grad,s1,m0) waits for its partner SEND(d1->d0,grad,s1,m0) to be issued\n"
        "  device 1 compute stream: F(d1,s1,m1) waits for RECV(d1<-d0,act,s0,m1)\n"
        "  device 1 send->d0 stream: SEND(d1->d0,grad,s1,m0) waits for B(d1,s1,m0)\n"
        "  device 1 recv<-d0 stream: RECV(d1<-d0,act,s0,m1) waits for its partner SEND(d0->d1,act,s0,m1) to be issued");
}

TEST_CASE("a cycle of dependencies alone is reported with its full path") {
  HandGraph g(1, {{OpKind::F, 0}, {OpKind::B, 0}}, {0});
  g.builder.depend(g.f0[0], g.act_send[0]);  // F waits for the send of its own output
  CHECK(validation_error(g.build(), 1) == "dependency cycle: F(d0,s0,m0) -> SEND(d0->d1,act,s0,m0)+RECV(d1<-d0,act,s0,m0) -> "
                                          "F(d0,s0,m0)");
}

TEST_CASE("missing, duplicated, misplaced and reordered ops are refused") {
  SECTION("missing B") {
    HandGraph g(2, {{OpKind::F, 0}, {OpKind::B, 0}, {OpKind::F, 1}}, {0, 1});
    CHECK(validation_error(g.build(), 2) == "missing B(s1,m1)");
  }
  SECTION("B before F") {
    HandGraph g(1, {{OpKind::B, 0}, {OpKind::F, 0}}, {0});
    CHECK(validation_error(g.build(), 1) == "B(s1,m0) comes before F(s1,m0) in program order");
  }
  SECTION("a dependency across devices") {
    HandGraph g(1, {{OpKind::F, 0}, {OpKind::B, 0}}, {0});
    g.builder.depend(g.f1[0], g.f0[0]);
    CHECK(validation_error(g.build(), 1) ==
          "F(d1,s1,m0) depends on F(d0,s0,m0) on another device; order across devices must go through a SEND/RECV pair");
  }
  SECTION("an op on the wrong device") {
    HandGraph g(1, {{OpKind::F, 0}, {OpKind::B, 0}}, {0});
    g.builder.add({.kind = OpKind::W, .chunk = 0, .device = 0, .stage = 1, .microbatch = 0});
    CHECK(validation_error(g.build(), 1) == "W(d0,s1,m0) runs on device 0 but stage 1 lives on device 1");
  }
}

TEST_CASE("a collective starts when its last member arrives and ends together on every member") {
  // Device 0 computes 3 ms, device 1 computes 1 ms, then both all-reduce (2 ms each).
  TaskGraphBuilder builder(2);
  const TaskId f0 = builder.add({.kind = OpKind::F, .chunk = 0, .device = 0, .stage = 0, .microbatch = 0});
  const TaskId f1 = builder.add({.kind = OpKind::F, .chunk = 0, .device = 1, .stage = 1, .microbatch = 0});
  const TaskId r0 = builder.add({.kind = OpKind::AllReduce, .device = 0});
  const TaskId r1 = builder.add({.kind = OpKind::AllReduce, .device = 1});
  builder.add_group({.members = {r0, r1}, .ranks = 2, .data = CollectiveData::OutputGrad, .op = ReduceOp::Sum, .root = -1});
  builder.depend(r0, f0);
  builder.depend(r1, f1);
  const TaskGraph graph = std::move(builder).build();
  std::vector<TimeNs> durations(graph.size());
  durations[std::size_t(f0)] = 3 * kNsPerMs;
  durations[std::size_t(f1)] = 1 * kNsPerMs;
  durations[std::size_t(r0)] = durations[std::size_t(r1)] = 2 * kNsPerMs;
  Result<Timeline> run = simulate(graph, durations);
  REQUIRE(run.ok());
  for (TaskId r : {r0, r1}) {
    CHECK(run.value().start[std::size_t(r)] == 3 * kNsPerMs);
    CHECK(run.value().end[std::size_t(r)] == 5 * kNsPerMs);
  }
}

TEST_CASE("ops with the same figures share one work record, and every op reads its own figures") {
  TaskGraphBuilder builder(2);
  const WorkId forward = builder.work({.flops = 6e9, .bytes = 1e6, .alloc_bytes = 4096});
  const WorkId backward = builder.work({.flops = 12e9, .bytes = 2e6, .free_bytes = 4096});
  CHECK(builder.work({.flops = 6e9, .bytes = 1e6, .alloc_bytes = 4096}) == forward);
  CHECK(forward != backward);
  CHECK(builder.work({}) == kNoWork);
  std::vector<TaskId> forwards;
  for (int mb = 0; mb < 3; ++mb)
    forwards.push_back(builder.add({.kind = OpKind::F, .chunk = 0, .device = 0, .stage = 0, .microbatch = mb,
                                    .work = forward}));
  const TaskId b = builder.add({.kind = OpKind::B, .chunk = 0, .device = 0, .stage = 0, .microbatch = 0,
                                .work = backward});
  const TaskId step = builder.add({.kind = OpKind::Optimizer, .device = 0});
  const TaskGraph graph = std::move(builder).build();
  for (TaskId f : forwards) {
    CHECK(graph.work(f).flops == 6e9);
    CHECK(graph.work(f).alloc_bytes == 4096);
    CHECK(graph.work(f).free_bytes == 0);
  }
  CHECK(graph.work(b).bytes == 2e6);
  CHECK(graph.work(b).free_bytes == 4096);
  CHECK(graph.work(step) == TaskWork{});
}

TEST_CASE("the memory over time counts every op that holds memory, on any stream") {
  // The graph notes whether only compute ops hold memory (as assemble builds them), and the memory
  // over time then reads the compute streams alone: a RECV given a buffer must still be counted.
  for (const bool receive_holds : {false, true}) {
    CAPTURE(receive_holds);
    HandGraph h(1, {{OpKind::F, 0}, {OpKind::B, 0}}, {0});
    h.builder.task(h.f1[0]).work = h.builder.work({.alloc_bytes = 100});
    h.builder.task(h.b1[0]).work = h.builder.work({.free_bytes = 100});
    if (receive_holds) h.builder.task(h.act_recv[0]).work = h.builder.work({.alloc_bytes = 7});
    const TaskGraph graph = h.build();
    CHECK(graph.memory_on_compute_only() == !receive_holds);
    const Result<Timeline> timeline = simulate(graph, std::vector<TimeNs>(graph.size(), 1));
    REQUIRE(timeline.ok());
    const std::vector<MemoryChange> changes = memory_changes(graph, timeline.value(), 1);
    REQUIRE(changes.size() == (receive_holds ? 3u : 2u));
    Bytes held = 0, peak = 0;
    for (const MemoryChange& c : changes) peak = std::max(peak, held += c.delta);
    CHECK(peak == (receive_holds ? 107 : 100));
  }
}
