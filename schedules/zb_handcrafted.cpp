#include <algorithm>
#include <atomic>

#include "greedy.h"
#include "order_eval.h"

namespace pipesim {
namespace {

/// The paper's handcrafted orders (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024, §2),
/// ZB-H1 at k = 1 and ZB-H2 at k = 2. Device i runs k(p - 1 - i) warm-up forwards -- 1F1B's, or twice
/// as many -- then per microbatch j one forward, B(j) and W(j - k i): its W passes trail its B passes
/// by k i microbatches.
///
/// At k = 1 every device keeps at most p microbatches between F and W -- device 0's 1F1B count -- and
/// the last device, which has the most slack to fill, defers the most: the backward chain of the last
/// microbatch runs up the pipeline with no W in its way, and the deferred W fill in behind it.
/// At k = 2 the extra forwards make the first B due just as a device's forwards run out, so with
/// F = B = W no device waits after its first op, and the W left at the end shorten the higher devices'
/// tails as the extra forwards shortened the lower devices' heads: a parallelogram. Peak activations
/// (2p - 1 - 2i) M_B + 2i M_W on device i, (2p - 1) M_B on device 0; bubble (p - 1)(F + B - 2W) per
/// device span (the paper's Table 2).
DeviceOrders zb_handcrafted_order(const ScheduleContext& context, int k) {
  const int p = context.layout.devices, m = context.microbatches;
  DeviceOrders orders(static_cast<std::size_t>(p));
  for (int d = 0; d < p; ++d) {
    auto& order = orders[std::size_t(d)];
    const int stage = context.layout.stage_of(d, 0);
    const int warmup = std::min(k * (p - 1 - d) + context.vocab_delay, m);
    const int lag = k * d;  // W(j) after B(j + lag)
    int next_forward = 0, next_weight = 0;
    while (next_forward < warmup) order.push_back({OpKind::F, stage, next_forward++});
    for (int j = 0; j < m; ++j) {
      if (next_forward < m) order.push_back({OpKind::F, stage, next_forward++});
      order.push_back({OpKind::B, stage, j});
      if (j - lag >= 0) order.push_back({OpKind::W, stage, next_weight++});
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
  DeviceOrders best = zb_handcrafted_order(context, 1);
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

/// ZB-H2: twice ZB-H1's warm-up forwards, spending memory on the bubble; no greedy rival, as none
/// beats it at its memory with F = B = W.
Result<DeviceOrders> generate_zb_h2(const ScheduleContext& context) { return zb_handcrafted_order(context, 2); }

}  // namespace pipesim
