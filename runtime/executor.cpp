#include "executor.h"

#include <fmt/format.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <map>
#include <stdexcept>
#include <thread>

#include "buffers.h"
#include "cpu/kernels.h"
#include "cpu/model.h"
#include "cpu/vocab.h"
#include "partition.h"
#include "vocab_assembly.h"

namespace pipesim::runtime {
namespace {

using Clock = std::chrono::steady_clock;

/// A rank cannot go on; the message names the rank and the op.
struct RankFailure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

std::uint64_t mix(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

/// Tokens of one microbatch and their targets: a fixed token -> next-token map that the model can
/// learn, so losses fall over steps.
struct Batch {
  std::vector<int> tokens, targets;
};
Batch make_batch(std::uint64_t seed, int step, int microbatch, int n, int vocab) {
  Batch b;
  for (int i = 0; i < n; ++i) {
    const int token = int(mix(mix(seed ^ 0x5eedull) + (std::uint64_t(step) << 40) + (std::uint64_t(microbatch) << 20) + std::uint64_t(i)) %
                          std::uint64_t(vocab));
    b.tokens.push_back(token);
    b.targets.push_back(int((std::int64_t(token) * 31 + 7) % vocab));
  }
  return b;
}

/// The single-device reference of one iteration: mean loss over all microbatches and its gradients.
double reference_iteration(const cpu::ModelShape& shape, const cpu::Model& model, const std::vector<Batch>& batches,
                           cpu::Model& grad) {
  double loss = 0;
  for (const Batch& b : batches) loss += cpu::reference_step(shape, model, b.tokens, b.targets, grad);
  const float scale = 1.0f / float(batches.size());
  const auto rescale = [scale](std::vector<float>& t) {
    for (float& v : t) v *= scale;
  };
  rescale(grad.embedding), rescale(grad.head), rescale(grad.final_gain), rescale(grad.final_bias);
  for (cpu::Layer& l : grad.layers)
    for (std::vector<float>* t : l.tensors()) rescale(*t);
  return loss / double(batches.size());
}

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
        last_stage_(layout_.stage_count() - 1), done_(graph_.size(), 0) {
    for (const Task& t : graph_.tasks()) split_weight_ |= t.kind == OpKind::W;
    for (std::size_t s = graph_.first_stream(rank_); s < graph_.first_stream(rank_ + 1); ++s)
      if (!graph_.stream(s).empty()) streams_.push_back(s);
    for (const Task& t : graph_.tasks()) own_tasks_ += t.device == rank_;
  }

  Result<RunResult> run() {
    RunResult result;
    result.timeline.start.assign(graph_.size(), 0), result.timeline.end.assign(graph_.size(), 0);
    result.vocab_layer_ns.assign(graph_.size(), 0);
    timeline_ = &result.timeline, vocab_layer_ns_ = &result.vocab_layer_ns;
    try {
      std::optional<cpu::Model> reference_grad;
      cpu::Model reference_model;
      double reference_loss = 0;
      for (int step = 0; step < options_.steps; ++step) {
        step_ = step;
        batches_.clear();
        for (int mb = 0; mb < plan_.config.parallel.microbatches; ++mb)
          batches_.push_back(make_batch(options_.seed, step, mb, n_, shape_.vocab));
        if (options_.check && step == 0) {
          reference_model = cpu::make_model(shape_, options_.seed);
          reference_grad = cpu::zero_model(shape_);
          reference_loss = reference_iteration(shape_, reference_model, batches_, *reference_grad);
          reference_ = &*reference_grad;
        }
        barrier();
        epoch_ = Clock::now();
        loss_part_ = 0;
        run_graph();
        const TimeNs elapsed = now();
        std::vector<float> loss{float(loss_part_)}, time{float(elapsed)};
        wait(comm_.all_reduce(loss, ReduceOp::Sum, vocab_lane::kDataParallel), "the loss all-reduce");
        wait(comm_.all_reduce(time, ReduceOp::Max, vocab_lane::kDataParallel), "the step-time all-reduce");
        result.losses.push_back(loss[0]);
        result.step_ns.push_back(TimeNs(time[0]));
        if (step == 0 && options_.check) result.check = finish_check(reference_loss, loss[0]);
        if (rank_ == 0 && options_.on_step) options_.on_step(step, loss[0], TimeNs(time[0]));
      }
      gather(result);
      return result;
    } catch (const CommError& e) {
      return Error{e.what()};
    } catch (const RankFailure& e) {
      comm_.abort(e.what());
      return Error{e.what()};
    }
  }

 private:
  TimeNs now() const { return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - epoch_).count(); }
  const std::vector<int>& tokens(int mb) const { return batches_[std::size_t(mb)].tokens; }
  const std::vector<int>& targets(int mb) const { return batches_[std::size_t(mb)].targets; }
  /// dloss/dlogit scale: the loss is the mean over every token of the iteration.
  float token_weight() const { return 1.0f / float(n_ * plan_.config.parallel.microbatches); }
  std::size_t activation_size() const { return std::size_t(n_) * std::size_t(h_); }

