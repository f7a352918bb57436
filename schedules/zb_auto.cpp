#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <limits>
#include <optional>

#include "order_eval.h"
#include "schedule.h"

namespace pipesim {
namespace {

/// The heuristic's three binary hyperparameters; the paper grid-searches all eight combinations.
struct Knobs {
  bool bubble_before_first_b;  ///< warm-up: one more F even if it delays the first B a little
  bool skip_surplus_forward;   ///< steady state: skip an F a stage is two ahead with, if no bubble grows
  bool fill_small_gaps;        ///< a gap shorter than W still gets a W when it is not the worst bubble
};

/// One run of the zero-bubble paper's heuristic (Qi et al., "Zero Bubble Pipeline Parallelism",
/// ICLR 2024, §3.1; its Megatron fork's scheduler/zb.py) for one stage per device. It plays the
/// pipeline forward in time, microbatch by microbatch: a warm-up with as many forwards as fit the
/// memory limit and shrink the bubble before the first B; then per microbatch one F and one B per
/// stage, a W put into every gap before an input arrives (and wherever the memory limit needs one
/// freed), and at the end the W left over. The times it keeps are its own estimate (an op starts when
/// its device is free and its input has arrived, one transfer later); evaluate_orders judges the
/// orders it returns.
class Heuristic {
 public:
  Heuristic(const ScheduleContext& context, const std::vector<Bytes>& limit, Knobs knobs)
      : c_(context), limit_(limit), knobs_(knobs), p_(context.layout.devices), m_(context.microbatches),
        count_(std::size_t(p_), {0, 0, 0}), free_at_(std::size_t(p_), 0), memory_(std::size_t(p_), 0),
        bubble_(std::size_t(p_), 0), forward_end_(std::size_t(p_ * m_), 0), backward_end_(std::size_t(p_ * m_), 0),
        orders_(std::size_t(p_)) {}

  /// Fails where the limit leaves a stage no W to free memory with.
  Result<DeviceOrders> run() {
    warm_up();
    if (failed_) return Error{*failed_};
    for (int i = 1; i < m_ && !failed_; ++i) steady_step(i);
    if (failed_) return Error{*failed_};
    for (int j = 0; j < p_; ++j)
      while (done(j, kW) < m_) put(j, kW);
    return std::move(orders_);
  }

 private:
  static constexpr int kF = 0, kB = 1, kW = 2;

  TimeNs cost(int j, int kind) const {
    const StageTimes& t = c_.times[std::size_t(j)];
    return kind == kF ? t.forward : kind == kB ? t.backward : t.weight;
  }
  /// What the op takes before it runs (F its activations, B the recomputation before it) and what
  /// the device holds after it, relative to before.
  Bytes rise(int j, int kind) const {
    const StageWork& w = c_.work[std::size_t(j)];
    return kind == kF ? w.activation_bytes : kind == kB ? w.recompute_alloc(true) : 0;
  }
  Bytes change(int j, int kind) const {
    const StageWork& w = c_.work[std::size_t(j)];
    return kind == kF ? w.activation_bytes : kind == kB ? w.recompute_alloc(true) - w.backward_free(true)
                                                        : -w.weight_held_bytes;
  }
  int& done(int j, int kind) { return count_[std::size_t(j)][std::size_t(kind)]; }
  TimeNs& forward_end(int j, int mb) { return forward_end_[std::size_t(j * m_ + mb)]; }
  TimeNs& backward_end(int j, int mb) { return backward_end_[std::size_t(j * m_ + mb)]; }
  TimeNs worst_bubble() const { return *std::max_element(bubble_.begin(), bubble_.end()); }

