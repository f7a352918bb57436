#include "simulator.h"

#include <fmt/format.h>

#include <cassert>
#include <queue>
#include <string>
#include <vector>

namespace pipesim {
namespace {

struct Event {
  TimeNs time;
  std::uint64_t sequence;
  TaskId task;
  bool operator>(const Event& other) const {
    return time != other.time ? time > other.time : sequence > other.sequence;
  }
};

/// Flat, index-based state so the hot loop touches a few contiguous arrays per op.
class Engine {
 public:
  Engine(const TaskGraph& graph, std::span<const TimeNs> durations)
      : graph_(graph), durations_(durations), n_(graph.size()) {
    const std::size_t slots = std::size_t(graph.devices()) * kStreamCount;
    stream_end_.resize(slots);
    head_.resize(slots);
    busy_.assign(slots, 0);
    slot_of_.resize(n_);
    for (int d = 0; d < graph.devices(); ++d)
      for (int s = 0; s < kStreamCount; ++s) {
        const std::size_t slot = std::size_t(d) * kStreamCount + std::size_t(s);
        const auto order = graph.stream_order(d, static_cast<Stream>(s));
        head_[slot] = order.data();
        stream_end_[slot] = order.data() + order.size();
        for (TaskId id : order) slot_of_[std::size_t(id)] = static_cast<std::uint32_t>(slot);
      }
    // Successor lists (CSR) and remaining-dependency counts.
    pending_.assign(n_, 0);
    succ_offsets_.assign(n_ + 1, 0);
    for (std::size_t i = 0; i < n_; ++i) {
      const auto deps = graph.deps(TaskId(i));
      pending_[i] = static_cast<std::int32_t>(deps.size());
      for (TaskId dep : deps) ++succ_offsets_[std::size_t(dep) + 1];
    }
    for (std::size_t i = 0; i < n_; ++i) succ_offsets_[i + 1] += succ_offsets_[i];
    succ_.resize(std::size_t(succ_offsets_[n_]));
    std::vector<std::int64_t> cursor(succ_offsets_.begin(), succ_offsets_.end() - 1);
    for (std::size_t i = 0; i < n_; ++i)
      for (TaskId dep : graph.deps(TaskId(i))) succ_[std::size_t(cursor[std::size_t(dep)]++)] = TaskId(i);
    partner_.resize(n_);
    group_.resize(n_);
    for (std::size_t i = 0; i < n_; ++i) {
      partner_[i] = graph.task(TaskId(i)).partner;
      group_[i] = graph.task(TaskId(i)).group;
    }
    arrived_.assign(n_, 0);
    group_arrivals_.assign(graph.groups().size(), 0);
    timeline_.start.assign(n_, -1);
    timeline_.end.assign(n_, -1);
  }

  Result<Timeline> run() {
    for (std::size_t slot = 0; slot < head_.size(); ++slot) try_start(slot, 0);
    std::size_t done = 0;
    TimeNs now = 0;
    while (!events_.empty()) {
      const Event e = events_.top();
      events_.pop();
      assert(e.time >= now && "an event was scheduled in the past");
      now = e.time;
      ++done;
      finish(e.task, now);
    }
    if (done != n_) return Error{deadlock_report(now)};
    return std::move(timeline_);
  }

 private:
  void try_start(std::size_t slot, TimeNs now) {
    if (busy_[slot] || head_[slot] == stream_end_[slot]) return;
    const TaskId t = *head_[slot];
    if (pending_[std::size_t(t)] > 0) return;
    busy_[slot] = 1;  // the head has arrived: nothing behind it may pass
    arrived_[std::size_t(t)] = 1;
    if (const TaskId p = partner_[std::size_t(t)]; p != kNoTask) {
      if (!arrived_[std::size_t(p)]) return;
      const TimeNs end = now + std::max(durations_[std::size_t(t)], durations_[std::size_t(p)]);
      start(t, now, end);
      start(p, now, end);
    } else if (const int g = group_[std::size_t(t)]; g >= 0) {
      const auto& members = graph_.groups()[std::size_t(g)].members;
      if (++group_arrivals_[std::size_t(g)] < members.size()) return;
      TimeNs longest = 0;
      for (TaskId m : members) longest = std::max(longest, durations_[std::size_t(m)]);
      for (TaskId m : members) start(m, now, now + longest);
    } else {
      start(t, now, now + durations_[std::size_t(t)]);
    }
  }

  void start(TaskId t, TimeNs now, TimeNs end) {
    timeline_.start[std::size_t(t)] = now;
    events_.push({end, sequence_++, t});
  }

  void finish(TaskId t, TimeNs now) {
    timeline_.end[std::size_t(t)] = now;
    const std::size_t slot = slot_of_[std::size_t(t)];
    ++head_[slot];
    busy_[slot] = 0;
    const std::int64_t end = succ_offsets_[std::size_t(t) + 1];
    for (std::int64_t k = succ_offsets_[std::size_t(t)]; k < end; ++k) {
      const TaskId s = succ_[std::size_t(k)];
      if (--pending_[std::size_t(s)] == 0) try_start(slot_of_[std::size_t(s)], now);
    }
    try_start(slot, now);
  }

  std::string deadlock_report(TimeNs now) const {
    std::string report = fmt::format("deadlock at t = {:.6f} ms: no op can start, but some have not run:", now / 1e6);
    for (std::size_t slot = 0; slot < head_.size(); ++slot) {
      if (head_[slot] == stream_end_[slot]) continue;
      const TaskId t = *head_[slot];
      const Task& task = graph_.task(t);
      std::string reason;
      if (pending_[std::size_t(t)] > 0) {
        for (TaskId dep : graph_.deps(t))
          if (timeline_.end[std::size_t(dep)] < 0) {
            reason = "waits for " + graph_.describe(dep);
            break;
          }
      } else if (task.partner != kNoTask) {
        reason = "waits for its partner " + graph_.describe(task.partner) + " to be issued";
      } else {
        reason = "waits for the other members of its collective";
      }
      report += fmt::format("\n  device {} {} stream: {} {}", task.device, stream_name(stream_of(task.kind)),
                            graph_.describe(t), reason);
    }
    return report;
  }

  const TaskGraph& graph_;
  std::span<const TimeNs> durations_;
  std::size_t n_;
  std::vector<const TaskId*> stream_end_, head_;  ///< per (device, stream): end, next op
  std::vector<std::uint8_t> busy_;
  std::vector<std::uint32_t> slot_of_;
  std::vector<std::int32_t> pending_;
  std::vector<std::int64_t> succ_offsets_;
  std::vector<TaskId> succ_;
  std::vector<TaskId> partner_;
  std::vector<std::int32_t> group_;
  std::vector<std::uint8_t> arrived_;
  std::vector<std::size_t> group_arrivals_;
  std::priority_queue<Event, std::vector<Event>, std::greater<>> events_;
  std::uint64_t sequence_ = 0;
  Timeline timeline_;
};

}  // namespace

Result<Timeline> simulate(const TaskGraph& graph, std::span<const TimeNs> durations) {
  if (durations.size() != graph.size())
    return Error{fmt::format("simulate: {} durations for {} ops", durations.size(), graph.size())};
  for (std::size_t i = 0; i < durations.size(); ++i)
    if (durations[i] < 0) return Error{fmt::format("simulate: {} has a negative duration", graph.describe(TaskId(i)))};
  return Engine(graph, durations).run();
}

}  // namespace pipesim
