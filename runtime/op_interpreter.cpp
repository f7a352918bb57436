// What each op does on a rank (op_interpreter.h). Which buffer a collective reads and fills follows
// from its CollectiveData.
#include "op_interpreter.h"

#include <fmt/format.h>

#include <algorithm>

#include "partition.h"

namespace pipesim::runtime {
namespace {

/// Done when every one of its parts is: the per-tensor collectives of one DP_ALLREDUCE (with none, at
/// once: an ALLTOALL, whose tokens moved inside the pass before it).
class AllOf final : public Request {
 public:
  explicit AllOf(std::vector<std::unique_ptr<Request>> parts) : parts_(std::move(parts)) {}
  bool done() override {
    while (!parts_.empty() && parts_.back()->done()) parts_.pop_back();
    return parts_.empty();
  }

 private:
  std::vector<std::unique_ptr<Request>> parts_;
};

}  // namespace

OpInterpreter::OpInterpreter(const Job& job, const RankPlace& place, Transport& comm, Transport* data,
                             Transport* tied, TensorParallel* tensor, Backend& backend,
                             const OptimizerSettings& optimizer, Transport* expert_data)
    : graph_(job.graph), layout_(job.layout), rank_(place.device), comm_(comm), backend_(backend),
      optimizer_(optimizer), microbatches_(job.microbatches), n_(job.shape.tokens()), h_(job.shape.hidden),
      data_(data), tied_(tied), tensor_(tensor), expert_data_(expert_data), expert_parallel_(job.expert_replicas() > 1),
      routed_experts_(routed_expert_tensors(job.layout, place.device)), replicas_(job.dp),
      owned_(job.owned_part(place)), expert_owned_(job.expert_owned_part(place)),
      last_device_(layout_.stages.back().device), last_stage_(layout_.stage_count() - 1),
      split_weight_(graph_.has(OpKind::W)), training_(job.training), tensor_stages_(tensor_stages(layout_, rank_)),
      own_gradient_ops_(std::size_t(layout_.stage_count()), false), own_weight_ops_(own_gradient_ops_) {
  for (TaskId id = 0; id < TaskId(graph_.size()); ++id) {
    const Task& t = graph_.task(id);
    if (t.kind != OpKind::DpAllReduce || t.device != rank_ || t.stage < 0) continue;
    (graph_.group_of(id).data == CollectiveData::Parameters ? own_weight_ops_ : own_gradient_ops_)[std::size_t(t.stage)] = true;
  }
}

bool OpInterpreter::moved_by(std::size_t index, int stage, bool weights) const {
  const int of = tensor_stages_.at(index);
  if (stage >= 0) return of == stage;
  return of < 0 || !(weights ? own_weight_ops_ : own_gradient_ops_)[std::size_t(of)];
}

void OpInterpreter::drop_unowned_weights(bool gathered_per_stage) {
  std::vector<Buffer> weights = backend_.parameter_buffers(false);
  std::vector<std::pair<DType, Tensor>> zeros;  // one per dtype, as long as the largest part to drop
  for (std::size_t i = 0; i < weights.size(); ++i) {
    const Buffer& b = weights[i];
    if (gathered_per_stage && (tensor_stages_.at(i) < 0 || !own_weight_ops_[std::size_t(tensor_stages_[i])])) continue;
    const std::size_t first = owned_of(i).begin(b.count), last = owned_of(i).end(b.count);
    const std::size_t dropped = std::max(first, b.count - last);
    if (dropped == 0) continue;
    auto z = std::find_if(zeros.begin(), zeros.end(), [&](const auto& x) { return x.first == b.dtype; });
    if (z == zeros.end() || z->second.count() < dropped) {
      if (z != zeros.end()) zeros.erase(z);
      z = zeros.emplace(zeros.end(), b.dtype, backend_.allocate(dropped, b.dtype));
    }
    Tensor whole(b.data, b.count, b.dtype, nullptr);  // a view: the backend keeps the tensor
    backend_.copy(z->second, 0, whole, 0, first);
    backend_.copy(z->second, 0, whole, last, b.count - last);
  }
  backend_.weights_written();
  backend_.synchronize();
}

void OpInterpreter::begin_step(std::span<const Batch> batches, bool capture_gradients) {
  // Where each stage gathers its weights before its first F (ZeRO 3, overlapped gathers), a replica
  // starts from its own part of them.
  if (owned_.count > 1 && !std::exchange(weights_dropped_, true)) drop_unowned_weights(true);
  backend_.set_batches(batches);
  loss_part_ = 0;
  capture_gradients_ = capture_gradients;
  buffers_.reset_peak();
}

void OpInterpreter::compute(TaskId id, DeviceClock& clock, std::vector<MarkSpan>& vocab_parts) {
  clock_ = &clock, vocab_parts_ = &vocab_parts;
  const Task& t = graph_.task(id);
  switch (t.kind) {
    case OpKind::F: forward(t); break;
    case OpKind::B: backward(t); break;
    case OpKind::W: weight(t); break;
    case OpKind::R: recompute(t); break;
    case OpKind::S: output_forward(t.microbatch); break;
    case OpKind::T: output_backward(t.microbatch); break;
    case OpKind::IF: buffers_.put({Buf::VocabInput, -1, t.microbatch}, backend_.embed(t.microbatch)); break;
    case OpKind::IB: backend_.embed_backward(t.microbatch, buffers_.take({Buf::VocabDy, -1, t.microbatch})); break;
    case OpKind::Optimizer: optimizer(); break;
    case OpKind::Send:
    case OpKind::Recv:
    case OpKind::AllReduce:
    case OpKind::Broadcast:
    case OpKind::Reduce:
    case OpKind::DpAllReduce:
    case OpKind::AllToAll: throw OpError("not a compute op");
  }
}

template <class F>
void OpInterpreter::vocab_layer(F&& work) {
  const DeviceClock::Mark from = clock_->mark();
  work();
  vocab_parts_->emplace_back(from, clock_->mark());
}

void OpInterpreter::forward(const Task& t) {
  const VirtualStage& stage = layout_.stages[std::size_t(t.stage)];
  const int mb = t.microbatch;
  Tensor x;
  if (stage.has_embedding)
    vocab_layer([&] { x = backend_.embed(mb); });
  else
    x = buffers_.take({Buf::StageInput, t.stage, mb});
  if (t.stage == 0) x = sequence_part(std::move(x));  // the embedding's output is whole
  StageCache cache;
  const int recomputed = recomputed_layers(training_, stage.layers);
  for (int i = 0; i < stage.layers; ++i) {
    if (i >= recomputed) {
      cache.layers.push_back(backend_.layer_forward(stage.first_layer + i, x));
      continue;
    }
    if (keeps_input(i)) {
      Tensor input = backend_.allocate(x.count(), x.dtype());
      backend_.copy(x, 0, input, 0, x.count());
      cache.kept_inputs.push_back(std::move(input));
    }
    backend_.layer_forward(stage.first_layer + i, x);  // its activations go now: R rebuilds them
    cache.layers.emplace_back();
  }
  if (t.stage == last_stage_) {
    cache.head = backend_.final_norm(sequence_whole(std::move(x)));
    if (stage.has_head)  // baseline: the whole LM head and the loss here
      vocab_layer([&] { loss_part_ += backend_.head_forward(*cache.head, mb, microbatch_weight()); });
    else  // vocabulary-parallel: X goes to every device (the broadcast on the output lane)
      buffers_.put({Buf::VocabX, -1, mb}, backend_.final_output(*cache.head));
  } else if (on_this_rank(t.stage + 1)) {  // a local hand-off: no transfer in the graph
    buffers_.put({Buf::StageInput, t.stage + 1, mb}, std::move(x));
  } else {
    buffers_.put({Buf::StageOutput, t.stage, mb}, std::move(x));
  }
  buffers_.put_cache({t.stage, mb}, std::move(cache));
}

Tensor OpInterpreter::sequence_part(Tensor whole) {
  if (!sequence_parallel()) return whole;
  Tensor part = backend_.allocate(backend_.layer_activation_count(), whole.dtype());
  backend_.copy(whole, std::size_t(tensor_->rank()) * part.count(), part, 0, part.count());
  return part;
}

Tensor OpInterpreter::sequence_whole(Tensor part) {
  if (!sequence_parallel()) return part;
  Tensor whole = backend_.allocate(activation_size(), part.dtype());
  backend_.synchronize();  // the group reads what the backend wrote
  tensor_->all_gather(part.view(), whole.view());
  return whole;
}

bool OpInterpreter::keeps_input(int i) const {
  return training_.recompute_method == RecomputeMethod::Block || i % training_.recompute_num_layers == 0;
}

void OpInterpreter::recompute(const Task& t) {
  const VirtualStage& stage = layout_.stages[std::size_t(t.stage)];
  StageCache& cache = buffers_.cache({t.stage, t.microbatch});
  if (cache.kept_inputs.empty())
    throw OpError(fmt::format("stage {} keeps no recomputation inputs: the graph has an R its config does not make "
                              "(training.recompute_granularity)",
                              t.stage));
  std::size_t group = 0;
  Tensor x;
  for (int i = 0; i < recomputed_layers(training_, stage.layers); ++i) {
    if (keeps_input(i)) x = std::move(cache.kept_inputs.at(group++));
    cache.layers[std::size_t(i)] = backend_.layer_forward(stage.first_layer + i, x);
  }
  cache.kept_inputs.clear();
  buffers_.recount_cache({t.stage, t.microbatch});
}

void OpInterpreter::backward(const Task& t) {
  const VirtualStage& stage = layout_.stages[std::size_t(t.stage)];
  const int mb = t.microbatch;
  StageCache& cache = buffers_.cache({t.stage, mb});
  Tensor dy;
  if (t.stage == last_stage_) {
    Tensor dnormed;
    if (stage.has_head)
      vocab_layer([&] { dnormed = backend_.head_backward(*cache.head); });
    else
      dnormed = buffers_.take({Buf::VocabDx, -1, mb});
    dy = sequence_part(backend_.final_norm_backward(*cache.head, dnormed));
  } else {
    dy = buffers_.take({Buf::GradInput, t.stage, mb});
  }
  for (int i = stage.layers - 1; i >= 0; --i) {
    if (!cache.layers[std::size_t(i)])
      throw OpError(fmt::format("layer {}'s activations are missing: it is recomputed and the graph has no R before "
                                "this B", stage.first_layer + i));
    backend_.layer_backward(stage.first_layer + i, *cache.layers[std::size_t(i)], dy, split_weight_);
  }
  if (t.stage == 0) {
    dy = sequence_whole(std::move(dy));
    if (stage.has_embedding)
      vocab_layer([&] { backend_.embed_backward(mb, dy); });
    else  // vocabulary-parallel: dY goes to every device (the broadcast on the gradient lane)
      buffers_.put({Buf::VocabDy, -1, mb}, std::move(dy));
  } else if (on_this_rank(t.stage - 1)) {
    buffers_.put({Buf::GradInput, t.stage - 1, mb}, std::move(dy));
  } else {
    buffers_.put({Buf::GradOutput, t.stage, mb}, std::move(dy));
  }
  if (split_weight_) {  // W needs the layers' activations only
    cache.head.reset();
    for (const auto& layer : cache.layers) layer->keep_for_weight_pass();
    buffers_.recount_cache({t.stage, mb});
  } else {
    buffers_.drop_cache({t.stage, mb});
  }
}

void OpInterpreter::weight(const Task& t) {
  const VirtualStage& stage = layout_.stages[std::size_t(t.stage)];
  StageCache& cache = buffers_.cache({t.stage, t.microbatch});
  for (int i = 0; i < stage.layers; ++i) backend_.layer_weight(stage.first_layer + i, *cache.layers[std::size_t(i)]);
  buffers_.drop_cache({t.stage, t.microbatch});
}

void OpInterpreter::output_forward(int mb) {
  OutputShard out = backend_.output_forward(mb, buffers_.get({Buf::VocabX, -1, mb}), layout_.vocab == VocabPlacement::Vocab2);
  if (!out.terms.empty()) buffers_.put({Buf::VocabTerms, -1, mb}, std::move(out.terms));
  buffers_.put({Buf::VocabLogits, -1, mb}, std::move(out.logits));
  buffers_.put({Buf::VocabLocal, -1, mb}, std::move(out.local));
}

void OpInterpreter::output_backward(int mb) {
  const Tensor logits = buffers_.take({Buf::VocabLogits, -1, mb});
  const Tensor stats = buffers_.take({Buf::VocabStats, -1, mb});  // M | S
  const Tensor x = buffers_.take({Buf::VocabX, -1, mb});
  Tensor dx = backend_.output_backward(mb, logits, stats, x, token_weight(), layout_.vocab != VocabPlacement::Vocab2);
  if (!dx.empty()) buffers_.put({Buf::VocabDxPart, -1, mb}, std::move(dx));
}

void OpInterpreter::optimizer() {
  if (capture_gradients_) gradients_ = backend_.gradients();
  backend_.optimizer_step(optimizer_, ++updates_);
  if (owned_.count > 1) drop_unowned_weights(false);  // the other parts are gathered before they are read
}

void OpInterpreter::start(InFlight& f) {
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
      Tensor& into = buffers_.put({activation ? Buf::StageInput : Buf::GradInput, fed_stage(t.stage, t.payload), mb},
                                  backend_.allocate(backend_.layer_activation_count(), backend_.activation_dtype()));
      f.request = comm_.p2p().recv(into.view(), t.peer);
      return;
    }
    case OpKind::AllReduce:
    case OpKind::Broadcast:
    case OpKind::Reduce: return start_collective(f, graph_.group_of(f.id));
    case OpKind::DpAllReduce: return start_data_parallel(f, graph_.group_of(f.id));
    case OpKind::AllToAll: {
      // The MoE layers exchange their tokens inside F, B and R, between router and experts, through
      // the expert-parallel group (cpu/moe.h): the pass this op follows has moved them already.
      if (graph_.group_of(f.id).data != CollectiveData::ExpertTokens)
        throw OpError("an all-to-all that moves no expert tokens");
      f.request = std::make_unique<AllOf>(std::vector<std::unique_ptr<Request>>{});
      return;
    }
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

void OpInterpreter::start_collective(InFlight& f, const CollectiveGroup& group) {
  const int mb = graph_.task(f.id).microbatch;
  Communicator& comm = lane(f.id);
  const auto buffer_at_root = [&](Buf buf) -> Tensor& {
    const Key key{buf, -1, mb};
    return rank_ == group.root ? buffers_.get(key)
                               : buffers_.put(key, backend_.allocate(activation_size(), backend_.activation_dtype()));
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
      f.data = backend_.allocate(std::size_t(n_), DType::F32);
      backend_.copy(local, 0, f.data, 0, std::size_t(n_));
      backend_.synchronize();  // the communicator reads what the copy wrote
      f.request = comm.all_reduce(f.data.view(), ReduceOp::Max);
      return;
    }
    case CollectiveData::OutputGrad:  // barrier C1: Σ dX_i
      f.data = buffers_.take({Buf::VocabDxPart, -1, mb});
      f.request = comm.all_reduce(f.data.view(), group.op);
      return;
    case CollectiveData::TiedEmbedding: {  // the embedding's gradient here, the LM head's there: summed
      if (!tied_) throw OpError("a tied embedding's all-reduce on a device that holds neither of its uses");
      const std::vector<Buffer> gradients = backend_.parameter_buffers(true);
      const std::size_t from_end = rank_ == layout_.stages.front().device ? kEmbeddingFromEnd : kHeadFromEnd;
      f.request = tied_->lane(graph_.task(f.id).lane).all_reduce(gradients.at(gradients.size() - from_end), group.op);
      return;
    }
    case CollectiveData::Gradients:
    case CollectiveData::GradientShards:
    case CollectiveData::Parameters: throw OpError("a data-parallel collective on a pipeline lane");
    case CollectiveData::ExpertTokens: throw OpError("an expert-parallel all-to-all on a pipeline lane");
  }
}

