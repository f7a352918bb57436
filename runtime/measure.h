#pragma once
/// Internal to the runtime: what a run measures and checks on each rank. A StepRecorder keeps each
/// op's times and the memory its rank held (the walker reports them); a GradientCheck compares the
/// first step with the single-device reference; gather_measurements brings every rank's figures to
/// rank 0.
#include <span>
#include <string>
#include <vector>

#include "buffers.h"
#include "comm.h"
#include "cpu/model.h"
#include "executor.h"
#include "walker.h"

namespace pipesim::runtime {

/// Waits for a request outside the graph (barriers, reports): RankFailure after `timeout_s` without
/// completion, naming `what`.
void wait_for(Transport& comm, std::unique_ptr<Request> request, double timeout_s, const std::string& what);
/// The same on a request the caller keeps (alive after a timeout, until the caller has aborted the run).
void wait_for(Transport& comm, Request& request, double timeout_s, const std::string& what);

/// One step's per-op figures (each step's replace the last's).
class StepRecorder final : public OpObserver {
 public:
  StepRecorder(std::size_t ops, BufferStore& buffers) : buffers_(buffers) { clear(ops); }
  void started(TaskId id, TimeNs at) override { timeline_.start[std::size_t(id)] = at; }
  void finished(TaskId id, TimeNs at, TimeNs vocab_layer_ns) override;
  void clear(std::size_t ops);
  /// Moves the figures into `result` (timeline, vocab_layer_ns, live_after).
  void move_into(RunResult& result);

 private:
  BufferStore& buffers_;  ///< whose bytes in use each op's end records
  Timeline timeline_;
  std::vector<TimeNs> vocab_layer_ns_;
  std::vector<Bytes> live_after_;
};

/// --check: the single-device reference of the first step, and how far a rank's gradients are from it.
class GradientCheck {
 public:
  /// Runs the reference: the whole model on one device over `batches` (the first step's).
  GradientCheck(const ModelShape& shape, std::uint64_t seed, std::span<const Batch> batches);
  /// For every tensor of the model, Σ (g − g_ref)² and Σ g_ref² over the elements in `gradients`
  /// (tensor_names' order, zeros where it holds none): summed over ranks they give each tensor's
  /// norm-wise relative error.
  std::vector<float> error_terms(std::span<const HostGradient> gradients) const;
  /// The verdict from every rank's error_terms summed and the run's loss, held to the options' bounds.
  CheckResult result(std::span<const float> terms, double loss, const RunOptions& options) const;

 private:
  ModelShape shape_;
  cpu::Model grad_;
  double loss_ = 0;
};

/// Rank 0 collects every rank's op figures, activation peak, static memory and tensor-parallel
/// collectives of the last step (other ranks send theirs); `peak`, `static_bytes` and, on entry,
/// result.tensor_parallel are this rank's.
void gather_measurements(Transport& comm, const TaskGraph& graph, double timeout_s, Bytes peak, TaskId peak_op,
                         Bytes static_bytes, RunResult& result);

}  // namespace pipesim::runtime
