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
#include "cpu/model.h"
#include "executor.h"
#include "partition.h"

namespace pipesim::runtime {

using Clock = std::chrono::steady_clock;

/// A rank cannot go on; the message names the rank and the op.
struct RankFailure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// Tokens of one microbatch and their targets: a fixed token -> next-token map that the model can
/// learn, so losses fall over steps.
struct Batch {
  std::vector<int> tokens, targets;
};

/// A communication op between its start and its completion. Collectives of the vocabulary barrier
/// take several rounds (max, then sums, then dX); `phase` counts them.
struct InFlight {
  TaskId id = kNoTask;
  std::unique_ptr<Request> request;
  std::vector<float> data;
  std::vector<float> global_max;  ///< barrier C0: M, kept between rounds
  int phase = 0;
};

/// What stage caches hold from F to B (and to W when it is split off).
struct StageCache {
  std::vector<cpu::LayerCache> layers;
  std::vector<cpu::DeferredWeightGrad> deferred;
  std::vector<float> final_input, final_mean, final_rstd, normed;  ///< final LayerNorm (last stage)
  std::vector<float> dlogits;                                      ///< baseline LM head (last stage)

  Bytes bytes() const {
    std::size_t floats = final_input.size() + final_mean.size() + final_rstd.size() + normed.size() + dlogits.size();
    for (const cpu::LayerCache& c : layers)
      for (const auto* v : {&c.input, &c.ln1, &c.mean1, &c.rstd1, &c.qkv, &c.probs, &c.attention, &c.middle, &c.ln2,
                            &c.mean2, &c.rstd2, &c.fc1, &c.gelu})
        floats += v->size();
    for (const cpu::DeferredWeightGrad& d : deferred) floats += d.fc2_dy.size() + d.fc1_dy.size() + d.proj_dy.size() + d.qkv_dy.size();
    return Bytes(floats * sizeof(float));
  }
};

class RankExecutor {
 public:
  RankExecutor(Communicator& comm, const Plan& plan, const RunOptions& options)
      : comm_(comm), plan_(plan), graph_(plan.graph), layout_(plan.layout), options_(options), rank_(comm.rank()),
        shape_(model_shape(plan.config)), n_(shape_.tokens()), h_(shape_.hidden),
        model_(make_rank_model(shape_, layout_, rank_, options.seed)),
        first_device_(layout_.stages.front().device), last_device_(layout_.stages.back().device),
        last_stage_(layout_.stage_count() - 1), done_(graph_.size()) {
    for (const Task& t : graph_.tasks()) split_weight_ |= t.kind == OpKind::W;
    for (std::size_t s = graph_.first_stream(rank_); s < graph_.first_stream(rank_ + 1); ++s)
      if (!graph_.stream(s).empty()) streams_.push_back(s);
    for (const Task& t : graph_.tasks()) own_tasks_ += t.device == rank_;
  }

  Result<RunResult> run();

 private:
  TimeNs now() const { return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - epoch_).count(); }
  const std::vector<int>& tokens(int mb) const { return batches_[std::size_t(mb)].tokens; }
  const std::vector<int>& targets(int mb) const { return batches_[std::size_t(mb)].targets; }
  /// dloss/dlogit scale: the loss is the mean over every token of the iteration.
  float token_weight() const { return 1.0f / float(n_ * plan_.config.parallel.microbatches); }
  std::size_t activation_size() const { return std::size_t(n_) * std::size_t(h_); }
  /// Waits for a request outside the graph (barriers, reports), with the same timeout.
  void wait(std::unique_ptr<Request> request, const std::string& what);
  void barrier();

  // ---- the walk over this rank's streams ----
  void run_graph();
  void walk(std::vector<std::size_t>& cursor, std::vector<InFlight>& in_flight);
  /// The compute stream's ops in order, each when its dependencies are done; on its own thread.
  void run_compute_stream(const std::stop_token& stop);
  /// One step of a communication stream whose next op is `id`: poll it if in flight, else start it
  /// if ready. True when something happened.
  bool step(TaskId id, InFlight& flight, std::size_t& cursor, std::size_t& remaining);
  bool ready(TaskId id) const;
  void complete(TaskId id);
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
  /// Baseline: the whole LM head and the loss on the last stage.
  void head_forward(StageCache& cache, int mb);
  void backward(TaskId id, const Task& t);
  void weight(const Task& t);
  /// S: logits of this device's shard and the local softmax statistics (+ A and Y for Algorithm 2).
  void output_forward(int mb);
  /// T: the softmax gradient of this shard, dW (+ this shard's dX for Algorithm 1).
  void output_backward(int mb);
  void input_forward(int mb);
  void input_backward(int mb);
  void optimizer();

  // ---- communication ops ----
  void start_comm(InFlight& f);
  /// Polls a communication op; runs its next round when one is due. True when the op is complete.
  bool advance(InFlight& f);
  /// Barrier C0 after each round: M -> (S, z) -> (Algorithm 2) dX.
  bool barrier0_round(InFlight& f);

  // ---- results ----
  CheckResult finish_check(double reference_loss, double loss);
  /// Rank 0 collects every rank's op times and memory peak of the last step.
  void gather(RunResult& result);

  Communicator& comm_;
  const Plan& plan_;
  const TaskGraph& graph_;
  const Layout& layout_;
  const RunOptions& options_;
  const int rank_;
  const cpu::ModelShape shape_;
  const int n_, h_;
  RankModel model_;
  const int first_device_, last_device_, last_stage_;
  bool split_weight_ = false;
  std::vector<std::size_t> streams_;  ///< this rank's non-empty streams
  std::size_t own_tasks_ = 0;

  std::vector<std::atomic<char>> done_;  ///< per op, this step; set by either thread
  BufferStore<StageCache> buffers_;
  std::vector<Batch> batches_;
  int step_ = 0;
  Clock::time_point epoch_;
  std::atomic<double> loss_part_ = 0;  ///< this rank's share of the loss (the head runs on either thread)
  Timeline* timeline_ = nullptr;
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
