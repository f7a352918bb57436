#include <algorithm>
#include <array>

#include "plan.h"
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
  OpTable &forward, &backward, &weight;
  OpTable &activation_recv, &gradient_recv;
  WorkId boundary;  ///< a transfer's work: the boundary activation (or its gradient)

  int device_of(int stage) const { return layout.stages[std::size_t(stage)].device; }
  /// The SEND of stage's output (or input gradient) for mb and its RECV on the other device.
  Task transfer(OpKind kind, Payload payload, int stage, int mb) const {
    const int to = payload == Payload::Activation ? stage + 1 : stage - 1;
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

/// Transfers in each producer's program order. A channel's RECVs are issued in the order of its
/// SENDs (receives have no dependencies, so posting them early costs nothing), which keeps every
/// pair matched whatever order the consumer computes in.
void derived_transfers(const Transfers& t, const DeviceOrders& orders) {
  for (int d = 0; d < t.layout.devices; ++d)
    for (const ComputeStep& s : orders[std::size_t(d)]) {
      const Payload payload = sent_out(t.layout, s, d);
      if (payload == Payload::None) continue;
      const TaskId send = t.builder.add(t.transfer(OpKind::Send, payload, s.stage, s.microbatch));
      const TaskId recv = t.builder.add(t.transfer(OpKind::Recv, payload, s.stage, s.microbatch));
      t.builder.pair(send, recv);
      t.builder.depend(send, t.producer(payload, s.stage, s.microbatch));
      t.receives(payload).at(payload == Payload::Activation ? s.stage + 1 : s.stage - 1, s.microbatch) = recv;
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

}  // namespace

TaskGraph assemble(const Layout& layout, const DeviceOrders& orders, const std::vector<StageWork>& work,
                   const VocabWork& vocab, int microbatches, int dp, Bytes boundary_bytes, double grad_bytes_per_param,
                   const DeviceComms& comms) {
  const int stages = layout.stage_count();
  const auto device_of = [&](int stage) { return layout.stages[std::size_t(stage)].device; };
  bool split_weight = false;
  for (const auto& order : orders)
    for (const ComputeStep& s : order) split_weight |= s.kind == OpKind::W;

  TaskGraphBuilder builder(layout.devices);
  {  // compute ops, a SEND and a RECV per boundary crossed, the end of iteration, vocabulary collectives
    std::size_t compute = 0, transfers = 0;
    for (int d = 0; d < layout.devices; ++d)
      for (const ComputeStep& s : orders[std::size_t(d)]) {
        ++compute;
        transfers += sent_out(layout, s, d) != Payload::None;
      }
    builder.reserve(compute + 2 * transfers + std::size_t(layout.devices) * (dp > 1 ? 2 : 1) +
                        VocabPasses::collective_ops(layout, microbatches),
                    2 * compute + transfers + VocabPasses::collective_dependencies(layout, microbatches));
  }
  // Each stage's F, B and W work, one record each.
  std::vector<std::array<WorkId, 3>> stage_work(static_cast<std::size_t>(stages));
  for (int s = 0; s < stages; ++s) {
    const StageWork& w = work[std::size_t(s)];
    stage_work[std::size_t(s)] = {
        builder.work({.flops = w.forward_flops, .bytes = w.forward_bytes, .alloc_bytes = w.activation_bytes}),
        builder.work({.flops = w.backward_flops + (split_weight ? 0 : w.weight_flops),
                      .bytes = w.backward_bytes + (split_weight ? 0 : w.weight_bytes),
                      .free_bytes = w.activation_bytes - (split_weight ? w.weight_held_bytes : 0)}),
        builder.work({.flops = w.weight_flops, .bytes = w.weight_bytes, .free_bytes = w.weight_held_bytes})};
  }
  OpTable forward(stages, microbatches), backward(stages, microbatches), weight(stages, microbatches);
  std::vector<TaskId> last_compute(std::size_t(layout.devices), kNoTask);
  VocabPasses passes(builder, layout, microbatches, vocab);
  for (int d = 0; d < layout.devices; ++d)
    for (const ComputeStep& s : orders[std::size_t(d)]) {
      if (s.stage < 0) {  // a vocabulary pass
        last_compute[std::size_t(d)] = passes.add(builder, d, s);
        continue;
      }
      const Task t{.kind = s.kind, .chunk = std::int8_t(layout.stages[std::size_t(s.stage)].chunk), .device = d,
                   .stage = s.stage, .microbatch = s.microbatch,
                   .work = stage_work[std::size_t(s.stage)][std::size_t(pass_index(s.kind))]};
      const TaskId id = builder.add(t);
      last_compute[std::size_t(d)] = id;
      passes.record_compute(d, id);
      if (s.kind == OpKind::F) forward.at(s.stage, s.microbatch) = id;
      if (s.kind == OpKind::B) backward.at(s.stage, s.microbatch) = id;
      if (s.kind == OpKind::W) weight.at(s.stage, s.microbatch) = id;
    }

  OpTable activation_recv(stages, microbatches), gradient_recv(stages, microbatches);
  const WorkId boundary = builder.work({.bytes = double(boundary_bytes)});
  const Transfers transfers{layout, builder, forward, backward, weight, activation_recv, gradient_recv, boundary};
  if (comms.empty()) derived_transfers(transfers, orders);
  else file_transfers(transfers, comms);

  // Compute dependencies: F on its input, B on its F and the gradient from the next stage, W on B.
  // An op missing from the orders (a hand-written schedule file) gets no edges; validation names it.
  const auto depend = [&builder](TaskId task, TaskId on) {
    if (task != kNoTask && on != kNoTask) builder.depend(task, on);
  };
  for (int s = 0; s < stages; ++s)
    for (int m = 0; m < microbatches; ++m) {
      if (s > 0) {
        const TaskId recv = activation_recv.at(s, m);
        depend(forward.at(s, m), recv != kNoTask ? recv : forward.at(s - 1, m));  // same device: direct
      }
      depend(backward.at(s, m), forward.at(s, m));
      if (s + 1 < stages) {
        const TaskId recv = gradient_recv.at(s, m);
        depend(backward.at(s, m), recv != kNoTask ? recv : backward.at(s + 1, m));
      }
      if (split_weight) depend(weight.at(s, m), backward.at(s, m));
    }

  if (layout.vocab != VocabPlacement::OnStages)
    passes.connect(builder, layout, [&](int stage, int mb) { return forward.at(stage, mb); },
                   [&](int stage, int mb) { return backward.at(stage, mb); });

  // End of iteration: gradient all-reduce over the DP replicas, then the optimizer step.
  std::vector<double> device_params(std::size_t(layout.devices), 0.0);
  for (int s = 0; s < stages; ++s) device_params[std::size_t(device_of(s))] += work[std::size_t(s)].params;
  for (int d = 0; d < layout.devices; ++d) {
    TaskId before = last_compute[std::size_t(d)];
    if (dp > 1) {
      const WorkId gradients = builder.work({.bytes = device_params[std::size_t(d)] * grad_bytes_per_param});
      const TaskId reduce = builder.add({.kind = OpKind::DpAllReduce, .device = d, .work = gradients});
      builder.add_group({.members = {reduce}, .ranks = dp, .data = CollectiveData::Gradients, .op = ReduceOp::Sum});
      if (before != kNoTask) builder.depend(reduce, before);
      before = reduce;
    }
    const TaskId step = builder.add({.kind = OpKind::Optimizer, .device = d});
    if (before != kNoTask) builder.depend(step, before);
  }
  return std::move(builder).build();
}

}  // namespace pipesim
