#pragma once
/// The vocabulary passes' part of assemble(): their tasks, and per microbatch the collectives that
/// tie them together, each kind on its own collective lane (communicator) so that kinds never wait
/// for each other:
///   lane 1  REDUCE    IF outputs summed into the first stage's input      (after IF on each device)
///   lane 2  BROADCAST the last stage's output X to every device           (after the last F)
///   lane 3  ALLREDUCE C0: max, sum-exp, target logit (+ dX, Algorithm 2)  (after S on each device)
///   lane 4  ALLREDUCE C1: dX (Algorithm 1 and interlaced)                  (after T on each device)
///   lane 5  BROADCAST the first stage's input gradient dY                  (after the first B)
/// Lane 0 is the data-parallel all-reduce. Where the vocabulary stays on stages, lane 1 carries the
/// all-reduce of a tied embedding's gradient between the first and the last stage's devices.
#include <functional>
#include <vector>

#include "cost_model.h"
#include "schedule.h"
#include "task_graph.h"

namespace pipesim {

/// The collective lanes, named for the executors that give each collective its meaning.
namespace vocab_lane {
constexpr int kDataParallel = 0, kInputReduce = 1, kOutputBroadcast = 2, kBarrier0 = 3, kBarrier1 = 4,
              kGradBroadcast = 5, kTiedEmbedding = 1;
}  // namespace vocab_lane

class VocabPasses {
 public:
  /// Registers the passes' and the collectives' work with `builder` (when `layout` has passes).
  VocabPasses(TaskGraphBuilder& builder, const Layout& layout, int microbatches, const VocabWork& work);
  /// Makes `id` (added, not yet filled in) the task of one vocabulary pass (an S, T, IF or IB step).
  /// Calls for different devices may run on different threads.
  void place(TaskGraphBuilder& builder, TaskId id, int device, const ComputeStep& step);
  /// Notes a transformer compute task, so that the op after a pass can be found (interlaced only:
  /// the op after T waits for its all-reduce there). Per device, as place().
  void record_compute(int device, TaskId id);
  /// The ops connect() adds for `layout`: a member per device in each microbatch's collectives
  /// (none with the vocabulary on the stages), and at most the dependencies it adds.
  static std::size_t collective_ops(const Layout& layout, int microbatches);
  static std::size_t collective_dependencies(const Layout& layout, int microbatches);
  /// Adds the collectives and all dependencies of the passes, once every compute task exists.
  void connect(TaskGraphBuilder& builder, const Layout& layout,
               const std::function<TaskId(int stage, int mb)>& forward,
               const std::function<TaskId(int stage, int mb)>& backward);

 private:
  enum Pass { kS, kT, kIF, kIB, kPasses };
  TaskId& pass(Pass p, int device, int mb) { return passes_[std::size_t(p)][std::size_t(device) * microbatches_ + std::size_t(mb)]; }
  /// The compute op that follows `id` on its device, or kNoTask.
  TaskId next_compute(int device, TaskId id) const;

  int devices_, microbatches_;
  bool synchronous_;  ///< interlaced: the device waits for each all-reduce before computing on
  WorkId pass_work_[kPasses] = {};
  /// Per collective lane, what one member moves.
  WorkId collective_work_[kCollectiveLanes] = {};
  std::vector<TaskId> passes_[kPasses];
  std::vector<std::vector<TaskId>> compute_;  ///< per device, every compute task in program order
};

}  // namespace pipesim
