#include <algorithm>
#include <atomic>

#include "greedy.h"
#include "order_eval.h"

namespace pipesim {
namespace {

/// The paper's handcrafted ZB-H1 order. Device i runs 1F1B's p - 1 - i warm-up forwards, then per
/// microbatch k one forward, B(k) and W(k - i): its W passes trail its B passes by i microbatches,
/// so every device keeps at most p microbatches between F and W -- device 0's 1F1B count -- and the
/// last device, which has the most slack to fill, defers the most. The backward chain of the last
/// microbatch then runs up the pipeline with no W in its way, and the deferred W fill in behind it.
DeviceOrders zb_h1_order(const ScheduleContext& context) {
  const int p = context.layout.devices, m = context.microbatches;
  DeviceOrders orders(static_cast<std::size_t>(p));
  for (int d = 0; d < p; ++d) {
    auto& order = orders[std::size_t(d)];
    const int stage = context.layout.stage_of(d, 0);
    const int warmup = std::min(p - 1 - d + context.vocab_delay, m);
    const int lag = d;  // W(k) after B(k + lag)
    int next_forward = 0, next_weight = 0;
    while (next_forward < warmup) order.push_back({OpKind::F, stage, next_forward++});
    for (int k = 0; k < m; ++k) {
      if (next_forward < m) order.push_back({OpKind::F, stage, next_forward++});
      order.push_back({OpKind::B, stage, k});
      if (k - lag >= 0) order.push_back({OpKind::W, stage, next_weight++});
    }
    while (next_weight < m) order.push_back({OpKind::W, stage, next_weight++});
  }
  return orders;
}

}  // namespace

/// ZB-H1 (Qi et al., "Zero Bubble Pipeline Parallelism", 2023): 1F1B with each backward split into
/// B (input gradient) and W (weight gradient), W deferred into what would be bubbles; bubble
/// (p - 1)(F + B - W) with 1F1B's peak activation (device 0's p microbatches). The greedy scheduler
/// under the same bound replaces the handcrafted order where it is faster (unequal costs, transfers).
Result<DeviceOrders> generate_zb_h1(const ScheduleContext& context) {
  DeviceOrders best = zb_h1_order(context);
  Result<OrderCost> cost = evaluate_orders(context, best);
  if (!cost.ok()) return cost.error();
  const std::atomic<TimeNs> to_beat = cost.value().makespan;  // the greedy order stops once it cannot
  GreedyOptions options;
  options.budget = cost.value().peak_activation;
  options.give_up_at = &to_beat;
  Result<GreedyOrders> greedy = greedy_schedule(context, options);
  // The greedy order keeps every device within its peak here, so the bound is the largest of them.
  if (greedy.ok() && improves_on(greedy.value().cost, cost.value().makespan, largest_peak(cost.value())))
    best = std::move(greedy.value().orders);
  return best;
}

}  // namespace pipesim
