#include <fmt/format.h>

#include <deque>

#include "schedule.h"

namespace pipesim {
namespace {

/// One rank's program, written the way DualPipeV's reference implementation walks its eight steps.
class DualPipeVRank {
 public:
  DualPipeVRank(const Layout& layout, int rank) : stage_{layout.stage_of(rank, 0), layout.stage_of(rank, 1)} {}

  void forward(int chunk) { order_.push_back({OpKind::F, stage_[chunk], next_forward_[chunk]++}); }
  /// With `defer_weight`, W waits in a queue for weight(); otherwise it follows B at once.
  void backward(int chunk, bool defer_weight) {
    const ComputeStep b{OpKind::B, stage_[chunk], next_backward_[chunk]++};
    order_.push_back(b);
    if (defer_weight) deferred_.push_back({OpKind::W, b.stage, b.microbatch});
    else order_.push_back({OpKind::W, b.stage, b.microbatch});
  }
  void weight() {
    order_.push_back(deferred_.front());
    deferred_.pop_front();
  }
  /// DualPipe overlaps these two; the simulator runs them back to back on the compute stream.
  void forward_backward(int forward_chunk, int backward_chunk) {
    forward(forward_chunk);
    backward(backward_chunk, false);
  }
  std::vector<ComputeStep> take() { return std::move(order_); }

 private:
  int stage_[2];
  int next_forward_[2] = {0, 0}, next_backward_[2] = {0, 0};
  std::deque<ComputeStep> deferred_;
  std::vector<ComputeStep> order_;
};

}  // namespace

/// DualPipeV (DeepSeek-AI, DualPipe repository): DualPipe cut in half onto p ranks in V placement.
/// Bubble (p - 1)(F&B + B - 3W) per rank with F, B (full backward) and W per chunk, activation at
/// most 2p + 1 chunk-microbatches. Needs m >= 2p.
Result<DeviceOrders> generate_dualpipe_v(const ScheduleContext& context) {
  const int p = context.layout.devices, m = context.microbatches;
  if (m < 2 * p)
    return Error{fmt::format("parallel.microbatches: dualpipe-v needs at least 2 x pp ({}) microbatches, got {}; use {}",
                             2 * p, m, 2 * p)};
  DeviceOrders orders;
  for (int r = 0; r < p; ++r) {
    DualPipeVRank rank(context.layout, r);
    for (int i = 0; i < 2 * (p - r - 1); ++i) rank.forward(0);  // 1: chunk-0 warm-up
    for (int i = 0; i < r + 1; ++i) rank.forward(0), rank.forward(1);  // 2: both chunks
    for (int i = 0; i < p - r - 1; ++i) {  // 3: B1 W1 F1, zero bubble
      rank.backward(1, true);
      rank.weight();
      rank.forward(1);
    }
    for (int i = 0; i < m - 2 * p + r + 1; ++i) {  // 4, main: F0&B1, F1&B0
      rank.forward_backward(0, 1);
      rank.forward_backward(1, 0);
    }
    for (int i = 0; i < p - r - 1; ++i) {  // 5: B1, F1&B0
      rank.backward(1, false);
      rank.forward_backward(1, 0);
    }
    bool defer = false;  // 6: B1 B0, the second half deferring W
    for (int i = 0; i < r + 1; ++i) {
      if (i == (r + 1) / 2 && r % 2 == 1) defer = true;
      rank.backward(1, defer);
      if (i == (r + 1) / 2 && r % 2 == 0) defer = true;
      rank.backward(0, defer);
    }
    for (int i = 0; i < p - r - 1; ++i) rank.weight(), rank.backward(0, true);  // 7: W B0
    for (int i = 0; i < r + 1; ++i) rank.weight();  // 8: drain W
    orders.push_back(rank.take());
  }
  return orders;
}

}  // namespace pipesim