  void put(int j, int kind) {
    const int mb = done(j, kind);
    const TimeNs without_wait = free_at_[std::size_t(j)] + cost(j, kind);
    TimeNs end = without_wait;
    if (kind == kF && j > 0) end = std::max(end, forward_end(j - 1, mb) + c_.transfer_ns + cost(j, kind));
    if (kind == kB && j + 1 < p_) end = std::max(end, backward_end(j + 1, mb) + c_.transfer_ns + cost(j, kind));
    if (done(j, kF) > 0) bubble_[std::size_t(j)] += end - without_wait;  // the start-up wait is not a bubble
    free_at_[std::size_t(j)] = end;
    if (kind == kF) forward_end(j, mb) = end;
    if (kind == kB) backward_end(j, mb) = end;
    memory_[std::size_t(j)] += change(j, kind);
    orders_[std::size_t(j)].push_back({kind == kF ? OpKind::F : kind == kB ? OpKind::B : OpKind::W, j, mb});
    ++done(j, kind);
  }

  /// What an op needs free: its own rise, and for a forward also room for the recomputation a later
  /// B makes, so that the forward cannot leave B without it.
  Bytes room(int j, int kind) const { return rise(j, kind) + (kind == kF ? rise(j, kB) : 0); }

  /// W passes until the next op's room fits the limit; fails when there is no W left to run.
  void make_room(int j, int kind) {
    while (memory_[std::size_t(j)] + room(j, kind) > limit_[std::size_t(j)]) {
      if (done(j, kW) >= done(j, kB)) {
        failed_ = fmt::format("device {} cannot hold microbatch {}'s {} within {} of activations", j, done(j, kind),
                              kind == kF ? "forward" : "backward", describe_bytes(limit_[std::size_t(j)]));
        return;
      }
      put(j, kW);
    }
  }

  /// W passes into the gap before an input arriving at `ready`: each that ends by then, and one more
  /// that overruns it unless the gap is small and not the worst bubble (`fill_small_gaps` decides).
  void fill_gap(int j, TimeNs ready) {
    while (done(j, kW) < done(j, kB) && free_at_[std::size_t(j)] + cost(j, kW) <= ready) put(j, kW);
    if (done(j, kW) < done(j, kB) && free_at_[std::size_t(j)] < ready) {
      const bool small = ready - free_at_[std::size_t(j)] <= worst_bubble() - bubble_[std::size_t(j)];
      if (!small || knobs_.fill_small_gaps) put(j, kW);
    }
  }

  /// The first microbatch (and the vocab_delay after it) through every stage, then per stage the
  /// extra forwards that fit the limit before its first B is due, fewer on each later stage.
  void warm_up() {
    for (int k = 0; k < std::min(1 + c_.vocab_delay, m_); ++k)
      for (int j = 0; j < p_; ++j) put(j, kF);
    std::vector<int> extra(std::size_t(p_), 0);
    TimeNs first_b_end = free_at_[std::size_t(p_ - 1)] + cost(p_ - 1, kB);  // the last stage's first B
    for (int j = p_ - 2; j >= 0; --j) {
      Bytes memory = memory_[std::size_t(j)];
      TimeNs busy_until = free_at_[std::size_t(j)];
      const TimeNs input_due = first_b_end + c_.transfer_ns;
      while (done(j, kF) + extra[std::size_t(j)] < m_ && memory + room(j, kF) <= limit_[std::size_t(j)]) {
        if (knobs_.bubble_before_first_b ? busy_until + cost(j, kF) > input_due : busy_until >= input_due) break;
        memory += change(j, kF);
        busy_until += cost(j, kF);
        ++extra[std::size_t(j)];
      }
      first_b_end = std::max(busy_until, input_due) + cost(j, kB);
    }
    // Each stage keeps fewer extra forwards than the one before it (all of them once they run out),
    // so that every forward it runs has come through the stage before.
    for (int j = 1; j < p_; ++j) {
      int& e = extra[std::size_t(j)];
      const int before = extra[std::size_t(j - 1)];
      while (e > 0 && (e > before || (e == before && done(j, kF) + e < m_))) --e;
    }
    for (int j = 0; j < p_; ++j)
      for (int k = 0; k < extra[std::size_t(j)]; ++k) put(j, kF);
    for (int j = p_ - 1; j >= 0 && !failed_; --j) {
      make_room(j, kB);
      put(j, kB);
    }
  }

