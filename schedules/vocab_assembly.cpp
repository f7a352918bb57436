#include "vocab_assembly.h"

#include <algorithm>

namespace pipesim {

VocabPasses::VocabPasses(TaskGraphBuilder& builder, const Layout& layout, int microbatches, const VocabWork& work)
    : devices_(layout.devices),
      microbatches_(microbatches),
      synchronous_(layout.vocab == VocabPlacement::Interlaced),
      compute_(std::size_t(layout.devices)) {
  for (auto& table : passes_) table.assign(std::size_t(devices_) * std::size_t(microbatches), kNoTask);
  if (layout.vocab == VocabPlacement::OnStages) return;
  pass_work_[kS] = builder.work({.flops = work.s_flops, .bytes = work.s_bytes, .alloc_bytes = work.s_activation_bytes});
  pass_work_[kT] = builder.work({.flops = work.t_flops, .bytes = work.t_bytes, .free_bytes = work.s_activation_bytes});
  pass_work_[kIF] = builder.work({.bytes = work.input_forward_bytes});
  pass_work_[kIB] = builder.work({.bytes = work.input_backward_bytes});
  using namespace vocab_lane;
  for (const auto& [lane, bytes] : {std::pair{kInputReduce, work.input_reduce_bytes},
                                    {kOutputBroadcast, work.output_broadcast_bytes},
                                    {kBarrier0, work.barrier0_bytes},
                                    {kBarrier1, work.barrier1_bytes},
                                    {kGradBroadcast, work.grad_broadcast_bytes}})
    collective_work_[lane] = builder.work({.bytes = bytes});
}

void VocabPasses::place(TaskGraphBuilder& builder, TaskId id, int device, const ComputeStep& step) {
  const Pass p = step.kind == OpKind::S ? kS : step.kind == OpKind::T ? kT : step.kind == OpKind::IF ? kIF : kIB;
  builder.task(id) = {.kind = step.kind, .device = device, .microbatch = step.microbatch, .work = pass_work_[p]};
  pass(p, device, step.microbatch) = id;
  record_compute(device, id);
}

void VocabPasses::record_compute(int device, TaskId id) {
  if (synchronous_) compute_[std::size_t(device)].push_back(id);
}

TaskId VocabPasses::next_compute(int device, TaskId id) const {
  // A device's tasks are added in its program order, so its ids rise.
  const auto& order = compute_[std::size_t(device)];
  const auto it = std::lower_bound(order.begin(), order.end(), id);
  return it != order.end() && *it == id && it + 1 != order.end() ? *(it + 1) : kNoTask;
}

std::size_t VocabPasses::collective_ops(const Layout& layout, int microbatches) {
  if (layout.vocab == VocabPlacement::OnStages) return 0;
  // Input reduce, output broadcast, barrier C0, gradient broadcast, and C1 with two barriers.
  const std::size_t collectives = layout.vocab == VocabPlacement::Vocab2 ? 4 : 5;
  return collectives * std::size_t(layout.devices) * std::size_t(microbatches);
}

std::size_t VocabPasses::collective_dependencies(const Layout& layout, int microbatches) {
  if (layout.vocab == VocabPlacement::OnStages) return 0;
  // One per member at most, two per microbatch for the first and last stage, and up to four per
  // device and microbatch for the passes.
  return collective_ops(layout, microbatches) + std::size_t(microbatches) * (2 + 4 * std::size_t(layout.devices));
}

void VocabPasses::connect(TaskGraphBuilder& builder, const Layout& layout,
                          const std::function<TaskId(int stage, int mb)>& forward,
                          const std::function<TaskId(int stage, int mb)>& backward) {
  const int last = layout.stage_count() - 1;
  const int first_device = layout.stages.front().device, last_device = layout.stages.back().device;
  const bool two_barriers = layout.vocab != VocabPlacement::Vocab2;
  /// One collective for microbatch x on the lane of its kind: a member per device, each depending
  /// on what that device must have finished (kNoTask: nothing). The members are added one after
  /// another: device d's is the returned id + d.
  const auto collective = [&](int lane, CollectiveData data, ReduceOp op, int root, int x, auto after, int rounds = 1) {
    const OpKind kind = op == ReduceOp::None ? OpKind::Broadcast : root >= 0 ? OpKind::Reduce : OpKind::AllReduce;
    std::vector<TaskId> members;
    members.reserve(std::size_t(devices_));
    for (int d = 0; d < devices_; ++d) {
      const TaskId member =
          builder.add({.kind = kind, .lane = std::uint8_t(lane), .device = d, .microbatch = x,
                       .work = collective_work_[lane]});
      if (const TaskId before = after(d); before != kNoTask) builder.depend(member, before);
      members.push_back(member);
    }
    const TaskId first = members.front();
    builder.add_group({.members = std::move(members), .ranks = devices_, .data = data, .op = op, .root = root,
                       .rounds = rounds});
    return first;
  };
  using enum CollectiveData;
  for (int x = 0; x < microbatches_; ++x) {
    const TaskId input = collective(vocab_lane::kInputReduce, InputEmbedding, ReduceOp::Sum, first_device, x,
                                    [&](int d) { return pass(kIF, d, x); });
    builder.depend(forward(0, x), input + first_device);
    const TaskId output = collective(vocab_lane::kOutputBroadcast, OutputX, ReduceOp::None, last_device, x,
                                     [&](int d) { return d == last_device ? forward(last, x) : kNoTask; });
    // C0: the max M, then S and z; with Algorithm 2 also dX (docs/runtime.md, "The vocabulary passes").
    const TaskId barrier0 = collective(vocab_lane::kBarrier0, SoftmaxStats, ReduceOp::MaxThenSum, -1, x,
                                       [&](int d) { return pass(kS, d, x); }, two_barriers ? 2 : 3);
    TaskId barrier1 = kNoTask;
    if (two_barriers)
      barrier1 = collective(vocab_lane::kBarrier1, OutputGrad, ReduceOp::Sum, -1, x,
                            [&](int d) { return pass(kT, d, x); });
    const TaskId gradient = collective(vocab_lane::kGradBroadcast, InputGrad, ReduceOp::None, first_device, x,
                                       [&](int d) { return d == first_device ? backward(0, x) : kNoTask; });
    builder.depend(backward(last, x), (two_barriers ? barrier1 : barrier0) + last_device);
    for (int d = 0; d < devices_; ++d) {
      builder.depend(pass(kS, d, x), output + d);
      builder.depend(pass(kT, d, x), barrier0 + d);
      builder.depend(pass(kIB, d, x), gradient + d);
      if (!synchronous_) continue;
      // Tensor-parallel style: after the output layer's T the device waits for its all-reduce before
      // it computes on (T itself already waits for C0, right after S).
      if (const TaskId next = next_compute(d, pass(kT, d, x)); next != kNoTask) builder.depend(next, barrier1 + d);
    }
  }
}

}  // namespace pipesim