  /// Waits for a request outside the graph (barriers, reports), with the same timeout.
  void wait(std::unique_ptr<Request> request, const std::string& what) {
    const auto start = Clock::now();
    while (!request->done()) {
      if (std::chrono::duration<double>(Clock::now() - start).count() > options_.timeout_s)
        throw RankFailure(fmt::format("rank {}: no progress for {:g} s waiting for {}", rank_, options_.timeout_s, what));
      comm_.wait_for_progress(0.001);
    }
  }

  void barrier() {
    std::vector<float> token{1.0f};
    wait(comm_.all_reduce(token, ReduceOp::Sum, vocab_lane::kDataParallel), "the start-of-step barrier");
  }

  // ---- the walk over this rank's streams ----

  void run_graph() {
    std::fill(done_.begin(), done_.end(), 0);
    std::vector<std::size_t> cursor(streams_.size(), 0);
    std::vector<InFlight> in_flight(streams_.size());
    peak_ = 0, peak_op_ = kNoTask;
    try {
      walk(cursor, in_flight);
    } catch (const CommError&) {
      // Another rank ended the run; say where this one stood.
      throw CommError(fmt::format("rank {} stopped waiting on {}", rank_, waiting_on(cursor, in_flight)));
    }
  }

  void walk(std::vector<std::size_t>& cursor, std::vector<InFlight>& in_flight) {
    std::size_t remaining = own_tasks_;
    auto last_progress = Clock::now();
    while (remaining > 0) {
      bool progressed = false;
      for (std::size_t i = 0; i < streams_.size(); ++i) {
        const auto ops = graph_.stream(streams_[i]);
        InFlight& flight = in_flight[i];
        if (flight.id != kNoTask) {
          if (!advance(flight)) continue;
          complete(flight.id);
          flight = InFlight{};
          ++cursor[i], --remaining, progressed = true;
        }
        if (cursor[i] == ops.size()) continue;
        const TaskId id = ops[cursor[i]];
        if (!ready(id)) continue;
        progressed = true;
        inject_fault(id);
        timeline_->start[std::size_t(id)] = now();
        try {
          if (is_compute(graph_.task(id).kind)) {
            compute(id);
            complete(id);
            ++cursor[i], --remaining;
          } else {
            flight.id = id;
            start_comm(flight);
          }
        } catch (const OpError& e) {
          throw RankFailure(fmt::format("rank {} failed at {}: {}", rank_, graph_.describe(id), e.what()));
        }
      }
      if (progressed) {
        last_progress = Clock::now();
        continue;
      }
      if (std::chrono::duration<double>(Clock::now() - last_progress).count() > options_.timeout_s) timed_out(cursor, in_flight);
      comm_.wait_for_progress(0.001);
    }
  }

