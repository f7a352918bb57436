// PyTorch compute-only CSV: every generated schedule survives export and import unchanged, and bad
// files are refused at the line and column.
#include <fstream>
#include <sstream>

#include "helpers.h"
#include "simulate_config.h"
#include "schedule_csv.h"
#include "simulator.h"

using namespace pipesim;
using namespace pipesim::testing;

namespace {

/// F = 1, B = 2 (input gradient), W = 1 ms per device share, no transfer cost unless given.
Config split_config(int p, int m, double p2p_ms = 0) {
  Config c = parse_or_fail(explicit_json(p, m, 2, 1, 2), {fmt::format("costs.p2p_ms={}", p2p_ms)});
  c.costs->weight_ms = {1};
  return c;
}

TimeNs simulate_custom(const Config& c, const CustomSchedule& schedule, std::string* exported = nullptr) {
  Result<Plan> plan = make_plan(c, &schedule);
  if (!plan.ok()) FAIL(plan.error().message);
  const auto durations = op_durations(*make_cost_model(plan.value().config, plan.value().layout), plan.value().graph);
  Result<Timeline> timeline = simulate(plan.value().graph, durations);
  if (!timeline.ok()) FAIL(timeline.error().message);
  if (exported) *exported = schedule_csv(plan.value().graph);
  return *std::max_element(timeline.value().end.begin(), timeline.value().end.end());
}

CustomSchedule parse_ok(const std::string& text, int p, int m) {
  Result<CustomSchedule> s = parse_schedule_csv(text, "s.csv", p, m);
  if (!s.ok()) FAIL(s.error().message);
  return std::move(s).value();
}

}  // namespace

TEST_CASE("every schedule file PyTorch 2.11 writes imports, simulates and survives a round trip") {
  const std::string name = GENERATE("1f1b", "gpipe", "interleaved-1f1b", "zb-interleaved", "zb-v", "dualpipe-v");
  CAPTURE(name);
  const int p = 4, m = 8;
  const Config c = split_config(p, m);
  const CustomSchedule torch = parse_ok(fixture("torch-" + name + "-p4-m8.csv"), p, m);
  std::string exported;
  const TimeNs iteration = simulate_custom(c, torch, &exported);
  CHECK(simulate_custom(c, parse_ok(exported, p, m)) == iteration);
  // GPipe and 1F1B: (m + p - 1)(F + B + W) with a full backward; DualPipeV: pipesim's own generator
  // writes PyTorch's order (an overlapped pair runs back to back in both).
  if (name == "gpipe" || name == "1f1b") CHECK(iteration == (m + p - 1) * ns_from_ms(1 + 2 + 1));
  if (name == "dualpipe-v") {
    Config generated = c;
    generated.schedule.name = "dualpipe-v";
    CHECK(simulate_or_fail(generated).metrics.iteration_ns == iteration);
  }
  // pipesim's own schedule of the same name is never slower than PyTorch's.
  if (name != "zb-interleaved") {
    Config generated = c;
    generated.schedule.name = name;
    CHECK(simulate_or_fail(generated).metrics.iteration_ns <= iteration);
  }
}

TEST_CASE("PyTorch's 1F1B file, whose last rank numbers forwards from 1, is read with a note") {
  const CustomSchedule s = parse_ok(fixture("torch-1f1b-p4-m8.csv"), 4, 8);
  REQUIRE(s.notes.size() == 1);
  CHECK(s.notes[0] == "s.csv: stage 3 numbers its forwards 1 to 8 and its backwards 0 to 7, as PyTorch 2.11's "
                      "Schedule1F1B writes its last rank; read as forwards 0 to 7");
  CHECK(s.orders[3].front().kind == OpKind::F);
  CHECK(s.orders[3].front().microbatch == 0);
}

TEST_CASE("the compute-only grammar: empty cells, REDUCE_GRAD, UNSHARD, RESHARD and OVERLAP_F_B") {
  const CustomSchedule s = parse_ok("0UNSHARD,0F0,,0F1,(0F2;1I0)OVERLAP_F_B,1W0,0RESHARD,0REDUCE_GRAD\n", 1, 3);
  // 0F2 and 1B0 overlapped, run back to back; the other cells name nothing pipesim runs per stage.
  const std::vector<std::pair<OpKind, int>> expected = {{OpKind::F, 0}, {OpKind::F, 0}, {OpKind::F, 0},
                                                        {OpKind::B, 1}, {OpKind::W, 1}};
  REQUIRE(s.orders[0].size() == expected.size());
  for (std::size_t i = 0; i < expected.size(); ++i) {
    CHECK(s.orders[0][i].kind == expected[i].first);
    CHECK(s.orders[0][i].stage == expected[i].second);
  }
  CHECK(s.comms.empty());
}

