// What each op of the IR does on a rank: compute ops call the backend, communication ops the lane
// their collective names (DESIGN.md §3: buffers keyed by kind, stage and microbatch; §5: the
// vocabulary passes). Which buffer a collective reads and fills follows from its CollectiveData.
#include <fmt/format.h>

#include "rank_executor.h"

namespace pipesim::runtime {

void RankExecutor::compute(TaskId id) {
  const Task& t = graph_.task(id);
  switch (t.kind) {
    case OpKind::F: forward(id, t); break;
    case OpKind::B: backward(id, t); break;
    case OpKind::W: weight(t); break;
    case OpKind::R: throw OpError("recomputation is not executed by this runtime (check_runnable refuses it)");
    case OpKind::S: output_forward(t.microbatch); break;
    case OpKind::T: output_backward(t.microbatch); break;
    case OpKind::IF: buffers_.put({Buf::VocabInput, -1, t.microbatch}, backend_->embed(t.microbatch)); break;
    case OpKind::IB: backend_->embed_backward(t.microbatch, buffers_.take({Buf::VocabDy, -1, t.microbatch})); break;
    case OpKind::Optimizer: optimizer(); break;
    case OpKind::Send:
    case OpKind::Recv:
    case OpKind::AllReduce:
    case OpKind::Broadcast:
    case OpKind::Reduce:
    case OpKind::DpAllReduce: throw OpError("not a compute op");
  }
}

template <class F>
void RankExecutor::vocab_layer(TaskId id, F&& work) {
  if (device_clock_) {  // read once the op has synchronised: no wait here
    const DeviceClock::Mark from = device_clock_->mark();
    work();
    vocab_marks_.emplace_back(from, device_clock_->mark());
    return;
  }
  const auto start = Clock::now();
  work();
  backend_->synchronize();
  (*vocab_layer_ns_)[std::size_t(id)] += std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - start).count();
}

void RankExecutor::forward(TaskId id, const Task& t) {
  const VirtualStage& stage = layout_.stages[std::size_t(t.stage)];
  const int mb = t.microbatch;
  Tensor x;
  if (stage.has_embedding)
    vocab_layer(id, [&] { x = backend_->embed(mb); });
  else
    x = buffers_.take({Buf::StageInput, t.stage, mb});
  std::unique_ptr<StageActivations> cache = backend_->stage_forward(t.stage, x);
  if (t.stage == last_stage_) {
    backend_->final_norm(*cache, std::move(x));
    if (stage.has_head)  // baseline: the whole LM head and the loss here
      vocab_layer(id, [&] { loss_part_ += backend_->head_forward(*cache, mb, 1.0f / float(microbatches_)); });
    else  // vocabulary-parallel: X goes to every device (the broadcast on the output lane)
      buffers_.put({Buf::VocabX, -1, mb}, backend_->final_output(*cache));
  } else if (layout_.stages[std::size_t(t.stage) + 1].device == rank_) {
    buffers_.put({Buf::StageInput, t.stage + 1, mb}, std::move(x));
  } else {
    buffers_.put({Buf::StageOutput, t.stage, mb}, std::move(x));
  }
  buffers_.put_cache({t.stage, mb}, std::move(cache));
}

void RankExecutor::backward(TaskId id, const Task& t) {
  const VirtualStage& stage = layout_.stages[std::size_t(t.stage)];
  const int mb = t.microbatch;
  StageActivations& cache = buffers_.cache({t.stage, mb});
  Tensor dy;
  if (t.stage == last_stage_) {
    Tensor dnormed;
    if (stage.has_head)
      vocab_layer(id, [&] { dnormed = backend_->head_backward(cache); });
    else
      dnormed = buffers_.take({Buf::VocabDx, -1, mb});
    dy = backend_->final_norm_backward(cache, dnormed);
  } else {
    dy = buffers_.take({Buf::GradInput, t.stage, mb});
  }
  backend_->stage_backward(t.stage, cache, dy, split_weight_);
  if (t.stage == 0) {
    if (stage.has_embedding)
      vocab_layer(id, [&] { backend_->embed_backward(mb, dy); });
    else  // vocabulary-parallel: dY goes to every device (the broadcast on the gradient lane)
      buffers_.put({Buf::VocabDy, -1, mb}, std::move(dy));
  } else if (layout_.stages[std::size_t(t.stage) - 1].device == rank_) {
    buffers_.put({Buf::GradInput, t.stage - 1, mb}, std::move(dy));
  } else {
    buffers_.put({Buf::GradOutput, t.stage, mb}, std::move(dy));
  }
  if (split_weight_) {
    cache.keep_for_weight_pass();
    buffers_.recount_cache({t.stage, mb});
  } else {
    buffers_.drop_cache({t.stage, mb});
  }
}

