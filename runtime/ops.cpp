// What each op of the IR does on a rank: compute ops call the CPU kernels, communication ops the
// communicator (DESIGN.md §3: buffers keyed by kind, stage and microbatch; §5: the vocabulary passes).
#include <fmt/format.h>

#include "cpu/kernels.h"
#include "cpu/vocab.h"
#include "rank_executor.h"
#include "vocab_assembly.h"

namespace pipesim::runtime {

void RankExecutor::compute(TaskId id) {
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

template <class F>
void RankExecutor::vocab_layer(TaskId id, F&& work) {
  const auto start = Clock::now();
  work();
  (*vocab_layer_ns_)[std::size_t(id)] += std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - start).count();
}

void RankExecutor::forward(TaskId id, const Task& t) {
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

void RankExecutor::head_forward(StageCache& cache, int mb) {
  std::vector<float> logits(std::size_t(n_) * std::size_t(shape_.vocab), 0.0f);
  cpu::matmul_bt(cache.normed, model_.params.head, logits, n_, h_, shape_.vocab);
  cache.dlogits.resize(logits.size());
  const double loss = cpu::cross_entropy(logits, targets(mb), cache.dlogits, n_, shape_.vocab);
  for (float& g : cache.dlogits) g /= float(plan_.config.parallel.microbatches);  // mean over microbatches too
  loss_part_ += loss / plan_.config.parallel.microbatches;
}

void RankExecutor::backward(TaskId id, const Task& t) {
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

void RankExecutor::weight(const Task& t) {
  const VirtualStage& stage = layout_.stages[std::size_t(t.stage)];
  StageCache& cache = buffers_.cache({t.stage, t.microbatch});
  for (int l = 0; l < stage.layers; ++l)
    cpu::layer_weight_backward(shape_, cache.layers[std::size_t(l)], cache.deferred[std::size_t(l)],
                               model_.grads.layers.at(stage.first_layer + l));
  buffers_.drop_cache({t.stage, t.microbatch});
}

void RankExecutor::output_forward(int mb) {
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

void RankExecutor::output_backward(int mb) {
  const std::vector<float> logits = buffers_.take({Buf::VocabLogits, -1, mb});
  const std::vector<float> stats = buffers_.take({Buf::VocabStats, -1, mb});  // M | S
  const std::vector<float> x = buffers_.take({Buf::VocabX, -1, mb});
  const std::span<const float> s(stats);
  std::vector<float> dx(layout_.vocab == VocabPlacement::Vocab2 ? 0 : activation_size());
  cpu::output_backward(logits, s.subspan(0, std::size_t(n_)), s.subspan(std::size_t(n_)), targets(mb), model_.shard,
                       token_weight(), x, model_.params.head, n_, h_, model_.grads.head, dx);
  if (!dx.empty()) buffers_.put({Buf::VocabDxPart, -1, mb}, std::move(dx));
}

void RankExecutor::input_forward(int mb) {
  std::vector<float> out(activation_size(), 0.0f);
  cpu::embedding_forward(model_.params.embedding, tokens(mb), out, h_, model_.shard.first, model_.shard.rows);
  buffers_.put({Buf::VocabInput, -1, mb}, std::move(out));
}

void RankExecutor::input_backward(int mb) {
  const std::vector<float> dy = buffers_.take({Buf::VocabDy, -1, mb});
  cpu::embedding_backward(tokens(mb), dy, model_.grads.embedding, h_, model_.shard.first, model_.shard.rows);
}

void RankExecutor::optimizer() {
  if (options_.check && step_ == 0) grad_terms_ = grad_error_terms(model_, *reference_grad_);
  model_.sgd_step(options_.learning_rate);
}

void RankExecutor::start_comm(InFlight& f) {
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

bool RankExecutor::advance(InFlight& f) {
  if (!f.request->done()) return false;
  const Task& t = graph_.task(f.id);
  const int mb = t.microbatch;
  if (t.kind == OpKind::Reduce && rank_ == first_device_) buffers_.put({Buf::StageInput, 0, mb}, std::move(f.data));
  if (t.kind == OpKind::AllReduce && t.lane == vocab_lane::kBarrier1 && rank_ == last_device_)
    buffers_.put({Buf::VocabDx, -1, mb}, std::move(f.data));
  if (t.kind == OpKind::AllReduce && t.lane == vocab_lane::kBarrier0) return barrier0_round(f);
  return true;
}

bool RankExecutor::barrier0_round(InFlight& f) {
  const int mb = graph_.task(f.id).microbatch;
  const std::size_t n = std::size_t(n_);
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
}

}  // namespace pipesim::runtime
