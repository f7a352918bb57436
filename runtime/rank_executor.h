#pragma once
/// Internal to the runtime: one rank's executor. executor.cpp has the walk over the rank's streams,
/// faults, timeouts and results; ops.cpp what each op computes or communicates.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <stop_token>
#include <stdexcept>
#include <string>
#include <vector>

#include "buffers.h"
#include "executor.h"
#include "partition.h"

namespace pipesim::runtime {

using Clock = std::chrono::steady_clock;

/// A rank cannot go on; the message names the rank and the op.
struct RankFailure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// A communication op between its start and its completion. Barrier C0 takes several rounds (max,
/// then sums, then with Algorithm 2 dX); `phase` counts them.
struct InFlight {
  TaskId id = kNoTask;
  std::unique_ptr<Request> request;
  Tensor data;
  Tensor global_max;  ///< barrier C0: M, kept between rounds
  int phase = 0;
};

class RankExecutor {
 public:
  RankExecutor(Transport& comm, std::unique_ptr<Backend> backend, const Job& job, const RunOptions& options);

  Result<RunResult> run();

 private:
  TimeNs now() const { return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - epoch_).count(); }
  /// dloss/dlogit scale: the loss is the mean over every token of the iteration.
  float token_weight() const { return 1.0f / float(n_ * microbatches_); }
  std::size_t activation_size() const { return std::size_t(n_) * std::size_t(h_); }
  /// Waits for a request outside the graph (barriers, reports), with the same timeout.
  void wait(std::unique_ptr<Request> request, const std::string& what);
  void barrier();

  // ---- the walk over this rank's streams ----
  void run_graph();
  /// "rank N failed: ...": the abort reason for an unexpected exception (out of memory, say).
  std::string failure(const std::exception& e) const;
  void walk(std::vector<std::size_t>& cursor, std::vector<InFlight>& in_flight);
  /// The compute stream's ops in order, each when its dependencies are done; on its own thread.
  void run_compute_stream(const std::stop_token& stop);
  /// One step of a communication stream whose next op is `id`: poll it if in flight, else start it
  /// if ready. True when something happened.
  bool step(TaskId id, InFlight& flight, std::size_t& cursor, std::size_t& remaining);
  bool ready(TaskId id) const;
  /// Marks the op done; `end`: when it ended on this rank's timeline.
  void complete(TaskId id, TimeNs end);
  void inject_fault(TaskId id, const std::stop_token& stop);
  /// The ops at the heads of this rank's streams that wait on another rank.
  std::string waiting_on(const std::vector<std::size_t>& cursor, const std::vector<InFlight>& in_flight) const;
  [[noreturn]] void timed_out(const std::vector<std::size_t>& cursor, const std::vector<InFlight>& in_flight);

  // ---- compute ops ----
  void compute(TaskId id);
  /// Times the vocabulary-layer part of an F or B (baseline), for the profile.
  template <class F>
  void vocab_layer(TaskId id, F&& work);
  void forward(TaskId id, const Task& t);
  void backward(TaskId id, const Task& t);
  void weight(const Task& t);
  /// S: logits of this device's shard and the local softmax statistics (+ A and Y for Algorithm 2).
  void output_forward(int mb);
  /// T: the softmax gradient of this shard, dW (+ this shard's dX for Algorithm 1).
  void output_backward(int mb);
  void optimizer();

  // ---- communication ops ----
  void start_comm(InFlight& f);
  void start_collective(InFlight& f, const CollectiveGroup& group);
  /// Polls a communication op; runs its next round when one is due. True when the op is complete.
  bool advance(InFlight& f);
  /// Barrier C0 after each round: M -> (S, z) -> (Algorithm 2) dX.
  bool barrier0_round(InFlight& f);
  /// The lane a collective runs on.
  Communicator& lane(TaskId id) { return comm_.lane(graph_.task(id).lane); }

  // ---- results ----
  CheckResult finish_check(double reference_loss, double loss);
  /// Rank 0 collects every rank's op times and memory peak of the last step.
  void gather(RunResult& result);

  Transport& comm_;
  const TaskGraph& graph_;
  const Layout& layout_;
  const RunOptions& options_;
  const int rank_;
  const cpu::ModelShape shape_;
  const int microbatches_;
  const int n_, h_;
  const std::unique_ptr<Backend> backend_;  ///< declared before what holds its tensors, so it outlives them
  const int first_device_, last_device_, last_stage_;
  const bool split_weight_;  ///< whether W runs apart from B (the graph has W ops)
  std::vector<std::size_t> streams_;  ///< this rank's non-empty streams
  std::size_t own_tasks_ = 0;

  std::vector<std::atomic<char>> done_;  ///< per op, this step; set by either thread
  BufferStore buffers_;
  std::vector<Batch> batches_;
  int step_ = 0;
  Clock::time_point epoch_;
  std::atomic<double> loss_part_ = 0;  ///< this rank's share of the loss (the head runs on either thread)
  Timeline* timeline_ = nullptr;
  /// The compute thread's device clock while it runs (null: host time), and the marks around the
  /// vocabulary parts of the op in progress, read when the op has synchronised.
  DeviceClock* device_clock_ = nullptr;
  std::vector<std::pair<DeviceClock::Mark, DeviceClock::Mark>> vocab_marks_;
  std::vector<TimeNs>* vocab_layer_ns_ = nullptr;
  Bytes* live_after_ = nullptr;
  std::optional<cpu::Model> reference_grad_;  ///< --check: the single-device gradients of step 0
  std::vector<float> grad_terms_;

  // The compute thread: where it is, and how it tells the communication thread.
  std::atomic<std::size_t> compute_cursor_ = 0, computed_ = 0;
  std::atomic<bool> compute_busy_ = false, compute_failed_ = false;
  std::exception_ptr compute_error_;
  std::mutex wake_mutex_;
  std::condition_variable_any wake_;  ///< signalled when any op of this rank completes
};

}  // namespace pipesim::runtime