  bool ready(TaskId id) const {
    for (TaskId dep : graph_.deps(id))
      if (!done_[std::size_t(dep)]) return false;
    return true;
  }

  void complete(TaskId id) {
    done_[std::size_t(id)] = 1;
    timeline_->end[std::size_t(id)] = now();
    if (buffers_.live() > peak_) peak_ = buffers_.live(), peak_op_ = id;
  }

  void inject_fault(TaskId id) {
    const Task& t = graph_.task(id);
    if (!options_.fault || options_.fault->rank != rank_ || options_.fault->kind != t.kind ||
        options_.fault->microbatch != t.microbatch || step_ != 0)
      return;
    if (!options_.fault->hang) throw RankFailure(fmt::format("rank {} failed at {}: injected fault", rank_, graph_.describe(id)));
    while (!comm_.aborted()) comm_.wait_for_progress(0.01);  // a hung rank: it answers nothing
    throw RankFailure(fmt::format("rank {} hung at {} (injected fault)", rank_, graph_.describe(id)));
  }

  /// The ops at the heads of this rank's streams that wait on another rank.
  std::string waiting_on(const std::vector<std::size_t>& cursor, const std::vector<InFlight>& in_flight) const {
    std::vector<std::string> waiting;
    for (std::size_t i = 0; i < streams_.size(); ++i) {
      const auto ops = graph_.stream(streams_[i]);
      if (cursor[i] == ops.size()) continue;
      const TaskId id = ops[cursor[i]];
      const Task& t = graph_.task(id);
      if (in_flight[i].id == kNoTask && !ready(id)) continue;  // waits on this rank's own ops
      waiting.push_back(t.kind == OpKind::Send || t.kind == OpKind::Recv
                            ? fmt::format("{} (rank {})", graph_.describe(id), t.peer)
                            : graph_.describe(id));
    }
    return waiting.empty() ? std::string("nothing it can name") : fmt::format("{}", fmt::join(waiting, ", "));
  }

  [[noreturn]] void timed_out(const std::vector<std::size_t>& cursor, const std::vector<InFlight>& in_flight) {
    throw RankFailure(
        fmt::format("rank {}: no progress for {:g} s; waiting on {}", rank_, options_.timeout_s, waiting_on(cursor, in_flight)));
  }

  // ---- compute ops ----

  void compute(TaskId id) {
    const Task& t = graph_.task(id);
    switch (t.kind) {
      case OpKind::F: forward(id, t); break;
      case OpKind::B: backward(id, t); break;
      case OpKind::W: weight(t); break;
      case OpKind::S: output_forward(t.microbatch); break;
      case OpKind::T: output_backward(t.microbatch); break;
      case OpKind::IF: input_forward(t.microbatch); break;
      case OpKind::IB: input_backward(t.microbatch); break;
      case OpKind::Optimizer: optimizer(); break;
      default: throw OpError("not a compute op");
    }
  }

  /// Times the vocabulary-layer part of an F or B (baseline), for the profile.
  template <class F>
  void vocab_layer(TaskId id, F&& work) {
    const auto start = Clock::now();
    work();
    (*vocab_layer_ns_)[std::size_t(id)] += std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - start).count();
  }

