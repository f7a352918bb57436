#include "vocab_assembly.h"

#include <algorithm>

namespace pipesim {

VocabPasses::VocabPasses(int devices, int microbatches)
    : devices_(devices), microbatches_(microbatches), compute_(std::size_t(devices)) {
  for (auto& table : passes_) table.assign(std::size_t(devices) * std::size_t(microbatches), kNoTask);
}

TaskId VocabPasses::add(TaskGraphBuilder& builder, int device, const ComputeStep& step, const VocabWork& work) {
  Task t{.kind = step.kind, .device = device, .microbatch = step.microbatch};
  Pass p = kS;
  switch (step.kind) {
    case OpKind::S: t.flops = work.s_flops, t.bytes = work.s_bytes, t.alloc_bytes = work.s_activation_bytes; break;
    case OpKind::T: p = kT, t.flops = work.t_flops, t.bytes = work.t_bytes, t.free_bytes = work.s_activation_bytes; break;
    case OpKind::IF: p = kIF, t.bytes = work.input_forward_bytes; break;
    default: p = kIB, t.bytes = work.input_backward_bytes; break;
  }
  const TaskId id = builder.add(t);
  pass(p, device, step.microbatch) = id;
  record_compute(device, id);
  return id;
}

void VocabPasses::record_compute(int device, TaskId id) { compute_[std::size_t(device)].push_back(id); }

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

void VocabPasses::connect(TaskGraphBuilder& builder, const Layout& layout, const VocabWork& work,
                          const std::function<TaskId(int stage, int mb)>& forward,
                          const std::function<TaskId(int stage, int mb)>& backward) {
  const int last = layout.stage_count() - 1;
  const int first_device = layout.stages.front().device, last_device = layout.stages.back().device;
  const bool two_barriers = layout.vocab != VocabPlacement::Vocab2;
  const bool synchronous = layout.vocab == VocabPlacement::Interlaced;
  /// One collective for microbatch x on the lane of its kind: a member per device, each depending
  /// on what that device must have finished (kNoTask: nothing).
  const auto collective = [&](int lane, CollectiveData data, ReduceOp op, int root, int x, double bytes,
                               const std::function<TaskId(int)>& after) {
    const OpKind kind = op == ReduceOp::None ? OpKind::Broadcast : root >= 0 ? OpKind::Reduce : OpKind::AllReduce;
    std::vector<TaskId> members;
    for (int d = 0; d < devices_; ++d) {
      const TaskId member =
          builder.add({.kind = kind, .lane = std::uint8_t(lane), .device = d, .microbatch = x, .bytes = bytes});
      if (const TaskId before = after(d); before != kNoTask) builder.depend(member, before);
      members.push_back(member);
    }
    builder.add_group({.members = members, .ranks = devices_, .data = data, .op = op, .root = root});
    return members;
  };
  using enum CollectiveData;
  for (int x = 0; x < microbatches_; ++x) {
    const auto input = collective(vocab_lane::kInputReduce, InputEmbedding, ReduceOp::Sum, first_device,
                                  x, work.input_reduce_bytes, [&](int d) { return pass(kIF, d, x); });
    builder.depend(forward(0, x), input[std::size_t(first_device)]);
    const auto output = collective(vocab_lane::kOutputBroadcast, OutputX, ReduceOp::None, last_device,
                                   x, work.output_broadcast_bytes,
                                   [&](int d) { return d == last_device ? forward(last, x) : kNoTask; });
    const auto barrier0 = collective(vocab_lane::kBarrier0, SoftmaxStats, ReduceOp::MaxThenSum, -1, x,
                                     work.barrier0_bytes, [&](int d) { return pass(kS, d, x); });
    std::vector<TaskId> barrier1;
    if (two_barriers)
      barrier1 = collective(vocab_lane::kBarrier1, OutputGrad, ReduceOp::Sum, -1, x, work.barrier1_bytes,
                            [&](int d) { return pass(kT, d, x); });
    const auto gradient = collective(vocab_lane::kGradBroadcast, InputGrad, ReduceOp::None, first_device,
                                     x, work.grad_broadcast_bytes,
                                     [&](int d) { return d == first_device ? backward(0, x) : kNoTask; });
    builder.depend(backward(last, x), (two_barriers ? barrier1 : barrier0)[std::size_t(last_device)]);
    for (int d = 0; d < devices_; ++d) {
      builder.depend(pass(kS, d, x), output[std::size_t(d)]);
      builder.depend(pass(kT, d, x), barrier0[std::size_t(d)]);
      builder.depend(pass(kIB, d, x), gradient[std::size_t(d)]);
      if (!synchronous) continue;
      // Tensor-parallel style: after the output layer's T the device waits for its all-reduce before
      // it computes on (T itself already waits for C0, right after S).
      if (const TaskId next = next_compute(d, pass(kT, d, x)); next != kNoTask) builder.depend(next, barrier1[std::size_t(d)]);
    }
  }
}

}  // namespace pipesim
