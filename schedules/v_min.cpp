#include "v_block.h"

namespace pipesim {

/// V-Min (Qi et al., "Pipeline Parallelism with Controllable Memory", 2024): V placement with B and
/// W split, from the most compact block -- every pass as early as its input and the block's
/// collision-free slots allow -- for about a third of 1F1B's activation memory. The greedy
/// scheduler under the same memory replaces the block where it runs faster.
Result<DeviceOrders> generate_v_min(const ScheduleContext& context) {
  return v_schedule(context, v_block(unit_costs(context), {}), {});
}

}  // namespace pipesim
