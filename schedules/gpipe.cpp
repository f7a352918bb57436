#include "schedule.h"

namespace pipesim {

/// GPipe: every device runs all its forwards, then all its backwards in the same microbatch order.
/// Time (m + p - 1)(F + B) without communication cost; m microbatches of activations per stage.
Result<DeviceOrders> generate_gpipe(const ScheduleContext& context) {
  const Layout& layout = context.layout;
  const int microbatches = context.microbatches;
  DeviceOrders orders(static_cast<std::size_t>(layout.devices));
  for (int d = 0; d < layout.devices; ++d) {
    const int stage = layout.stage_of(d, 0);
    auto& order = orders[static_cast<std::size_t>(d)];
    for (int m = 0; m < microbatches; ++m) order.push_back({OpKind::F, stage, m});
    for (int m = 0; m < microbatches; ++m) order.push_back({OpKind::B, stage, m});
  }
  return orders;
}

}  // namespace pipesim
