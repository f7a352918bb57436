#include <algorithm>

#include "schedule.h"

namespace pipesim {

/// 1F1B (PipeDream-flush): device i runs p-1-i warm-up forwards, then alternates one forward and
/// one backward, then drains the remaining backwards. Same time as GPipe, but device i holds at
/// most min(p - i, m) microbatches of activations.
Result<DeviceOrders> generate_1f1b(const ScheduleContext& context) {
  const Layout& layout = context.layout;
  const int microbatches = context.microbatches;
  const int p = layout.devices;
  DeviceOrders orders(static_cast<std::size_t>(p));
  for (int d = 0; d < p; ++d) {
    const int stage = layout.stage_of(d, 0);
    const int warmup = std::min(p - 1 - d + context.vocab_delay, microbatches);
    auto& order = orders[static_cast<std::size_t>(d)];
    int next_forward = 0, next_backward = 0;
    while (next_forward < warmup) order.push_back({OpKind::F, stage, next_forward++});
    while (next_forward < microbatches) {
      order.push_back({OpKind::F, stage, next_forward++});
      order.push_back({OpKind::B, stage, next_backward++});
    }
    while (next_backward < microbatches) order.push_back({OpKind::B, stage, next_backward++});
  }
  return orders;
}

}  // namespace pipesim
