#pragma once
/// Discrete-event simulator over the task graph. Deterministic: events are ordered by
/// (time, sequence number), so equal times run first-in first-out.
#include <span>

#include "status.h"
#include "task_graph.h"
#include "timeline.h"
#include "units.h"

namespace pipesim {

/// Runs `graph` with `durations[id]` per op and returns when each op ran. Each (device, stream)
/// runs its ops in program order, one at a time; an op starts once its stream is free and its
/// dependencies are done; a SEND and its RECV start together once both are ready, and a collective
/// once all members are. If ops remain but nothing can start, returns a deadlock error naming the
/// op at the head of every stuck stream and what it waits for.
Result<Timeline> simulate(const TaskGraph& graph, std::span<const TimeNs> durations);

}  // namespace pipesim
