#pragma once
/// A list scheduler shared by the zero-bubble and V-shaped schedules: it plays the pipeline forward
/// in time with the stage costs and, whenever a device is free, starts the most useful op that is
/// ready -- a backward first (it frees memory and unblocks the stages before), then a forward if
/// it fits the device's activation budget, then a deferred weight-gradient pass (it fills what
/// would be a bubble, and frees the inputs W keeps). A device's activations -- from F, through B,
/// to W -- never exceed its budget, by construction.
#include <atomic>
#include <vector>

#include "order_eval.h"
#include "schedule.h"

namespace pipesim {

struct GreedyOptions {
  std::vector<Bytes> budget;  ///< per device: activation bytes it may hold at once
  /// For a caller that keeps the greedy order only where it finishes before a rival's: when set, the
  /// scheduler fails once a bound shows that its makespan cannot come out below *give_up_at (checked
  /// every few dozen steps, so it may also finish with one that does not). It reads the value as it
  /// goes: another thread may lower it when it finds a faster rival.
  const std::atomic<TimeNs>* give_up_at = nullptr;
};

/// The orders and their cost: the makespan and peak activations evaluate_orders(context, orders)
/// gives (no per-op times). The scheduler starts each op as soon as its device is free and its input
/// has arrived -- the evaluation's own rule -- so callers need not evaluate the orders again.
struct GreedyOrders {
  DeviceOrders orders;
  OrderCost cost;
};

/// Fails, naming the device, when a budget is too small for the pipeline to make progress.
Result<GreedyOrders> greedy_schedule(const ScheduleContext& context, const GreedyOptions& options);

/// Per device d: units(d) + vocab_delay x (chunks + 1) times the average activation of one of its
/// chunks for one microbatch (the vocabulary passes hold the last stage's backward back by
/// vocab_delay microbatches), but never less than all its chunks' activations for one microbatch
/// (the least that can progress).
std::vector<Bytes> activation_budget(const ScheduleContext& context, double (*units)(int device, int devices));

}  // namespace pipesim
