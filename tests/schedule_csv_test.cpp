// PyTorch compute-only CSV: every generated schedule survives export and import unchanged, and bad
// files are refused at the line and column.
#include "helpers.h"
#include "schedule_csv.h"

using namespace pipesim;
using namespace pipesim::testing;

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
      {"0F0,0F1\n1F0, 1X1\n", 2, 2, "s.csv:2:5: '1X1' is not an action; write [stage][F|I|B|W][microbatch], e.g. 0F0"},
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
}

TEST_CASE("a file with a missing or a repeated op is refused before anything indexes by it") {
  // With vocabulary passes, a missing op was read at index -1 (found by tools/fuzz.sh).
  Config c = parse_or_fail(explicit_json(2, 2, 1, 1, 1));
  c.schedule.vocab = GENERATE("baseline", "vocab-1");
  const std::string rule = "; every stage runs F and B (and W, if any does) once per microbatch";
  using Case = std::pair<std::string, std::string>;
  const Case k = GENERATE_COPY(values<Case>({
      {"0F0,0B0,0F1\n1F0,1B0,1F1,1B1\n", "schedule 'file:s.csv': missing B(s0,m1)" + rule},
      {"0F1\n1F0,1B0,1F1,1B1\n", "schedule 'file:s.csv': missing F(s0,m0)" + rule},
      {"0F0,0B0,0F1,0B1,0B1\n1F0,1B0,1F1,1B1\n", "schedule 'file:s.csv': B(s0,m1) appears twice"},
  }));
  CAPTURE(c.schedule.vocab, k.first);
  Result<CustomSchedule> s = parse_schedule_csv(k.first, "s.csv", 2, 2);
  REQUIRE(s.ok());
  Result<Plan> plan = make_plan(c, &s.value());
  REQUIRE_FALSE(plan.ok());
  CHECK(plan.error().message == k.second);
}
