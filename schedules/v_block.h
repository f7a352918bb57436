#pragma once
/// V-shaped schedules built from a repeating block (after Qi et al., "Pipeline Parallelism with
/// Controllable Memory", 2024). The six passes of one microbatch on device d -- F and B of both
/// chunks and their W -- get start times that do not overlap modulo a common period T (the busiest
/// device's work per microbatch), so microbatch k runs the block shifted by kT without collisions
/// and the steady state has no bubble. The paper uses unit slots (T = 6); here the block is laid
/// out in the stages' real times, so unequal F, B and W keep the steady state full. A block's
/// lifespans (first F to last W on a device) set its activation memory.
#include <array>
#include <vector>

#include "schedule.h"
#include "v_squeeze.h"

namespace pipesim {

struct VBlock {
  TimeNs period = 0;
  std::vector<std::array<TimeNs, 6>> start;  ///< per device: F0, F1, B1, B0, W1, W0
};

/// Extra waits along the V, in multiples of the waiting pass's own duration: after each forward of
/// chunk 0 before the next device's, and after each backward of chunk 1 before the next device's.
/// V-Half spreads the chunk-0 forwards and chunk-1 backwards by one pass each (its slots 2i and
/// 3p + δ + 2i - 1); V-Min waits nowhere.
struct VSpacing {
  double forward_down = 0;
  double backward_up = 0;
};

/// Every pass starts at the first time after its input arrives (and its spacing) at which it does
/// not overlap, modulo the period, the passes already placed on its device; W right after its B.
VBlock v_block(const ScheduleContext& context, VSpacing spacing);
/// The paper's V-Half block in unit slots (period 6): F0, F1, B1 and B0 where `pattern` puts them
/// (v_half_pattern), each W in the first free slot after its B.
VBlock paper_v_half_block(const VPattern& pattern);
/// `context` with every pass one unit long and free transfers: blocks built on it are in unit slots.
ScheduleContext unit_costs(const ScheduleContext& context);

/// Per-device orders: the block for every microbatch, ordered by start time.
DeviceOrders orders_from_block(const ScheduleContext& context, const VBlock& block);

/// A V schedule. `reference`, a block in unit slots, fixes the memory bound: a device's peak
/// activation depends on its order alone, not on the costs. Among the reference's orders, the block
/// for `spacing` in unit slots and in the real costs, and the greedy scheduler with the same budget,
/// the fastest within the bound wins (evaluate_orders): never worse than the reference.
/// `pattern`, when given, adds one more candidate: that stable pattern squeezed within the bound.
Result<DeviceOrders> v_schedule(const ScheduleContext& context, const VBlock& reference, VSpacing spacing,
                                const VPattern* pattern = nullptr);

}  // namespace pipesim
