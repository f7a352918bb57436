#include "order_eval.h"

#include <algorithm>
#include <limits>

namespace pipesim {

namespace {

/// What timing one op of a stage needs, gathered once per stage: the loop below reads one record
/// instead of the stage times, the stage work and the layout.
struct StageCosts {
  TimeNs forward, backward, weight;  ///< backward includes W where the orders have none
  /// Activation memory as the graph's ops take and return it (StageWork): F takes `taken`; R, just
  /// before B, takes `rebuilt`; B returns `freed_by_backward`, W `freed_by_weight`.
  Bytes taken, rebuilt, freed_by_backward, freed_by_weight;
  TimeNs from_previous, from_next;  ///< an input's transfer from stage s - 1 or s + 1: 0 on one device
};

constexpr TimeNs kPending = std::numeric_limits<TimeNs>::max();

/// Each stage's costs under `context`, B with or without the weight gradient (`split_weight`).
std::vector<StageCosts> stage_costs(const ScheduleContext& context, bool split_weight) {
  const Layout& layout = context.layout;
  const int stages = layout.stage_count();
  std::vector<StageCosts> per_stage(static_cast<std::size_t>(stages));
  const auto hop = [&](int from, int to) {
    return layout.stages[std::size_t(from)].device == layout.stages[std::size_t(to)].device ? 0 : context.transfer_ns;
  };
  for (int s = 0; s < stages; ++s) {
    const StageTimes& t = context.times[std::size_t(s)];
    const StageWork& w = context.work[std::size_t(s)];
    per_stage[std::size_t(s)] = {t.forward,
                                 t.backward + (split_weight ? 0 : t.weight),
                                 t.weight,
                                 w.activation_bytes,
                                 w.recompute_alloc(split_weight),
                                 w.backward_free(split_weight),
                                 w.weight_held_bytes,
                                 s > 0 ? hop(s - 1, s) : 0,
                                 s + 1 < stages ? hop(s + 1, s) : 0};
  }
  return per_stage;
}

/// Room for every op's start and end and its place in the sequence (OpTimes::Record), so that
/// recording them never reallocates.
void reserve_op_times(OrderCost& cost, const DeviceOrders& orders) {
  cost.start.resize(orders.size());
  cost.end.resize(orders.size());
  std::size_t total = 0;
  for (std::size_t d = 0; d < orders.size(); ++d) {
    cost.start[d].reserve(orders[d].size()), cost.end[d].reserve(orders[d].size());
    total += orders[d].size();
  }
  cost.sequence.reserve(total);
}

/// How far one device's run over its order got.
enum class DeviceRun { Stalled, Progressed, MetVocabularyPass };

/// What evaluate_orders keeps between its passes over the devices: when each F and B ends, and
/// per device its next op, when it is free and the activation memory it holds (the peak is kept in
/// the cost).
class OrderTimer {
 public:
  OrderTimer(const ScheduleContext& context, const DeviceOrders& orders, OrderCost& cost, bool record)
      : orders_(orders),
        cost_(cost),
        record_(record),
        stages_(context.layout.stage_count()),
        m_(std::size_t(context.microbatches)),
        forward_end_(std::size_t(stages_) * m_, kPending),
        backward_end_(forward_end_),
        per_stage_(stage_costs(context, splits_weight(orders))),
        next_(orders.size(), 0),
        free_at_(orders.size(), 0),
        live_(orders.size(), 0) {}

  DeviceRun run(std::size_t d);
  TimeNs makespan() const { return makespan_; }
  bool finished() const {
    for (std::size_t d = 0; d < orders_.size(); ++d)
      if (next_[d] < orders_[d].size()) return false;
    return true;
  }