  void forward(TaskId id, const Task& t) {
    const VirtualStage& stage = layout_.stages[std::size_t(t.stage)];
    const int mb = t.microbatch;
    std::vector<float> x;
    if (stage.has_embedding) {
      x.assign(activation_size(), 0.0f);
      vocab_layer(id, [&] { cpu::embedding_forward(model_.params.embedding, tokens(mb), x, h_, 0, shape_.vocab); });
    } else {
      x = buffers_.take({Buf::StageInput, t.stage, mb});
    }
    StageCache cache;
    cache.layers.resize(std::size_t(stage.layers));
    for (int l = 0; l < stage.layers; ++l) {
      std::vector<float> y(activation_size());
      cpu::layer_forward(shape_, model_.params.layers.at(stage.first_layer + l), x, y, cache.layers[std::size_t(l)]);
      x = std::move(y);
    }
    if (t.stage == last_stage_) {
      cache.final_input = std::move(x);
      cache.normed.resize(activation_size()), cache.final_mean.resize(std::size_t(n_)), cache.final_rstd.resize(std::size_t(n_));
      cpu::layernorm_forward(cache.final_input, model_.params.final_gain, model_.params.final_bias, cache.normed,
                             cache.final_mean, cache.final_rstd, n_, h_);
      if (stage.has_head)
        vocab_layer(id, [&] { head_forward(cache, mb); });
      else  // vocabulary-parallel: X goes to every device (the broadcast on the output lane)
        buffers_.put({Buf::VocabX, -1, mb}, cache.normed);
    } else if (layout_.stages[std::size_t(t.stage) + 1].device == rank_) {
      buffers_.put({Buf::StageInput, t.stage + 1, mb}, std::move(x));
    } else {
      buffers_.put({Buf::StageOutput, t.stage, mb}, std::move(x));
    }
    buffers_.put_cache({t.stage, mb}, std::move(cache));
  }

  /// Baseline: the whole LM head and the loss on the last stage.
  void head_forward(StageCache& cache, int mb) {
    std::vector<float> logits(std::size_t(n_) * std::size_t(shape_.vocab), 0.0f);
    cpu::matmul_bt(cache.normed, model_.params.head, logits, n_, h_, shape_.vocab);
    cache.dlogits.resize(logits.size());
    const double loss = cpu::cross_entropy(logits, targets(mb), cache.dlogits, n_, shape_.vocab);
    for (float& g : cache.dlogits) g /= float(plan_.config.parallel.microbatches);  // mean over microbatches too
    loss_part_ += loss / plan_.config.parallel.microbatches;
  }

  void backward(TaskId id, const Task& t) {
    const VirtualStage& stage = layout_.stages[std::size_t(t.stage)];
    const int mb = t.microbatch;
    StageCache& cache = buffers_.cache({t.stage, mb});
    std::vector<float> dy;
    if (t.stage == last_stage_) {
      std::vector<float> dnormed;
      if (stage.has_head) {
        dnormed.assign(activation_size(), 0.0f);
        vocab_layer(id, [&] {
          cpu::matmul_at(cache.dlogits, cache.normed, model_.grads.head, n_, shape_.vocab, h_);
          cpu::matmul(cache.dlogits, model_.params.head, dnormed, n_, shape_.vocab, h_, true);
        });
      } else {
        dnormed = buffers_.take({Buf::VocabDx, -1, mb});
      }
      dy.assign(activation_size(), 0.0f);
      cpu::layernorm_backward(cache.final_input, model_.params.final_gain, cache.final_mean, cache.final_rstd, dnormed, dy,
                              model_.grads.final_gain, model_.grads.final_bias, n_, h_);
    } else {
      dy = buffers_.take({Buf::GradInput, t.stage, mb});
    }
    if (split_weight_) cache.deferred.resize(std::size_t(stage.layers));
    for (int l = stage.layers - 1; l >= 0; --l) {
      std::vector<float> dx(activation_size(), 0.0f);
      cpu::layer_backward(shape_, model_.params.layers.at(stage.first_layer + l), cache.layers[std::size_t(l)], dy, dx,
                          model_.grads.layers.at(stage.first_layer + l),
                          split_weight_ ? &cache.deferred[std::size_t(l)] : nullptr);
      dy = std::move(dx);
    }
    if (t.stage == 0) {
      if (stage.has_embedding)
        vocab_layer(id, [&] { cpu::embedding_backward(tokens(mb), dy, model_.grads.embedding, h_, 0, shape_.vocab); });
      else  // vocabulary-parallel: dY goes to every device (the broadcast on the gradient lane)
        buffers_.put({Buf::VocabDy, -1, mb}, std::move(dy));
    } else if (layout_.stages[std::size_t(t.stage) - 1].device == rank_) {
      buffers_.put({Buf::GradInput, t.stage - 1, mb}, std::move(dy));
    } else {
      buffers_.put({Buf::GradOutput, t.stage, mb}, std::move(dy));
    }
    if (split_weight_) {
      // W needs the layer inputs and these output gradients; the rest of the cache can go now.
      cache.final_input.clear(), cache.normed.clear(), cache.dlogits.clear();
      buffers_.recount_cache({t.stage, mb});
    } else {
      buffers_.drop_cache({t.stage, mb});
    }
  }

