#pragma once
/// Vocabulary Parallelism (Yeung et al., MLSys 2025): the vocabulary layers split over all devices
/// and run as extra passes -- S and T for the output layer, IF and IB for the input layer -- placed
/// into any schedule's per-device orders. See docs/vocabulary-parallelism.md.
#include "order_eval.h"
#include "schedule.h"

namespace pipesim {

/// Microbatches the last stage's backward must trail its forward so that the passes between them
/// can run: 2 for Algorithm 1 (S, then T a microbatch later, then barrier C1), 1 for Algorithm 2,
/// 0 with the vocabulary on the stages. Interlaced: floor(p / 2), the extra microbatches in flight
/// that hide its synchronous output-layer step in its reference implementation (on 1F1B its
/// lockstep program, interlaced_1f1b_orders, replaces the order; other schedules take the delay).
int vocab_delay(VocabPlacement vocab, int devices);

/// Moves each backward of the last stage (with its W) after the forward `delay` microbatches
/// later on the same device, where it is not already.
DeviceOrders delay_last_backward(const Layout& layout, const DeviceOrders& orders, int delay, int microbatches);

/// Inserts S, T, IF and IB for every microbatch into every device's order. Each pass goes where
/// its input arrives in a time estimate of the transformer ops (S when the last stage's output X
/// reaches the device, IF just before the first stage needs the embedding, IB when the first stage's
/// gradient comes back), clamped to where it cannot wait for itself: S (and, for Algorithm 1, T)
/// between the device's last forward and first backward of that microbatch, IF before its first
/// forward, IB after its last backward. T of x runs with S of x + 1 (with S of x when interlaced).
/// `estimate` is evaluate_orders(context, orders, OpTimes::Record).
DeviceOrders insert_vocab_passes(const ScheduleContext& context, const DeviceOrders& orders,
                                 const OrderCost& estimate, VocabPlacement vocab);

/// Interlaced on 1F1B as its reference implementation runs it: every device steps through the same
/// iterations, each one forward, one backward and the output layer (S then T, its all-reduces
/// waited for) of one microbatch, in lockstep; odd devices run the backward before the forward.
/// The input layer likewise: IF of the next microbatch before each S (its sum runs while the
/// output is broadcast), IB once dY is back. Device i then runs about floor(1.5p) - i forwards before its first backward.
DeviceOrders interlaced_1f1b_orders(const ScheduleContext& context);

}  // namespace pipesim
