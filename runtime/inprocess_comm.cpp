#include "inprocess_comm.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <stdexcept>
#include <string>

namespace pipesim::runtime {
namespace {

enum class Collective { AllReduce, Broadcast, Reduce };

void combine(std::vector<float>& into, const std::vector<float>& from, ReduceOp op) {
  for (std::size_t i = 0; i < into.size(); ++i) into[i] = op == ReduceOp::Sum ? into[i] + from[i] : std::max(into[i], from[i]);
}

}  // namespace

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

class InProcessComm final : public Communicator {
 public:
  InProcessComm(World& world, int rank) : world_(world), rank_(rank), next_index_(std::size_t(world.lanes()), 0) {}
  int rank() const override { return rank_; }
  int size() const override { return world_.ranks(); }

  std::unique_ptr<Request> send(std::span<const std::byte> data, int peer) override {
    auto taken = std::make_shared<bool>(false);
    {
      std::lock_guard lock(world_.mutex_);
      world_.check_aborted();
      world_.channels_[channel(rank_, peer)].push_back({{data.begin(), data.end()}, taken});
      world_.notify();
    }
    return std::make_unique<InProcessRequest>(world_, [taken] { return *taken; });
  }

  std::unique_ptr<Request> recv(std::span<std::byte> data, int peer) override {
    return std::make_unique<InProcessRequest>(world_, [this, data, peer] {
      auto& queue = world_.channels_[channel(peer, rank_)];
      if (queue.empty()) return false;
      World::Message& message = queue.front();
      if (message.data.size() != data.size())
        throw std::logic_error("rank " + std::to_string(rank_) + " expected " + std::to_string(data.size()) +
                        " bytes from rank " + std::to_string(peer) + ", got " + std::to_string(message.data.size()));
      std::memcpy(data.data(), message.data.data(), data.size());
      *message.taken = true;
      queue.pop_front();
      return true;
    });
  }

  std::unique_ptr<Request> all_reduce(std::span<float> data, ReduceOp op, int lane) override {
    return collective(Collective::AllReduce, data, op, 0, lane);
  }
  std::unique_ptr<Request> broadcast(std::span<float> data, int root, int lane) override {
    return collective(Collective::Broadcast, data, ReduceOp::Sum, root, lane);
  }
  std::unique_ptr<Request> reduce(std::span<float> data, ReduceOp op, int root, int lane) override {
    return collective(Collective::Reduce, data, op, root, lane);
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
  std::size_t channel(int from, int to) const { return std::size_t(from) * std::size_t(world_.ranks()) + std::size_t(to); }

  /// Deposits this rank's input in the lane's next slot; the last rank to arrive computes the result
  /// (reducing in rank order); each rank then copies out what it gets.
  std::unique_ptr<Request> collective(Collective kind, std::span<float> data, ReduceOp op, int root, int lane) {
    const std::pair<int, long> key{lane, next_index_[std::size_t(lane)]++};
    {
      std::lock_guard lock(world_.mutex_);
      world_.check_aborted();
      World::Slot& slot = world_.slots_[key];
      slot.inputs.resize(std::size_t(world_.ranks()));
      if (kind != Collective::Broadcast || rank_ == root) slot.inputs[std::size_t(rank_)].assign(data.begin(), data.end());
      if (++slot.arrived == world_.ranks()) {
        slot.result = kind == Collective::Broadcast ? slot.inputs[std::size_t(root)] : slot.inputs[0];
        if (kind != Collective::Broadcast)
          for (std::size_t r = 1; r < slot.inputs.size(); ++r) combine(slot.result, slot.inputs[r], op);
        slot.inputs.clear();
        slot.ready = true;
      }
      world_.notify();
    }
    const bool receives = kind != Collective::Reduce || rank_ == root;
    return std::make_unique<InProcessRequest>(world_, [this, key, data, receives] {
      auto it = world_.slots_.find(key);
      if (!it->second.ready) return false;
      if (receives) {
        if (it->second.result.size() != data.size())
          throw std::logic_error("rank " + std::to_string(rank_) + ": collective on lane " + std::to_string(key.first) +
                          " has " + std::to_string(data.size()) + " values here and " +
                          std::to_string(it->second.result.size()) + " elsewhere");
        std::copy(it->second.result.begin(), it->second.result.end(), data.begin());
      }
      if (++it->second.collected == world_.ranks()) world_.slots_.erase(it);
      return true;
    });
  }

  World& world_;
  int rank_;
  std::vector<long> next_index_;  ///< per lane: the index of this rank's next collective
  std::uint64_t seen_ = 0;        ///< the last world change wait_for_progress saw
};

World::World(int ranks, int lanes) : ranks_(ranks), lanes_(lanes), channels_(std::size_t(ranks) * std::size_t(ranks)) {
  for (int r = 0; r < ranks; ++r) comms_.push_back(std::make_unique<InProcessComm>(*this, r));
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
