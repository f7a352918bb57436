#include "simulator.h"

#include <fmt/format.h>

#include <algorithm>
#include <cassert>
#include <memory>
#include <queue>
#include <string>
#include <vector>

namespace pipesim {
namespace {

/// 16 bytes: a graph has fewer than 2^31 ops, so the sequence number fits in 32 bits.
struct Event {
  TimeNs time;
  std::uint32_t sequence;
  TaskId task;
  bool operator>(const Event& other) const {
    return time != other.time ? time > other.time : sequence > other.sequence;
  }
};

/// What the event loop keeps for one op, in one 16-byte record: with hundreds of streams advancing
/// through memory at once, one cache line holds what several arrays would spread over as many.
/// The rest it reads from the graph's own compact lists (successors: 4 bytes an op) and from the
/// durations; the times it writes go straight to the Timeline it returns.
struct OpState {
  std::int32_t pending;  ///< unfinished dependencies; kArrived once it heads a free stream, ready
  std::uint32_t slot;    ///< the stream it runs on (TaskGraph::stream_of)
  TaskId partner;        ///< rendezvous partner, or kNoTask
  std::int32_t group;    ///< collective group, or -1
};
static_assert(sizeof(OpState) == 16);
constexpr std::int32_t kArrived = -1;

class Engine {
 public:
  Engine(const TaskGraph& graph, std::span<const TimeNs> durations)
      : graph_(graph),
        durations_(durations),
        // Left uninitialised (every field is set below): tens of MiB on a large graph, written once.
        ops_(new OpState[graph.size()]) {
    const std::size_t n = graph.size(), slots = graph.stream_count();
    for (std::size_t i = 0; i < n; ++i) {
      const Task& t = graph.task(TaskId(i));
      ops_[i] = {std::int32_t(graph.deps(TaskId(i)).size()), std::uint32_t(graph.stream_of(t)), t.partner, t.group};
    }
    head_.resize(slots);
    end_.resize(slots);
    for (std::size_t slot = 0; slot < slots; ++slot) {
      const auto order = graph.stream(slot);
      head_[slot] = order.data();
      end_[slot] = order.data() + order.size();
    }
    timeline_.start.assign(n, -1);
    timeline_.end.assign(n, -1);
    busy_.assign(slots, 0);
    group_arrivals_.assign(graph.groups().size(), 0);
    std::vector<Event> storage;
    storage.reserve(slots);
    events_ = decltype(events_)(std::greater<>(), std::move(storage));
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
      const OpState& op = ops_[std::size_t(e.task)];
      if (op.partner != kNoTask) {
        done += 2;
        finish(e.task, now);
        finish(op.partner, now);
      } else if (op.group >= 0) {
        const auto& members = graph_.groups()[std::size_t(op.group)].members;
        done += members.size();
        for (TaskId m : members) finish(m, now);
      } else {
        ++done;
        finish(e.task, now);
      }
    }
    if (done != graph_.size()) return Error{deadlock_report(now)};
    return std::move(timeline_);
  }

 private:
  void try_start(std::size_t slot, TimeNs now) {
    if (busy_[slot] || head_[slot] == end_[slot]) return;
    const TaskId t = *head_[slot];
    OpState& op = ops_[std::size_t(t)];
    if (op.pending > 0) return;
    busy_[slot] = 1;  // the head has arrived: nothing behind it may pass
    op.pending = kArrived;
    if (op.partner != kNoTask) {
      const OpState& partner = ops_[std::size_t(op.partner)];
      if (partner.pending != kArrived) return;
      // One event ends both sides of the transfer.
      timeline_.start[std::size_t(op.partner)] = now;
      start(t, now, now + std::max(durations_[std::size_t(t)], durations_[std::size_t(op.partner)]));
    } else if (op.group >= 0) {
      const auto& members = graph_.groups()[std::size_t(op.group)].members;
      if (++group_arrivals_[std::size_t(op.group)] < members.size()) return;
      TimeNs longest = 0;
      for (TaskId m : members) longest = std::max(longest, durations_[std::size_t(m)]);
      for (TaskId m : members) timeline_.start[std::size_t(m)] = now;
      start(members.front(), now, now + longest);  // one event ends every member
    } else {
      start(t, now, now + durations_[std::size_t(t)]);
    }
  }

