#include "assemble.h"

#include <algorithm>
#include <array>
#include <cmath>

#include "two_threads.h"
#include "vocab_assembly.h"

namespace pipesim {
namespace {

/// Dense (stage, microbatch) -> task tables for the ops assemble needs to find again.
class OpTable {
 public:
  OpTable(int stages, int microbatches) : microbatches_(microbatches), ids_(std::size_t(stages) * microbatches, kNoTask) {}
  TaskId& at(int stage, int microbatch) { return ids_[std::size_t(stage) * microbatches_ + microbatch]; }
  int microbatches() const { return microbatches_; }

 private:
  int microbatches_;
  std::vector<TaskId> ids_;
};

/// What adding the P2P transfers needs: the compute ops by (stage, microbatch), and the tables of
/// RECVs it fills, remembered by the stage they feed.
struct Transfers {
  const Layout& layout;
  TaskGraphBuilder& builder;
  OpTable &forward, &backward, &weight, &recompute;
  OpTable &activation_recv, &gradient_recv;
  WorkId boundary;  ///< a transfer's work: the boundary activation (or its gradient)

  int device_of(int stage) const { return layout.stages[std::size_t(stage)].device; }
  /// The SEND of stage's output (or input gradient) for mb and its RECV on the other device.
  Task transfer(OpKind kind, Payload payload, int stage, int mb) const {
    const int to = fed_stage(stage, payload);
    const bool send = kind == OpKind::Send;
    return {.kind = kind, .payload = payload, .chunk = std::int8_t(layout.stages[std::size_t(stage)].chunk),
            .device = device_of(send ? stage : to), .stage = stage, .microbatch = mb,
            .peer = device_of(send ? to : stage), .work = boundary};
  }
  TaskId producer(Payload payload, int stage, int mb) const {
    return (payload == Payload::Activation ? forward : backward).at(stage, mb);
  }
  OpTable& receives(Payload payload) const { return payload == Payload::Activation ? activation_recv : gradient_recv; }
};

/// What step `s` on device `d` sends to another device: its output (Activation) when the next
/// stage lives elsewhere, its input gradient (Gradient) when the previous one does; None otherwise.
Payload sent_out(const Layout& layout, const ComputeStep& s, int d) {
  const auto elsewhere = [&](int stage) { return layout.stages[std::size_t(stage)].device != d; };
  if (s.kind == OpKind::F && s.stage + 1 < layout.stage_count() && elsewhere(s.stage + 1)) return Payload::Activation;
  if (s.kind == OpKind::B && s.stage > 0 && elsewhere(s.stage - 1)) return Payload::Gradient;
  return Payload::None;
}

/// Device d's transfers, in its program order: a SEND and its RECV per step that sends, filling the
/// blank ids from `id` on, and each SEND's dependency on its producer from `edge` on. A channel's
/// RECVs are issued in the order of its SENDs (receives have no dependencies, so posting them early
/// costs nothing), which keeps every pair matched whatever order the consumer computes in.
void derived_transfers(const Transfers& t, const std::vector<ComputeStep>& order, int d, TaskId id,
                       std::pair<TaskId, TaskId>* edge) {
  for (const ComputeStep& s : order) {
    const Payload payload = sent_out(t.layout, s, d);
    if (payload == Payload::None) continue;
    const TaskId send = id++, recv = id++;
    t.builder.task(send) = t.transfer(OpKind::Send, payload, s.stage, s.microbatch);
    t.builder.task(recv) = t.transfer(OpKind::Recv, payload, s.stage, s.microbatch);
    t.builder.pair(send, recv);
    *edge++ = {send, t.producer(payload, s.stage, s.microbatch)};
    t.receives(payload).at(fed_stage(s.stage, payload), s.microbatch) = recv;
  }
}

/// Transfers as a schedule file orders them on each rank, each issued after the compute op it
/// follows there (a RECV posted late delays what waits for it, as it does in PyTorch's runtime).
/// Pairs match by (stage, microbatch); the reader has checked that every SEND has its RECV.
void file_transfers(const Transfers& t, const DeviceComms& comms) {
  const int stages = t.layout.stage_count();
  OpTable sent_forward(stages, t.forward.microbatches()), sent_backward(stages, t.forward.microbatches());
  const auto compute = [&t](const ComputeStep& s) {
    return (s.kind == OpKind::F ? t.forward : s.kind == OpKind::B ? t.backward : t.weight).at(s.stage, s.microbatch);
  };
  for (int d = 0; d < t.layout.devices; ++d)
    for (const CommStep& c : comms[std::size_t(d)]) {
      const bool send = c.kind == OpKind::Send;
      // A RECV is named by the stage it feeds; the task by the stage that produced the data.
      const int producer = send ? c.stage : c.payload == Payload::Activation ? c.stage - 1 : c.stage + 1;
      const TaskId id = t.builder.add(t.transfer(c.kind, c.payload, producer, c.microbatch));
      const TaskId after = c.after ? compute(*c.after) : kNoTask;
      if (after != kNoTask) t.builder.depend(id, after);
      if (!send) {
        t.receives(c.payload).at(c.stage, c.microbatch) = id;
        continue;
      }
      if (const TaskId data = t.producer(c.payload, c.stage, c.microbatch); data != after) t.builder.depend(id, data);
      (c.payload == Payload::Activation ? sent_forward : sent_backward).at(c.stage, c.microbatch) = id;
    }
  for (int s = 0; s < stages; ++s)
    for (int mb = 0; mb < t.forward.microbatches(); ++mb) {
      if (const TaskId send = sent_forward.at(s, mb); send != kNoTask) t.builder.pair(send, t.activation_recv.at(s + 1, mb));
      if (const TaskId send = sent_backward.at(s, mb); send != kNoTask) t.builder.pair(send, t.gradient_recv.at(s - 1, mb));
    }
}

/// Where each device's ops begin: its compute ops among all compute ops, its SENDs and RECVs among
/// all transfers derived from the orders; one entry per device, then the end.
struct OpNumbering {
  std::vector<std::size_t> compute_first, transfer_first;
  std::size_t compute_ops() const { return compute_first.back(); }
  std::size_t transfer_pairs() const { return transfer_first.back() / 2; }
};

/// Whether step `s` is a B that an R (recomputation) precedes.
bool recomputed(const ComputeStep& s, const std::vector<StageWork>& work) {
  return s.kind == OpKind::B && s.stage >= 0 && work[std::size_t(s.stage)].recomputes();
}

OpNumbering number_ops(const Layout& layout, const DeviceOrders& orders, const std::vector<StageWork>& work) {
  const auto devices = std::size_t(layout.devices);
  OpNumbering n{std::vector<std::size_t>(devices + 1, 0), std::vector<std::size_t>(devices + 1, 0)};
  for (std::size_t d = 0; d < devices; ++d) {
    std::size_t sends = 0, recomputations = 0;
    for (const ComputeStep& s : orders[d]) {
      sends += sent_out(layout, s, int(d)) != Payload::None;
      recomputations += recomputed(s, work);
    }
    n.compute_first[d + 1] = n.compute_first[d] + orders[d].size() + recomputations;
    n.transfer_first[d + 1] = n.transfer_first[d] + 2 * sends;
  }
  return n;
}

/// Each stage's F, B, W and R work, one record each (indexed by pass_index, R last).
using StageWorkIds = std::vector<std::array<WorkId, 4>>;
constexpr std::size_t kRecomputeWork = 3;

StageWorkIds add_stage_work(TaskGraphBuilder& builder, const std::vector<StageWork>& work, int stages,
                            bool split_weight) {
  StageWorkIds stage_work(static_cast<std::size_t>(stages));
  for (int s = 0; s < stages; ++s) {
    const StageWork& w = work[std::size_t(s)];
    stage_work[std::size_t(s)] = {
        builder.work({.flops = w.forward_flops, .bytes = w.forward_bytes, .alloc_bytes = w.activation_bytes}),
        builder.work({.flops = w.backward_flops + (split_weight ? 0 : w.weight_flops),
                      .bytes = w.backward_bytes + (split_weight ? 0 : w.weight_bytes),
                      .free_bytes = w.backward_free(split_weight)}),
        builder.work({.flops = w.weight_flops, .bytes = w.weight_bytes, .free_bytes = w.weight_held_bytes}),
        builder.work({.flops = w.recompute_flops, .bytes = w.recompute_bytes,
                      .alloc_bytes = w.recompute_alloc(split_weight)})};
  }
  return stage_work;
}

/// What filling in the compute ops needs: their work, the vocabulary passes, and the tables of
/// F, B and W ops it fills for the transfers and dependencies added after.
struct ComputeOps {
  const Layout& layout;
  TaskGraphBuilder& builder;
  VocabPasses& passes;
  const StageWorkIds& stage_work;
  const std::vector<StageWork>& work;
  OpTable &forward, &backward, &weight, &recompute;

