#pragma once
/// A quick evaluation of per-device orders of the transformer compute ops (F, B, W): each op starts
/// when its device is free and its input has arrived (one transfer time across devices, none on one),
/// and each device's activation memory is followed to its peak (F takes, B and W free). Generators
/// use it to choose between candidate orders; the simulator remains the judge of the final graph.
#include <algorithm>
#include <array>
#include <cstdint>
#include <utility>
#include <vector>

#include "schedule.h"

namespace pipesim {

struct OrderCost {
  TimeNs makespan = 0;
  std::vector<Bytes> peak_activation;  ///< per device, from the order alone (F and R take, B and W return)
  std::vector<std::vector<TimeNs>> start, end;  ///< per device, per position in its order (OpTimes::Record)
  /// (device, position) of every op in the order they were timed: each after its inputs and its
  /// device's previous op, a topological order of the data flow and program order (OpTimes::Record).
  std::vector<std::pair<std::uint32_t, std::uint32_t>> sequence;
};

/// The largest of the devices' activation peaks: the memory a schedule is known by.
inline Bytes largest_peak(const OrderCost& cost) {
  const std::vector<Bytes>& peaks = cost.peak_activation;
  return peaks.empty() ? 0 : *std::max_element(peaks.begin(), peaks.end());
}

/// The one rule by which a generator weighing candidate orders replaces its best so far: the
/// candidate is strictly faster (on a tie the earlier candidate stays, by convention the handcrafted
/// or reference order) and no device's peak exceeds `peak_bound`, the memory the schedule promises.
inline bool improves_on(const OrderCost& candidate, TimeNs best_makespan, Bytes peak_bound) {
  return candidate.makespan < best_makespan && largest_peak(candidate) <= peak_bound;
}

/// Whether evaluate_orders keeps every op's start and end, or only the makespan and peaks (what
/// choosing between candidate orders needs, without the arrays' 16 bytes an op).
enum class OpTimes { Skip, Record };

/// The transformer ops whose results `step` consumes: F(s-1) for F(s); F(s) and B(s+1) for B(s);
/// B(s) for W(s) -- the data flow every analysis of the orders follows.
/// At most two, held inline, and defined here to be inlined: the analyses call this for every op.
struct DataInputs {
  std::array<ComputeStep, 2> steps;
  int count = 0;
  const ComputeStep* begin() const { return steps.data(); }
  const ComputeStep* end() const { return steps.data() + count; }
};
inline DataInputs data_inputs(const ComputeStep& s, int stages) {
  switch (s.kind) {
    case OpKind::F:
      if (s.stage > 0) return {{{{OpKind::F, s.stage - 1, s.microbatch}}}, 1};
      return {};
    case OpKind::B:
      if (s.stage + 1 < stages) return {{{{OpKind::F, s.stage, s.microbatch}, {OpKind::B, s.stage + 1, s.microbatch}}}, 2};
      return {{{{OpKind::F, s.stage, s.microbatch}}}, 1};
    case OpKind::W: return {{{{OpKind::B, s.stage, s.microbatch}}}, 1};
    default: return {};
  }
}

/// Fails if the orders cannot run to the end (an op waits for one that comes after it).
Result<OrderCost> evaluate_orders(const ScheduleContext& context, const DeviceOrders& orders,
                                  OpTimes times = OpTimes::Skip);

/// No graph assembled from `orders`, with vocabulary passes inserted or not, simulates to an
/// iteration shorter than this. evaluate_orders times the same compute ops in the same order on
/// each device, with the same durations and data inputs; the graph only adds waits (passes,
/// barriers, a transfer's rendezvous, the end of the iteration), so by the max-plus rule
/// (docs/ir.md) none of its times is earlier -- where the evaluation's transfer is no longer than
/// any of the graph's: `shortest_transfer` (cost_model.h) is used where context.transfer_ns is
/// longer. `estimate` is evaluate_orders(context, orders).
TimeNs iteration_lower_bound(const ScheduleContext& context, const DeviceOrders& orders, const OrderCost& estimate,
                             TimeNs shortest_transfer);

}  // namespace pipesim
