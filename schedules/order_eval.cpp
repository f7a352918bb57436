#include "order_eval.h"

#include <algorithm>
#include <limits>

namespace pipesim {

Result<OrderCost> evaluate_orders(const ScheduleContext& context, const DeviceOrders& orders, OpTimes times) {
  const Layout& layout = context.layout;
  const int stages = layout.stage_count(), m = context.microbatches;
  constexpr TimeNs kPending = std::numeric_limits<TimeNs>::max();
  std::vector<TimeNs> forward_end(std::size_t(stages) * m, kPending), backward_end(forward_end);
  const auto at = [m](int stage, int mb) { return std::size_t(stage) * m + std::size_t(mb); };
  const auto arrival = [&](TimeNs end, int from, int to) {
    return end + (layout.stages[std::size_t(from)].device == layout.stages[std::size_t(to)].device ? 0 : context.transfer_ns);
  };
  bool split_weight = false;
  for (const auto& order : orders)
    for (const ComputeStep& s : order) split_weight |= s.kind == OpKind::W;

  OrderCost cost;
  std::vector<std::size_t> next(orders.size(), 0);
  std::vector<TimeNs> free_at(orders.size(), 0);
  std::vector<Bytes> live(orders.size(), 0);
  cost.peak_activation.assign(orders.size(), 0);
  const bool record = times == OpTimes::Record;
  if (record) {
    cost.start.resize(orders.size());
    cost.end.resize(orders.size());
    std::size_t total = 0;
    for (std::size_t d = 0; d < orders.size(); ++d) {
      cost.start[d].reserve(orders[d].size()), cost.end[d].reserve(orders[d].size());
      total += orders[d].size();
    }
    cost.sequence.reserve(total);
  }
  for (bool progressed = true; progressed;) {
    progressed = false;
    for (std::size_t d = 0; d < orders.size(); ++d)
      for (; next[d] < orders[d].size(); ++next[d]) {
        const ComputeStep& s = orders[d][next[d]];
        if (s.stage < 0) return Error{"evaluate_orders: vocabulary passes are evaluated by the simulator, not here"};
        const StageTimes& t = context.times[std::size_t(s.stage)];
        const StageWork& w = context.work[std::size_t(s.stage)];
        TimeNs ready = 0, duration = 0;
        bool waiting = false;
        for (const ComputeStep& in : data_inputs(s, stages)) {
          const TimeNs end = (in.kind == OpKind::F ? forward_end : backward_end)[at(in.stage, in.microbatch)];
          if (end == kPending) waiting = true;
          else ready = std::max(ready, arrival(end, in.stage, s.stage));
        }
        if (waiting) break;
        if (s.kind == OpKind::F) {
          duration = t.forward;
          live[d] += w.activation_bytes;
          cost.peak_activation[d] = std::max(cost.peak_activation[d], live[d]);
        } else if (s.kind == OpKind::B) {
          duration = t.backward + (split_weight ? 0 : t.weight);
          live[d] -= w.activation_bytes - (split_weight ? w.weight_held_bytes : 0);
        } else if (s.kind == OpKind::W) {
          duration = t.weight;
          live[d] -= w.weight_held_bytes;
        }
        const TimeNs end = std::max(ready, free_at[d]) + duration;
        if (record) {
          cost.start[d].push_back(end - duration), cost.end[d].push_back(end);
          cost.sequence.emplace_back(std::uint32_t(d), std::uint32_t(next[d]));
        }
        free_at[d] = end;
        if (s.kind == OpKind::F) forward_end[at(s.stage, s.microbatch)] = end;
        if (s.kind == OpKind::B) backward_end[at(s.stage, s.microbatch)] = end;
        cost.makespan = std::max(cost.makespan, end);
        progressed = true;
      }
  }
  for (std::size_t d = 0; d < orders.size(); ++d)
    if (next[d] < orders[d].size()) return Error{"the orders wait on each other and cannot finish"};
  return cost;
}

TimeNs iteration_lower_bound(const ScheduleContext& context, const DeviceOrders& orders, const OrderCost& estimate,
                             TimeNs shortest_transfer) {
  if (context.transfer_ns <= shortest_transfer) return estimate.makespan;
  ScheduleContext shorter = context;
  shorter.transfer_ns = shortest_transfer;
  const Result<OrderCost> cost = evaluate_orders(shorter, orders);
  return cost.ok() ? cost.value().makespan : 0;
}

}  // namespace pipesim