  /// Microbatch i's B on every stage, after at most one F each.
  void steady_step(int i) {
    std::vector<int> forward(std::size_t(p_), 0);
    for (int j = 0; j < p_; ++j) forward[std::size_t(j)] = wants_forward(j) ? 1 : 0;
    for (int j = p_ - 2; j >= 0; --j) forward[std::size_t(j)] = std::min(forward[std::size_t(j)], forward[std::size_t(j + 1)]);
    for (int j = 0; j < p_ && !failed_; ++j) {
      if (!forward[std::size_t(j)]) continue;
      make_room(j, kF);
      if (j > 0) fill_gap(j, forward_end(j - 1, done(j, kF)) + c_.transfer_ns);
      put(j, kF);
    }
    for (int j = p_ - 1; j >= 0 && !failed_; --j) {
      make_room(j, kB);
      if (j + 1 < p_) fill_gap(j, backward_end(j + 1, i) + c_.transfer_ns);
      if (j == 0 && done(0, kF) == m_)
        while (done(0, kW) < done(0, kB)) put(0, kW);
      put(j, kB);
    }
  }

  /// Whether stage j runs a forward this step: always while it has any left, unless it is two or
  /// more ahead of the next stage, which will not need it soon, and skipping it grows no bubble.
  bool wants_forward(int j) {
    if (done(j, kF) >= m_) return false;
    if (!knobs_.skip_surplus_forward || j + 1 >= p_ || done(j, kF) < done(j + 1, kF) + 2) return true;
    const TimeNs next_needs = free_at_[std::size_t(j + 1)] + cost(j + 1, kF) + cost(j + 1, kB) + c_.transfer_ns;
    const TimeNs free = free_at_[std::size_t(j)];
    if (free >= next_needs) return false;
    TimeNs freeing = 0;  // the W that must run first for the forward to fit
    Bytes memory = memory_[std::size_t(j)] + change(j, kF);
    for (int w = done(j, kW); memory > limit_[std::size_t(j)] && w < done(j, kB); ++w) {
      freeing += cost(j, kW);
      memory += change(j, kW);
    }
    if (free + cost(j, kF) + freeing <= next_needs) return true;
    return next_needs - free > worst_bubble() - bubble_[std::size_t(j)];
  }

  static std::string describe_bytes(Bytes b) {
    return b >= (Bytes(1) << 30) ? fmt::format("{:.2f} GiB", double(b) / double(Bytes(1) << 30))
                                 : fmt::format("{:.1f} KiB", double(b) / 1024.0);
  }

