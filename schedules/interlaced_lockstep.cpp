#include <algorithm>

#include "vocab_passes.h"

namespace pipesim {
namespace {

/// Where each pass of the lockstep program falls, in iterations. Forwards: device 0 starts
/// microbatch y in iteration y, and a forward crosses two devices per iteration (an even device
/// forwards first in its iteration, the odd one after it backwards first, the next even device in
/// the next iteration). The output layer of y runs in the iteration its last forward does; the
/// last stage's backward in the next; a backward crosses one device per iteration.
struct Timing {
  int p;
  int turn() const { return (p - 1) / 2; }  ///< iteration of y = 0's last forward, and S(0)
  int forward(int d, int y) const { return y + d / 2; }
  int backward(int d, int y) const { return y + turn() + 1 + (p - 1 - d); }
  int output(int y) const { return y + turn(); }
  /// dY of y comes back after device 0's backward: IB at the end of the next iteration.
  int input_backward(int y) const { return backward(0, y) + 1; }
};

}  // namespace

DeviceOrders interlaced_1f1b_orders(const ScheduleContext& context) {
  const Layout& layout = context.layout;
  const int p = layout.devices, m = context.microbatches;
  const Timing at{p};
  const int iterations = at.input_backward(m - 1) + 1;
  DeviceOrders orders(static_cast<std::size_t>(p));
  for (int d = 0; d < p; ++d) {
    auto& order = orders[std::size_t(d)];
    const int stage = layout.stage_of(d, 0);
    order.push_back({OpKind::IF, -1, 0});
    for (int k = 0; k < iterations; ++k) {
      const int f = k - d / 2;  // inverse of Timing::forward
      const int b = k - at.turn() - 1 - (p - 1 - d);
      const ComputeStep forward{OpKind::F, stage, f}, backward{OpKind::B, stage, b};
      const bool has_f = f >= 0 && f < m, has_b = b >= 0 && b < m;
      // Odd devices backward first, so that a forward and a backward each cross two devices.
      if (d % 2 == 1 && has_b) order.push_back(backward);
      if (has_f) order.push_back(forward);
      if (d % 2 == 0 && has_b) order.push_back(backward);
      // The embedding device 0 needs next: its sum runs while the output X is broadcast for S.
      if (k + 1 < m) order.push_back({OpKind::IF, -1, k + 1});
      if (const int y = k - at.turn(); y >= 0 && y < m) order.push_back({OpKind::S, -1, y}), order.push_back({OpKind::T, -1, y});
      for (int y = 0; y < m; ++y)
        if (at.input_backward(y) == k) order.push_back({OpKind::IB, -1, y});
    }
  }
  return orders;
}

}  // namespace pipesim