  /// Device d's compute ops in its order, on the blank ids from `id` on, with an R before each B
  /// that recomputes; returns the id of its last op (kNoTask for an empty order). Calls for
  /// different devices may run on different threads.
  TaskId place(const std::vector<ComputeStep>& order, int d, TaskId id) const {
    TaskId last = kNoTask;
    for (const ComputeStep& s : order) {
      if (s.stage < 0) {  // a vocabulary pass
        last = id;
        passes.place(builder, id++, d, s);
        continue;
      }
      const auto chunk = std::int8_t(layout.stages[std::size_t(s.stage)].chunk);
      if (recomputed(s, work)) {
        builder.task(id) = {.kind = OpKind::R, .chunk = chunk, .device = d, .stage = s.stage,
                            .microbatch = s.microbatch, .work = stage_work[std::size_t(s.stage)][kRecomputeWork]};
        passes.record_compute(d, id);
        recompute.at(s.stage, s.microbatch) = id++;
      }
      last = id;
      builder.task(id) = {.kind = s.kind, .chunk = chunk, .device = d, .stage = s.stage, .microbatch = s.microbatch,
                          .work = stage_work[std::size_t(s.stage)][std::size_t(pass_index(s.kind))]};
      passes.record_compute(d, id);
      if (s.kind == OpKind::F) forward.at(s.stage, s.microbatch) = id;
      if (s.kind == OpKind::B) backward.at(s.stage, s.microbatch) = id;
      if (s.kind == OpKind::W) weight.at(s.stage, s.microbatch) = id;
      ++id;
    }
    return last;
  }
};

/// Compute dependencies: F on its input, B on its F and the gradient from the next stage, W on B --
/// through the RECV where the neighbouring stage is on another device. R waits for what its B waits
/// for, as Megatron-LM recomputes when the gradient has arrived (B follows R on the stream). An op
/// missing from the orders (a hand-written schedule file) gets no edges; validation names it.
void add_compute_dependencies(const Transfers& t, int microbatches, bool split_weight) {
  const int stages = t.layout.stage_count();
  const auto depend = [&t](TaskId task, TaskId on) {
    if (task != kNoTask && on != kNoTask) t.builder.depend(task, on);
  };
  for (int s = 0; s < stages; ++s)
    for (int m = 0; m < microbatches; ++m) {
      if (s > 0) {
        const TaskId recv = t.activation_recv.at(s, m);
        depend(t.forward.at(s, m), recv != kNoTask ? recv : t.forward.at(s - 1, m));  // same device: direct
      }
      for (const TaskId backward : {t.recompute.at(s, m), t.backward.at(s, m)}) {
        depend(backward, t.forward.at(s, m));
        if (s + 1 < stages) {
          const TaskId recv = t.gradient_recv.at(s, m);
          depend(backward, recv != kNoTask ? recv : t.backward.at(s + 1, m));
        }
      }
      if (split_weight) depend(t.weight.at(s, m), t.backward.at(s, m));
    }
}

/// Megatron-LM's point-to-point without `overlap_p2p_comm` (its default, and the only mode of its
/// 1F1B): each exchange is a batch_isend_irecv that the rank waits for, then a device synchronisation
/// (megatron/core/pipeline_parallel/p2p_communication.py, `_communicate`), so a transfer sits on the
/// compute stream. Here the op after a SEND's producer on its device waits for the SEND. Receives
/// stay posted ahead: a rank that also blocked until it asked for its input would deadlock the
/// schedules built for posted receives (interleaved, V-shaped, zero bubble), which Megatron-LM avoids
/// by batching each step's sends and receives in one call after its compute. In a steady 1F1B, where
/// every rank both sends and receives each step, each transfer is then paid once per step, as there.
void synchronize_transfers(const Transfers& t, TaskId first_compute, const std::vector<std::size_t>& compute_first) {
  for (int s = 0; s < t.layout.stage_count(); ++s)
    for (int m = 0; m < t.forward.microbatches(); ++m)
      for (const TaskId recv : {t.activation_recv.at(s, m), t.gradient_recv.at(s, m)}) {
        if (recv == kNoTask) continue;
        const TaskId send = t.builder.task(recv).partner;
        const Task& sent = t.builder.task(send);
        const TaskId producer = t.producer(sent.payload, sent.stage, sent.microbatch);
        const TaskId device_end = TaskId(first_compute + compute_first[std::size_t(sent.device) + 1]);
        if (producer != kNoTask && producer + 1 < device_end) t.builder.depend(producer + 1, send);
      }
}

/// The ALLTOALL after each F and B of a MoE stage (ExpertComm): on the expert lane of its device, in
/// its compute order; what waits for the F or B waits for it instead (the B of the same microbatch
/// too: the forward's output and loss exist only after the combine), and, when blocking, so does the
/// device's next compute op. The group has one member: the other ranks of the expert-parallel group
/// are the data-parallel replicas of this pipeline, simulated by it (as a DP_ALLREDUCE's are).
void add_expert_exchanges(TaskGraphBuilder& builder, const std::vector<StageWork>& work, OpTable& backward,
                          TaskId first_compute, const std::vector<std::size_t>& compute_first, ExpertComm mode) {
  if (std::none_of(work.begin(), work.end(), [](const StageWork& w) { return w.expert_exchanges > 0; })) return;
  for (std::size_t d = 0; d + 1 < compute_first.size(); ++d) {
    const TaskId device_end = TaskId(first_compute + compute_first[d + 1]);
    for (TaskId id = TaskId(first_compute + compute_first[d]); id < device_end; ++id) {
      const Task op = builder.task(id);
      if ((op.kind != OpKind::F && op.kind != OpKind::B) || op.stage < 0) continue;
      const StageWork& w = work[std::size_t(op.stage)];
      if (w.expert_exchanges == 0) continue;
      const TaskId exchange = builder.add(
          {.kind = OpKind::AllToAll, .payload = op.kind == OpKind::F ? Payload::Activation : Payload::Gradient,
           .lane = std::uint8_t(kExpertLane), .chunk = op.chunk, .device = op.device,
           .stage = op.stage, .microbatch = op.microbatch,
           .work = builder.work({.bytes = 2.0 * w.expert_exchanges * w.exchange_bytes})});
      builder.add_group({.members = {exchange}, .ranks = w.exchange_ranks, .data = CollectiveData::ExpertTokens, .op = ReduceOp::None});
      builder.depend(exchange, id);
      builder.reroute(id, exchange);
      if (op.kind == OpKind::F && backward.at(op.stage, op.microbatch) != kNoTask)
        builder.depend(backward.at(op.stage, op.microbatch), exchange);
      if (mode == ExpertComm::Blocking && id + 1 < device_end) builder.depend(id + 1, exchange);
    }
  }
}

/// Where, in one device's compute order, each of its stages runs its first F, its first B (or R) and
/// its last backward pass (B, or W when split off): the data-parallel collectives of a stage are
/// issued on the lane in the order the compute reaches them.
struct StageSteps {
  int stage;
  std::size_t first_forward, first_backward, last_backward;
};

std::vector<StageSteps> stage_steps(const std::vector<ComputeStep>& order) {
  std::vector<StageSteps> steps;
  for (std::size_t i = 0; i < order.size(); ++i) {
    const ComputeStep& s = order[i];
    if (s.stage < 0) continue;
    auto it = std::find_if(steps.begin(), steps.end(), [&](const StageSteps& x) { return x.stage == s.stage; });
    if (it == steps.end()) it = steps.insert(steps.end(), {s.stage, order.size(), order.size(), 0});
    if (s.kind == OpKind::F) it->first_forward = std::min(it->first_forward, i);
    if (s.kind == OpKind::B) it->first_backward = std::min(it->first_backward, i);
    if (s.kind == OpKind::B || s.kind == OpKind::W) it->last_backward = i;
  }
  return steps;
}

/// The data-parallel collectives and the optimizer step, on collective lane 0 of each device
/// (docs/cost-model.md, "Data parallelism"). Gradients are all-reduced (ZeRO 0) or reduce-scattered
/// (ZeRO 1 to 3): once per device after its last compute op, or per stage after that stage's last
/// backward under overlap_grad_reduce. Under ZeRO 1 and 2 the updated weights are all-gathered after
/// the optimizer step, or under overlap_param_gather before each stage's first F (the next step's,
/// steady state). ZeRO 3 gathers each stage's weights before its first F and again before its first
/// backward, and reduce-scatters its gradients after its last. A device's vocabulary shards belong to
/// no stage: where stages have their own collectives, the shards' gradients are reduced after the
/// device's last compute op and their weights gathered after the optimizer step, by the op of stage
/// -1, which covers whatever no per-stage op of its kind covers (task_graph.h). A tied embedding on
/// two devices has its gradient summed between them first: after each one's last compute op, before
/// the collectives and the optimizer step that read it (Megatron's embedding group).
class DataParallelOps {
 public:
  DataParallelOps(TaskGraphBuilder& builder, const Layout& layout, const std::vector<StageWork>& work,
                  const DataParallelWork& dp)
      : builder_(builder), layout_(layout), work_(work), dp_(dp) {}