  const ScheduleContext& c_;
  const std::vector<Bytes>& limit_;
  Knobs knobs_;
  int p_, m_;
  std::vector<std::array<int, 3>> count_;  ///< per stage: F, B, W run so far
  std::vector<TimeNs> free_at_;            ///< per stage: when its last op ends
  std::vector<Bytes> memory_;              ///< per stage: activations held
  std::vector<TimeNs> bubble_;             ///< per stage: idle time since its first forward
  std::vector<TimeNs> forward_end_, backward_end_;  ///< per stage and microbatch
  DeviceOrders orders_;
  std::optional<std::string> failed_;
};

constexpr Bytes kUnbounded = std::numeric_limits<Bytes>::max() / 4;

/// 1F1B's peak activation on its largest device: the unit of schedule.memory_limit.
Result<Bytes> one_f_one_b_peak(const ScheduleContext& context) {
  Result<DeviceOrders> orders = generate_1f1b(context);
  if (!orders.ok()) return orders.error();
  Result<OrderCost> cost = evaluate_orders(context, orders.value());
  if (!cost.ok()) return cost.error();
  return largest_peak(cost.value());
}

/// Per device, the activation bytes `limit` allows.
Result<std::vector<Bytes>> device_limits(const ScheduleContext& context, const ActivationLimit& limit) {
  const std::size_t devices = std::size_t(context.layout.devices);
  switch (limit.unit) {
    case ActivationLimit::Unit::Times1F1B: {
      Result<Bytes> unit = one_f_one_b_peak(context);
      if (!unit.ok()) return unit.error();
      return std::vector<Bytes>(devices, Bytes(double(unit.value()) * limit.value));
    }
    case ActivationLimit::Unit::Bytes: return std::vector<Bytes>(devices, Bytes(limit.value));
    case ActivationLimit::Unit::Fit: break;
  }
  if (context.activation_room.empty()) return std::vector<Bytes>(devices, kUnbounded);
  return context.activation_room;
}

/// The orders of the best of the heuristic's eight runs under `limit`: the shortest iteration (the
/// longest device span where iterations overlap, as the paper measures), among those whose evaluated
/// peaks keep within the limit -- the check the paper's scheduler makes of its own output.
Result<DeviceOrders> zero_bubble_auto(const ScheduleContext& context, const ActivationLimit& limit) {
  if (context.layout.stage_count() != context.layout.devices)
    return Error{"the zero-bubble scheduler runs one stage per device (parallel.chunks does not apply)"};
  Result<std::vector<Bytes>> limits = device_limits(context, limit);
  if (!limits.ok()) return limits.error();
  std::optional<DeviceOrders> best;
  TimeNs best_time = 0;
  std::string why;
  for (const bool before_first_b : {true, false})
    for (const bool skip : {true, false})
      for (const bool small_gaps : {true, false}) {
        Result<DeviceOrders> orders = Heuristic(context, limits.value(), {before_first_b, skip, small_gaps}).run();
        if (!orders.ok()) {
          why = orders.error().message;
          continue;
        }
        Result<OrderCost> cost = evaluate_orders(context, orders.value(), OpTimes::Record);
        if (!cost.ok()) return cost.error();  // the heuristic keeps the data flow: a bug if not
        const OrderCost& c = cost.value();
        bool within = true;
        TimeNs time = c.makespan;
        if (context.iterations_overlap) time = 0;
        for (std::size_t d = 0; d < c.peak_activation.size(); ++d) {
          within = within && c.peak_activation[d] <= limits.value()[d];
          if (context.iterations_overlap && !c.end[d].empty()) time = std::max(time, c.end[d].back() - c.start[d].front());
        }
        if (!within) {
          why = "its order exceeds the limit once the graph's memory is counted";
          continue;
        }
        if (!best || time < best_time) best = std::move(orders).value(), best_time = time;
      }
  if (!best)
    return Error{fmt::format("no zero-bubble schedule fits an activation limit of {}: {}; raise schedule.memory_limit "
                             "(1x is 1F1B's peak activation memory)",
                             activation_limit_text(limit), why)};
  return std::move(*best);
}

}  // namespace

std::optional<ActivationLimit> automatic_limit(std::string_view schedule, const ActivationLimit& configured) {
  if (schedule == "zb-1p") return ActivationLimit{ActivationLimit::Unit::Times1F1B, 1};
  if (schedule == "zb-2p") return ActivationLimit{ActivationLimit::Unit::Times1F1B, 2};
  if (schedule == "zb-auto") return configured;
  return std::nullopt;
}

Result<DeviceOrders> generate_zb_auto(const ScheduleContext& context) {
  return zero_bubble_auto(context, *automatic_limit("zb-auto", context.memory_limit));
}
Result<DeviceOrders> generate_zb_1p(const ScheduleContext& context) {
  return zero_bubble_auto(context, *automatic_limit("zb-1p", context.memory_limit));
}
Result<DeviceOrders> generate_zb_2p(const ScheduleContext& context) {
  return zero_bubble_auto(context, *automatic_limit("zb-2p", context.memory_limit));
}

}  // namespace pipesim