  void weight(const Task& t) {
    const VirtualStage& stage = layout_.stages[std::size_t(t.stage)];
    StageCache& cache = buffers_.cache({t.stage, t.microbatch});
    for (int l = 0; l < stage.layers; ++l)
      cpu::layer_weight_backward(shape_, cache.layers[std::size_t(l)], cache.deferred[std::size_t(l)],
                                 model_.grads.layers.at(stage.first_layer + l));
    buffers_.drop_cache({t.stage, t.microbatch});
  }

  /// S: logits of this device's shard and the local softmax statistics (+ A and Y for Algorithm 2).
  void output_forward(int mb) {
    const std::vector<float>& x = buffers_.get({Buf::VocabX, -1, mb});
    const std::size_t n = std::size_t(n_);
    std::vector<float> logits(n * std::size_t(model_.shard.rows)), local(3 * n);  // local: max | sum-exp | target
    const std::span<float> l(local);
    cpu::output_logits(x, model_.params.head, targets(mb), model_.shard, n_, h_, logits, l.subspan(0, n), l.subspan(n, n),
                       l.subspan(2 * n, n));
    if (layout_.vocab == VocabPlacement::Vocab2) {
      std::vector<float> terms(2 * activation_size());  // A | Y
      const std::span<float> a(terms);
      cpu::output_input_grad_terms(logits, l.subspan(0, n), l.subspan(n, n), model_.params.head, targets(mb), model_.shard,
                                   n_, h_, a.subspan(0, activation_size()), a.subspan(activation_size()));
      buffers_.put({Buf::VocabTerms, -1, mb}, std::move(terms));
    }
    buffers_.put({Buf::VocabLogits, -1, mb}, std::move(logits));
    buffers_.put({Buf::VocabLocal, -1, mb}, std::move(local));
  }

  /// T: the softmax gradient of this shard, dW (+ this shard's dX for Algorithm 1).
  void output_backward(int mb) {
    const std::vector<float> logits = buffers_.take({Buf::VocabLogits, -1, mb});
    const std::vector<float> stats = buffers_.take({Buf::VocabStats, -1, mb});  // M | S
    const std::vector<float> x = buffers_.take({Buf::VocabX, -1, mb});
    const std::span<const float> s(stats);
    std::vector<float> dx(layout_.vocab == VocabPlacement::Vocab2 ? 0 : activation_size());
    cpu::output_backward(logits, s.subspan(0, std::size_t(n_)), s.subspan(std::size_t(n_)), targets(mb), model_.shard,
                         token_weight(), x, model_.params.head, n_, h_, model_.grads.head, dx);
    if (!dx.empty()) buffers_.put({Buf::VocabDxPart, -1, mb}, std::move(dx));
  }

  void input_forward(int mb) {
    std::vector<float> out(activation_size(), 0.0f);
    cpu::embedding_forward(model_.params.embedding, tokens(mb), out, h_, model_.shard.first, model_.shard.rows);
    buffers_.put({Buf::VocabInput, -1, mb}, std::move(out));
  }

