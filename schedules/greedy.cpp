#include "greedy.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <deque>
#include <limits>
#include <queue>

namespace pipesim {
namespace {

constexpr TimeNs kNever = std::numeric_limits<TimeNs>::max();

class Greedy {
 public:
  Greedy(const ScheduleContext& context, const GreedyOptions& options)
      : c_(context), o_(options), stages_(context.layout.stage_count()), m_(context.microbatches) {
    const int devices = context.layout.devices;
    stages_of_.resize(std::size_t(devices));
    for (int s = 0; s < stages_; ++s) stages_of_[std::size_t(device_of(s))].push_back(s);
    // A microbatch enters a device at its first stage there; it may return for a later chunk (V
    // placement). Entering must leave room for a later-chunk forward, so that the oldest
    // microbatch -- the next one every later stage forwards, in order -- can always go on.
    // With vocabulary passes the oldest microbatch's backward also waits for vocab_delay later
    // microbatches' forwards through the last stage: room for that many more.
    headroom_.assign(std::size_t(devices), 0);
    for (int d = 0; d < devices; ++d)
      for (std::size_t k = 1; k < stages_of_[std::size_t(d)].size(); ++k)
        headroom_[std::size_t(d)] = std::max(headroom_[std::size_t(d)], work(stages_of_[std::size_t(d)][k]).activation_bytes);
    for (Bytes& room : headroom_) room *= 1 + context.vocab_delay;
    // Every forward also leaves room for what a recomputation (R, just before a B) takes, so that the
    // device stays within its budget when the B comes.
    rebuilt_.assign(std::size_t(devices), 0);
    for (int s = 0; s < stages_; ++s)
      rebuilt_[std::size_t(device_of(s))] = std::max(rebuilt_[std::size_t(device_of(s))], work(s).recompute_alloc(true));
    remaining_.assign(std::size_t(devices), 0);
    for (int s = 0; s < stages_; ++s) {
      const StageTimes& t = context.times[std::size_t(s)];
      remaining_[std::size_t(device_of(s))] += m_ * (t.forward + t.backward + t.weight);
    }
    next_forward_.assign(std::size_t(stages_), 0);
    next_backward_.assign(std::size_t(stages_), 0);
    forward_ready_.assign(std::size_t(stages_) * m_, kNever);
    backward_ready_.assign(std::size_t(stages_) * m_, kNever);
    for (int mb = 0; mb < m_; ++mb) forward_ready_[std::size_t(mb)] = 0;  // stage 0 reads the batch
    free_at_.assign(std::size_t(devices), 0);
    queued_for_.assign(std::size_t(devices), -1);
    memory_.assign(std::size_t(devices), 0);
    cost_.peak_activation.assign(std::size_t(devices), 0);
    weights_.resize(std::size_t(devices));
    orders_.resize(std::size_t(devices));
    for (int d = 0; d < devices; ++d)  // F, B and W of each of its stages, every microbatch
      orders_[std::size_t(d)].reserve(3 * stages_of_[std::size_t(d)].size() * std::size_t(m_));
  }

  /// At each time something may start, passes over the devices in index order, each device
  /// starting at most one op per pass, until a pass starts nothing (zero-length ops can enable
  /// others at the same instant). Only devices woken at this time -- freed, or given an input --
  /// are visited: any other is busy or found nothing ready when last visited, and nothing it waits
  /// for has changed since.
  Result<GreedyOrders> run() {
    const std::size_t total = std::size_t(stages_) * m_ * 3;
    std::size_t placed = 0;
    for (int d = 0; d < c_.layout.devices; ++d) wake(d);
    while (true) {
      while (!next_pass_.empty()) {
        std::swap(this_pass_, next_pass_);  // this_pass_ was drained by the pass before
        ++pass_;
        while (!this_pass_.empty()) {
          visiting_ = this_pass_.top();
          this_pass_.pop();
          if (free_at_[std::size_t(visiting_)] <= now_ && start_next(visiting_, now_)) ++placed;
        }
        visiting_ = -1;
      }
      if (placed == total) break;
      if (events_.empty()) return Error{stuck_message()};
      // Out through the loop's end: measured, one more return from inside it slows the loop by half.
      if (o_.give_up_at && ++steps_ % kStepsPerCheck == 0 && !can_beat(*o_.give_up_at)) break;
      now_ = events_.top().time;
      for (; !events_.empty() && events_.top().time == now_; events_.pop()) wake(events_.top().device);
    }
    if (placed < total) return Error{"the greedy order cannot finish before its rival"};
    return GreedyOrders{std::move(orders_), std::move(cost_)};
  }

