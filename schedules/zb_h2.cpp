#include <algorithm>

#include "schedule.h"

namespace pipesim {

/// ZB-H2 (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024, §2.2): the handcrafted schedule
/// that spends memory on the bubble. Device i runs 2(p - 1 - i) warm-up forwards, twice 1F1B's, so
/// that its first B is due just as its forwards run out: with F = B = W no device waits after its
/// first op. Then per microbatch k one forward, B(k) and W(k - 2i): W trails B by 2i microbatches,
/// so the W left at the end shorten the higher devices' tails as the extra forwards shortened the
/// lower devices' heads -- a parallelogram. Peak activations (2p - 1 - 2i) M_B + 2i M_W on device
/// i, (2p - 1) M_B on device 0; bubble (p - 1)(F + B - 2W) per device span (the paper's Table 2).
Result<DeviceOrders> generate_zb_h2(const ScheduleContext& context) {
  const int p = context.layout.devices, m = context.microbatches;
  DeviceOrders orders(static_cast<std::size_t>(p));
  for (int d = 0; d < p; ++d) {
    auto& order = orders[std::size_t(d)];
    const int stage = context.layout.stage_of(d, 0);
    const int warmup = std::min(2 * (p - 1 - d) + context.vocab_delay, m);
    const int lag = 2 * d;  // W(k) after B(k + lag)
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

}  // namespace pipesim