  void input_backward(int mb) {
    const std::vector<float> dy = buffers_.take({Buf::VocabDy, -1, mb});
    cpu::embedding_backward(tokens(mb), dy, model_.grads.embedding, h_, model_.shard.first, model_.shard.rows);
  }

  void optimizer() {
    if (options_.check && step_ == 0) grad_terms_ = grad_error_terms(model_, *reference_);
    model_.sgd_step(options_.learning_rate);
  }

  // ---- communication ops ----

  void start_comm(InFlight& f) {
    const Task& t = graph_.task(f.id);
    const int mb = t.microbatch;
    switch (t.kind) {
      case OpKind::Send: {
        f.data = buffers_.take({t.payload == Payload::Activation ? Buf::StageOutput : Buf::GradOutput, t.stage, mb});
        f.request = comm_.send(bytes_of(std::span<const float>(f.data)), t.peer);
        return;
      }
      case OpKind::Recv: {
        const bool activation = t.payload == Payload::Activation;
        std::vector<float>& into = buffers_.put({activation ? Buf::StageInput : Buf::GradInput,
                                                 activation ? t.stage + 1 : t.stage - 1, mb},
                                                std::vector<float>(activation_size()));
        f.request = comm_.recv(bytes_of(std::span<float>(into)), t.peer);
        return;
      }
      case OpKind::Reduce:  // lane 1: the IF outputs summed into the first stage's input
        f.data = buffers_.take({Buf::VocabInput, -1, mb});
        f.request = comm_.reduce(f.data, ReduceOp::Sum, first_device_, t.lane);
        return;
      case OpKind::Broadcast: {
        const bool output = t.lane == vocab_lane::kOutputBroadcast;
        const Key key{output ? Buf::VocabX : Buf::VocabDy, -1, mb};
        const bool root = rank_ == (output ? last_device_ : first_device_);
        std::vector<float>& data = root ? buffers_.get(key) : buffers_.put(key, std::vector<float>(activation_size()));
        f.request = comm_.broadcast(data, output ? last_device_ : first_device_, t.lane);
        return;
      }
      case OpKind::AllReduce:
        if (t.lane == vocab_lane::kBarrier0) {  // round 1: the global max M
          f.data = std::vector<float>(buffers_.get({Buf::VocabLocal, -1, mb}).begin(),
                                      buffers_.get({Buf::VocabLocal, -1, mb}).begin() + n_);
          f.request = comm_.all_reduce(f.data, ReduceOp::Max, t.lane);
        } else {  // barrier C1: Σ dX_i
          f.data = buffers_.take({Buf::VocabDxPart, -1, mb});
          f.request = comm_.all_reduce(f.data, ReduceOp::Sum, t.lane);
        }
        return;
      default:
        throw OpError(fmt::format("{} cannot run in this runtime (data-parallel replicas are not executed)",
                                      op_kind_name(t.kind)));
    }
  }

  /// Polls a communication op; runs its next round when one is due. True when the op is complete.
  bool advance(InFlight& f) {
    if (!f.request->done()) return false;
    const Task& t = graph_.task(f.id);
    const int mb = t.microbatch;
    if (t.kind == OpKind::Reduce && rank_ == first_device_) buffers_.put({Buf::StageInput, 0, mb}, std::move(f.data));
    if (t.kind == OpKind::AllReduce && t.lane == vocab_lane::kBarrier1 && rank_ == last_device_)
      buffers_.put({Buf::VocabDx, -1, mb}, std::move(f.data));
    if (t.kind == OpKind::AllReduce && t.lane == vocab_lane::kBarrier0) return barrier0_round(f);
    return true;
  }

