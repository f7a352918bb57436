#include "greedy.h"

namespace pipesim {

/// ZB-V (Qi et al., "Zero Bubble Pipeline Parallelism", 2023): V placement with B and W split and
/// 1F1B's peak activation memory (p stage-microbatches, 2p chunk-microbatches) on every device;
/// the deferred W passes fill the bubbles, leaving almost none.
Result<DeviceOrders> generate_zb_v(const ScheduleContext& context) {
  GreedyOptions options;
  options.budget = activation_budget(context, [](int, int devices) { return 2.0 * devices; });
  return greedy_schedule(context, options);
}

}  // namespace pipesim
