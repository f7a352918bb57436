// The memory a schedule's generator plans with (order_eval.h, from the orders alone) is the
// simulator's (the graph's ops, timed): both take their figures from parallel_shape.h and op_work.h,
// so for every schedule, vocabulary mode and recomputation setting they agree — exactly where the
// vocabulary layers sit on the stages, and as a lower bound where vocabulary passes add their own
// activations (the S pass keeps its logits shard until T), which the orders do not hold.
#include <algorithm>

#include "helpers.h"
#include "order_eval.h"

using namespace pipesim;
using namespace pipesim::testing;

namespace {

/// Each device's activation peak as the generator's orders give it, before the vocabulary passes
/// are placed: the context and orders make_plan builds.
std::vector<Bytes> planned_peaks(const Plan& plan) {
  const ScheduleContext context = schedule_context(plan.config, plan.layout, *plan.costs);
  Result<DeviceOrders> orders = plan.schedule->generate(context);
  REQUIRE(orders.ok());
  Result<OrderCost> cost = evaluate_orders(context, orders.value());
  REQUIRE(cost.ok());
  return cost.value().peak_activation;
}

}  // namespace

TEST_CASE("the memory the schedules plan with is the simulator's peak activation memory") {
  const std::string recompute = GENERATE("none", "selective", "full");
  const std::string method = GENERATE("uniform", "block");
  if (recompute != "full" && method == "block") return;  // the method only matters under full recomputation
  CAPTURE(recompute, method);
  // Flash attention off: selective recomputation then has score matrices to rebuild (an R op).
  const Config base = shipped_config("tiny.json", {"precision.flash_attention=false",
                                                   "training.recompute_granularity=\"" + recompute + "\"",
                                                   "training.recompute_method=\"" + method + "\"",
                                                   "training.recompute_num_layers=1"});
  int compared = 0;
  for (const std::string& schedule : schedule_names())
    for (const std::string& vocab : vocab_mode_names()) {
      Config c = base;
      c.schedule.name = schedule;
      c.schedule.vocab = *vocab_mode_named(vocab);
      Result<Plan> plan = make_plan(c);
      if (!plan.ok()) continue;  // a schedule that cannot run this shape refuses it, with its reason
      // Interlaced runs its own lockstep program instead of the generator's orders (plan.cpp).
      if (vocab == "interlaced") continue;
      CAPTURE(schedule, vocab);
      const Simulated s = simulate_or_fail(c);
      const std::vector<Bytes> planned = planned_peaks(plan.value());
      REQUIRE(planned.size() == s.metrics.devices.size());
      const bool on_stages = plan.value().layout.vocab == VocabPlacement::OnStages;
      for (const DeviceMetrics& d : s.metrics.devices) {
        CAPTURE(d.rank);
        const Bytes simulated = d.peak_memory_bytes - d.static_bytes;
        if (on_stages) CHECK(planned[std::size_t(d.rank)] == simulated);
        else CHECK(planned[std::size_t(d.rank)] <= simulated);
      }
      ++compared;
    }
  CHECK(compared >= int(schedule_names().size()) * 2);  // at least baseline and redistribute of each
}

TEST_CASE("under recomputation the planned peak counts what R rebuilds before B returns it") {
  // One device's stage of two layers under full uniform recomputation: F keeps one input per layer,
  // R rebuilds one layer, B returns both; GPipe runs every F, then every B.
  const Config c = shipped_config("tiny.json", {"schedule.name=\"gpipe\"", "schedule.vocab=\"baseline\"",
                                                "training.recompute_granularity=\"full\""});
  const Plan plan = plan_or_fail(c);
  const ScheduleContext context = schedule_context(plan.config, plan.layout, *plan.costs);
  const StageWork& w = context.work[0];
  REQUIRE(w.recomputes());
  const Bytes all_forwards = Bytes(c.parallel.microbatches) * w.activation_bytes;
  // The first B comes when every F has kept its part: R's rebuilt layer comes on top of them.
  CHECK(planned_peaks(plan)[0] == all_forwards + w.recompute_alloc(false));
}