  void start(TaskId t, TimeNs now, TimeNs end) {
    const OpState& op = ops_[std::size_t(t)];
    timeline_.start[std::size_t(t)] = now;
    // The stream's next ops are needed when this one ends: fetch them into cache meanwhile.
    const TaskId* head = head_[op.slot];
    const std::ptrdiff_t behind = end_[op.slot] - head - 1;
    if (behind > 0) __builtin_prefetch(&ops_[std::size_t(head[1])]);
    if (behind > 1) __builtin_prefetch(&ops_[std::size_t(head[2])]);
    events_.push({end, sequence_++, t});
  }

  void finish(TaskId t, TimeNs now) {
    const OpState& op = ops_[std::size_t(t)];
    timeline_.end[std::size_t(t)] = now;
    const std::size_t slot = op.slot;
    ++head_[slot];
    busy_[slot] = 0;
    for (const TaskId successor : graph_.successors(t)) {
      OpState& next = ops_[std::size_t(successor)];
      if (--next.pending == 0) try_start(next.slot, now);
    }
    try_start(slot, now);
  }

  std::string deadlock_report(TimeNs now) const {
    std::string report = fmt::format("deadlock at t = {:.6f} ms: no op can start, but some have not run:", now / 1e6);
    for (std::size_t slot = 0; slot < head_.size(); ++slot) {
      if (head_[slot] == end_[slot]) continue;
      const TaskId t = *head_[slot];
      const Task& task = graph_.task(t);
      std::string reason = "waits for the other members of its collective";
      if (ops_[std::size_t(t)].pending > 0) {
        for (TaskId dep : graph_.deps(t))
          if (timeline_.end[std::size_t(dep)] < 0) {
            reason = "waits for " + graph_.describe(dep);
            break;
          }
      } else if (task.partner != kNoTask) {
        reason = "waits for its partner " + graph_.describe(task.partner) + " to be issued";
      }
      report += fmt::format("\n  device {} {} stream: {} {}", task.device, graph_.stream_name(slot),
                            graph_.describe(t), reason);
    }
    return report;
  }

  const TaskGraph& graph_;
  std::span<const TimeNs> durations_;
  std::unique_ptr<OpState[]> ops_;
  Timeline timeline_;  ///< start and end of every op; -1 until it starts, ends
  std::vector<const TaskId*> head_, end_;  ///< per (device, stream): next op, end of its program
  std::vector<std::uint8_t> busy_;         ///< per (device, stream): its head has arrived or runs
  std::vector<std::size_t> group_arrivals_;
  std::priority_queue<Event, std::vector<Event>, std::greater<>> events_;
  std::uint32_t sequence_ = 0;
};

}  // namespace

Result<Timeline> simulate(const TaskGraph& graph, std::span<const TimeNs> durations) {
  if (durations.size() != graph.size())
    return Error{fmt::format("simulate: {} durations for {} ops", durations.size(), graph.size())};
  // Every end time is a sum of durations along a chain, so a total below 2^62 keeps all of them exact.
  TimeNs total = 0;
  for (std::size_t i = 0; i < durations.size(); ++i) {
    if (durations[i] < 0)
      return Error{fmt::format("simulate: {} has no valid duration (negative, NaN or over 146 years); check the "
                               "hardware speeds, the costs and the model sizes",
                               graph.describe(TaskId(i)))};
    if (__builtin_add_overflow(total, durations[i], &total) || total > TimeNs(1) << 62)
      return Error{"simulate: the ops' durations add up to over 146 years; check the hardware speeds, the costs and "
                   "the model sizes"};
  }
  return Engine(graph, durations).run();
}

}  // namespace pipesim