  /// Barrier C0 after each round: M -> (S, z) -> (Algorithm 2) dX.
  bool barrier0_round(InFlight& f) {
    const int mb = graph_.task(f.id).microbatch;
    const std::size_t n = std::size_t(n_);
    try {
      switch (f.phase++) {
        case 0: {  // have M; next Σ s_i·exp(m_i − M) and Σ z_i
          f.global_max = std::move(f.data);
          const std::span<const float> local(buffers_.get({Buf::VocabLocal, -1, mb}));
          f.data.assign(2 * n, 0.0f);
          cpu::rescale_sum_exp(local.subspan(0, n), local.subspan(n, n), f.global_max, std::span(f.data).subspan(0, n));
          std::copy(local.begin() + std::ptrdiff_t(2 * n), local.end(), f.data.begin() + std::ptrdiff_t(n));
          f.request = comm_.all_reduce(f.data, ReduceOp::Sum, graph_.task(f.id).lane);
          return false;
        }
        case 1: {  // have S and z: the loss, and what T needs
          const std::span<const float> sums(f.data);
          if (rank_ == last_device_) loss_part_ += cpu::loss_sum(f.global_max, sums.subspan(0, n), sums.subspan(n)) * token_weight();
          std::vector<float> stats(f.global_max);
          stats.insert(stats.end(), f.data.begin(), f.data.begin() + std::ptrdiff_t(n));
          const std::vector<float> local = buffers_.take({Buf::VocabLocal, -1, mb});
          buffers_.put({Buf::VocabStats, -1, mb}, std::move(stats));
          if (layout_.vocab != VocabPlacement::Vocab2) return true;
          // Algorithm 2: this shard's term of dX, summed in a last round.
          const std::vector<float> terms = buffers_.take({Buf::VocabTerms, -1, mb});
          const std::span<const float> ay(terms);
          std::vector<float> scaled(n);
          cpu::rescale_sum_exp(std::span(local).subspan(0, n), std::span(local).subspan(n, n), f.global_max, scaled);
          std::vector<float> dx(activation_size());
          cpu::input_grad_share(scaled, sums.subspan(0, n), ay.subspan(0, activation_size()), ay.subspan(activation_size()),
                                token_weight(), n_, h_, dx);
          f.data = std::move(dx);
          f.request = comm_.all_reduce(f.data, ReduceOp::Sum, graph_.task(f.id).lane);
          return false;
        }
        default:
          if (rank_ == last_device_) buffers_.put({Buf::VocabDx, -1, mb}, std::move(f.data));
          return true;
      }
    } catch (const OpError& e) {
      throw RankFailure(fmt::format("rank {} failed at {}: {}", rank_, graph_.describe(f.id), e.what()));
    }
  }

  // ---- results ----

  CheckResult finish_check(double reference_loss, double loss) {
    wait(comm_.all_reduce(grad_terms_, ReduceOp::Sum, vocab_lane::kDataParallel), "the gradient-check all-reduce");
    CheckResult check{.loss = loss, .reference_loss = reference_loss, .max_grad_rel_err = 0, .worst_tensor = ""};
    const std::vector<std::string> names = tensor_names(shape_);
    for (std::size_t t = 0; t < names.size(); ++t) {
      const double diff = grad_terms_[2 * t], ref = grad_terms_[2 * t + 1];
      const double err = ref > 0 ? std::sqrt(diff / ref) : std::sqrt(diff);
      if (err >= check.max_grad_rel_err) check.max_grad_rel_err = err, check.worst_tensor = names[t];
    }
    return check;
  }

