#pragma once
/// Checks a task graph before anything runs it, so that neither the simulator nor the runtime meets
/// a malformed schedule: coverage, F-before-B-before-W, matched P2P order, no cycles, no deadlock.
#include "layout.h"
#include "status.h"
#include "task_graph.h"

namespace pipesim {

/// Every (stage, microbatch) has exactly one F on its stage's device and one B after it (and one
/// W after that when the graph splits W); every device has one OPTIMIZER; dependencies stay on one
/// device (devices synchronise only through SEND/RECV and collectives); every SEND/RECV is
/// matched and pairs appear in the same order on both sides; and the graph of dependencies,
/// stream program order and rendezvous has no cycle. A cycle made of dependencies alone is
/// reported as "dependency cycle: A -> B -> A"; one that needs stream order or a rendezvous is a
/// deadlock and reported with the ops and the kind of each wait.
Status validate(const TaskGraph& graph, const Layout& layout, int microbatches);

/// What validate checks besides orderability: for callers that simulate the graph next, since the
/// simulator walks the same waits and fails exactly when check_orderable would.
Status validate_structure(const TaskGraph& graph, const Layout& layout, int microbatches);

/// The last of validate's checks: no cycle through dependencies, stream order and rendezvous.
Status check_orderable(const TaskGraph& graph);

}  // namespace pipesim