  void add(const DeviceOrders& orders, const Transfers& t, const std::vector<TaskId>& last_compute) const {
    const int last_mb = t.forward.microbatches() - 1;
    const std::vector<TaskId> tie = tie_ops(last_compute);
    const int first_stage = 0, last_stage = layout_.stage_count() - 1;
    for (int d = 0; d < layout_.devices; ++d) {
      // What reads the tied gradient waits for its sum: the collective of the stage that holds it
      // (the first or the last, on the device that has a tie op), or of every stage.
      const auto tied_first = [&](TaskId op, int stage = -1) {
        const bool holds = stage < 0 || stage == first_stage || stage == last_stage;
        if (holds && tie[std::size_t(d)] != kNoTask) builder_.depend(op, tie[std::size_t(d)]);
        return op;
      };
      std::vector<StageSteps> steps = stage_steps(orders[std::size_t(d)]);
      const auto by = [&](std::size_t StageSteps::*position) {
        std::sort(steps.begin(), steps.end(), [&](const StageSteps& a, const StageSteps& b) { return a.*position < b.*position; });
        return steps;
      };
      const ZeroSharding& zero = dp_.zero;
      const bool sharded = zero.any();
      const bool gather_before_forward = sharded && (zero.parameters() || dp_.overlap_param_gather);
      if (gather_before_forward)
        for (const StageSteps& s : by(&StageSteps::first_forward))
          before(collective(d, CollectiveData::Parameters, params(s.stage), s.stage), t.forward.at(s.stage, 0));
      if (zero.parameters())
        for (const StageSteps& s : by(&StageSteps::first_backward)) {
          const TaskId r = t.recompute.at(s.stage, 0);
          before(collective(d, CollectiveData::Parameters, params(s.stage), s.stage, Payload::Gradient),
                 r != kNoTask ? r : t.backward.at(s.stage, 0));
        }
      const CollectiveData gradients = sharded ? CollectiveData::GradientShards : CollectiveData::Gradients;
      std::vector<TaskId> reduced;
      if (zero.dp > 1 && (dp_.overlap_grad_reduce || zero.parameters())) {
        for (const StageSteps& s : by(&StageSteps::last_backward)) {
          const TaskId last = t.weight.at(s.stage, last_mb) != kNoTask ? t.weight.at(s.stage, last_mb) : t.backward.at(s.stage, last_mb);
          Tensors g = grads(s.stage);
          // FSDP gathers the next unit's weights while this one's gradients reduce: the same links.
          if (zero.parameters()) g.gathered_beside = params(s.stage).bytes - params(s.stage).embedding;
          reduced.push_back(tied_first(after(collective(d, gradients, g, s.stage), last), s.stage));
        }
        if (dp_.shard_params > 0)
          reduced.push_back(after(collective(d, gradients, {dp_.shard_params * dp_.grad_bytes}), last_compute[std::size_t(d)]));
      } else if (zero.dp > 1) {
        Tensors all{dp_.shard_params * dp_.grad_bytes};
        for (const StageSteps& s : steps) all += grads(s.stage);
        reduced.push_back(tied_first(after(collective(d, gradients, all), last_compute[std::size_t(d)])));
      }
      const TaskId step = tied_first(builder_.add({.kind = OpKind::Optimizer, .device = d}));
      after(step, last_compute[std::size_t(d)]);
      for (const TaskId r : reduced) builder_.depend(step, r);
      if (sharded && !gather_before_forward) {
        Tensors all{dp_.shard_params * dp_.param_bytes};
        for (const StageSteps& s : steps) all += params(s.stage);
        after(collective(d, CollectiveData::Parameters, all), step);
      } else if (gather_before_forward && dp_.shard_params > 0) {
        after(collective(d, CollectiveData::Parameters, {dp_.shard_params * dp_.param_bytes}), step);
      }
    }
  }