  /// Rank 0 collects every rank's op times and memory peak of the last step.
  void gather(RunResult& result) {
    const int ranks = comm_.size();
    result.peak_activation_bytes.assign(std::size_t(ranks), 0);
    result.peak_op.assign(std::size_t(ranks), kNoTask);
    result.static_bytes.assign(std::size_t(ranks), 0);
    const auto pack = [&](int rank, std::vector<double>& record, bool write) {
      std::size_t i = 0;
      const auto field = [&](auto& value) {
        if (write) value = static_cast<std::remove_reference_t<decltype(value)>>(record[i]);
        else record.push_back(double(value));
        ++i;
      };
      for (TaskId id = 0; id < TaskId(graph_.size()); ++id)
        if (graph_.task(id).device == rank)
          field(result.timeline.start[std::size_t(id)]), field(result.timeline.end[std::size_t(id)]),
              field(result.vocab_layer_ns[std::size_t(id)]);
      field(result.peak_activation_bytes[std::size_t(rank)]), field(result.peak_op[std::size_t(rank)]),
          field(result.static_bytes[std::size_t(rank)]);
    };
    result.peak_activation_bytes[std::size_t(rank_)] = peak_, result.peak_op[std::size_t(rank_)] = peak_op_;
    result.static_bytes[std::size_t(rank_)] = Bytes(model_.parameter_count() * 2 * sizeof(float));
    std::vector<double> record;
    if (rank_ != 0) {
      pack(rank_, record, false);
      wait(comm_.send(std::as_bytes(std::span<const double>(record)), 0), "rank 0 to take this rank's measurements");
      return;
    }
    for (int r = 1; r < ranks; ++r) {
      std::vector<double> theirs;
      pack(r, theirs, false);  // sizes the record
      wait(comm_.recv(std::as_writable_bytes(std::span<double>(theirs)), r), fmt::format("rank {}'s measurements", r));
      pack(r, theirs, true);
    }
  }

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

  std::vector<char> done_;
  BufferStore<StageCache> buffers_;
  std::vector<Batch> batches_;
  int step_ = 0;
  Clock::time_point epoch_;
  double loss_part_ = 0;
  Bytes peak_ = 0;
  TaskId peak_op_ = kNoTask;
  Timeline* timeline_ = nullptr;
  std::vector<TimeNs>* vocab_layer_ns_ = nullptr;
  const cpu::Model* reference_ = nullptr;
  std::vector<float> grad_terms_;
};

}  // namespace

Status check_runnable(const Plan& plan) {
  const Config& c = plan.config;
  if (c.parallel.tp != 1)
    return Error{fmt::format("{}: parallel.tp: the runtime runs each stage on one device; set parallel.tp to 1", c.source)};
  if (c.parallel.dp != 1)
    return Error{fmt::format("{}: parallel.dp: the runtime runs one pipeline replica; set parallel.dp to 1", c.source)};
  // Weights and gradients of every rank plus the activations of every microbatch in flight, fp32.
  const cpu::ModelShape s = model_shape(c);
  const double n = double(s.tokens()), h = s.hidden;
  const double params = 2.0 * s.vocab * h + double(s.layers) * (4.0 * h * h + 2.0 * h * s.ffn + 9.0 * h + s.ffn);
  const double activations = double(c.parallel.microbatches) * s.layers *
                             (n * (10.0 * h + 2.0 * s.ffn) + double(s.batch) * s.heads * s.seq * s.seq);
  const double needed = 4.0 * (2.0 * params + activations + 2.0 * n * s.vocab * c.parallel.microbatches);
  const double available = double(sysconf(_SC_PHYS_PAGES)) * double(sysconf(_SC_PAGE_SIZE));
  if (needed > 0.5 * available)
    return Error{fmt::format("{}: model: the CPU runtime would need about {:.1f} GiB for this model (fp32 weights, "
                             "gradients and activations), more than half of this machine's {:.1f} GiB; shrink model.* "
                             "(configs/tiny.json is sized for it) or parallel.microbatches",
                             c.source, needed / double(1ull << 30), available / double(1ull << 30))};
  return Status::Ok();
}

Result<RunResult> run_rank(Communicator& comm, const Plan& plan, const RunOptions& options) {
  if (comm.size() != plan.layout.devices)
    return Error{fmt::format("{} ranks cannot run a pipeline of {} devices", comm.size(), plan.layout.devices)};
  RankExecutor executor(comm, plan, options);
  return executor.run();
}

}  // namespace pipesim::runtime
