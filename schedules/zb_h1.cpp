#include "greedy.h"

namespace pipesim {

/// ZB-H1 (Qi et al., "Zero Bubble Pipeline Parallelism", 2023): 1F1B with each backward split into
/// B (input gradient) and W (weight gradient), W deferred into what would be bubbles. Device i keeps
/// 1F1B's p - i microbatches in flight, and at most p - 1 - i deferred W.
Result<DeviceOrders> generate_zb_h1(const ScheduleContext& context) {
  GreedyOptions options;
  options.budget = activation_budget(context, [](int device, int devices) { return double(devices - device); });
  return greedy_schedule(context, options);
}

}  // namespace pipesim