TEST_CASE("a full backward inside OVERLAP_F_B runs as I then W when the file splits backwards") {
  const CustomSchedule s = parse_ok("0F0,0F1,(0F2;0B0)OVERLAP_F_B,0I1,0W1,0I2,0W2\n", 1, 3);
  REQUIRE(s.orders[0].size() == 9);
  CHECK(s.orders[0][3].kind == OpKind::B);
  CHECK(s.orders[0][4].kind == OpKind::W);
  CHECK(s.orders[0][4].microbatch == 0);
}

TEST_CASE("export then import gives the same graph and the same simulation") {
  const std::string schedule = GENERATE(from_range(schedule_names()));
  CAPTURE(schedule);
  const Config c = parse_or_fail(explicit_json(4, 8, 2, 2, 3, schedule));
  const Simulated generated = simulate_or_fail(c);
  const std::string csv = schedule_csv(generated.plan.graph);
  Result<CustomSchedule> loaded = parse_schedule_csv(csv, "s.csv", 4, 8);
  if (!loaded.ok()) FAIL(loaded.error().message);
  CHECK(loaded.value().chunks == generated.plan.config.parallel.chunks);
  CHECK(loaded.value().placement == generated.plan.layout.placement);
  Result<Plan> plan = make_plan(c, &loaded.value());
  if (!plan.ok()) FAIL(plan.error().message);
  CHECK(schedule_csv(plan.value().graph) == csv);
  const std::vector<TimeNs> durations = op_durations(*make_cost_model(plan.value().config, plan.value().layout), plan.value().graph);
  Result<Timeline> timeline = simulate(plan.value().graph, durations);
  REQUIRE(timeline.ok());
  CHECK(*std::max_element(timeline.value().end.begin(), timeline.value().end.end()) == generated.metrics.iteration_ns);
}

TEST_CASE("a full backward B in a file with W is run as I then W") {
  Result<CustomSchedule> s = parse_schedule_csv("0F0,0B0,0F1,0I1,0W1\n", "s.csv", 1, 2);
  REQUIRE(s.ok());
  const auto& order = s.value().orders[0];
  REQUIRE(order.size() == 6);
  CHECK(order[1].kind == OpKind::B);
  CHECK(order[2].kind == OpKind::W);
  CHECK(order[2].microbatch == 0);
}

TEST_CASE("bad schedule files are refused with the line and column") {
  using Case = std::tuple<std::string, int, int, std::string>;
  const Case c = GENERATE(values<Case>({
      {"0F0,0F1\n1F0, 1X1\n", 2, 2,
       "s.csv:2:5: '1X1' is not an action; write [stage][F|I|B|W][microbatch] (e.g. 0F0), "
       "[stage][SEND_F|RECV_F|SEND_B|RECV_B][microbatch], [stage][UNSHARD|RESHARD|REDUCE_GRAD] or "
       "([action];[action])OVERLAP_F_B"},
      {"0F0,(0F1;1B0\n", 1, 2,
       "s.csv:1:5: '(0F1;1B0' is not an action; write [stage][F|I|B|W][microbatch] (e.g. 0F0), "
       "[stage][SEND_F|RECV_F|SEND_B|RECV_B][microbatch], [stage][UNSHARD|RESHARD|REDUCE_GRAD] or "
       "([action];[action])OVERLAP_F_B"},
      {"0F0,0SEND_F0,0B0\n1RECV_F0,1F0,1B0\n", 2, 1,
       "s.csv: has no 1SEND_B0 (rank 1); a file with SEND/RECV actions needs every transfer between ranks, or none"},
      {"0F0,0SEND_F0,0SEND_F0\n1F0\n", 2, 1, "s.csv:1:14: 0SEND_F0 appears twice"},
      {"0F0,0SEND_B0\n1F0\n", 2, 1,
       "s.csv:1:5: 0SEND_B0 crosses no rank boundary (stage -1 is on the same rank or does not exist)"},
      {"0F0\n", 2, 1, "s.csv: has 1 rows but parallel.pp is 2; write one row per rank"},
      {"0F0,0B0\n1F0,1B0\n", 2, 2,
       "s.csv: schedules 1 microbatches but parallel.microbatches is 2; use --set parallel.microbatches=1"},
      {"0F0,0B0\n0F0,1B0\n", 2, 1, "s.csv:2:1: stage 0 already runs on rank 0; a stage lives on one rank"},
      {"0F0,0B0,2F0,2B0\n1F0,1B0\n", 2, 1, "s.csv: uses 3 stages, not a multiple of the 2 ranks; every rank needs as many chunks"},
      {"1F0,1B0\n0F0,0B0\n", 2, 1,
       "s.csv: the stages are neither in loop placement (stage s on rank s mod 2) nor in V placement (2 chunks, stage "
       "2p-1-i on rank i)"},
  }));
  CAPTURE(std::get<0>(c));
  Result<CustomSchedule> s = parse_schedule_csv(std::get<0>(c), "s.csv", std::get<1>(c), std::get<2>(c));
  REQUIRE_FALSE(s.ok());
  CHECK(s.error().message == std::get<3>(c));
}