 private:
  /// Per device, its member of the tied gradient's all-reduce, or kNoTask.
  std::vector<TaskId> tie_ops(const std::vector<TaskId>& last_compute) const {
    std::vector<TaskId> tie(std::size_t(layout_.devices), kNoTask);
    if (dp_.tied_params <= 0) return tie;
    const WorkId work = builder_.work({.bytes = dp_.tied_params * dp_.grad_bytes});
    std::vector<TaskId> members;
    for (const int d : {layout_.stages.front().device, layout_.stages.back().device}) {
      tie[std::size_t(d)] = builder_.add({.kind = OpKind::AllReduce, .lane = std::uint8_t(vocab_lane::kTiedEmbedding),
                                          .device = d, .work = work});
      members.push_back(after(tie[std::size_t(d)], last_compute[std::size_t(d)]));
    }
    builder_.add_group({.members = std::move(members), .ranks = 2, .data = CollectiveData::TiedEmbedding, .op = ReduceOp::Sum});
    return tie;
  }
  /// A stage's gradients or weights as its DP_ALLREDUCE carries them: all bytes, and the routed experts'.
  struct Tensors {
    double bytes = 0, experts = 0;
    int buckets = 1;  ///< TaskWork::buckets
    double embedding = 0;
    double gathered_beside = 0;  ///< TaskWork::gathered_beside_bytes
    Tensors& operator+=(const Tensors& o) {
      bytes += o.bytes, experts += o.experts;
      return *this;
    }
  };
  Tensors grads(int stage) const { return tensors(stage, dp_.grad_bytes); }
  Tensors params(int stage) const { return tensors(stage, dp_.param_bytes); }
  /// Megatron-LM buckets the data-parallel buffer of the first model chunk of the first pipeline rank
  /// only (Megatron-Core's DistributedDataParallel: later stages' reductions are off the critical
  /// path), so only stage 0's collectives go in buckets; its embedding, reached last by the backward
  /// and first by the forward, apart. FSDP (ZeRO 3) gathers and reduces every stage a layer at a
  /// time, the embedding and the LM head in the root unit, gathered first and reduced last.
  Tensors tensors(int stage, double bytes_each) const {
    const StageWork& w = work_[std::size_t(stage)];
    Tensors t{w.params * bytes_each, w.expert_params * bytes_each};
    if (dp_.zero.parameters()) {
      t.buckets = std::max(1, layout_.stages[std::size_t(stage)].layers);
      t.embedding = (w.embedding_params + w.head_params) * bytes_each;
    } else if (stage == 0 && dp_.bucket_params > 0) {
      t.buckets = std::max(1, int(std::ceil((w.params - w.embedding_params) / dp_.bucket_params)));
      t.embedding = w.embedding_params * bytes_each;
    }
    return t;
  }
  /// A DP_ALLREDUCE of the weights (or gradients) of `stage`, or with -1 of what no per-stage op of its
  /// kind covers on device d (task_graph.h).
  TaskId collective(int d, CollectiveData data, Tensors tensors, int stage = -1, Payload payload = Payload::None) const {
    const TaskWork work{.bytes = tensors.bytes, .expert_bytes = tensors.experts, .buckets = tensors.buckets,
                        .embedding_bytes = tensors.embedding, .gathered_beside_bytes = tensors.gathered_beside};
    const TaskId id = builder_.add({.kind = OpKind::DpAllReduce, .payload = payload, .lane = 0, .device = d, .stage = stage,
                                    .work = builder_.work(work)});
    builder_.add_group({.members = {id}, .ranks = dp_.zero.dp, .data = data, .op = ReduceOp::Sum});
    return id;
  }
  TaskId after(TaskId op, TaskId on) const {
    if (on != kNoTask) builder_.depend(op, on);
    return op;
  }
  void before(TaskId op, TaskId consumer) const {
    if (consumer != kNoTask) builder_.depend(consumer, op);
  }

