#pragma once
/// In-process communicator: every rank is a thread of this process and all of them share one World.
/// A receive copies straight from the sender's buffer; collectives meet in slots keyed by (group,
/// lane, index on the lane), and the last rank to arrive reduces in rank order, so results do not
/// depend on which thread arrives first. A subgroup is a view of the same World: it shares its lock,
/// its wake-ups and its abort. Where the buffers live is the World's `Memory`: host memory by
/// default, device memory when a GPU backend gives its own copies and reductions.
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <tuple>
#include <vector>

#include "comm.h"

namespace pipesim::runtime {

/// How a World reads, writes and combines buffers of one memory space. It is the Allocator
/// (tensor.h) of what it allocates, as a backend is of its tensors: a Tensor it made gives its bytes
/// back to it.
class Memory : public Allocator {
 public:
  virtual void* allocate(std::size_t bytes) = 0;
  virtual void copy(void* to, const void* from, std::size_t bytes) = 0;
  /// into[i] = op(into[i], from[i]) for `count` elements of `dtype`.
  virtual void combine(void* into, const void* from, std::size_t count, DType dtype, ReduceOp op) = 0;
  /// `count` elements of `dtype` (uninitialised) that give themselves back when destroyed.
  Tensor tensor(std::size_t count, DType dtype) { return Tensor(allocate(count * size_of(dtype)), count, dtype, this); }
};

/// Host memory, fp32 and fp64 reductions.
Memory& host_memory();

class World {
 public:
  /// `data` holds the buffers of the IR's lanes (collective and point-to-point); the control lane
  /// is always host memory.
  explicit World(int ranks, Memory& data = host_memory());
  ~World();
  int ranks() const { return ranks_; }
  /// The transport of one rank; lives as long as the World.
  Transport& rank(int r) { return *transports_[std::size_t(r)]; }
  /// Waits until something changed in the world (a message, a collective, an abort, a wake-up)
  /// since the change numbered `seen`, or `seconds` pass, so idle ranks sleep instead of spinning.
  /// Updates `seen`; no change is missed between two calls.
  void wait_for_change(double seconds, std::uint64_t& seen);
  /// Why the run was aborted (the first rank's message), if it was.
  std::optional<std::string> abort_reason();

 private:
  friend class InProcessLane;
  friend class InProcessTransport;
  friend class InProcessRequest;
  struct Message {
    Buffer data;  ///< the sender's buffer, read by the receiver
    std::shared_ptr<bool> taken;
  };
  struct Slot {
    std::vector<Buffer> inputs;  ///< by rank in the group
    std::vector<std::vector<std::size_t>> send_counts, recv_counts;  ///< an all-to-all's, by rank
    int arrived = 0, collected = 0;
    Tensor result;               ///< in the lane's memory, which it goes back to with the slot
    std::vector<std::size_t> from;  ///< where each rank's output starts in `result`, in bytes
    bool ready = false;
  };
  /// (group, lane, from, to) in world ranks: a FIFO per channel.
  using ChannelKey = std::tuple<int, int, int, int>;
  /// (group, lane, index on the lane).
  using SlotKey = std::tuple<int, int, long>;
  void notify();  ///< call with mutex_ held
  void check_aborted() const;  ///< throws CommError; call with mutex_ held
  /// The id of the group of these world ranks (0: all of them); made on first use.
  int group_id(const std::vector<int>& members);

  int ranks_;
  Memory& data_memory_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::map<ChannelKey, std::deque<Message>> channels_;
  std::map<SlotKey, Slot> slots_;
  std::map<std::vector<int>, int> groups_;
  std::optional<std::string> aborted_;
  std::uint64_t changes_ = 0;
  std::vector<std::unique_ptr<Transport>> transports_;
};

}  // namespace pipesim::runtime