TEST_CASE("an order that deadlocks is refused by validation, naming the ops") {
  // Rank 1 wants microbatch 1's forward before microbatch 0 has been through rank 0's backward.
  const Config c = parse_or_fail(explicit_json(2, 2, 1, 1, 1));
  Result<CustomSchedule> s = parse_schedule_csv("0F0,0B0,0F1,0B1\n1F1,1B1,1F0,1B0\n", "s.csv", 2, 2);
  REQUIRE(s.ok());
  Result<Plan> plan = make_plan(c, &s.value());
  REQUIRE_FALSE(plan.ok());
  CHECK(plan.error().message.rfind("schedule 'file:s.csv' produced an invalid graph: deadlock: ", 0) == 0);

  // `simulate` leaves the check to the simulator, and names the cycle as make_plan does.
  Result<SimulatedRun> run = simulate_config(c, &s.value());
  REQUIRE_FALSE(run.ok());
  CHECK(run.error().message == c.source + ": " + plan.error().message);
  Result<Plan> unchecked = make_plan(c, &s.value(), Validation::ByCaller);
  REQUIRE(unchecked.ok());
  CHECK_FALSE(simulate(unchecked.value().graph, std::vector<TimeNs>(unchecked.value().graph.size(), 1)).ok());
}

TEST_CASE("a file with a missing or a repeated op is refused before anything indexes by it") {
  // With vocabulary passes, a missing op was read at index -1 (found by tools/fuzz.sh).
  Config c = parse_or_fail(explicit_json(2, 2, 1, 1, 1));
  c.schedule.vocab = GENERATE(VocabMode::Baseline, VocabMode::Vocab1);
  const std::string rule = "; every stage runs F and B (and W, if any does) once per microbatch";
  using Case = std::pair<std::string, std::string>;
  const Case k = GENERATE_COPY(values<Case>({
      {"0F0,0B0,0F1\n1F0,1B0,1F1,1B1\n", "schedule 'file:s.csv': missing B(s0,m1)" + rule},
      {"0F1\n1F0,1B0,1F1,1B1\n", "schedule 'file:s.csv': missing F(s0,m0)" + rule},
      {"0F0,0B0,0F1,0B1,0B1\n1F0,1B0,1F1,1B1\n", "schedule 'file:s.csv': B(s0,m1) appears twice"},
  }));
  CAPTURE(vocab_mode_name(c.schedule.vocab), k.first);
  Result<CustomSchedule> s = parse_schedule_csv(k.first, "s.csv", 2, 2);
  REQUIRE(s.ok());
  Result<Plan> plan = make_plan(c, &s.value());
  REQUIRE_FALSE(plan.ok());
  CHECK(plan.error().message == k.second);
}

