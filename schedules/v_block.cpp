#include "v_block.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <deque>
#include <future>
#include <optional>
#include <tuple>

#include "greedy.h"
#include "order_eval.h"
#include "two_threads.h"

namespace pipesim {
namespace {

enum Pass { kF0, kF1, kB1, kB0, kW1, kW0 };

/// Busy intervals of one device, modulo the period.
class Ring {
 public:
  explicit Ring(TimeNs period) : period_(period) {}

  /// The first start >= earliest at which [start, start + duration) is free modulo the period;
  /// marks it busy. If a later start is free, one is where a busy interval ends.
  TimeNs take(TimeNs earliest, TimeNs duration) {
    std::vector<TimeNs> candidates{earliest};
    for (const auto& [begin, end] : busy_) candidates.push_back(earliest + ((end - earliest) % period_ + period_) % period_);
    std::sort(candidates.begin(), candidates.end());
    for (TimeNs start : candidates)
      if (is_free(start, duration)) {
        busy_.emplace_back(start % period_, start % period_ + duration);
        return start;
      }
    busy_.emplace_back(earliest % period_, earliest % period_ + duration);  // unreachable when work fits the period
    return earliest;
  }

 private:
  bool is_free(TimeNs start, TimeNs duration) const {
    const TimeNs s = start % period_;
    for (const auto& [begin, end] : busy_)
      for (TimeNs shift : {-period_, TimeNs(0), period_})  // intervals may wrap around the period
        if (s < end + shift && begin + shift < s + duration) return false;
    return true;
  }

