#include "order_eval.h"

#include <algorithm>
#include <limits>

namespace pipesim {

namespace {

/// What timing one op of a stage needs, gathered once per stage: the loop below reads one record
/// instead of the stage times, the stage work and the layout.
struct StageCosts {
  TimeNs forward, backward, weight;  ///< backward includes W where the orders have none
  Bytes taken, freed_by_backward, freed_by_weight;
  TimeNs from_previous, from_next;  ///< an input's transfer from stage s - 1 or s + 1: 0 on one device
};

}  // namespace

Result<OrderCost> evaluate_orders(const ScheduleContext& context, const DeviceOrders& orders, OpTimes times) {
  const Layout& layout = context.layout;
  const int stages = layout.stage_count(), m = context.microbatches;
  constexpr TimeNs kPending = std::numeric_limits<TimeNs>::max();
  // Per (stage, microbatch), stage-major: F(s - 1) and B(s + 1) of a microbatch are m entries away.
  std::vector<TimeNs> forward_end(std::size_t(stages) * m, kPending), backward_end(forward_end);
  bool split_weight = false;
  for (const auto& order : orders)
    for (const ComputeStep& s : order) split_weight |= s.kind == OpKind::W;
  std::vector<StageCosts> per_stage(static_cast<std::size_t>(stages));
  const auto hop = [&](int from, int to) {
    return layout.stages[std::size_t(from)].device == layout.stages[std::size_t(to)].device ? 0 : context.transfer_ns;
  };
  for (int s = 0; s < stages; ++s) {
    const StageTimes& t = context.times[std::size_t(s)];
    const StageWork& w = context.work[std::size_t(s)];
    per_stage[std::size_t(s)] = {t.forward, t.backward + (split_weight ? 0 : t.weight), t.weight,
                                 w.activation_bytes, w.activation_bytes - (split_weight ? w.weight_held_bytes : 0),
                                 w.weight_held_bytes, s > 0 ? hop(s - 1, s) : 0, s + 1 < stages ? hop(s + 1, s) : 0};
  }

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
  // Each device runs its order until an op waits for an input not yet timed; passes over the
  // devices repeat until none moves. A device's state is kept in locals while it runs.
  TimeNs makespan = 0;
  for (bool progressed = true; progressed;) {
    progressed = false;
    for (std::size_t d = 0; d < orders.size(); ++d) {
      const std::vector<ComputeStep>& order = orders[d];
      std::size_t i = next[d];
      TimeNs free = free_at[d];
      Bytes held = live[d], peak = cost.peak_activation[d];
      for (; i < order.size(); ++i) {
        const ComputeStep& s = order[i];
        if (s.stage < 0) return Error{"evaluate_orders: vocabulary passes are evaluated by the simulator, not here"};
        const StageCosts& c = per_stage[std::size_t(s.stage)];
        const std::size_t at = std::size_t(s.stage) * std::size_t(m) + std::size_t(s.microbatch);
        // When its inputs (data_inputs(), order_eval.h) have arrived; none waits for one not yet timed.
        TimeNs ready = 0, duration = 0;
        if (s.kind == OpKind::F) {
          if (s.stage > 0) {
            if (forward_end[at - std::size_t(m)] == kPending) break;
            ready = forward_end[at - std::size_t(m)] + c.from_previous;
          }
          duration = c.forward;
          held += c.taken;
          peak = std::max(peak, held);
        } else if (s.kind == OpKind::B) {
          if (forward_end[at] == kPending) break;
          ready = forward_end[at];
          if (s.stage + 1 < stages) {
            if (backward_end[at + std::size_t(m)] == kPending) break;
            ready = std::max(ready, backward_end[at + std::size_t(m)] + c.from_next);
          }
          duration = c.backward;
          held -= c.freed_by_backward;
        } else if (s.kind == OpKind::W) {
          if (backward_end[at] == kPending) break;
          ready = backward_end[at];
          duration = c.weight;
          held -= c.freed_by_weight;
        }
        const TimeNs end = std::max(ready, free) + duration;
        if (record) {
          cost.start[d].push_back(end - duration), cost.end[d].push_back(end);
          cost.sequence.emplace_back(std::uint32_t(d), std::uint32_t(i));
        }
        free = end;
        if (s.kind == OpKind::F) forward_end[at] = end;
        if (s.kind == OpKind::B) backward_end[at] = end;
        makespan = std::max(makespan, end);
      }
      progressed |= i != next[d];
      next[d] = i, free_at[d] = free, live[d] = held, cost.peak_activation[d] = peak;
    }
  }
  cost.makespan = makespan;
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
