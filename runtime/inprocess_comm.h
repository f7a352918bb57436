#pragma once
/// In-process communicator: every rank is a thread of this process and all of them share one World.
/// Messages are copied through per-channel queues; collectives meet in slots keyed by (lane, index on
/// the lane) and reduce in rank order, so results do not depend on which thread arrives first.
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "comm.h"

namespace pipesim::runtime {

class World {
 public:
  World(int ranks, int lanes);
  int ranks() const { return ranks_; }
  int lanes() const { return lanes_; }
  /// The communicator of one rank; lives as long as the World.
  Communicator& rank(int r) { return *comms_[std::size_t(r)]; }
  /// Waits until something changed in the world (a message, a collective, an abort, a wake-up)
  /// since the change numbered `seen`, or `seconds` pass, so idle ranks sleep instead of spinning.
  /// Updates `seen`; no change is missed between two calls.
  void wait_for_change(double seconds, std::uint64_t& seen);
  /// Why the run was aborted (the first rank's message), if it was.
  std::optional<std::string> abort_reason();

 private:
  friend class InProcessComm;
  friend class InProcessRequest;
  struct Message {
    std::vector<std::byte> data;
    std::shared_ptr<bool> taken;
  };
  struct Slot {
    std::vector<std::vector<float>> inputs;  ///< by rank; empty until it arrives
    int arrived = 0, collected = 0;
    std::vector<float> result;
    bool ready = false;
  };
  void notify();  ///< call with mutex_ held
  void check_aborted() const;  ///< throws CommError; call with mutex_ held

  int ranks_, lanes_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::vector<std::deque<Message>> channels_;  ///< [from * ranks + to], FIFO
  std::map<std::pair<int, long>, Slot> slots_;  ///< (lane, index)
  std::optional<std::string> aborted_;
  std::uint64_t changes_ = 0;
  std::vector<std::unique_ptr<Communicator>> comms_;
};

}  // namespace pipesim::runtime
