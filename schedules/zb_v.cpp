#include <atomic>
#include <limits>

#include "greedy.h"
#include "order_eval.h"
#include "two_threads.h"
#include "zbv_reference.h"

namespace pipesim {

/// ZB-V (Qi et al., "Zero Bubble Pipeline Parallelism", 2023): V placement with B and W split and
/// 1F1B's peak activation memory (p stage-microbatches, 2p chunk-microbatches) on every device.
/// Two candidates: PyTorch 2.11's handcrafted order (zero bubble when F = B = W) and the greedy
/// list scheduler under that budget (it adapts to unequal costs and transfers). The greedy order
/// wins only if it is faster without a higher peak, so zb-v is never behind PyTorch's order.
Result<DeviceOrders> generate_zb_v(const ScheduleContext& context) {
  // The greedy order runs beside PyTorch's, and stops once it cannot beat that order's makespan.
  std::atomic<TimeNs> to_beat = std::numeric_limits<TimeNs>::max();
  GreedyOptions options;
  options.budget = activation_budget(context, [](int, int devices) { return 2.0 * devices; });
  options.give_up_at = &to_beat;
  std::future<Result<GreedyOrders>> greedy_order =
      beside(context.worth_a_thread(), [&] { return greedy_schedule(context, options); });
  DeviceOrders reference = zbv_reference_orders(context.layout, context.microbatches);
  Result<OrderCost> reference_cost = evaluate_orders(context, reference);
  if (reference_cost.ok()) to_beat.store(reference_cost.value().makespan, std::memory_order_relaxed);
  Result<GreedyOrders> greedy = greedy_order.get();
  if (!greedy.ok()) return reference_cost.ok() ? Result<DeviceOrders>(std::move(reference)) : greedy.error();
  if (!reference_cost.ok()) return std::move(greedy.value().orders);  // e.g. too few microbatches for PyTorch's order
  const OrderCost& to_replace = reference_cost.value();
  if (improves_on(greedy.value().cost, to_replace.makespan, largest_peak(to_replace)))
    return std::move(greedy.value().orders);
  return reference;
}

}  // namespace pipesim
