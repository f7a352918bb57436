#include "inprocess_comm.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <functional>
#include <numeric>
#include <stdexcept>
#include <string>

#include <fmt/format.h>

namespace pipesim::runtime {
namespace {

enum class Collective { AllReduce, Broadcast, Reduce, AllGather, ReduceScatter, AllToAll };

template <class T>
void combine_as(void* into, const void* from, std::size_t count, ReduceOp op) {
  T* a = static_cast<T*>(into);
  const T* b = static_cast<const T*>(from);
  for (std::size_t i = 0; i < count; ++i) a[i] = op == ReduceOp::Max ? std::max(a[i], b[i]) : a[i] + b[i];
}

class HostMemory final : public Memory {
 public:
  void* allocate(std::size_t bytes) override { return ::operator new(std::max<std::size_t>(bytes, 1)); }
  void free(void* data, std::size_t) noexcept override { ::operator delete(data); }
  void copy(void* to, const void* from, std::size_t bytes) override {
    if (bytes) std::memcpy(to, from, bytes);
  }
  void combine(void* into, const void* from, std::size_t count, DType dtype, ReduceOp op) override {
    switch (dtype) {
      case DType::F32: return combine_as<float>(into, from, count, op);
      case DType::F64: return combine_as<double>(into, from, count, op);
      case DType::BF16: break;
    }
    throw std::logic_error("host reductions take fp32 or fp64 buffers, not bf16");
  }
};

}  // namespace

Memory& host_memory() {
  static HostMemory memory;
  return memory;
}

class InProcessRequest final : public Request {
 public:
  using Poll = std::function<bool()>;  ///< runs under the world's mutex
  InProcessRequest(World& world, Poll poll) : world_(world), poll_(std::move(poll)) {}
  bool done() override {
    if (done_) return true;
    std::lock_guard lock(world_.mutex_);
    world_.check_aborted();
    done_ = poll_();
    if (done_) world_.notify();
    return done_;
  }

 private:
  World& world_;
  Poll poll_;
  bool done_ = false;
};

/// Who a lane or transport talks to: a group of world ranks and this rank's place in it.
struct Group {
  int id = 0;
  std::vector<int> members;  ///< world ranks, by rank in the group
  int index = 0;             ///< this rank's rank in the group
  int size() const { return int(members.size()); }
};

class InProcessLane final : public Communicator {
 public:
  InProcessLane(World& world, const Group& group, int lane, Memory& memory)
      : world_(world), group_(group), lane_(lane), memory_(memory) {}

  std::unique_ptr<Request> send(Buffer data, int peer) override {
    auto taken = std::make_shared<bool>(false);
    {
      std::lock_guard lock(world_.mutex_);
      world_.check_aborted();
      world_.channels_[channel(group_.index, peer)].push_back({data, taken});
      world_.notify();
    }
    return std::make_unique<InProcessRequest>(world_, [taken] { return *taken; });
  }

  std::unique_ptr<Request> recv(Buffer data, int peer) override {
    return std::make_unique<InProcessRequest>(world_, [this, data, peer] {
      auto& queue = world_.channels_[channel(peer, group_.index)];
      if (queue.empty()) return false;
      World::Message& message = queue.front();
      if (message.data.bytes() != data.bytes())
        throw std::logic_error(fmt::format("rank {} expected {} bytes from rank {}, got {}", group_.index, data.bytes(),
                                           peer, message.data.bytes()));
      memory_.copy(data.data, message.data.data, data.bytes());
      *message.taken = true;
      queue.pop_front();
      return true;
    });
  }

  std::unique_ptr<Request> all_reduce(Buffer data, ReduceOp op) override {
    return collective(Collective::AllReduce, data, data, op, 0);
  }
  std::unique_ptr<Request> broadcast(Buffer data, int root) override {
    return collective(Collective::Broadcast, data, data, ReduceOp::None, root);
  }
  std::unique_ptr<Request> reduce(Buffer data, ReduceOp op, int root) override {
    return collective(Collective::Reduce, data, data, op, root);
  }
  std::unique_ptr<Request> all_gather(Buffer in, Buffer out) override {
    expect_blocks(out, in, "all-gather");
    return collective(Collective::AllGather, in, out, ReduceOp::None, 0);
  }
  std::unique_ptr<Request> reduce_scatter(Buffer in, Buffer out, ReduceOp op) override {
    expect_blocks(in, out, "reduce-scatter");
    return collective(Collective::ReduceScatter, in, out, op, 0);
  }
  std::unique_ptr<Request> all_to_all(Buffer in, std::span<const std::size_t> send_counts, Buffer out,
                                      std::span<const std::size_t> recv_counts) override {
    check_all_to_all(in, send_counts, out, recv_counts, group_.size());
    return collective(Collective::AllToAll, in, out, ReduceOp::None, 0, send_counts, recv_counts);
  }

