#pragma once
/// The task graph: the one representation that schedules produce and that both the simulator and
/// the runtime execute. Each device issues its ops on streams, each stream strictly in program
/// order; an op starts when its stream is free and all its dependencies are done. SEND/RECV are
/// matched pairs that start together (rendezvous, NCCL semantics); collectives start when every
/// member of their group has reached them.
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "units.h"

namespace pipesim {

/// A closed set: every `switch` over it is exhaustive (-Wswitch is an error under werror).
enum class OpKind : std::uint8_t {
  F,            ///< forward of one virtual stage for one microbatch
  B,            ///< backward; input-gradient only when the schedule splits off W
  W,            ///< weight-gradient pass
  R,            ///< recomputation of a stage's activations from its saved input, just before its B
  S,            ///< vocabulary output pass: logits, local max and sum-exp
  T,            ///< vocabulary output pass: softmax gradient and dW
  IF,           ///< vocabulary input pass: sharded embedding lookup
  IB,           ///< vocabulary input pass: sharded embedding gradient
  Send,         ///< point-to-point send of an activation or gradient
  Recv,         ///< the matching receive
  AllReduce,    ///< collective over a group of devices
  Broadcast,
  Reduce,
  DpAllReduce,  ///< data-parallel collective: gradient all-reduce, or ZeRO's reduce-scatter and all-gather
  Optimizer,    ///< end-of-iteration optimizer step
  /// A MoE stage's expert-parallel token exchange after its F (payload Activation) or its B (Gradient):
  /// the dispatch and combine all-to-alls of its MoE layers (docs/ir.md, "Mixture of experts")
  AllToAll,
};
constexpr int kOpKindCount = 16;
/// 0, 1, 2 for F, B, W: where a transformer pass goes in tables kept per (pass, stage, microbatch);
/// -1 for every other kind.
constexpr int pass_index(OpKind kind) {
  return kind == OpKind::F ? 0 : kind == OpKind::B ? 1 : kind == OpKind::W ? 2 : -1;
}
std::string_view op_kind_name(OpKind kind);

/// Kinds of stream. Every device has one compute stream, kCollectiveLanes collective streams (one
/// per communicator: collectives on different lanes never wait for each other), and towards every
/// other device one send stream and one receive stream: a point-to-point channel per ordered device
/// pair, whose SENDs and RECVs pair up in order, as NCCL matches them.
enum class Stream : std::uint8_t { Compute, Collective, Send, Recv };
constexpr int kCollectiveLanes = 7;
/// The collective lane of the ALLTOALL ops (a MoE stage's expert-parallel exchanges): the last, which
/// no other op takes, so the runtime's expert-parallel group may use it too (runtime/executor.cpp).
constexpr int kExpertLane = kCollectiveLanes - 1;
/// Defined here, like TaskGraph::stream_of, because the simulator and the graph's builder ask it of
/// every op.
constexpr Stream stream_kind(OpKind kind) {
  switch (kind) {
    case OpKind::F:
    case OpKind::B:
    case OpKind::W:
    case OpKind::R:
    case OpKind::S:
    case OpKind::T:
    case OpKind::IF:
    case OpKind::IB:
    case OpKind::Optimizer: return Stream::Compute;
    case OpKind::Send: return Stream::Send;
    case OpKind::Recv: return Stream::Recv;
    case OpKind::AllReduce:
    case OpKind::Broadcast:
    case OpKind::Reduce:
    case OpKind::DpAllReduce:
    case OpKind::AllToAll: return Stream::Collective;
  }
  return Stream::Compute;
}
constexpr bool is_compute(OpKind kind) { return stream_kind(kind) == Stream::Compute; }

/// What a SEND/RECV carries; on an ALLTOALL, whether the forward's or the backward's; on a
/// DP_ALLREDUCE of weights under ZeRO 3, Gradient marks the gather for the backward.
enum class Payload : std::uint8_t { None, Activation, Gradient };
/// The stage a transfer feeds: a SEND/RECV's `stage` is the stage that produced the data, an
/// activation goes to the stage after it and a gradient to the stage before.
constexpr int fed_stage(int stage, Payload payload) { return payload == Payload::Activation ? stage + 1 : stage - 1; }

using TaskId = std::int32_t;
constexpr TaskId kNoTask = -1;
/// A position in one of the graph's edge (or stream) lists. 32 bits: a graph has at most
/// limits::kTasks = 2^28 ops, none with 16 dependencies, so its lists hold under 2^32 entries.
using EdgeIndex = std::uint32_t;

/// What an op computes, moves and holds. Ops with the same figures (a stage's forwards, every
/// transfer across one boundary, ...) share one record, so that a graph carries a few hundred of
/// them however many ops it has.
struct TaskWork {
  double flops = 0;       ///< compute ops: floating-point operations
  double bytes = 0;       ///< compute ops: HBM traffic; comm ops: payload size
  Bytes alloc_bytes = 0;  ///< activation memory taken when the op starts
  Bytes free_bytes = 0;   ///< activation memory returned when the op ends
  /// DP_ALLREDUCE: the part of `bytes` that is routed experts' tensors, which go round the expert
  /// data-parallel group instead (parallel_shape.h, expert_data_parallel).
  double expert_bytes = 0;
  /// DP_ALLREDUCE of a stage whose collective goes in buckets beside a pass (Megatron-LM's first model
  /// chunk, FSDP's layers under ZeRO 3; docs/cost-model.md, "The training job"): how many buckets the
  /// layers' tensors fill, and the bytes among `bytes` that the backward fills last and the forward
  /// needs first (the embedding's; under ZeRO 3 the LM head's too). 1: one collective after (or
  /// before) the pass, as the graph orders it.
  std::int32_t buckets = 1;
  double embedding_bytes = 0;
  /// DP_ALLREDUCE of a stage's gradients under ZeRO 3: the bytes of its layers' weights that FSDP
  /// gathers a unit at a time during the same backward, over the same links as these gradients'
  /// reduce-scatters (docs/cost-model.md, "The training job").
  double gathered_beside_bytes = 0;
  bool operator==(const TaskWork&) const = default;
};
/// Index into TaskGraph's work records; 0 is the record of an op that does no work.
using WorkId = std::uint32_t;
constexpr WorkId kNoWork = 0;

/// 32 bytes, half a cache line: a graph holds up to millions, and every phase walks them.
struct Task {
  OpKind kind = OpKind::F;
  Payload payload = Payload::None;
  std::uint8_t lane = 0;         ///< collectives: which collective stream, 0 .. kCollectiveLanes - 1
  std::int8_t chunk = -1;        ///< model chunk on the device (limits::kChunks); -1 for per-device ops
  std::int32_t device = 0;
  /// Virtual stage; -1 for per-device ops. A DP_ALLREDUCE of stage s moves that stage's tensors; one
  /// of -1 moves every tensor of its device that no per-stage DP_ALLREDUCE of its kind (gradients or
  /// weights) moves: all of them, or where stages have their own, the vocabulary shards.
  std::int32_t stage = -1;
  std::int32_t microbatch = -1;  ///< -1 for per-iteration ops
  std::int32_t peer = -1;        ///< SEND/RECV: the device at the other end
  TaskId partner = kNoTask;      ///< SEND/RECV: the matched op on the peer
  std::int32_t group = -1;       ///< collectives: index into TaskGraph::groups()
  WorkId work = kNoWork;         ///< TaskGraph::work_of; from TaskGraphBuilder::work
};
static_assert(sizeof(Task) == 32);

/// What a collective combines. Every executor reads a collective's meaning from here (the runtime
/// picks its buffers by it), never from the lane it runs on.
enum class CollectiveData : std::uint8_t {
  Gradients,       ///< DP_ALLREDUCE: weight gradients all-reduced over the data-parallel replicas
  GradientShards,  ///< DP_ALLREDUCE under ZeRO: weight gradients reduce-scattered (each replica its shard)
  Parameters,      ///< DP_ALLREDUCE under ZeRO: updated (or, at stage 3, needed) weights all-gathered
  InputEmbedding,  ///< REDUCE: the IF outputs summed into the first stage's input
  OutputX,         ///< BROADCAST: the last stage's output X to every device
  SoftmaxStats,    ///< ALLREDUCE, barrier C0: M, then S and z (+ dX with Algorithm 2)
  OutputGrad,      ///< ALLREDUCE, barrier C1: Σ dX_i (Algorithm 1, interlaced)
  InputGrad,       ///< BROADCAST: the first stage's input gradient dY to every device
  TiedEmbedding,   ///< ALLREDUCE: a tied embedding's gradient, summed between the first stage's device and the last's
  ExpertTokens,    ///< ALLTOALL: MoE layers' routed tokens (or their gradients) to their experts and back
};

enum class ReduceOp : std::uint8_t {
  None,        ///< BROADCAST
  Sum,
  Max,
  MaxThenSum,  ///< barrier C0: a max round (M), then sum rounds of values rescaled by it
};

/// Members of one collective, plus the number of ranks the collective spans (which may exceed the
/// members simulated here: a DP all-reduce runs over `ranks` replicas of which one is simulated).
struct CollectiveGroup {
  std::vector<TaskId> members;
  int ranks = 1;
  CollectiveData data = CollectiveData::Gradients;
  ReduceOp op = ReduceOp::Sum;
  int root = -1;  ///< BROADCAST and REDUCE: the device that holds the source or gets the result; -1 otherwise
  /// Collectives run one after another inside the op, each waiting for the last: barrier C0 takes a
  /// max round, then a sum round (and with Algorithm 2 a third for dX). `TaskWork::bytes` is their
  /// total; every round pays the collective's latency.
  int rounds = 1;
};

/// The allocator of the op array and the CSR id lists, which writes nothing where an array grows:
/// every op is written whole before it is read (add() copies one in, add_blank()'s callers fill in
/// theirs), and Task, an aggregate, begins to exist with its storage; the counting sort that builds
/// a CSR list writes each entry once. Millions of entries are then written once, by the threads
/// that fill them, not first with defaults by one.
template <class T>
struct UnfilledAllocator : std::allocator<T> {
  template <class U>
  struct rebind {
    using other = UnfilledAllocator<U>;
  };
  template <class U>
  void construct(U*) noexcept {}
  template <class U, class... Args>
  void construct(U* at, Args&&... args) {
    ::new (static_cast<void*>(at)) U(std::forward<Args>(args)...);
  }
};
using TaskArray = std::vector<Task, UnfilledAllocator<Task>>;
using IdArray = std::vector<TaskId, UnfilledAllocator<TaskId>>;

/// Frozen, index-based graph: copies and compares cheaply, borrowed by const&.
class TaskGraph {
 public:
  int devices() const { return devices_; }
  std::size_t size() const { return tasks_.size(); }
  const Task& task(TaskId id) const { return tasks_[static_cast<std::size_t>(id)]; }
  std::span<const Task> tasks() const { return tasks_; }
  /// Whether any op is of `kind` (noted as the graph is built, not searched for).
  bool has(OpKind kind) const { return kinds_ >> static_cast<int>(kind) & 1u; }
  /// Whether only compute ops take or return activation memory (noted as the graph is built): the
  /// memory held over time can then be read from the compute streams alone.
  bool memory_on_compute_only() const { return memory_on_compute_only_; }
  const TaskWork& work_of(const Task& task) const { return works_[task.work]; }
  const TaskWork& work(TaskId id) const { return work_of(task(id)); }
  /// The ops `id` waits for (besides its stream predecessor and its rendezvous partners).
  std::span<const TaskId> deps(TaskId id) const { return csr(dep_offsets_, dep_ids_, id); }
  /// The ops that wait for `id`: deps() inverted, kept so executors need not rebuild it.
  std::span<const TaskId> successors(TaskId id) const { return csr(succ_offsets_, succ_ids_, id); }
  /// Starts fetching where successors(id) begins, for a sweep that will ask for it soon. (Always
  /// inlined: GCC finds a function that only prefetches free of effects and drops the call.)
  [[gnu::always_inline]] void prefetch_successors(TaskId id) const {
    __builtin_prefetch(&succ_offsets_[static_cast<std::size_t>(id)]);
  }
  /// Streams are numbered device by device: [first_stream(d), first_stream(d + 1)) are device d's.
  std::size_t stream_count() const { return stream_offsets_.size() - 1; }
  std::size_t first_stream(int device) const { return std::size_t(device) * streams_per_device(); }
  /// The stream `id` runs on.
  std::size_t stream_of(TaskId id) const { return stream_of(task(id)); }
  std::size_t stream_of(const Task& task) const {
    const std::size_t base = first_stream(task.device);
    switch (stream_kind(task.kind)) {
      case Stream::Compute: return base;
      case Stream::Collective: return base + 1 + std::size_t(task.lane);
      case Stream::Send: return base + kFirstSend + std::size_t(task.peer);
      case Stream::Recv: return base + kFirstSend + std::size_t(devices_) + std::size_t(task.peer);
    }
    return base;
  }
  /// Ops of a stream, in program order.
  std::span<const TaskId> stream(std::size_t s) const {
    return {stream_ids_.data() + stream_offsets_[s], stream_ids_.data() + stream_offsets_[s + 1]};
  }
  /// Ops of one device's stream of `kind` (towards `peer` for Send and Recv, on lane `peer` for
  /// Collective), in program order.
  std::span<const TaskId> stream_order(int device, Stream kind, int peer = -1) const;
  Stream stream_kind_of(std::size_t s) const;
  int stream_device(std::size_t s) const { return int(s / streams_per_device()); }
  /// "compute", "collective 2", "send->d3" or "recv<-d1".
  std::string stream_name(std::size_t s) const;
  std::span<const CollectiveGroup> groups() const { return groups_; }
  /// The collective `id` is a member of (a collective op's group).
  const CollectiveGroup& group_of(TaskId id) const { return groups_[static_cast<std::size_t>(task(id).group)]; }
  /// Short human name, e.g. `F(d0,s0,m1)` or `SEND(d0->d1,act,s0,m1)`.
  std::string describe(TaskId id) const;
  /// Bytes the graph holds (ops, edges, streams, groups): what `pipesim bench` reports per op.
  std::size_t memory_bytes() const;

