#pragma once
/// Where the vocabulary passes go in a schedule's orders, and whether moving the last stage's
/// backwards to make room for them pays: the one planning step that simulates candidate graphs.
#include <functional>
#include <optional>

#include "cost_model.h"
#include "schedule.h"
#include "status.h"
#include "task_graph.h"
#include "timeline.h"

namespace pipesim {

/// A graph and, where planning simulated it under the config's costs, its timeline and the verdict
/// of its structure checks (validate_structure), which ran beside the simulation.
struct PlacedGraph {
  TaskGraph graph;
  std::optional<Timeline> timeline;  ///< nothing if not simulated, or if it cannot run to its end
  Status structure = Status::Ok();
};

/// Assembles the graph of final orders (the vocabulary passes placed).
using BuildGraph = std::function<TaskGraph(const DeviceOrders&)>;

/// The graph of `orders` with the vocabulary passes placed (`build` assembles one). The passes want
/// the last stage's backward of each microbatch to trail its forward by context.vocab_delay
/// microbatches; generators that know it already leave that room, the others' orders are moved
/// (delay_last_backward) where the moved orders still run. A move can cost more than it saves:
/// where it slows the transformer passes' own estimate (PyTorch's ZB-V order and DualPipeV turn the
/// last stage's backward round at once, and their patterns lose their fit when it is moved), the
/// unmoved graph is simulated, and the moved one too unless its bound (iteration_lower_bound) shows it
/// cannot be faster; the faster is kept, the unmoved one on a tie (it holds less activation).
Result<PlacedGraph> with_vocab_passes(const ScheduleContext& context, DeviceOrders orders, VocabPlacement vocab,
                                      const CostModel& costs, TimeNs shortest_transfer, const BuildGraph& build);

}  // namespace pipesim
