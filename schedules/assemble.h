#pragma once
/// From per-device compute orders to the one task graph that the simulator and the runtime run.
#include <vector>

#include "cost_model.h"
#include "custom_schedule.h"
#include "layout.h"
#include "schedule.h"
#include "task_graph.h"

namespace pipesim {

/// Adds to the per-device compute orders the P2P transfers between stages on different devices,
/// the dependencies, the memory effects and the end-of-iteration DP all-reduce and optimizer step.
/// `boundary_bytes` is the size of one activation (or its gradient) crossing a stage boundary.
/// Vocabulary passes (S/T/IF/IB steps in `orders`) get the work in `vocab` and their collectives.
/// With `comms` (complete: a SEND and a RECV for every boundary between devices), the transfers
/// are issued in that order instead, each after the compute op it follows.
TaskGraph assemble(const Layout& layout, const DeviceOrders& orders, const std::vector<StageWork>& work,
                   const VocabWork& vocab, int microbatches, int dp, Bytes boundary_bytes, double grad_bytes_per_param,
                   const DeviceComms& comms = {});

}  // namespace pipesim
