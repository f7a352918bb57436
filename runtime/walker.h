#pragma once
/// Internal to the runtime: when each op of one rank runs. The walker follows the rank's streams of
/// the task graph -- each in program order, an op when its dependencies are done -- with the compute
/// stream on a thread of its own, and ends the step on a failure, a hang (no progress for the
/// timeout) or an injected fault. With RunOptions::ordered_issue (NCCL) it also issues the rank's
/// communication one call at a time in the graph's issue order (issue_order.h). What an op does is an
/// OpRunner's business (op_interpreter.h); what is measured goes to an OpObserver (measure.h).
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <stop_token>
#include <string>
#include <vector>

#include "backend.h"
#include "comm.h"
#include "executor.h"
#include "task_graph.h"

namespace pipesim::runtime {

using Clock = std::chrono::steady_clock;

/// A rank cannot go on; the message names the rank and the op.
struct RankFailure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// A communication op between its start and its completion. A collective of several rounds
/// (CollectiveGroup::rounds) counts them in `round`.
struct InFlight {
  TaskId id = kNoTask;
  std::unique_ptr<Request> request;
  Tensor data;
  Tensor kept;  ///< what a later round needs of an earlier one (barrier C0: the global max)
  int round = 0;
};

/// Two marks on a DeviceClock: a part of an op that the profile reports apart.
using MarkSpan = std::pair<DeviceClock::Mark, DeviceClock::Mark>;

/// What each op does on a rank.
class OpRunner {
 public:
  virtual ~OpRunner() = default;
  /// Issues compute op `id` (on the compute thread); brackets with marks on `clock` the parts the
  /// profile reports apart (the embedding and the LM head), into `vocab_parts`.
  virtual void compute(TaskId id, DeviceClock& clock, std::vector<MarkSpan>& vocab_parts) = 0;
  /// Starts communication op `f.id`: sets f.request (and f.data).
  virtual void start(InFlight& f) = 0;
  /// Once f.request is done: finishes the op, or starts its next round. True when it is complete.
  virtual bool advance(InFlight& f) = 0;
};

/// What the walker reports of each op: when it started and ended on the rank's timeline (ns since
/// the step began), and the time its embedding or LM-head parts took. Called from either thread,
/// never twice at once for one op.
class OpObserver {
 public:
  virtual ~OpObserver() = default;
  virtual void started(TaskId id, TimeNs at) = 0;
  virtual void finished(TaskId id, TimeNs at, TimeNs vocab_layer_ns) = 0;
};

class StreamWalker {
 public:
  /// How errors name this rank and the peers it waits on: "rank 1" and "rank"; with tensor and data
  /// parallelism "rank 5 (device 1, replica 0, tp rank 1)" and "device" (a peer is named by the device
  /// whose ops it runs).
  struct Names {
    std::string self;
    std::string peer = "rank";
  };
  /// Walks device `rank`'s ops. `compute_collectives`: its compute ops issue collectives of their own
  /// (tensor parallelism's), which options.ordered_issue then orders with the rest. Throws
  /// std::runtime_error when the graph has no issue order (issue_order.h).
  StreamWalker(const TaskGraph& graph, int rank, Names names, Transport& comm, Backend& backend,
               const RunOptions& options, bool compute_collectives = false);

  /// Runs every op of this rank for step `step`, times measured from `epoch`. Throws RankFailure
  /// (this rank failed or hung; the run is aborted) or CommError (another rank ended the run).
  void run_step(int step, Clock::time_point epoch, OpRunner& runner, OpObserver& observer);

  /// Called on the compute thread by a compute op about to issue a collective of its own (tensor
  /// parallelism's): with options.ordered_issue, waits until every element of this rank's issue
  /// sequence before that op has completed, so that no other call of the rank is in flight. Throws
  /// RankFailure after the timeout, CommError when the step is being ended. Returns at once without
  /// ordered_issue.
  void await_issue_turn();

 private:
  TimeNs now() const { return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - epoch_).count(); }
  void walk();
  void run_compute_stream(const std::stop_token& stop);
  /// One step of a communication stream whose next op is `id`: poll it if in flight, else start it
  /// if ready. True when something happened.
  bool step(TaskId id, InFlight& flight, std::size_t& cursor, std::size_t& remaining);
  bool ready(TaskId id) const;
  /// Whether `id` may issue its calls: without ordered_issue always; with it, once every element
  /// before it in this rank's issue sequence has completed.
  bool issue_turn(TaskId id) const {
    return sequence_.empty() || std::size_t(sequence_index_[std::size_t(id)]) == completed_prefix_.load(std::memory_order_acquire);
  }
  void complete(TaskId id, TimeNs end, TimeNs vocab_layer_ns);
  void inject_fault(TaskId id, const std::stop_token& stop);
  /// "rank N failed: ...": the abort reason for an unexpected exception (out of memory, say).
  std::string failure(const std::exception& e) const;
  /// The ops at the heads of this rank's streams that wait on another rank.
  std::string waiting_on() const;
  [[noreturn]] void timed_out() const;

  const TaskGraph& graph_;
  const int rank_;
  const Names names_;
  Transport& comm_;
  Backend& backend_;
  const RunOptions& options_;
  std::vector<std::size_t> streams_;  ///< this rank's non-empty streams; the compute stream first
  std::size_t own_tasks_ = 0;
  /// With ordered_issue: this rank's elements of the issue order (issue_order.h), in it, and each op's
  /// index among them (-1: none). Empty without.
  std::vector<TaskId> sequence_;
  std::vector<std::int32_t> sequence_index_;

  // One step's state.
  int step_ = 0;
  Clock::time_point epoch_;
  OpRunner* runner_ = nullptr;
  OpObserver* observer_ = nullptr;
  std::vector<std::atomic<char>> done_;  ///< per op; set by either thread
  std::vector<std::size_t> cursor_;      ///< per stream (the compute stream's is compute_cursor_)
  std::vector<InFlight> in_flight_;      ///< per communication stream
  /// With ordered_issue: how many elements lead sequence_ complete (under wake_mutex_; read without):
  /// the index of the one element that may issue calls now.
  std::atomic<std::size_t> completed_prefix_ = 0;

  // The compute thread: where it is, and how it tells the communication thread.
  std::atomic<std::size_t> compute_cursor_ = 0, computed_ = 0;
  std::atomic<bool> compute_busy_ = false, compute_failed_ = false;
  std::exception_ptr compute_error_;
  std::stop_token compute_stop_;  ///< the compute thread's: it ends await_issue_turn when the step is ended
  std::mutex wake_mutex_;
  std::condition_variable_any wake_;  ///< signalled when any op of this rank completes
};

}  // namespace pipesim::runtime
