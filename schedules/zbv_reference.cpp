#include "zbv_reference.h"

#include <algorithm>

namespace pipesim {
namespace {

/// Builds one rank's program the way PyTorch 2.11's ScheduleZBVZeroBubble counts its passes:
/// forwards, input gradients and weight gradients of each chunk in microbatch order.
class RankProgram {
 public:
  RankProgram(const Layout& layout, int rank) : stage_{layout.stage_of(rank, 0), layout.stage_of(rank, 1)} {}
  void f(int chunk) { push(OpKind::F, chunk, forward_[chunk]++); }
  void b(int chunk) { push(OpKind::B, chunk, backward_[chunk]++); }
  void w(int chunk) { push(OpKind::W, chunk, weight_[chunk]++); }
  int forwards(int chunk) const { return forward_[chunk]; }
  int backwards(int chunk) const { return backward_[chunk]; }
  int weights(int chunk) const { return weight_[chunk]; }
  /// Ops of microbatches beyond `m` are dropped, as PyTorch drops them (it plans for at least 2p - 1).
  std::vector<ComputeStep> take(int m) {
    std::erase_if(order_, [m](const ComputeStep& s) { return s.microbatch >= m; });
    return std::move(order_);
  }

 private:
  void push(OpKind kind, int chunk, int mb) { order_.push_back({kind, stage_[chunk], mb}); }
  int stage_[2];
  int forward_[2] = {0, 0}, backward_[2] = {0, 0}, weight_[2] = {0, 0};
  std::vector<ComputeStep> order_;
};

std::vector<ComputeStep> zbv_rank(const Layout& layout, int rank, int m) {
  const int p = layout.devices, planned = std::max(2 * p - 1, m);
  RankProgram r(layout, rank);
  for (int i = 0; i < 2 * (p - rank) - 1; ++i) r.f(0);  // warm-up: chunk 0 fills the V's down stroke
  for (int i = 0; i < rank; ++i) r.f(1), r.f(0);
  for (int i = 0; i < p - rank; ++i) r.f(1), r.b(1), r.w(1);  // the turn: chunk 1 starts coming back
  while (r.forwards(1) < r.forwards(0) || r.forwards(0) < planned) {  // steady: F B W on both chunks
    if (r.forwards(0) < planned) r.f(0);
    r.b(0), r.w(0);
    r.f(1), r.b(1), r.w(1);
  }
  for (int i = 0; i < rank; ++i) r.b(0), r.b(1);  // cool-down: input gradients first, W after
  for (int i = 0; i < p - rank; ++i) r.b(0), r.w(0);
  while (r.weights(1) < r.backwards(1)) r.w(1);
  while (r.weights(0) < r.backwards(0)) r.w(0);
  return r.take(m);
}

}  // namespace

DeviceOrders zbv_reference_orders(const Layout& layout, int microbatches) {
  DeviceOrders orders;
  for (int rank = 0; rank < layout.devices; ++rank) orders.push_back(zbv_rank(layout, rank, microbatches));
  return orders;
}

}  // namespace pipesim
