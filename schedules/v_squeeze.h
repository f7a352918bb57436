#pragma once
/// The V-Half stable pattern of Qi et al., "Pipeline Parallelism with Controllable
/// Memory" (2024), and the greedy squeeze their reference generator applies (sail-sg's
/// zero-bubble repository, `zbv_greedy.py`): in unit slots, the passes of the warm-up and the
/// cool-down move to the earliest free slot their inputs allow without any device holding more
/// activation than the largest device did before; the steady state stays the pattern's.
#include <array>
#include <vector>

#include "schedule.h"

namespace pipesim {

/// Per device: the slots of F (chunk 0), F (chunk 1), B (chunk 1) and B (chunk 0) of microbatch 0;
/// microbatch k runs 6k slots later.
using VPattern = std::vector<std::array<int, 4>>;

/// F0 at 2i, F1 at 3p - i - 2, B1 at 3p + δ + 2i - 1, B0 at 6p + δ - i - 2; δ = 3 for even p.
VPattern v_half_pattern(int devices);

/// The squeezed pattern as per-device orders, W of each chunk in the first free slot after its B.
/// Each squeeze moves a pass only where its device stays within the most any device held before
/// it (in activation bytes), and compacts the slots after it, as the reference generator does.
DeviceOrders squeezed_v_orders(const ScheduleContext& context, const VPattern& pattern);

}  // namespace pipesim