 private:
  int device_of(int stage) const { return c_.layout.stages[std::size_t(stage)].device; }
  std::size_t at(int stage, int mb) const { return std::size_t(stage) * m_ + std::size_t(mb); }
  const StageWork& work(int stage) const { return c_.work[std::size_t(stage)]; }
  TimeNs hop(int from, int to) const { return device_of(from) == device_of(to) ? 0 : c_.transfer_ns; }
  /// Whether the makespan may still come out below `rival`. No op starts before now_, and each
  /// device runs one at a time: its work still to place ends no earlier than that work after now_
  /// (or after its current op).
  bool can_beat(const std::atomic<TimeNs>& rival) const {
    TimeNs bound = cost_.makespan;
    for (std::size_t d = 0; d < remaining_.size(); ++d)
      bound = std::max(bound, std::max(now_, free_at_[d]) + remaining_[d]);
    return bound < rival.load(std::memory_order_relaxed);
  }
  bool fits(int d, int s) const {
    const bool enters = s == stages_of_[std::size_t(d)].front();
    return memory_[std::size_t(d)] + work(s).activation_bytes + rebuilt_[std::size_t(d)] +
               (enters ? headroom_[std::size_t(d)] : 0) <=
           o_.budget[std::size_t(d)];
  }

  /// Starts the best ready op on device d at `now`; false when nothing is ready.
  bool start_next(int d, TimeNs now) {
    int best_backward = -1, best_forward = -1;
    TimeNs best_ready = kNever;
    for (int s : stages_of_[std::size_t(d)]) {
      const int b = next_backward_[std::size_t(s)];
      if (b < next_forward_[std::size_t(s)] && backward_ready_[at(s, b)] <= now && backward_ready_[at(s, b)] < best_ready)
        best_backward = s, best_ready = backward_ready_[at(s, b)];
      const int f = next_forward_[std::size_t(s)];
      // Among forwards: the oldest microbatch, then the later stage (it reaches the turn sooner).
      if (f < m_ && forward_ready_[at(s, f)] <= now && fits(d, s) &&
          (best_forward < 0 || f <= next_forward_[std::size_t(best_forward)]))
        best_forward = s;
    }
    if (best_backward >= 0) return backward(d, best_backward, now), true;
    if (best_forward >= 0) return forward(d, best_forward, now), true;
    if (!weights_[std::size_t(d)].empty()) return weight(d, now), true;
    return false;
  }

  void forward(int d, int s, TimeNs now) {
    const int mb = next_forward_[std::size_t(s)]++;
    const TimeNs duration = c_.times[std::size_t(s)].forward, end = now + duration;
    remaining_[std::size_t(d)] -= duration;
    orders_[std::size_t(d)].push_back({OpKind::F, s, mb});
    memory_[std::size_t(d)] += work(s).activation_bytes;
    cost_.peak_activation[std::size_t(d)] = std::max(cost_.peak_activation[std::size_t(d)], memory_[std::size_t(d)]);
    cost_.makespan = std::max(cost_.makespan, end);
    if (s + 1 < stages_) {
      set(forward_ready_[at(s + 1, mb)], end + hop(s, s + 1), device_of(s + 1));
    } else {
      // The loss is computed in the last stage's forward; with vocabulary passes, the backward of
      // a microbatch waits until the forward of the one `vocab_delay` later has run.
      const int delay = c_.vocab_delay;
      if (mb - delay >= 0) set(backward_ready_[at(s, mb - delay)], end, d);
      if (mb == m_ - 1)
        for (int x = std::max(0, mb - delay + 1); x < m_; ++x) set(backward_ready_[at(s, x)], end, d);
    }
    set(free_at_[std::size_t(d)], end, d);
  }

  void backward(int d, int s, TimeNs now) {
    const int mb = next_backward_[std::size_t(s)]++;
    const TimeNs duration = c_.times[std::size_t(s)].backward, end = now + duration;
    remaining_[std::size_t(d)] -= duration;
    orders_[std::size_t(d)].push_back({OpKind::B, s, mb});
    cost_.makespan = std::max(cost_.makespan, end);
    // As the graph has it (StageWork): R, just before B, takes what it rebuilds; B returns that and
    // what F kept, less what W still needs.
    memory_[std::size_t(d)] += work(s).recompute_alloc(true);
    cost_.peak_activation[std::size_t(d)] = std::max(cost_.peak_activation[std::size_t(d)], memory_[std::size_t(d)]);
    memory_[std::size_t(d)] -= work(s).backward_free(true);
    weights_[std::size_t(d)].push_back({s, mb});
    if (s > 0) set(backward_ready_[at(s - 1, mb)], end + hop(s, s - 1), device_of(s - 1));
    set(free_at_[std::size_t(d)], end, d);
  }

  void weight(int d, TimeNs now) {
    const auto [s, mb] = weights_[std::size_t(d)].front();
    weights_[std::size_t(d)].pop_front();
    orders_[std::size_t(d)].push_back({OpKind::W, s, mb});
    memory_[std::size_t(d)] -= work(s).weight_held_bytes;
    const TimeNs duration = c_.times[std::size_t(s)].weight, end = now + duration;
    remaining_[std::size_t(d)] -= duration;
    cost_.makespan = std::max(cost_.makespan, end);
    set(free_at_[std::size_t(d)], end, d);
  }

