// zb-v and dualpipe-v against the orders PyTorch 2.11 runs for ScheduleZBVZeroBubble and
// ScheduleDualPipeV, replayed in pipesim with the same costs: never slower, never more memory.
// The replayed orders are pinned to the files PyTorch writes (tests/fixtures/torch-2.11/).
#include <deque>
#include <fstream>
#include <sstream>

#include "helpers.h"
#include "schedule_csv.h"
#include "zbv_reference.h"

using namespace pipesim;
using namespace pipesim::testing;

namespace {

/// PyTorch's DualPipeV per rank, replayed step by step (its eight steps; a full backward -- in an
/// overlapped pair or alone -- is B then W at once, an input gradient queues its W).
DeviceOrders torch_dualpipe_v(const Layout& layout, int m) {
  DeviceOrders orders;
  const int p = layout.devices;
  for (int r = 0; r < p; ++r) {
    const int stage[2] = {layout.stage_of(r, 0), layout.stage_of(r, 1)};
    int forward[2] = {0, 0}, backward[2] = {0, 0};
    std::deque<ComputeStep> weights;
    std::vector<ComputeStep> o;
    const auto f = [&](int c) { o.push_back({OpKind::F, stage[c], forward[c]++}); };
    const auto b = [&](int c, bool full) {
      o.push_back({OpKind::B, stage[c], backward[c]});
      (full ? o.emplace_back(OpKind::W, stage[c], backward[c]) : weights.emplace_back(OpKind::W, stage[c], backward[c]));
      ++backward[c];
    };
    const auto w = [&] {
      if (weights.empty()) return;
      o.push_back(weights.front());
      weights.pop_front();
    };
    for (int i = 0; i < 2 * (p - r - 1); ++i) f(0);
    for (int i = 0; i < r + 1; ++i) f(0), f(1);
    for (int i = 0; i < p - r - 1; ++i) b(1, false), w(), f(1);
    for (int i = 0; i < m - 2 * p + r + 1; ++i) f(0), b(1, true), f(1), b(0, true);
    for (int i = 0; i < p - r - 1; ++i) b(1, true), f(1), b(0, true);
    bool zb = false;
    for (int i = 0; i < r + 1; ++i) {
      if (i == (r + 1) / 2 && r % 2 == 1) zb = true;
      b(1, !zb);
      if (i == (r + 1) / 2 && r % 2 == 0) zb = true;
      b(0, !zb);
    }
    for (int i = 0; i < p - r - 1; ++i) w(), b(0, !zb);
    for (int i = 0; i < r + 1; ++i) w();
    orders.push_back(std::move(o));
  }
  return orders;
}

bool same_orders(const DeviceOrders& a, const DeviceOrders& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t d = 0; d < a.size(); ++d) {
    if (a[d].size() != b[d].size()) return false;
    for (std::size_t i = 0; i < a[d].size(); ++i)
      if (a[d][i].kind != b[d][i].kind || a[d][i].stage != b[d][i].stage || a[d][i].microbatch != b[d][i].microbatch)
        return false;
  }
  return true;
}

Config split_costs(int p, int m, double f, double b, double w) {
  Config c = parse_or_fail(explicit_json(p, m, 2, f, b, "zb-v", 1e6));
  c.costs->weight_ms = {w};
  return c;
}

struct Replayed {
  TimeNs iteration;
  Bytes peak;  ///< the largest device's peak activation
};

Replayed replay(const Config& c, const DeviceOrders& orders, Placement placement) {
  const CustomSchedule custom{"torch", placement, 2, orders, {}, {}};
  Result<Plan> plan = make_plan(c, &custom);
  if (!plan.ok()) FAIL(plan.error().message);
  const auto durations = op_durations(*make_cost_model(plan.value().config, plan.value().layout), plan.value().graph);
  Result<Timeline> timeline = simulate(plan.value().graph, durations);
  if (!timeline.ok()) FAIL(timeline.error().message);
  const RunMetrics metrics = compute_metrics(plan.value().config, plan.value().graph, timeline.value(), plan.value().static_bytes);
  Bytes peak = 0;
  for (const DeviceMetrics& d : metrics.devices) peak = std::max(peak, d.peak_activation_bytes);
  return {metrics.iteration_ns, peak};
}

Replayed generated(Config c, const std::string& schedule) {
  c.schedule.name = schedule;
  const Simulated s = simulate_or_fail(c);
  Bytes peak = 0;
  for (const DeviceMetrics& d : s.metrics.devices) peak = std::max(peak, d.peak_activation_bytes);
  return {s.metrics.iteration_ns, peak};
}

}  // namespace

TEST_CASE("the replayed PyTorch orders are the ones PyTorch 2.11 writes") {
  const Plan plan = plan_or_fail(split_costs(4, 8, 1, 1, 1));
  Result<CustomSchedule> zbv = parse_schedule_csv(fixture("torch-zb-v-p4-m8.csv"), "zb-v.csv", 4, 8);
  Result<CustomSchedule> dual = parse_schedule_csv(fixture("torch-dualpipe-v-p4-m8.csv"), "dualpipe-v.csv", 4, 8);
  REQUIRE(zbv.ok());
  REQUIRE(dual.ok());
  CHECK(same_orders(zbv.value().orders, zbv_reference_orders(plan.layout, 8)));
  CHECK(same_orders(dual.value().orders, torch_dualpipe_v(plan.layout, 8)));
}

TEST_CASE("zb-v and dualpipe-v are never slower than PyTorch's orders, at no more peak activation") {
  using Costs = std::tuple<double, double, double>;
  const Costs costs = GENERATE(Costs{1, 1, 1}, Costs{1, 2, 1}, Costs{1, 2, 2});
  const int p = GENERATE(4, 8, 16);
  const int m = p * GENERATE(2, 4);
  const auto [f, b, w] = costs;
  CAPTURE(f, b, w, p, m);
  const Config c = split_costs(p, m, f, b, w);
  const Layout& layout = plan_or_fail(c).layout;
  const Replayed torch_zbv = replay(c, zbv_reference_orders(layout, m), Placement::V);
  const Replayed zbv = generated(c, "zb-v");
  CHECK(zbv.iteration <= torch_zbv.iteration);
  CHECK(zbv.peak <= torch_zbv.peak);
  const Replayed torch_dual = replay(c, torch_dualpipe_v(layout, m), Placement::V);
  const Replayed dual = generated(c, "dualpipe-v");
  CHECK(dual.iteration <= torch_dual.iteration);
  CHECK(dual.peak <= torch_dual.peak);
}