void OpInterpreter::start_data_parallel(InFlight& f, const CollectiveGroup& group) {
  const Task& t = graph_.task(f.id);
  if (!data_ || group.ranks != data_->size())
    throw OpError(fmt::format("the graph's data-parallel collective spans {} replicas; this run has {}", group.ranks,
                              data_ ? data_->size() : 1));
  Communicator& lane = data_->lane(t.lane);
  const bool weights = group.data == CollectiveData::Parameters;
  data_parallel_.clear();
  std::vector<std::unique_ptr<Request>> parts;
  const std::vector<Buffer> tensors = backend_.parameter_buffers(!weights);
  if (tensors.size() != tensor_stages_.size())
    throw OpError(fmt::format("the backend holds {} tensors; this rank's part of the model has {}", tensors.size(),
                              tensor_stages_.size()));
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const Buffer& b = tensors[i];
    if (b.count == 0 || !moved_by(i, t.stage, weights)) continue;
    if (group.data == CollectiveData::Gradients) {  // in place, whole
      // Under expert parallelism a routed experts' map sums over the replicas that hold the same
      // experts only (their gradient already has every replica's tokens that chose them): on the same
      // lane number of the expert data-parallel group, or, when this replica alone holds them, not at all.
      if (expert_parallel_ && routed_experts_.at(i)) {
        if (expert_data_) parts.push_back(expert_data_->lane(t.lane).all_reduce(b, ReduceOp::Sum));
        continue;
      }
      parts.push_back(lane.all_reduce(b, ReduceOp::Sum));
      continue;
    }
    // ZeRO shards a routed experts' map over the expert data-parallel group; a replica that alone
    // holds its experts owns all of it, and has nothing to move.
    const bool expert = expert_parallel_ && routed_experts_.at(i);
    if (expert && !expert_data_) continue;
    Communicator& over = expert ? expert_data_->lane(t.lane) : lane;
    const std::size_t replicas = std::size_t(expert ? expert_data_->size() : data_->size());
    // Reduce-scatter and all-gather move equal blocks: every tensor is padded to replicas × block.
    const OwnedPart& part = owned_of(i);
    const std::size_t block = part.block(b.count), first = part.begin(b.count), owned = part.end(b.count) - first;
    const Tensor whole(b.data, b.count, b.dtype, nullptr);  // a view: the backend keeps the tensor
    PaddedTransfer& x =
        data_parallel_.emplace_back(PaddedTransfer{.tensor = b, .in = {}, .out = {}, .lane = &over, .owned = part});
    if (group.data == CollectiveData::GradientShards) {
      x.in = backend_.allocate(block * replicas, b.dtype), x.out = backend_.allocate(block, b.dtype);
      backend_.copy(whole, 0, x.in, 0, b.count);
    } else {
      x.in = backend_.allocate(block, b.dtype), x.out = backend_.allocate(block * replicas, b.dtype);
      backend_.copy(whole, first, x.in, 0, owned);
    }
  }
  backend_.synchronize();  // the communicator reads what the copies wrote
  for (PaddedTransfer& x : data_parallel_)
    parts.push_back(group.data == CollectiveData::GradientShards
                        ? x.lane->reduce_scatter(x.in.view(), x.out.view(), ReduceOp::Sum)
                        : x.lane->all_gather(x.in.view(), x.out.view()));
  f.request = std::make_unique<AllOf>(std::move(parts));
}