  /// Every time a device frees up or an input arrives is a time something may start there -- except
  /// an input that arrives while the device is busy: the event of its freeing visits it then.
  void set(TimeNs& when, TimeNs time, int device) {
    const TimeNs busy_until = free_at_[std::size_t(device)];  // read before `when` may change it
    when = time;
    if (time <= now_) wake(device);  // a zero-length op: at this same instant
    else if (busy_until <= now_ || time > busy_until) events_.push({time, device});
  }

  /// Device d is visited at now_: in the pass under way if its turn in it is still to come, else in
  /// the next pass -- when a scan of every device in index order would next reach it.
  void wake(int d) {
    const bool this_pass = visiting_ >= 0 && d > visiting_;
    const std::int64_t pass = this_pass ? pass_ : pass_ + 1;
    if (queued_for_[std::size_t(d)] == pass) return;
    queued_for_[std::size_t(d)] = pass;
    (this_pass ? this_pass_ : next_pass_).push(d);
  }

  std::string stuck_message() const {
    for (int d = 0; d < c_.layout.devices; ++d)
      for (int s : stages_of_[std::size_t(d)])
        if (next_forward_[std::size_t(s)] < m_ && !fits(d, s))
          return fmt::format("the activation budget of device {} ({} bytes) leaves no room for the next forward of "
                             "stage {}; the schedule cannot progress with this memory limit",
                             d, o_.budget[std::size_t(d)], s);
    return "the schedule cannot progress: no op is ready on any device";
  }

  const ScheduleContext& c_;
  const GreedyOptions& o_;
  int stages_, m_;
  std::vector<std::vector<int>> stages_of_;             ///< per device: its stages, in model order
  std::vector<Bytes> headroom_;                         ///< per device: room kept for a later chunk
  std::vector<Bytes> rebuilt_;                          ///< per device: the most one of its R's takes
  std::vector<int> next_forward_, next_backward_;      ///< per stage: next microbatch (in order)
  std::vector<TimeNs> forward_ready_, backward_ready_;  ///< per (stage, mb): when its input arrives
  std::vector<TimeNs> free_at_;
  std::vector<Bytes> memory_;                           ///< per device: live activation bytes
  std::vector<TimeNs> remaining_;                       ///< per device: the durations of its ops not yet placed
  std::vector<std::deque<std::pair<int, int>>> weights_;  ///< per device: deferred W, oldest first
  DeviceOrders orders_;
  OrderCost cost_;  ///< makespan and peak activations, kept as the ops are placed
  TimeNs now_ = 0;
  /// When an input arrives at a device or it frees up, earliest first. Ordered by time alone: every
  /// event of one time is taken before any device is visited, and the visits go in device order
  /// whatever order the events came in.
  struct Event {
    TimeNs time;
    int device;
  };
  struct Later {
    bool operator()(const Event& a, const Event& b) const { return a.time > b.time; }
  };
  std::priority_queue<Event, std::vector<Event>, Later> events_;
  /// Devices to visit at now_, lowest index first: in the pass under way and in the next one.
  std::priority_queue<int, std::vector<int>, std::greater<>> this_pass_, next_pass_;
  std::int64_t pass_ = 0;               ///< passes so far
  std::int64_t steps_ = 0;              ///< times at which ops were started, so far
  /// How often (in those times) the bound is compared with give_up_at: each check costs a pass
  /// over the devices.
  static constexpr std::int64_t kStepsPerCheck = 64;
  int visiting_ = -1;                   ///< the device the pass under way is at
  std::vector<std::int64_t> queued_for_;  ///< per device: the pass it is queued for
};

}  // namespace

Result<GreedyOrders> greedy_schedule(const ScheduleContext& context, const GreedyOptions& options) {
  return Greedy(context, options).run();
}

std::vector<Bytes> activation_budget(const ScheduleContext& context, double (*units)(int device, int devices)) {
  const Layout& layout = context.layout;
  std::vector<Bytes> all_chunks(std::size_t(layout.devices), 0);
  for (int s = 0; s < layout.stage_count(); ++s)
    all_chunks[std::size_t(layout.stages[std::size_t(s)].device)] += context.work[std::size_t(s)].activation_bytes;
  std::vector<Bytes> budget;
  for (int d = 0; d < layout.devices; ++d) {
    const double sum = double(all_chunks[std::size_t(d)]);
    // The delay keeps vocab_delay more microbatches in flight, and the headroom grows with it.
    const double chunks = units(d, layout.devices) + double(context.vocab_delay * (layout.chunks + 1));
    budget.push_back(std::max(Bytes(sum), Bytes(std::llround(chunks * sum / layout.chunks))));
  }
  return budget;
}

}  // namespace pipesim
