#include "vocab_passes.h"

namespace pipesim {
namespace {

/// Which microbatch each pass of the lockstep program serves in iteration k (out of range: none).
/// Forwards: device 0 starts microbatch y in iteration y, and a forward crosses two devices per
/// iteration (an even device forwards first, the odd one after it backwards first and then
/// forwards; the next even device does so in the next iteration). The output layer of y runs in the
/// iteration of its last forward, the last stage's backward of y in the next, and a backward
/// crosses one device per iteration; IB of y runs in the iteration after device 0's backward.
struct Lockstep {
  int p;
  int turn() const { return (p - 1) / 2; }  ///< the iteration of microbatch 0's last forward
  int forward(int d, int k) const { return k - d / 2; }
  int backward(int d, int k) const { return k - turn() - 1 - (p - 1 - d); }
  int output(int k) const { return k - turn(); }
  int input_backward(int k) const { return backward(0, k) - 1; }
};

}  // namespace

DeviceOrders interlaced_1f1b_orders(const ScheduleContext& context) {
  const Layout& layout = context.layout;
  const int p = layout.devices, m = context.microbatches;
  const Lockstep at{p};
  const auto due = [m](int y) { return y >= 0 && y < m; };
  DeviceOrders orders(static_cast<std::size_t>(p));
  for (int d = 0; d < p; ++d) {
    auto& order = orders[std::size_t(d)];
    const int stage = layout.stage_of(d, 0);
    order.push_back({OpKind::IF, -1, 0});
    for (int k = 0; at.input_backward(k) < m; ++k) {
      const ComputeStep forward{OpKind::F, stage, at.forward(d, k)}, backward{OpKind::B, stage, at.backward(d, k)};
      if (d % 2 == 1 && due(backward.microbatch)) order.push_back(backward);
      if (due(forward.microbatch)) order.push_back(forward);
      if (d % 2 == 0 && due(backward.microbatch)) order.push_back(backward);
      // The embedding device 0 needs next: its sum runs while the output X is broadcast for S.
      if (due(k + 1)) order.push_back({OpKind::IF, -1, k + 1});
      if (const int y = at.output(k); due(y)) order.push_back({OpKind::S, -1, y}), order.push_back({OpKind::T, -1, y});
      if (const int y = at.input_backward(k); due(y)) order.push_back({OpKind::IB, -1, y});
    }
  }
  return orders;
}

}  // namespace pipesim