 private:
  const DeviceOrders& orders_;
  OrderCost& cost_;
  const bool record_;
  const int stages_;
  const std::size_t m_;
  // Per (stage, microbatch), stage-major: F(s - 1) and B(s + 1) of a microbatch are m entries away.
  std::vector<TimeNs> forward_end_, backward_end_;
  std::vector<StageCosts> per_stage_;
  std::vector<std::size_t> next_;
  std::vector<TimeNs> free_at_;
  std::vector<Bytes> live_;
  TimeNs makespan_ = 0;
};

/// Runs device d's order from where it stopped until an op waits for an input not yet timed, or to
/// its end. The device's state, and the makespan, are kept in locals while it runs: as members, each
/// op's store to forward_end_ or backward_end_ (TimeNs too) could alias them and force them to memory.
DeviceRun OrderTimer::run(std::size_t d) {
  const std::vector<ComputeStep>& order = orders_[d];
  const std::size_t m = m_;
  std::size_t i = next_[d];
  TimeNs free = free_at_[d], makespan = makespan_;
  Bytes held = live_[d], peak = cost_.peak_activation[d];
  for (; i < order.size(); ++i) {
    const ComputeStep& s = order[i];
    if (s.stage < 0) return DeviceRun::MetVocabularyPass;
    const StageCosts& c = per_stage_[std::size_t(s.stage)];
    const std::size_t at = std::size_t(s.stage) * m + std::size_t(s.microbatch);
    // When its inputs (data_inputs(), order_eval.h) have arrived; none waits for one not yet timed.
    TimeNs ready = 0, duration = 0;
    if (s.kind == OpKind::F) {
      if (s.stage > 0) {
        if (forward_end_[at - m] == kPending) break;
        ready = forward_end_[at - m] + c.from_previous;
      }
      duration = c.forward;
      held += c.taken;
      peak = std::max(peak, held);
    } else if (s.kind == OpKind::B) {
      if (forward_end_[at] == kPending) break;
      ready = forward_end_[at];
      if (s.stage + 1 < stages_) {
        if (backward_end_[at + m] == kPending) break;
        ready = std::max(ready, backward_end_[at + m] + c.from_next);
      }
      duration = c.backward;
      held += c.rebuilt;  // R's, returned by B with what F kept
      peak = std::max(peak, held);
      held -= c.freed_by_backward;
    } else if (s.kind == OpKind::W) {
      if (backward_end_[at] == kPending) break;
      ready = backward_end_[at];
      duration = c.weight;
      held -= c.freed_by_weight;
    }
    const TimeNs end = std::max(ready, free) + duration;
    if (record_) {
      cost_.start[d].push_back(end - duration), cost_.end[d].push_back(end);
      cost_.sequence.emplace_back(std::uint32_t(d), std::uint32_t(i));
    }
    free = end;
    if (s.kind == OpKind::F) forward_end_[at] = end;
    if (s.kind == OpKind::B) backward_end_[at] = end;
    makespan = std::max(makespan, end);
  }
  const bool progressed = i != next_[d];
  next_[d] = i, free_at_[d] = free, live_[d] = held, cost_.peak_activation[d] = peak, makespan_ = makespan;
  return progressed ? DeviceRun::Progressed : DeviceRun::Stalled;
}

}  // namespace

Result<OrderCost> evaluate_orders(const ScheduleContext& context, const DeviceOrders& orders, OpTimes times) {
  OrderCost cost;
  cost.peak_activation.assign(orders.size(), 0);
  const bool record = times == OpTimes::Record;
  if (record) reserve_op_times(cost, orders);
  OrderTimer timer(context, orders, cost, record);
  // Each device runs its order until an op waits for an input not yet timed; passes over the
  // devices repeat until none moves.
  for (bool progressed = true; progressed;) {
    progressed = false;
    for (std::size_t d = 0; d < orders.size(); ++d) {
      const DeviceRun run = timer.run(d);
      if (run == DeviceRun::MetVocabularyPass)
        return Error{"evaluate_orders: vocabulary passes are evaluated by the simulator, not here"};
      progressed |= run == DeviceRun::Progressed;
    }
  }
  cost.makespan = timer.makespan();
  if (!timer.finished()) return Error{"the orders wait on each other and cannot finish"};
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
