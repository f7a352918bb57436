#include "inprocess_comm.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <functional>
#include <stdexcept>
#include <string>

#include <fmt/format.h>

namespace pipesim::runtime {
namespace {

enum class Collective { AllReduce, Broadcast, Reduce };

template <class T>
void combine_as(void* into, const void* from, std::size_t count, ReduceOp op) {
  T* a = static_cast<T*>(into);
  const T* b = static_cast<const T*>(from);
  for (std::size_t i = 0; i < count; ++i) a[i] = op == ReduceOp::Max ? std::max(a[i], b[i]) : a[i] + b[i];
}

class HostMemory final : public Memory {
 public:
  void* allocate(std::size_t bytes) override { return ::operator new(std::max<std::size_t>(bytes, 1)); }
  void free(void* data) noexcept override { ::operator delete(data); }
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

class InProcessLane final : public Communicator {
 public:
  InProcessLane(World& world, int rank, int lane, Memory& memory)
      : world_(world), rank_(rank), lane_(lane), memory_(memory) {}

  std::unique_ptr<Request> send(Buffer data, int peer) override {
    auto taken = std::make_shared<bool>(false);
    {
      std::lock_guard lock(world_.mutex_);
      world_.check_aborted();
      world_.channels_[channel(rank_, peer)].push_back({data, taken});
      world_.notify();
    }
    return std::make_unique<InProcessRequest>(world_, [taken] { return *taken; });
  }

  std::unique_ptr<Request> recv(Buffer data, int peer) override {
    return std::make_unique<InProcessRequest>(world_, [this, data, peer] {
      auto& queue = world_.channels_[channel(peer, rank_)];
      if (queue.empty()) return false;
      World::Message& message = queue.front();
      if (message.data.bytes() != data.bytes())
        throw std::logic_error(fmt::format("rank {} expected {} bytes from rank {}, got {}", rank_, data.bytes(), peer,
                                           message.data.bytes()));
      memory_.copy(data.data, message.data.data, data.bytes());
      *message.taken = true;
      queue.pop_front();
      return true;
    });
  }

  std::unique_ptr<Request> all_reduce(Buffer data, ReduceOp op) override {
    return collective(Collective::AllReduce, data, op, 0);
  }
  std::unique_ptr<Request> broadcast(Buffer data, int root) override {
    return collective(Collective::Broadcast, data, ReduceOp::None, root);
  }
  std::unique_ptr<Request> reduce(Buffer data, ReduceOp op, int root) override {
    return collective(Collective::Reduce, data, op, root);
  }

 private:
  std::size_t channel(int from, int to) const { return std::size_t(from) * std::size_t(world_.ranks()) + std::size_t(to); }

  /// Records this rank's buffer in the lane's next slot; the last rank to arrive computes the
  /// result (reducing in rank order); each rank then copies out what it gets.
  std::unique_ptr<Request> collective(Collective kind, Buffer data, ReduceOp op, int root) {
    const std::pair<int, long> key{lane_, next_index_++};
    {
      std::lock_guard lock(world_.mutex_);
      world_.check_aborted();
      World::Slot& slot = world_.slots_[key];
      slot.inputs.resize(std::size_t(world_.ranks()));
      slot.inputs[std::size_t(rank_)] = data;
      if (++slot.arrived == world_.ranks()) finish(slot, kind, op, root);
      world_.notify();
    }
    const bool receives = kind != Collective::Reduce || rank_ == root;
    return std::make_unique<InProcessRequest>(world_, [this, key, data, receives] {
      auto it = world_.slots_.find(key);
      World::Slot& slot = it->second;
      if (!slot.ready) return false;
      if (receives) memory_.copy(data.data, slot.result, data.bytes());
      if (++slot.collected == world_.ranks()) {
        memory_.free(slot.result);
        world_.slots_.erase(it);
      }
      return true;
    });
  }

  void finish(World::Slot& slot, Collective kind, ReduceOp op, int root) {
    const std::size_t source = std::size_t(kind == Collective::Broadcast ? root : 0);
    const Buffer& first = slot.inputs[source];
    for (std::size_t r = 0; r < slot.inputs.size(); ++r)
      if (slot.inputs[r].count != first.count || slot.inputs[r].dtype != first.dtype)
        throw std::logic_error(fmt::format("collective on lane {} has {} {} values on rank {} and {} {} on rank {}", lane_,
                                           first.count, dtype_name(first.dtype), source, slot.inputs[r].count,
                                           dtype_name(slot.inputs[r].dtype), r));
    slot.result = memory_.allocate(first.bytes());
    slot.count = first.count;
    memory_.copy(slot.result, first.data, first.bytes());
    if (kind != Collective::Broadcast)
      for (std::size_t r = 1; r < slot.inputs.size(); ++r)
        memory_.combine(slot.result, slot.inputs[r].data, first.count, first.dtype, op);
    slot.ready = true;
  }

  World& world_;
  int rank_, lane_;
  Memory& memory_;
  long next_index_ = 0;  ///< the index of this rank's next collective on this lane
};

class InProcessTransport final : public Transport {
 public:
  InProcessTransport(World& world, int rank) : world_(world), rank_(rank) {
    for (int lane = 0; lane < kLanes; ++lane)
      lanes_.push_back(std::make_unique<InProcessLane>(world, rank, lane,
                                                       lane == kControlLane ? host_memory() : world.data_memory_));
  }
  int rank() const override { return rank_; }
  int size() const override { return world_.ranks(); }
  Communicator& lane(int lane) override { return *lanes_.at(std::size_t(lane)); }

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
  int rank_;
  std::vector<std::unique_ptr<Communicator>> lanes_;
  std::uint64_t seen_ = 0;  ///< the last world change wait_for_progress saw
};

World::World(int ranks, Memory& data) : ranks_(ranks), data_memory_(data), channels_(std::size_t(ranks) * std::size_t(ranks)) {
  for (int r = 0; r < ranks; ++r) transports_.push_back(std::make_unique<InProcessTransport>(*this, r));
}

World::~World() {
  for (auto& [key, slot] : slots_)
    if (slot.result) (key.first == kControlLane ? host_memory() : data_memory_).free(slot.result);
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
