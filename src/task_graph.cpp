#include "task_graph.h"

#include <fmt/format.h>

#include <algorithm>
#include <bit>

#include "two_threads.h"

namespace pipesim {

std::string_view op_kind_name(OpKind kind) {
  switch (kind) {
    case OpKind::F: return "F";
    case OpKind::B: return "B";
    case OpKind::W: return "W";
    case OpKind::R: return "R";
    case OpKind::S: return "S";
    case OpKind::T: return "T";
    case OpKind::IF: return "IF";
    case OpKind::IB: return "IB";
    case OpKind::Send: return "SEND";
    case OpKind::Recv: return "RECV";
    case OpKind::AllReduce: return "ALLREDUCE";
    case OpKind::Broadcast: return "BROADCAST";
    case OpKind::Reduce: return "REDUCE";
    case OpKind::DpAllReduce: return "DP_ALLREDUCE";
    case OpKind::AllToAll: return "ALLTOALL";
    case OpKind::Optimizer: return "OPTIMIZER";
  }
  return "?";
}

std::span<const TaskId> TaskGraph::stream_order(int device, Stream kind, int peer) const {
  Task probe;
  probe.device = device;
  probe.peer = peer;
  probe.lane = std::uint8_t(std::max(peer, 0));
  probe.kind = kind == Stream::Compute      ? OpKind::F
               : kind == Stream::Collective ? OpKind::AllReduce
               : kind == Stream::Send       ? OpKind::Send
                                            : OpKind::Recv;
  return stream(stream_of(probe));
}

Stream TaskGraph::stream_kind_of(std::size_t s) const {
  const std::size_t local = s % streams_per_device();
  if (local == 0) return Stream::Compute;
  if (local < kFirstSend) return Stream::Collective;
  return local < kFirstSend + std::size_t(devices_) ? Stream::Send : Stream::Recv;
}

std::string TaskGraph::stream_name(std::size_t s) const {
  const std::size_t local = s % streams_per_device();
  switch (stream_kind_of(s)) {
    case Stream::Compute: return "compute";
    case Stream::Collective: return fmt::format("collective {}", local - 1);
    case Stream::Send: return fmt::format("send->d{}", local - kFirstSend);
    case Stream::Recv: return fmt::format("recv<-d{}", local - kFirstSend - std::size_t(devices_));
  }
  return "?";
}

std::string TaskGraph::describe(TaskId id) const {
  const Task& t = task(id);
  switch (t.kind) {
    case OpKind::Send:
    case OpKind::Recv: {
      const bool send = t.kind == OpKind::Send;
      return fmt::format("{}(d{}{}d{},{},s{},m{})", op_kind_name(t.kind), t.device, send ? "->" : "<-", t.peer,
                         t.payload == Payload::Activation ? "act" : "grad", t.stage, t.microbatch);
    }
    case OpKind::AllToAll:
      return fmt::format("{}(d{},{},s{},m{})", op_kind_name(t.kind), t.device,
                         t.payload == Payload::Activation ? "fwd" : "bwd", t.stage, t.microbatch);
    case OpKind::DpAllReduce:
    case OpKind::Optimizer: return fmt::format("{}(d{})", op_kind_name(t.kind), t.device);
    case OpKind::AllReduce:
    case OpKind::Broadcast:
    case OpKind::Reduce: return fmt::format("{}(d{},lane{},m{})", op_kind_name(t.kind), t.device, t.lane, t.microbatch);
    case OpKind::S:
    case OpKind::T:
    case OpKind::IF:
    case OpKind::IB: return fmt::format("{}(d{},m{})", op_kind_name(t.kind), t.device, t.microbatch);
    default: break;
  }
  if (t.microbatch < 0) return fmt::format("{}(d{},s{})", op_kind_name(t.kind), t.device, t.stage);
  return fmt::format("{}(d{},s{},m{})", op_kind_name(t.kind), t.device, t.stage, t.microbatch);
}

std::size_t TaskGraph::memory_bytes() const {
  const auto bytes = [](const auto& v) { return v.capacity() * sizeof(v[0]); };
  std::size_t total = bytes(tasks_) + bytes(works_) + bytes(dep_offsets_) + bytes(dep_ids_) + bytes(succ_offsets_) +
                      bytes(succ_ids_) + bytes(stream_offsets_) + bytes(stream_ids_) + bytes(groups_);
  for (const CollectiveGroup& g : groups_) total += bytes(g.members);
  return total;
}

TaskGraphBuilder::TaskGraphBuilder(int devices) : devices_(devices) {}

void TaskGraphBuilder::reserve(std::size_t tasks, std::size_t edges) {
  tasks_.reserve(tasks);
  edges_.reserve(edges);
}

std::size_t TaskGraphBuilder::WorkHash::operator()(const TaskWork& w) const {
  std::size_t h = 0;
  for (std::uint64_t bits : {std::bit_cast<std::uint64_t>(w.flops), std::bit_cast<std::uint64_t>(w.bytes), std::bit_cast<std::uint64_t>(w.expert_bytes),
                             std::uint64_t(w.alloc_bytes), std::uint64_t(w.free_bytes), std::uint64_t(w.buckets),
                             std::bit_cast<std::uint64_t>(w.embedding_bytes), std::bit_cast<std::uint64_t>(w.gathered_beside_bytes)})
    h = (h ^ bits) * 0x9E3779B97F4A7C15ull;
  return h;
}

WorkId TaskGraphBuilder::work(const TaskWork& work) {
  const auto [known, added] = work_ids_.try_emplace(work, WorkId(works_.size()));
  if (added) works_.push_back(work);
  return known->second;
}

TaskId TaskGraphBuilder::add(const Task& task) {
  tasks_.push_back(task);
  return static_cast<TaskId>(tasks_.size() - 1);
}

TaskId TaskGraphBuilder::add_blank(std::size_t count) {
  const auto first = static_cast<TaskId>(tasks_.size());
  tasks_.resize(tasks_.size() + count);
  return first;
}

void TaskGraphBuilder::depend(TaskId task, TaskId on) { edges_.emplace_back(task, on); }

void TaskGraphBuilder::depend_all(std::span<const std::pair<TaskId, TaskId>> edges) {
  edges_.insert(edges_.end(), edges.begin(), edges.end());
}

void TaskGraphBuilder::pair(TaskId send, TaskId recv) {
  tasks_[static_cast<std::size_t>(send)].partner = recv;
  tasks_[static_cast<std::size_t>(recv)].partner = send;
}

int TaskGraphBuilder::add_group(CollectiveGroup group) {
  const int index = static_cast<int>(groups_.size());
  for (TaskId member : group.members) tasks_[static_cast<std::size_t>(member)].group = index;
  groups_.push_back(std::move(group));
  return index;
}

namespace {

/// Counting sort of items 0 .. count - 1 into CSR form; values keep their item order per key. The
/// items are placed last to first, each key's end counting down to its start, so the offsets are
/// the only array besides the result (no cursor copy: at hundreds of thousands of ops, every array
/// is megabytes the kernel must zero).
template <class KeyOf, class ValueOf>
void build_csr(std::size_t keys, std::size_t count, KeyOf key_of, ValueOf value_of, std::vector<EdgeIndex>& offsets,
               IdArray& ids) {
  offsets.assign(keys + 1, 0);
  for (std::size_t i = 0; i < count; ++i) ++offsets[key_of(i)];
  for (std::size_t k = 1; k <= keys; ++k) offsets[k] += offsets[k - 1];  // offsets[k]: end of key k
  ids.resize(count);
  for (std::size_t i = count; i-- > 0;)
    ids[static_cast<std::size_t>(--offsets[key_of(i)])] = static_cast<TaskId>(value_of(i));
}

}  // namespace

void TaskGraphBuilder::reroute(TaskId op, TaskId instead) {
  if (reroutes_.size() <= std::size_t(op)) reroutes_.resize(tasks_.size(), kNoTask);
  reroutes_[std::size_t(op)] = instead;
}

TaskGraph TaskGraphBuilder::build() && {
  for (auto& [task, on] : edges_)
    if (std::size_t(on) < reroutes_.size() && reroutes_[std::size_t(on)] != kNoTask && reroutes_[std::size_t(on)] != task)
      on = reroutes_[std::size_t(on)];
  TaskGraph graph;
  graph.devices_ = devices_;
  const auto task = [this](std::size_t i) { return static_cast<std::size_t>(edges_[i].first); };
  const auto on = [this](std::size_t i) { return static_cast<std::size_t>(edges_[i].second); };
  // The three lists share nothing they write: on a large graph, the dependencies and the streams
  // (about as much work as the successors) on a second thread.
  const std::size_t ops = tasks_.size(), edges = edges_.size();
  std::future<void> deps_and_streams = beside(ops >= kOpsWorthAThread, [&] {
    build_csr(ops, edges, task, on, graph.dep_offsets_, graph.dep_ids_);
    // Each op's stream, worked out once for both passes of the counting sort; the kinds present, and
    // whether an op off the compute streams holds memory.
    std::vector<std::uint32_t> stream(ops);
    for (std::size_t i = 0; i < ops; ++i) {
      const Task& t = tasks_[i];
      stream[i] = std::uint32_t(graph.stream_of(t));
      graph.kinds_ |= 1u << static_cast<int>(t.kind);
      if (!is_compute(t.kind) && (works_[t.work].alloc_bytes != 0 || works_[t.work].free_bytes != 0))
        graph.memory_on_compute_only_ = false;
    }
    build_csr(
        std::size_t(devices_) * graph.streams_per_device(), ops, [&stream](std::size_t i) { return stream[i]; },
        [](std::size_t i) { return static_cast<TaskId>(i); }, graph.stream_offsets_, graph.stream_ids_);
  });
  build_csr(ops, edges, on, task, graph.succ_offsets_, graph.succ_ids_);
  deps_and_streams.get();

  graph.tasks_ = std::move(tasks_);
  // Grown past a reserve() by doubling, it may hold twice its size: give that back. A close reserve
  // is kept as it is (a copy of every op costs more than the slack).
  if (graph.tasks_.capacity() > graph.tasks_.size() + graph.tasks_.size() / 4) graph.tasks_.shrink_to_fit();
  graph.groups_ = std::move(groups_);
  graph.works_ = std::move(works_);
  return graph;
}

}  // namespace pipesim