  TaskGraphBuilder& builder_;
  const Layout& layout_;
  const std::vector<StageWork>& work_;
  const DataParallelWork& dp_;
};

}  // namespace

TaskGraph assemble(const Layout& layout, const DeviceOrders& orders, const std::vector<StageWork>& work,
                   const VocabWork& vocab, int microbatches, Bytes boundary_bytes, const DataParallelWork& data_parallel,
                   P2pMode p2p, const DeviceComms& comms, ExpertComm expert_comm) {
  const int stages = layout.stage_count();
  const bool split_weight = splits_weight(orders);

  // Ops are numbered device by device: first every compute op (vocabulary passes among them), then,
  // derived from the orders, every SEND and RECV. Knowing where each device's ops begin, the two
  // halves of the devices fill in their ops on two threads of a large graph, with the ids, and the
  // dependencies in the order, that adding them one by one would give.
  const auto devices = std::size_t(layout.devices);
  const OpNumbering numbering = number_ops(layout, orders, work);
  const std::size_t compute = numbering.compute_ops(), transfers = numbering.transfer_pairs();
  TaskGraphBuilder builder(layout.devices);
  builder.reserve(compute + 2 * transfers + devices * (data_parallel.zero.dp > 1 ? 2 : 1) +
                      VocabPasses::collective_ops(layout, microbatches),
                  2 * compute + transfers + VocabPasses::collective_dependencies(layout, microbatches));
  const StageWorkIds stage_work = add_stage_work(builder, work, stages, split_weight);
  OpTable forward(stages, microbatches), backward(stages, microbatches), weight(stages, microbatches),
      recompute(stages, microbatches);
  OpTable activation_recv(stages, microbatches), gradient_recv(stages, microbatches);
  std::vector<TaskId> last_compute(devices, kNoTask);
  VocabPasses passes(builder, layout, microbatches, vocab);
  const WorkId boundary = builder.work({.bytes = double(boundary_bytes)});
  const ComputeOps compute_ops{layout, builder, passes, stage_work, work, forward, backward, weight, recompute};
  const Transfers transfer{layout, builder, forward, backward, weight, recompute, activation_recv, gradient_recv, boundary};
  const bool derived = comms.empty();
  const TaskId first_compute = builder.add_blank(compute);
  const TaskId first_transfer = derived ? builder.add_blank(2 * transfers) : kNoTask;
  std::vector<std::pair<TaskId, TaskId>> transfer_edges(derived ? transfers : 0);
  in_two_halves(devices, compute + transfers >= kOpsWorthAThread, [&](std::size_t begin, std::size_t end) {
    for (std::size_t d = begin; d < end; ++d) {
      last_compute[d] = compute_ops.place(orders[d], int(d), TaskId(first_compute + numbering.compute_first[d]));
      if (derived)
        derived_transfers(transfer, orders[d], int(d), TaskId(first_transfer + numbering.transfer_first[d]),
                          transfer_edges.data() + numbering.transfer_first[d] / 2);
    }
  });
  if (derived) builder.depend_all(transfer_edges);
  else file_transfers(transfer, comms);

  add_compute_dependencies(transfer, microbatches, split_weight);
  if (derived && p2p == P2pMode::Synchronous)
    synchronize_transfers(transfer, first_compute, numbering.compute_first);
  if (layout.vocab != VocabPlacement::OnStages)
    passes.connect(builder, layout, [&](int stage, int mb) { return forward.at(stage, mb); },
                   [&](int stage, int mb) { return backward.at(stage, mb); });
  add_expert_exchanges(builder, work, backward, first_compute, numbering.compute_first, expert_comm);
  DataParallelOps(builder, layout, work, data_parallel).add(orders, transfer, last_compute);
  return std::move(builder).build();
}

}  // namespace pipesim