 private:
  World::ChannelKey channel(int from, int to) const {
    return {group_.id, lane_, group_.members.at(std::size_t(from)), group_.members.at(std::size_t(to))};
  }
  /// `whole` must hold one `block` per rank.
  void expect_blocks(Buffer whole, Buffer block, const char* what) const {
    if (whole.count != block.count * std::size_t(group_.size()) || whole.dtype != block.dtype)
      throw std::logic_error(fmt::format("{} on lane {}: {} {} values are not {} blocks of {} {}", what, lane_, whole.count,
                                         dtype_name(whole.dtype), group_.size(), block.count, dtype_name(block.dtype)));
  }

  /// Records this rank's input (and an all-to-all's counts) in the lane's next slot; the last rank to
  /// arrive computes the result (reducing in rank order); each rank then copies out what it gets.
  std::unique_ptr<Request> collective(Collective kind, Buffer in, Buffer out, ReduceOp op, int root,
                                      std::span<const std::size_t> send_counts = {},
                                      std::span<const std::size_t> recv_counts = {}) {
    const World::SlotKey key{group_.id, lane_, next_index_++};
    {
      std::lock_guard lock(world_.mutex_);
      world_.check_aborted();
      World::Slot& slot = world_.slots_[key];
      const auto ranks = std::size_t(group_.size()), me = std::size_t(group_.index);
      slot.inputs.resize(ranks);
      slot.inputs[me] = in;
      if (kind == Collective::AllToAll) {
        slot.send_counts.resize(ranks), slot.recv_counts.resize(ranks);
        slot.send_counts[me].assign(send_counts.begin(), send_counts.end());
        slot.recv_counts[me].assign(recv_counts.begin(), recv_counts.end());
      }
      if (++slot.arrived == group_.size()) finish(slot, kind, op, root);
      world_.notify();
    }
    const bool receives = kind != Collective::Reduce || group_.index == root;
    return std::make_unique<InProcessRequest>(world_, [this, key, out, receives] {
      auto it = world_.slots_.find(key);
      World::Slot& slot = it->second;
      if (!slot.ready) return false;
      const std::size_t from = slot.from[std::size_t(group_.index)];
      if (receives) memory_.copy(out.data, static_cast<std::byte*>(slot.result.data()) + from, out.bytes());
      if (++slot.collected == group_.size()) world_.slots_.erase(it);  // its result goes back to the memory
      return true;
    });
  }

  /// The result, and where each rank's output starts in it: a reduce-scatter's rank takes its
  /// block, an all-to-all's rank the blocks sent to it, every other kind's rank the whole result.
  void finish(World::Slot& slot, Collective kind, ReduceOp op, int root) {
    const std::size_t ranks = slot.inputs.size();
    const std::size_t source = std::size_t(kind == Collective::Broadcast ? root : 0);
    const Buffer& first = slot.inputs[source];
    for (std::size_t r = 0; r < ranks; ++r)  // an all-to-all's ranks send as many values as their counts say
      if ((kind != Collective::AllToAll && slot.inputs[r].count != first.count) || slot.inputs[r].dtype != first.dtype)
        throw std::logic_error(fmt::format("collective on lane {} has {} {} values on rank {} and {} {} on rank {}", lane_,
                                           first.count, dtype_name(first.dtype), source, slot.inputs[r].count,
                                           dtype_name(slot.inputs[r].dtype), r));
    slot.from.assign(ranks, 0);
    if (kind == Collective::ReduceScatter)
      for (std::size_t r = 0; r < ranks; ++r) slot.from[r] = r * (first.bytes() / ranks);
    if (kind == Collective::AllToAll) {
      all_to_all(slot);
    } else if (kind == Collective::AllGather) {  // the inputs side by side, in rank order
      slot.result = memory_.tensor(first.count * ranks, first.dtype);
      for (std::size_t r = 0; r < ranks; ++r)
        memory_.copy(static_cast<std::byte*>(slot.result.data()) + r * first.bytes(), slot.inputs[r].data, first.bytes());
    } else {
      slot.result = memory_.tensor(first.count, first.dtype);
      memory_.copy(slot.result.data(), first.data, first.bytes());
      if (kind != Collective::Broadcast)
        for (std::size_t r = 1; r < slot.inputs.size(); ++r)
          memory_.combine(slot.result.data(), slot.inputs[r].data, first.count, first.dtype, op);
    }
    slot.ready = true;
  }

