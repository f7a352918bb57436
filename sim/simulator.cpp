#include "simulator.h"

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <memory>
#include <string>
#include <vector>

#include "two_threads.h"

namespace pipesim {
namespace {

/// What the sweep keeps for one op, in one 16-byte record: with hundreds of streams advancing
/// through memory at once, one cache line holds what several arrays would spread over as many.
/// The rest it reads from the graph's own compact lists (successors: 4 bytes an op) and from the
/// durations; the times it writes go straight to the Timeline it returns, whose end times take the
/// durations' place (an op's duration is last read when it starts, and its end first written then).
struct OpState {
  std::int32_t pending;  ///< unfinished dependencies; kArrived once it heads its stream, ready
  std::uint32_t slot;    ///< the stream it runs on (TaskGraph::stream_of)
  TaskId partner;        ///< rendezvous partner, or kNoTask
  std::int32_t group;    ///< collective group, or -1
};
static_assert(sizeof(OpState) == 16);
constexpr std::int32_t kArrived = -1;
/// How far down its stream an op's records are fetched ahead of its turn (measured: 16 to 32 alike).
constexpr std::ptrdiff_t kFetchAhead = 16;

/// Every time in the model is a max-plus expression: an op arrives when its stream's previous op and
/// its dependencies have ended, a rendezvous (a SEND and its RECV, or a collective's members) starts
/// when its last member arrives, and ends its longest duration later. Nothing else competes for a
/// stream, so these times do not depend on the order in which they are worked out, and no event queue
/// is needed: the sweep runs each stream forward as far as it can, and a stream that waits is taken up
/// again when the op it waits for ends. Running along one stream reads its ops' state in program
/// order, which is mostly memory order.
class Engine {
 public:
  Engine(const TaskGraph& graph, std::vector<TimeNs> durations)
      : graph_(graph),
        // Left uninitialised (every field is set below): tens of MiB on a large graph, written once.
        ops_(new OpState[graph.size()]) {
    const std::size_t n = graph.size(), slots = graph.stream_count();
    in_two_halves(n, n >= kOpsWorthAThread, [&](std::size_t begin, std::size_t end) {
      for (std::size_t i = begin; i < end; ++i) {
        const Task& t = graph.task(TaskId(i));
        ops_[i] = {std::int32_t(graph.deps(TaskId(i)).size()), std::uint32_t(graph.stream_of(t)), t.partner, t.group};
      }
    });
    head_.resize(slots);
    end_.resize(slots);
    for (std::size_t slot = 0; slot < slots; ++slot) {
      const auto order = graph.stream(slot);
      head_[slot] = order.data();
      end_[slot] = order.data() + order.size();
    }
    // start[t] holds the latest end of t's finished dependencies until t starts; end[t] holds t's
    // duration until it ends.
    timeline_.start.assign(n, 0);
    timeline_.end = std::move(durations);
    free_at_.assign(slots, 0);
    group_arrivals_.assign(graph.groups().size(), 0);
    group_ready_.assign(graph.groups().size(), 0);
    waiting_.reserve(slots);
  }

  Result<Timeline> run() {
    for (std::size_t slot = 0; slot < head_.size(); ++slot) advance(slot);
    while (!waiting_.empty()) {
      const std::size_t slot = waiting_.back();
      waiting_.pop_back();
      advance(slot);
    }
    // Every op sits on one stream, so all have run when every stream has reached its end.
    for (std::size_t slot = 0; slot < head_.size(); ++slot)
      if (head_[slot] != end_[slot]) return Error{deadlock_report()};
    return std::move(timeline_);
  }

 private:
  /// Starts the ops at the head of `slot` one after another until one must wait: for a dependency
  /// (its end takes the stream up again) or for its rendezvous (the last member to arrive starts it).
  void advance(std::size_t slot) {
    while (head_[slot] != end_[slot]) {
      const TaskId t = *head_[slot];
      fetch_ahead(slot);
      OpState& op = ops_[std::size_t(t)];
      if (op.pending != 0) return;  // a dependency has not ended, or it has arrived and waits
      op.pending = kArrived;
      const TimeNs arrival = std::max(timeline_.start[std::size_t(t)], free_at_[slot]);
      if (op.partner != kNoTask) {
        const TaskId partner = op.partner;
        if (ops_[std::size_t(partner)].pending != kArrived) {
          timeline_.start[std::size_t(t)] = arrival;
          return;
        }
        const TimeNs begin = std::max(arrival, timeline_.start[std::size_t(partner)]);
        const TimeNs end = begin + std::max(duration(t), duration(partner));
        timeline_.start[std::size_t(partner)] = begin;
        finish(partner, end);
        timeline_.start[std::size_t(t)] = begin;
        finish(t, end);
        wake(ops_[std::size_t(partner)].slot);
      } else if (op.group >= 0) {
        const auto group = std::size_t(op.group);
        group_ready_[group] = std::max(group_ready_[group], arrival);
        const auto& members = graph_.groups()[group].members;
        if (++group_arrivals_[group] < members.size()) return;
        TimeNs longest = 0;
        for (TaskId m : members) longest = std::max(longest, duration(m));
        const TimeNs begin = group_ready_[group];
        for (TaskId m : members) {
          timeline_.start[std::size_t(m)] = begin;
          finish(m, begin + longest);
          if (m != t) wake(ops_[std::size_t(m)].slot);
        }
      } else {
        timeline_.start[std::size_t(t)] = arrival;
        finish(t, arrival + duration(t));
      }
    }
  }

