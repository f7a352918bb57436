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

/// V-Half's stable pattern (Qi et al. 2024): F0 at 2i, F1 at 3p - i - 2, B1 at 3p + δ + 2i - 1, B0 at
/// 6p + δ - i - 2; δ = 3 for even p, plus one period (6 slots) for each of `delayed_periods`.
VPattern v_half_pattern(int devices, int delayed_periods = 0);

/// How a squeeze counts a device's memory: in activation bytes as the simulator does (B frees all but
/// what W needs), or in the reference generator's own units (each chunk's F takes one, its W returns
/// it, B returns nothing). Neither order is better everywhere: the units' order is the reference's
/// own, and runs faster at B = 2F (82 against 84 unit slots at p = 4, m = 8) in the same peak bytes.
enum class SqueezeMemory { Bytes, ReferenceUnits };

/// The squeezed pattern as per-device orders, W of each chunk in the first free slot after its B.
/// Each squeeze moves a pass only where its device stays within the most any device held before
/// it (counted as `memory` says), and compacts the slots after it, as the reference generator does.
DeviceOrders squeezed_v_orders(const ScheduleContext& context, const VPattern& pattern, SqueezeMemory memory);

}  // namespace pipesim