  TimeNs period_;
  std::vector<std::pair<TimeNs, TimeNs>> busy_;  ///< [begin, end) with 0 <= begin < period
};

/// `orders` with, on each device, the oldest pending W pulled in front of any forward that would
/// take the device past `limit`: a W earlier in program order only frees memory sooner.
DeviceOrders within_memory(const ScheduleContext& context, const DeviceOrders& orders, const std::vector<Bytes>& limit) {
  DeviceOrders fitted(orders.size());
  for (std::size_t d = 0; d < orders.size(); ++d) {
    Bytes live = 0;
    std::deque<ComputeStep> pending;  // W whose B has run, oldest first
    std::vector<ComputeStep>& out = fitted[d];
    const auto emit_weight = [&](const ComputeStep& w) {
      out.push_back(w);
      live -= context.work[std::size_t(w.stage)].weight_held_bytes;
      std::erase_if(pending, [&](const ComputeStep& p) { return p.stage == w.stage && p.microbatch == w.microbatch; });
    };
    for (const ComputeStep& s : orders[d]) {
      const StageWork& w = context.work[std::size_t(s.stage)];
      if (s.kind == OpKind::W) {
        const bool waiting = std::any_of(pending.begin(), pending.end(),
                                         [&](const ComputeStep& p) { return p.stage == s.stage && p.microbatch == s.microbatch; });
        if (waiting) emit_weight(s);
        continue;
      }
      if (s.kind == OpKind::F)
        while (live + w.activation_bytes > limit[d] && !pending.empty()) emit_weight(pending.front());
      out.push_back(s);
      if (s.kind == OpKind::F) live += w.activation_bytes;
      if (s.kind == OpKind::B) live -= w.activation_bytes - w.weight_held_bytes, pending.push_back({OpKind::W, s.stage, s.microbatch});
    }
  }
  return fitted;
}

}  // namespace

VBlock v_block(const ScheduleContext& context, VSpacing spacing) {
  const Layout& layout = context.layout;
  const int p = layout.devices;
  const auto times = [&](int d, int chunk) { return context.times[std::size_t(layout.stage_of(d, chunk))]; };
  VBlock block;
  for (int d = 0; d < p; ++d) {
    TimeNs work = 0;
    for (int chunk : {0, 1}) work += times(d, chunk).forward + times(d, chunk).backward + times(d, chunk).weight;
    block.period = std::max(block.period, work);
  }
  block.period = std::max<TimeNs>(block.period, 1);
  block.start.assign(std::size_t(p), {});
  std::vector<Ring> rings(std::size_t(p), Ring(block.period));
  const TimeNs hop = context.transfer_ns;
  TimeNs ready = 0;  // when the next pass's input is available
  const auto place = [&](int d, Pass pass, TimeNs duration, double wait) {
    const TimeNs start = rings[std::size_t(d)].take(ready, duration);
    block.start[std::size_t(d)][pass] = start;
    ready = start + duration + TimeNs(wait * double(duration));
  };
  for (int d = 0; d < p; ++d, ready += hop) place(d, kF0, times(d, 0).forward, spacing.forward_down);
  ready -= hop;  // the turn at the last device stays on it
  for (int d = p - 1; d >= 0; --d, ready += hop) place(d, kF1, times(d, 1).forward, 0);
  ready -= hop;
  for (int d = 0; d < p; ++d, ready += hop) place(d, kB1, times(d, 1).backward, spacing.backward_up);
  ready -= hop;
  for (int d = p - 1; d >= 0; --d, ready += hop) place(d, kB0, times(d, 0).backward, 0);
  for (int d = 0; d < p; ++d) {
    auto& start = block.start[std::size_t(d)];
    start[kW1] = rings[std::size_t(d)].take(start[kB1] + times(d, 1).backward, times(d, 1).weight);
    start[kW0] = rings[std::size_t(d)].take(start[kB0] + times(d, 0).backward, times(d, 0).weight);
  }
  return block;
}

VBlock paper_v_half_block(const VPattern& pattern) {
  const std::size_t p = pattern.size();
  VBlock block{6, std::vector<std::array<TimeNs, 6>>(p)};
  std::vector<Ring> rings(p, Ring(6));
  for (std::size_t i = 0; i < p; ++i) {
    auto& start = block.start[i];
    for (int pass : {kF0, kF1, kB1, kB0}) start[std::size_t(pass)] = rings[i].take(pattern[i][std::size_t(pass)], 1);
    start[kW1] = rings[i].take(start[kB1] + 1, 1);
    start[kW0] = rings[i].take(start[kB0] + 1, 1);
  }
  return block;
}

ScheduleContext unit_costs(const ScheduleContext& context) {
  ScheduleContext unit = context;
  std::fill(unit.times.begin(), unit.times.end(), StageTimes{1, 1, 1});
  unit.transfer_ns = 0;
  return unit;
}

DeviceOrders orders_from_block(const ScheduleContext& context, const VBlock& block) {
  const Layout& layout = context.layout;
  const int m = context.microbatches;
  DeviceOrders orders(std::size_t(layout.devices));
  for (int d = 0; d < layout.devices; ++d) {
    const int chunk0 = layout.stage_of(d, 0), chunk1 = layout.stage_of(d, 1);
    const std::array<ComputeStep, 6> passes = {{{OpKind::F, chunk0, 0}, {OpKind::F, chunk1, 0}, {OpKind::B, chunk1, 0},
                                                {OpKind::B, chunk0, 0}, {OpKind::W, chunk1, 0}, {OpKind::W, chunk0, 0}}};
    // Pass p of microbatch x starts at start[p] + period * x: the order is every (p, x) by start,
    // equal starts to the earlier microbatch, then the earlier pass. With start[p] = q[p] * period +
    // r[p] (0 <= r[p] < period), (p, x) starts in period q[p] + x at offset r[p]: period by period,
    // the passes go in the order of their offsets, so one sort of the six passes orders them all.
    const std::array<TimeNs, 6>& start = block.start[std::size_t(d)];
    std::vector<ComputeStep>& order = orders[std::size_t(d)];
    order.reserve(passes.size() * std::size_t(m));
    std::array<TimeNs, 6> q{}, r{};  // a block's period is at least 1 and its starts are not negative
    for (std::size_t p = 0; p < passes.size(); ++p) q[p] = start[p] / block.period, r[p] = start[p] % block.period;
    std::array<std::size_t, 6> by_offset{0, 1, 2, 3, 4, 5};
    std::sort(by_offset.begin(), by_offset.end(), [&](std::size_t a, std::size_t b) {
      return std::tuple(r[a], -q[a], a) < std::tuple(r[b], -q[b], b);  // larger q: the earlier microbatch
    });
    const TimeNs first = *std::min_element(q.begin(), q.end()), last = *std::max_element(q.begin(), q.end()) + m - 1;
    for (TimeNs round = first; round <= last; ++round)  // round: which period of the block
      for (const std::size_t p : by_offset)
        if (const TimeNs x = round - q[p]; x >= 0 && x < m) order.push_back({passes[p].kind, passes[p].stage, int(x)});
  }
  return orders;
}

Result<DeviceOrders> v_schedule(const ScheduleContext& context, const VBlock& reference, VSpacing spacing,
                                const VPattern* pattern) {
  using Timed = std::pair<DeviceOrders, Result<OrderCost>>;
  const auto timed = [&context](DeviceOrders orders) {
    Result<OrderCost> cost = evaluate_orders(context, orders);
    return Timed{std::move(orders), std::move(cost)};
  };
  // The squeezed pattern, fitted to the reference block's peak memory, on a second thread: about
  // as much work as the other candidates on this one. The fit waits for the reference's peak
  // (nothing if it failed).
  std::promise<std::optional<Bytes>> reference_peak;
  auto squeezed = beside(context.worth_a_thread(), [&, peak = reference_peak.get_future()]() mutable {
    std::vector<DeviceOrders> orders;
    // The reference's own units only where nothing is added to the orders later: with vocabulary
    // passes the graph's iteration is not the orders' makespan, and there the units' order, faster
    // without them, ran slower with them (the vocabulary paper's V-Half setups, docs/schedules.md).
    if (pattern) orders.push_back(squeezed_v_orders(context, *pattern, SqueezeMemory::Bytes));
    if (pattern && context.vocab_delay == 0)
      orders.push_back(squeezed_v_orders(context, *pattern, SqueezeMemory::ReferenceUnits));
    const std::optional<Bytes> limit = peak.get();
    std::optional<Timed> fastest;
    if (!limit) return fastest;
    for (DeviceOrders& candidate : orders) {
      Timed fitted = timed(within_memory(context, candidate, std::vector<Bytes>(context.layout.devices, *limit)));
      if (fitted.second.ok() && (!fastest || fitted.second.value().makespan < fastest->second.value().makespan))
        fastest = std::move(fitted);
    }
    return fastest;
  });

  DeviceOrders best = orders_from_block(context, reference);
  Result<OrderCost> bound = evaluate_orders(context, best);
  if (!bound.ok()) {
    reference_peak.set_value(std::nullopt);
    return bound.error();
  }
  TimeNs best_makespan = bound.value().makespan;
  const std::vector<Bytes>& limit = bound.value().peak_activation;
  // A candidate may not hold more than the reference block's largest device: the peak memory the
  // schedule is known by. The greedy scheduler keeps each device within its own share.
  const Bytes peak = largest_peak(bound.value());
  reference_peak.set_value(peak);
  const auto consider = [&](DeviceOrders& candidate, const Result<OrderCost>& cost) {
    if (cost.ok() && improves_on(cost.value(), best_makespan, peak))
      best = std::move(candidate), best_makespan = cost.value().makespan;
  };
  // Weighed in this order (the first of equal makespans is kept): the blocks, greedy, the squeeze.
  for (const VBlock& block : {v_block(unit_costs(context), spacing), v_block(context, spacing)}) {
    Timed candidate = timed(orders_from_block(context, block));
    consider(candidate.first, candidate.second);
  }
  // The greedy order is kept only if it beats the best so far: it stops once it cannot.
  const std::atomic<TimeNs> to_beat = best_makespan;
  Result<GreedyOrders> greedy = greedy_schedule(context, GreedyOptions{limit, &to_beat});
  if (greedy.ok()) consider(greedy.value().orders, greedy.value().cost);
  if (std::optional<Timed> fitted = squeezed.get()) consider(fitted->first, fitted->second);
  return best;
}

}  // namespace pipesim
