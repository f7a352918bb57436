#pragma once
/// Internal to the runtime: one order of a task graph's ops that every rank computes alike, in which
/// a rank issues its communication when a call that waits for its peers can hold the device another
/// call needs (NCCL, whose kernels spin on the GPU until every peer's kernel has arrived). With
/// RunOptions::ordered_issue the walker (walker.h) issues a rank's calls one at a time in it: the
/// next only once the last has completed. docs/runtime.md ("One order of NCCL calls") proves that
/// this cannot deadlock, whatever the GPUs run side by side.
#include <cstddef>
#include <vector>

#include "task_graph.h"

namespace pipesim::runtime {

/// A topological order of the whole graph -- every op after its dependencies and its stream
/// predecessor -- in which a SEND and its RECV, and the members of one collective, are one element
/// (one NCCL call on each rank that takes part): an op's position is its element's. The order is a
/// list schedule in which a compute op takes its flops and communication takes no time, ties broken
/// by communication first, then the lowest op id: a function of the graph alone, so every rank (and
/// every process) computes the same one. A data-parallel collective's replicas, and a compute op's tensor-parallel collectives on
/// each rank of its group, run the same graph op: they share its position.
class IssueOrder {
 public:
  /// Throws std::runtime_error, naming an op, when the graph's rendezvous cannot be ordered (an op
  /// would wait on itself through them): no executor could run such a graph.
  explicit IssueOrder(const TaskGraph& graph);
  /// 0, 1, ...: the position of `id`'s element. Equal positions: the same element.
  std::size_t position(TaskId id) const { return position_[std::size_t(id)]; }
  /// Device `device`'s elements in order: its communication ops and, with `compute` (its compute ops
  /// issue collectives inside them: tensor parallelism's), its compute ops too.
  std::vector<TaskId> sequence(int device, bool compute) const;

 private:
  const TaskGraph& graph_;
  std::vector<std::size_t> position_;
};

}  // namespace pipesim::runtime
