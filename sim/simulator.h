#pragma once
/// The simulator over the task graph. Every start and end is a max-plus expression of the durations
/// (docs/ir.md), worked out exactly in integer nanoseconds: the result does not depend on the order
/// in which the simulator visits the ops.
#include <vector>

#include "status.h"
#include "task_graph.h"
#include "timeline.h"
#include "units.h"

namespace pipesim {

/// Runs `graph` with `durations[id]` per op and returns when each op ran (its end times are written
/// over the durations: pass them with std::move where they are not needed after). Each (device, stream)
/// runs its ops in program order, one at a time; an op starts once its stream is free and its
/// dependencies are done; a SEND and its RECV start together once both are ready, and a collective
/// once all members are. If ops remain but nothing can start, returns a deadlock error naming the
/// op at the head of every stuck stream and what it waits for.
Result<Timeline> simulate(const TaskGraph& graph, std::vector<TimeNs> durations);

}  // namespace pipesim