  /// The result is every rank's output, receiver after receiver: the blocks addressed to it, in
  /// sender order. Each sender's block for a receiver must be as long as the receiver expects.
  void all_to_all(World::Slot& slot) {
    const std::size_t ranks = slot.inputs.size(), width = size_of(slot.inputs[0].dtype);
    std::size_t total = 0;
    for (const Buffer& in : slot.inputs) total += in.count;
    slot.result = memory_.tensor(total, slot.inputs[0].dtype);
    std::size_t at = 0;  // bytes into the result
    for (std::size_t to = 0; to < ranks; ++to) {
      slot.from[to] = at;
      for (std::size_t from = 0; from < ranks; ++from) {
        const std::vector<std::size_t>& sent = slot.send_counts[from];
        if (sent[to] != slot.recv_counts[to][from])
          throw std::logic_error(fmt::format("all-to-all on lane {}: rank {} sends {} values to rank {}, which expects {}",
                                             lane_, from, sent[to], to, slot.recv_counts[to][from]));
        const std::size_t offset = std::accumulate(sent.begin(), sent.begin() + std::ptrdiff_t(to), std::size_t{0});
        memory_.copy(static_cast<std::byte*>(slot.result.data()) + at,
                     static_cast<const std::byte*>(slot.inputs[from].data) + offset * width, sent[to] * width);
        at += sent[to] * width;
      }
    }
  }

  World& world_;
  const Group& group_;
  int lane_;
  Memory& memory_;
  long next_index_ = 0;  ///< the index of this rank's next collective on this lane
};

class InProcessTransport final : public Transport {
 public:
  InProcessTransport(World& world, Group group) : world_(world), group_(std::move(group)) {
    for (int lane = 0; lane < kLanes; ++lane)
      lanes_.push_back(std::make_unique<InProcessLane>(world, group_, lane,
                                                       lane == kControlLane ? host_memory() : world.data_memory_));
  }
  int rank() const override { return group_.index; }
  int size() const override { return group_.size(); }
  Communicator& lane(int lane) override { return *lanes_.at(std::size_t(lane)); }

  /// Every lane carries any message, whatever the group's use.
  std::unique_ptr<Transport> subgroup(const std::vector<int>& members, GroupUse) override {
    Group sub;
    for (const int m : members) {
      if (m < 0 || m >= size()) throw std::logic_error(fmt::format("subgroup names rank {} of {}", m, size()));
      if (m == rank()) sub.index = int(sub.members.size());
      sub.members.push_back(group_.members[std::size_t(m)]);
    }
    if (std::find(members.begin(), members.end(), rank()) == members.end())
      throw std::logic_error(fmt::format("rank {} asked for a subgroup it is not in", rank()));
    {
      std::lock_guard lock(world_.mutex_);
      sub.id = world_.group_id(sub.members);
    }
    return std::make_unique<InProcessTransport>(world_, std::move(sub));
  }

  void wait_for_progress(double seconds) override { world_.wait_for_change(seconds, seen_); }
  void wake() override {
    std::lock_guard lock(world_.mutex_);
    world_.notify();
  }
  bool aborted() override {
    std::lock_guard lock(world_.mutex_);
    return world_.aborted_.has_value();
  }
  void abort(const std::string& why) override {
    std::lock_guard lock(world_.mutex_);
    if (!world_.aborted_) world_.aborted_ = why;  // the first failure is the cause; later ones follow from it
    world_.notify();
  }

 private:
  World& world_;
  const Group group_;  ///< the lanes hold a reference to it
  std::vector<std::unique_ptr<Communicator>> lanes_;
  std::uint64_t seen_ = 0;  ///< the last world change wait_for_progress saw
};

World::World(int ranks, Memory& data) : ranks_(ranks), data_memory_(data) {
  std::vector<int> all(std::size_t(ranks), 0);
  std::iota(all.begin(), all.end(), 0);
  groups_.emplace(all, 0);
  for (int r = 0; r < ranks; ++r) transports_.push_back(std::make_unique<InProcessTransport>(*this, Group{0, all, r}));
}

World::~World() = default;  // a slot's result goes back to its lane's memory with it

int World::group_id(const std::vector<int>& members) {
  return groups_.try_emplace(members, int(groups_.size())).first->second;
}

void World::wait_for_change(double seconds, std::uint64_t& seen) {
  std::unique_lock lock(mutex_);
  changed_.wait_for(lock, std::chrono::duration<double>(seconds), [&] { return changes_ != seen; });
  seen = changes_;
}

std::optional<std::string> World::abort_reason() {
  std::lock_guard lock(mutex_);
  return aborted_;
}

void World::notify() {
  ++changes_;
  changed_.notify_all();
}

void World::check_aborted() const {
  if (aborted_) throw CommError(*aborted_);
}

}  // namespace pipesim::runtime