TEST_CASE("the compute_comms format keeps the file's communication order") {
  // Rank 0 sends microbatch 1's activation before microbatch 0's, and posts each gradient RECV
  // after its previous compute, as PyTorch's runtime issues them. With F = 1, a full backward of
  // 3 and 0.5 ms per transfer: 0F0 0F1 end at 2; SEND_F1 [2, 2.5], SEND_F0 [2.5, 3]; rank 1 runs
  // 1F0 1F1 1B0 over [3, 8], SEND_B0 [8, 8.5], 1B1 [8, 11], SEND_B1 [11, 11.5]; rank 0 receives
  // B0 [8, 8.5], runs 0B0 [8.5, 11.5], posts RECV_B1 only then [11.5, 12] and 0B1 ends at 15.
  // Derived from the compute order instead, the sends follow the forwards: 13 ms.
  const Config c = parse_or_fail(explicit_json(2, 2, 1, 1, 3), {"costs.p2p_ms=0.5"});
  const CustomSchedule file = parse_ok(
      "0F0,0F1,0SEND_F1,0SEND_F0,0RECV_B0,0B0,0RECV_B1,0B1\n"
      "1RECV_F1,1RECV_F0,1F0,1F1,1B0,1SEND_B0,1B1,1SEND_B1\n",
      2, 2);
  CHECK(simulate_custom(c, file) == ns_from_ms(15));
  CHECK(simulate_custom(c, parse_ok("0F0,0F1,0B0,0B1\n1F0,1F1,1B0,1B1\n", 2, 2)) == ns_from_ms(13));
}

TEST_CASE("a compute_comms file whose channel orders disagree is refused, naming the pair") {
  const Config c = parse_or_fail(explicit_json(2, 2, 1, 1, 3));
  const CustomSchedule file = parse_ok(
      "0F0,0SEND_F0,0F1,0SEND_F1,0RECV_B0,0B0,0RECV_B1,0B1\n"
      "1RECV_F1,1F1,1RECV_F0,1F0,1B0,1SEND_B0,1B1,1SEND_B1\n",
      2, 2);
  Result<Plan> plan = make_plan(c, &file);
  REQUIRE_FALSE(plan.ok());
  CHECK(plan.error().message ==
        "schedule 'file:s.csv' produced an invalid graph: p2p order mismatch between device 0 and device 1: SEND "
        "number 1 on device 0 is SEND(d0->d1,act,s0,m0), but RECV number 1 on device 1 is RECV(d1<-d0,act,s0,m1); "
        "sends and receives between a pair must be issued in the same order");
  // `simulate` checks the structure itself, and refuses the graph in the same words.
  Result<SimulatedRun> run = simulate_config(c, &file);
  REQUIRE_FALSE(run.ok());
  CHECK(run.error().message == c.source + ": " + plan.error().message);
}

TEST_CASE("a large graph is validated beside its simulation, with the same outcome as in the plan") {
  // 8 devices x 2 chunks x 1024 microbatches: over 65536 ops, so the checks run on their own thread.
  const Config c = parse_or_fail(explicit_json(8, 1024, 2, 1, 2, "v-half"));
  Result<Plan> plan = make_plan(c);
  REQUIRE(plan.ok());
  REQUIRE(plan.value().graph.size() >= std::size_t(1) << 16);
  const auto durations = op_durations(*make_cost_model(plan.value().config, plan.value().layout), plan.value().graph);
  Result<Timeline> timeline = simulate(plan.value().graph, durations);
  REQUIRE(timeline.ok());
  Result<SimulatedRun> run = simulate_config(c);
  REQUIRE(run.ok());
  CHECK(run.value().timeline.end == timeline.value().end);
}

TEST_CASE("export then import keeps 1f1b's interlaced program, and so its iteration time") {
  const Config c = source_config("tiny.json", {"schedule.name=\"1f1b\"", "schedule.vocab=\"interlaced\""});
  const Simulated generated = simulate_or_fail(c);
  const int p = c.parallel.pp, m = c.parallel.microbatches;
  Result<CustomSchedule> loaded = parse_schedule_csv(schedule_csv(generated.plan.graph), "s.csv", p, m);
  if (!loaded.ok()) FAIL(loaded.error().message);
  Result<Plan> plan = make_plan(c, &loaded.value());
  if (!plan.ok()) FAIL(plan.error().message);
  const std::vector<TimeNs> durations = op_durations(*make_cost_model(plan.value().config, plan.value().layout), plan.value().graph);
  Result<Timeline> timeline = simulate(plan.value().graph, durations);
  REQUIRE(timeline.ok());
  CHECK(*std::max_element(timeline.value().end.begin(), timeline.value().end.end()) == generated.metrics.iteration_ns);
}