void OpInterpreter::finish_data_parallel(const CollectiveGroup& group) {
  for (PaddedTransfer& x : data_parallel_) {
    Tensor whole(x.tensor.data, x.tensor.count, x.tensor.dtype, nullptr);
    if (group.data == CollectiveData::GradientShards)  // this replica's part, summed over all
      backend_.copy(x.out, 0, whole, x.owned.begin(x.tensor.count),
                    x.owned.end(x.tensor.count) - x.owned.begin(x.tensor.count));
    else  // every replica's updated part
      backend_.copy(x.out, 0, whole, 0, x.tensor.count);
  }
  if (group.data == CollectiveData::Parameters) backend_.weights_written();
  backend_.synchronize();
  data_parallel_.clear();
}

bool OpInterpreter::advance(InFlight& f) {
  const Task& t = graph_.task(f.id);
  if (t.group < 0) return true;  // SEND, RECV
  if (t.kind == OpKind::DpAllReduce) {
    finish_data_parallel(graph_.group_of(f.id));
    return true;
  }
  const CollectiveGroup& group = graph_.group_of(f.id);
  const int mb = t.microbatch;
  switch (group.data) {
    case CollectiveData::InputEmbedding:
      if (rank_ == group.root) buffers_.put({Buf::StageInput, 0, mb}, std::move(f.data));
      return true;
    case CollectiveData::OutputGrad:
      if (rank_ == last_device_) buffers_.put({Buf::VocabDx, -1, mb}, std::move(f.data));
      return true;
    case CollectiveData::SoftmaxStats: return barrier0_round(f, group);
    case CollectiveData::OutputX:
    case CollectiveData::InputGrad:
    case CollectiveData::TiedEmbedding:
    case CollectiveData::Gradients:
    case CollectiveData::GradientShards:
    case CollectiveData::Parameters:
    case CollectiveData::ExpertTokens: return true;
  }
  return true;
}