void RankExecutor::weight(const Task& t) {
  backend_->stage_weight(t.stage, buffers_.cache({t.stage, t.microbatch}));
  buffers_.drop_cache({t.stage, t.microbatch});
}

void RankExecutor::output_forward(int mb) {
  OutputShard out = backend_->output_forward(mb, buffers_.get({Buf::VocabX, -1, mb}), layout_.vocab == VocabPlacement::Vocab2);
  if (!out.terms.empty()) buffers_.put({Buf::VocabTerms, -1, mb}, std::move(out.terms));
  buffers_.put({Buf::VocabLogits, -1, mb}, std::move(out.logits));
  buffers_.put({Buf::VocabLocal, -1, mb}, std::move(out.local));
}

void RankExecutor::output_backward(int mb) {
  const Tensor logits = buffers_.take({Buf::VocabLogits, -1, mb});
  const Tensor stats = buffers_.take({Buf::VocabStats, -1, mb});  // M | S
  const Tensor x = buffers_.take({Buf::VocabX, -1, mb});
  Tensor dx = backend_->output_backward(mb, logits, stats, x, token_weight(), layout_.vocab != VocabPlacement::Vocab2);
  if (!dx.empty()) buffers_.put({Buf::VocabDxPart, -1, mb}, std::move(dx));
}

void RankExecutor::optimizer() {
  if (options_.check && step_ == 0) grad_terms_ = backend_->grad_error_terms(*reference_grad_);
  backend_->optimizer_step(options_.learning_rate);
}

void RankExecutor::start_comm(InFlight& f) {
  const Task& t = graph_.task(f.id);
  const int mb = t.microbatch;
  switch (t.kind) {
    case OpKind::Send: {
      f.data = buffers_.take({t.payload == Payload::Activation ? Buf::StageOutput : Buf::GradOutput, t.stage, mb});
      f.request = comm_.p2p().send(f.data.view(), t.peer);
      return;
    }
    case OpKind::Recv: {
      const bool activation = t.payload == Payload::Activation;
      Tensor& into = buffers_.put({activation ? Buf::StageInput : Buf::GradInput, activation ? t.stage + 1 : t.stage - 1, mb},
                                  backend_->allocate(activation_size(), backend_->activation_dtype()));
      f.request = comm_.p2p().recv(into.view(), t.peer);
      return;
    }
    case OpKind::AllReduce:
    case OpKind::Broadcast:
    case OpKind::Reduce: return start_collective(f, graph_.group_of(f.id));
    case OpKind::DpAllReduce:
      throw OpError(fmt::format("{} cannot run in this runtime (data-parallel replicas are not executed)", op_kind_name(t.kind)));
    case OpKind::F:
    case OpKind::B:
    case OpKind::W:
    case OpKind::R:
    case OpKind::S:
    case OpKind::T:
    case OpKind::IF:
    case OpKind::IB:
    case OpKind::Optimizer: throw OpError("not a communication op");
  }
}

