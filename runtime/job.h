#pragma once
/// What the runtime executes: a task graph, where its stages sit, and the model whose math its ops
/// do. The runtime needs nothing else of a plan, so it depends on the IR alone (src/), never on the
/// planner, the schedules or the simulator that made the graph.
#include "cpu/model.h"
#include "layout.h"
#include "task_graph.h"

namespace pipesim::runtime {

/// Borrowed from the caller, which keeps the graph and the layout alive for the whole run.
struct Job {
  const TaskGraph& graph;
  const Layout& layout;
  cpu::ModelShape shape;
  int microbatches = 1;  ///< per iteration: the loss is the mean over all of their tokens
  /// Its recompute_* fields, which put R ops in the graph: which layers' activations F drops, keeping
  /// only the inputs that R rebuilds them from.
  TrainingConfig training;
};

}  // namespace pipesim::runtime