bool OpInterpreter::barrier0_round(InFlight& f, const CollectiveGroup& group) {
  const int mb = graph_.task(f.id).microbatch;
  const std::size_t n = std::size_t(n_);
  // Algorithm 2 sums this shard's dX term in a third round; the graph says how many rounds C0 has.
  const bool algorithm2 = layout_.vocab == VocabPlacement::Vocab2;
  if (group.rounds != (algorithm2 ? 3 : 2))
    throw OpError(fmt::format("barrier C0 has {} rounds in the graph; {} takes {}", group.rounds,
                              algorithm2 ? "Algorithm 2" : "Algorithm 1", algorithm2 ? 3 : 2));
  switch (f.round++) {
    case 0: {  // have M; next Σ s_i·exp(m_i − M) and Σ z_i
      f.kept = std::move(f.data);
      f.data = backend_.softmax_sums(buffers_.get({Buf::VocabLocal, -1, mb}), f.kept);
      backend_.synchronize();  // the sum round reads what the backend just wrote
      f.request = lane(f.id).all_reduce(f.data.view(), ReduceOp::Sum);
      return false;
    }
    case 1: {  // have S and z: the loss, and what T needs
      if (rank_ == last_device_) loss_part_ += backend_.loss_sum(f.kept, f.data) * token_weight();
      Tensor stats = backend_.allocate(2 * n, DType::F32);
      backend_.copy(f.kept, 0, stats, 0, n);
      backend_.copy(f.data, 0, stats, n, n);
      const Tensor local = buffers_.take({Buf::VocabLocal, -1, mb});
      buffers_.put({Buf::VocabStats, -1, mb}, std::move(stats));
      if (!algorithm2) {
        backend_.synchronize();
        return true;
      }
      f.data = backend_.input_grad_share(local, f.kept, f.data, buffers_.take({Buf::VocabTerms, -1, mb}), token_weight());
      backend_.synchronize();
      f.request = lane(f.id).all_reduce(f.data.view(), ReduceOp::Sum);
      return false;
    }
    default:
      if (rank_ == last_device_) buffers_.put({Buf::VocabDx, -1, mb}, std::move(f.data));
      return true;
  }
}

}  // namespace pipesim::runtime
