#include "vocab_placement.h"

#include <algorithm>
#include <future>
#include <utility>

#include "order_eval.h"
#include "release.h"
#include "simulator.h"
#include "two_threads.h"
#include "validate.h"
#include "vocab_passes.h"

namespace pipesim {
namespace {

/// Moved and unmoved orders whose estimates differ by under 1/kCloseEstimates of the unmoved one's:
/// measured on the shipped configs, the moved graph's bound (iteration_lower_bound) then nearly always
/// falls short of the unmoved graph's time, and above it nearly always reaches it.
constexpr TimeNs kCloseEstimates = 10;

/// `graph` simulated under `costs`; its structure checked beside the simulation when `check`
/// (two cores' worth on a large graph), or else left to the caller.
PlacedGraph simulated(TaskGraph graph, const ScheduleContext& context, const CostModel& costs, bool check) {
  std::vector<TimeNs> durations = op_durations(costs, graph);  // itself in two halves
  std::future<Status> structure = beside(check && graph.size() >= kOpsWorthAThread, [&] {
    return check ? validate_structure(graph, context.layout, context.microbatches) : Status::Ok();
  });
  Result<Timeline> timeline = simulate(graph, std::move(durations));
  Status verdict = structure.get();  // before the graph moves
  PlacedGraph placed{std::move(graph), std::nullopt, std::move(verdict)};
  if (timeline.ok()) placed.timeline = std::move(timeline).value();
  return placed;
}

void drop_op_times(OrderCost& estimate) { release(estimate.start), release(estimate.end), release(estimate.sequence); }

TimeNs iteration(const Timeline& timeline) {
  // Millions of ops on a large graph: in two halves.
  const std::size_t n = timeline.end.size();
  TimeNs first_half = 0, second_half = 0;
  in_two_halves(n, n >= kOpsWorthAThread, [&](std::size_t begin, std::size_t end) {
    TimeNs& last = begin == 0 ? first_half : second_half;
    for (std::size_t i = begin; i < end; ++i) last = std::max(last, timeline.end[i]);
  });
  return std::max(first_half, second_half);
}

}  // namespace

Result<PlacedGraph> with_vocab_passes(const ScheduleContext& context, DeviceOrders orders, VocabPlacement vocab,
                                      const CostModel& costs, TimeNs shortest_transfer, const BuildGraph& build) {
  // Each version of the orders is placed once at most, and placing the passes is the last use of
  // its orders and of its estimate's per-op times (only the makespan is read after): both are
  // dropped there, before the graph is built, and the graph and its simulation reuse their memory.
  const auto placed = [&](DeviceOrders& o, OrderCost& estimate) {
    const DeviceOrders with_passes = insert_vocab_passes(context, o, estimate, vocab);
    release(o), drop_op_times(estimate);
    return build(with_passes);
  };
  DeviceOrders delayed = delay_last_backward(context.layout, orders, context.vocab_delay, context.microbatches);
  const bool moved_any = delayed != orders;
  if (!moved_any) {
    release(delayed);
    Result<OrderCost> cost = evaluate_orders(context, orders, OpTimes::Record);
    if (!cost.ok()) return cost.error();
    return PlacedGraph{placed(orders, cost.value()), {}};
  }
  // Both versions estimated side by side.
  std::future<Result<OrderCost>> own_estimate =
      beside(context.worth_a_thread(), [&] { return evaluate_orders(context, orders, OpTimes::Record); });
  Result<OrderCost> delayed_cost = evaluate_orders(context, delayed, OpTimes::Record);
  Result<OrderCost> own_cost = own_estimate.get();
  if (!delayed_cost.ok()) {
    if (!own_cost.ok()) return own_cost.error();
    release(delayed);
    return PlacedGraph{placed(orders, own_cost.value()), {}};
  }
  if (!own_cost.ok() || delayed_cost.value().makespan <= own_cost.value().makespan) {
    release(orders);
    if (own_cost.ok()) drop_op_times(own_cost.value());
    return PlacedGraph{placed(delayed, delayed_cost.value()), {}};
  }
  const auto faster = [](PlacedGraph& unmoved, PlacedGraph& moved) {
    const bool keep = unmoved.timeline && (!moved.timeline || iteration(*unmoved.timeline) <= iteration(*moved.timeline));
    return std::move(keep ? unmoved : moved);
  };
  const TimeNs own = own_cost.value().makespan, delayed_estimate = delayed_cost.value().makespan;
  if (delayed_estimate - own < own / kCloseEstimates) {
    // Close estimates (DualPipeV): the bound rarely rules the moved graph out, so both are built and
    // simulated side by side (they share nothing they write), and the one kept is checked after.
    std::future<PlacedGraph> moved = beside(context.worth_a_thread(), [&] {
      return simulated(placed(delayed, delayed_cost.value()), context, costs, false);
    });
    PlacedGraph unmoved = simulated(placed(orders, own_cost.value()), context, costs, false);
    PlacedGraph other = moved.get();
    PlacedGraph kept = faster(unmoved, other);
    kept.structure = validate_structure(kept.graph, context.layout, context.microbatches);
    return kept;
  }
  // The bound needs only the moved orders' makespan: their estimate's per-op times go before the
  // unmoved graph is built (at p = 64, m = 1024: 9 MiB), and are worked out again if the moved graph
  // is built too.
  const TimeNs moved_bound = iteration_lower_bound(context, delayed, delayed_cost.value(), shortest_transfer);
  drop_op_times(delayed_cost.value());
  PlacedGraph unmoved = simulated(placed(orders, own_cost.value()), context, costs, true);
  if (unmoved.timeline && moved_bound >= iteration(*unmoved.timeline)) return unmoved;
  delayed_cost = evaluate_orders(context, delayed, OpTimes::Record);  // as it was a moment ago: it runs
  PlacedGraph moved = simulated(placed(delayed, delayed_cost.value()), context, costs, true);
  return faster(unmoved, moved);
}


}  // namespace pipesim