 private:
  friend class TaskGraphBuilder;
  /// Device d's streams, from first_stream(d): compute, the collective lanes, send to each device,
  /// receive from each device (the entries for d itself stay empty).
  static constexpr std::size_t kFirstSend = 1 + kCollectiveLanes;
  std::size_t streams_per_device() const { return 1 + kCollectiveLanes + 2 * std::size_t(devices_); }
  static std::span<const TaskId> csr(const std::vector<EdgeIndex>& offsets, const IdArray& ids, TaskId id) {
    const auto i = static_cast<std::size_t>(id);
    return {ids.data() + offsets[i], ids.data() + offsets[i + 1]};
  }
  int devices_ = 0;
  std::uint32_t kinds_ = 0;  ///< bit k: some op is of OpKind k
  static_assert(kOpKindCount <= 32);
  bool memory_on_compute_only_ = true;
  TaskArray tasks_;
  std::vector<TaskWork> works_;
  std::vector<EdgeIndex> dep_offsets_;  ///< CSR: deps of task i are dep_ids_[off[i]..off[i+1])
  IdArray dep_ids_;
  std::vector<EdgeIndex> succ_offsets_;  ///< CSR of successors, same layout
  IdArray succ_ids_;
  std::vector<EdgeIndex> stream_offsets_{0};  ///< CSR over streams (see first_stream)
  IdArray stream_ids_;
  std::vector<CollectiveGroup> groups_;
};

/// Appends ops in program order per (device, stream), records edges, and freezes a TaskGraph.
class TaskGraphBuilder {
 public:
  explicit TaskGraphBuilder(int devices);
  /// Room for this many ops and edges: a builder that knows its size grows without copying.
  void reserve(std::size_t tasks, std::size_t edges);
  /// The id of the work record with these figures, added if new: give it to every Task doing them.
  WorkId work(const TaskWork& work);
  TaskId add(const Task& task);
  /// Adds `count` tasks to be filled in through task(id), possibly from several threads (each its
  /// own ids), before the graph is built: until then they hold nothing. Returns the first id.
  TaskId add_blank(std::size_t count);
  /// `task` may start only after `on` has finished.
  void depend(TaskId task, TaskId on);
  /// depend() for each (task, on) in turn.
  void depend_all(std::span<const std::pair<TaskId, TaskId>> edges);
  /// Every op that waits for `op` waits for `instead` (an op that waits for `op`) when the graph is
  /// built: `op`'s results are ready only once `instead` is done (a MoE stage's F, after its ALLTOALL).
  void reroute(TaskId op, TaskId instead);
  /// Matches a SEND with its RECV; both start together.
  void pair(TaskId send, TaskId recv);
  /// Registers a collective; each member's `group` is set.
  int add_group(CollectiveGroup group);
  Task& task(TaskId id) { return tasks_[static_cast<std::size_t>(id)]; }
  TaskGraph build() &&;

 private:
  int devices_;
  TaskArray tasks_;
  struct WorkHash {
    std::size_t operator()(const TaskWork& work) const;
  };
  std::vector<TaskWork> works_{TaskWork{}};
  std::unordered_map<TaskWork, WorkId, WorkHash> work_ids_{{TaskWork{}, kNoWork}};
  std::vector<std::pair<TaskId, TaskId>> edges_;  ///< (task, on)
  std::vector<TaskId> reroutes_;                  ///< by op: reroute()'s `instead`, or kNoTask
  std::vector<CollectiveGroup> groups_;
};

}  // namespace pipesim