  /// Until `t` ends, its end time holds its duration.
  TimeNs duration(TaskId t) const { return timeline_.end[std::size_t(t)]; }

  void finish(TaskId t, TimeNs end) {
    const OpState& op = ops_[std::size_t(t)];
    timeline_.end[std::size_t(t)] = end;
    free_at_[op.slot] = end;
    ++head_[op.slot];
    for (const TaskId successor : graph_.successors(t)) {
      OpState& next = ops_[std::size_t(successor)];
      TimeNs& ready = timeline_.start[std::size_t(successor)];
      ready = std::max(ready, end);
      if (--next.pending == 0 && *head_[next.slot] == successor) wake(next.slot);
    }
  }

  /// Asks for the records of the ops further down `slot` before their turn. The sweep walks hundreds
  /// of streams at once, too many for the processor to follow each one's stride, so an op's records
  /// would otherwise each wait for memory when it comes up (measured at 1.4 M ops: 53 ms without
  /// these requests, 30 with them). Each request reads only what an earlier one brought in: the
  /// stream's list far ahead, then an op's own records and successor offsets, its successor list
  /// closer, and the records of its successors (which it updates when it ends) closer still.
  /// Always inlined: GCC finds a function that only prefetches free of effects and drops the call.
  [[gnu::always_inline]] void fetch_ahead(std::size_t slot) const {
    const std::ptrdiff_t left = end_[slot] - head_[slot];
    if (left <= kFetchAhead) return;
    __builtin_prefetch(head_[slot] + std::min(4 * kFetchAhead, left - 1));
    const auto far = std::size_t(head_[slot][kFetchAhead]);
    __builtin_prefetch(&ops_[far], 1);
    __builtin_prefetch(&timeline_.start[far], 1);
    __builtin_prefetch(&timeline_.end[far], 1);
    graph_.prefetch_successors(TaskId(far));
    __builtin_prefetch(graph_.successors(head_[slot][kFetchAhead / 2]).data());
    for (const TaskId successor : graph_.successors(head_[slot][kFetchAhead / 4])) {
      __builtin_prefetch(&ops_[std::size_t(successor)], 1);
      __builtin_prefetch(&timeline_.start[std::size_t(successor)], 1);
    }
  }

  /// Takes `slot` up again later (from a stack: the stream most recently woken runs next).
  void wake(std::size_t slot) { waiting_.push_back(std::uint32_t(slot)); }

  std::string deadlock_report() const {
    // The ops that ran: those before the head of their stream.
    std::vector<bool> ran(graph_.size(), false);
    TimeNs stopped = 0;  // where the run stopped: the latest end of the ops that ran
    for (std::size_t slot = 0; slot < head_.size(); ++slot)
      for (const TaskId* t = graph_.stream(slot).data(); t != head_[slot]; ++t) {
        ran[std::size_t(*t)] = true;
        stopped = std::max(stopped, timeline_.end[std::size_t(*t)]);
      }
    std::string report =
        fmt::format("deadlock at t = {:.6f} ms: no op can start, but some have not run:", stopped / 1e6);
    for (std::size_t slot = 0; slot < head_.size(); ++slot) {
      if (head_[slot] == end_[slot]) continue;
      const TaskId t = *head_[slot];
      const Task& task = graph_.task(t);
      std::string reason = "waits for the other members of its collective";
      if (ops_[std::size_t(t)].pending > 0) {
        for (TaskId dep : graph_.deps(t))
          if (!ran[std::size_t(dep)]) {
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
  std::unique_ptr<OpState[]> ops_;
  Timeline timeline_;  ///< start and end of every op; end is its duration until it is known
  std::vector<const TaskId*> head_, end_;  ///< per (device, stream): next op, end of its program
  std::vector<TimeNs> free_at_;            ///< per (device, stream): when its last op ended
  std::vector<std::size_t> group_arrivals_;
  std::vector<TimeNs> group_ready_;  ///< per collective: latest arrival of its members so far
  std::vector<std::uint32_t> waiting_;  ///< streams to take up again
};

}  // namespace

Result<Timeline> simulate(const TaskGraph& graph, std::vector<TimeNs> durations) {
  if (durations.size() != graph.size())
    return Error{fmt::format("simulate: {} durations for {} ops", durations.size(), graph.size())};
  // Every end time is a sum of durations along a chain, so a total below 2^62 keeps all of them exact.
  // Where every duration is below 2^width and n of them stay below 2^62, that holds, and none is
  // negative (its sign bit would make the width 64): one OR over the durations shows it.
  std::uint64_t bits = 0;
  for (const TimeNs d : durations) bits |= std::uint64_t(d);
  if (std::bit_width(bits) + std::bit_width(durations.size()) <= 62) return Engine(graph, std::move(durations)).run();
  TimeNs total = 0;  // otherwise the exact check, naming what fails
  for (std::size_t i = 0; i < durations.size(); ++i) {
    if (durations[i] < 0)
      return Error{fmt::format("simulate: {} has no valid duration (negative, NaN or over 146 years); check the "
                               "hardware speeds, the costs and the model sizes",
                               graph.describe(TaskId(i)))};
    if (__builtin_add_overflow(total, durations[i], &total) || total > TimeNs(1) << 62)
      return Error{"simulate: the ops' durations add up to over 146 years; check the hardware speeds, the costs and "
                   "the model sizes"};
  }
  return Engine(graph, std::move(durations)).run();
}

}  // namespace pipesim