void RankExecutor::start_collective(InFlight& f, const CollectiveGroup& group) {
  const int mb = graph_.task(f.id).microbatch;
  Communicator& comm = lane(f.id);
  const auto buffer_at_root = [&](Buf buf) -> Tensor& {
    const Key key{buf, -1, mb};
    return rank_ == group.root ? buffers_.get(key)
                               : buffers_.put(key, backend_->allocate(activation_size(), backend_->activation_dtype()));
  };
  switch (group.data) {
    case CollectiveData::InputEmbedding:  // the IF outputs summed into the first stage's input
      f.data = buffers_.take({Buf::VocabInput, -1, mb});
      f.request = comm.reduce(f.data.view(), group.op, group.root);
      return;
    case CollectiveData::OutputX: f.request = comm.broadcast(buffer_at_root(Buf::VocabX).view(), group.root); return;
    case CollectiveData::InputGrad: f.request = comm.broadcast(buffer_at_root(Buf::VocabDy).view(), group.root); return;
    case CollectiveData::SoftmaxStats: {  // round 1: the global max M
      const Tensor& local = buffers_.get({Buf::VocabLocal, -1, mb});
      f.data = backend_->allocate(std::size_t(n_), DType::F32);
      backend_->copy(local, 0, f.data, 0, std::size_t(n_));
      backend_->synchronize();  // the communicator reads what the copy wrote
      f.request = comm.all_reduce(f.data.view(), ReduceOp::Max);
      return;
    }
    case CollectiveData::OutputGrad:  // barrier C1: Σ dX_i
      f.data = buffers_.take({Buf::VocabDxPart, -1, mb});
      f.request = comm.all_reduce(f.data.view(), group.op);
      return;
    case CollectiveData::Gradients:
    case CollectiveData::GradientShards:
    case CollectiveData::Parameters:
      throw OpError("data-parallel collectives are not executed (one pipeline replica runs)");
  }
}

bool RankExecutor::advance(InFlight& f) {
  if (!f.request->done()) return false;
  const Task& t = graph_.task(f.id);
  if (t.group < 0) return true;  // SEND, RECV
  const CollectiveGroup& group = graph_.group_of(f.id);
  const int mb = t.microbatch;
  switch (group.data) {
    case CollectiveData::InputEmbedding:
      if (rank_ == group.root) buffers_.put({Buf::StageInput, 0, mb}, std::move(f.data));
      return true;
    case CollectiveData::OutputGrad:
      if (rank_ == last_device_) buffers_.put({Buf::VocabDx, -1, mb}, std::move(f.data));
      return true;
    case CollectiveData::SoftmaxStats: return barrier0_round(f);
    case CollectiveData::OutputX:
    case CollectiveData::InputGrad:
    case CollectiveData::Gradients:
    case CollectiveData::GradientShards:
    case CollectiveData::Parameters: return true;
  }
  return true;
}

bool RankExecutor::barrier0_round(InFlight& f) {
  const int mb = graph_.task(f.id).microbatch;
  const std::size_t n = std::size_t(n_);
  switch (f.phase++) {
    case 0: {  // have M; next Σ s_i·exp(m_i − M) and Σ z_i
      f.global_max = std::move(f.data);
      f.data = backend_->softmax_sums(buffers_.get({Buf::VocabLocal, -1, mb}), f.global_max);
      backend_->synchronize();  // the sum round reads what the backend just wrote
      f.request = lane(f.id).all_reduce(f.data.view(), ReduceOp::Sum);
      return false;
    }
    case 1: {  // have S and z: the loss, and what T needs
      if (rank_ == last_device_) loss_part_ += backend_->loss_sum(f.global_max, f.data) * token_weight();
      Tensor stats = backend_->allocate(2 * n, DType::F32);
      backend_->copy(f.global_max, 0, stats, 0, n);
      backend_->copy(f.data, 0, stats, n, n);
      const Tensor local = buffers_.take({Buf::VocabLocal, -1, mb});
      buffers_.put({Buf::VocabStats, -1, mb}, std::move(stats));
      if (layout_.vocab != VocabPlacement::Vocab2) {
        backend_->synchronize();
        return true;
      }
      // Algorithm 2: this shard's term of dX, summed in a last round.
      f.data = backend_->input_grad_share(local, f.global_max, f.data, buffers_.take({Buf::VocabTerms, -1, mb}), token_weight());
      backend_->synchronize();
      f.request = lane(f.id).all_reduce(f.data.view(), ReduceOp::Sum);
      return false;
    }
    default:
      if (rank_ == last_device_) buffers_.put({Buf::VocabDx, -1, mb}, std::move(f.data));
      return true;
  }
}

}  // namespace pipesim::runtime
