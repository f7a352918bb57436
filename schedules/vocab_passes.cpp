#include "vocab_passes.h"

#include <algorithm>
#include <compare>
#include <cstdint>
#include <future>
#include <span>

#include "two_threads.h"

namespace pipesim {

int vocab_delay(VocabPlacement vocab, int devices) {
  switch (vocab) {
    case VocabPlacement::OnStages: return 0;
    case VocabPlacement::Vocab1: return 2;
    case VocabPlacement::Vocab2: return 1;
    case VocabPlacement::Interlaced: return std::max(1, devices / 2);
  }
  return 0;
}

DeviceOrders delay_last_backward(const Layout& layout, const DeviceOrders& orders, int delay, int microbatches) {
  if (delay == 0) return orders;
  const int last = layout.stage_count() - 1;
  const auto m = std::size_t(microbatches);
  const auto anchor_of = [&](std::size_t x) { return std::min(x + std::size_t(delay), m - 1); };
  DeviceOrders delayed = orders;
  auto& order = delayed[std::size_t(layout.stages[std::size_t(last)].device)];
  // Moving microbatch x's backward (and W) behind the forward of x + delay never changes the
  // relative order of another microbatch's ops or of any forward, so each move can be decided on
  // the original order and the result written in one pass.
  constexpr std::size_t kAbsent = SIZE_MAX;
  std::vector<std::size_t> forward(m, kAbsent), backward(m, kAbsent), weight(m, kAbsent);
  for (std::size_t i = 0; i < order.size(); ++i) {
    const ComputeStep& s = order[i];
    if (s.stage != last) continue;
    auto& position = s.kind == OpKind::F ? forward : s.kind == OpKind::B ? backward : weight;
    position[std::size_t(s.microbatch)] = i;
  }
  std::vector<std::uint8_t> moves_backward(m, 0), moves_weight(m, 0);
  for (std::size_t x = 0; x < m; ++x) {
    const std::size_t anchor = forward[anchor_of(x)];
    if (backward[x] == kAbsent || anchor == kAbsent || backward[x] > anchor) continue;
    moves_backward[x] = 1;
    moves_weight[x] = weight[x] != kAbsent && weight[x] < anchor;
  }
  std::vector<ComputeStep> result;
  result.reserve(order.size());
  for (const ComputeStep& s : order) {
    const auto x = std::size_t(s.microbatch);
    const bool moves = s.stage == last && ((s.kind == OpKind::B && moves_backward[x]) ||
                                           (s.kind == OpKind::W && moves_weight[x]));
    if (moves) continue;
    result.push_back(s);
    if (s.stage != last || s.kind != OpKind::F) continue;
    // The microbatches anchored here; each move went right behind the anchor, ahead of the moves
    // made before it, so the latest microbatch comes first.
    const std::size_t first = x - std::min(x, std::size_t(delay)), past = x + 1 < m ? first + 1 : m;
    for (std::size_t y = past; y-- > first;) {
      if (anchor_of(y) != x || !moves_backward[y]) continue;
      result.push_back({OpKind::B, last, int(y)});
      if (moves_weight[y]) result.push_back({OpKind::W, last, int(y)});
    }
  }
  order = std::move(result);
  return delayed;
}

namespace {

struct Insertion {
  std::size_t slot;  ///< goes before the op at this position of the original order
  TimeNs time;       ///< desired start, orders insertions that share a slot
  int rank;          ///< then this, so that S(x + 1) precedes T(x)
  ComputeStep step;
};

/// What orders the insertions of one device: slot, then Insertion::time and rank within a group.
struct SortKey {
  std::size_t slot;
  std::uint32_t group;
  TimeNs time;
  int rank;
  std::uint32_t index;  ///< into the insertions, as added
  auto operator<=>(const SortKey&) const = default;
};

/// The first position in [low, high) whose op starts (in the estimate) at `time` or later; `high`
/// if none. A device's ops start in program order, so `start` is sorted.
std::size_t slot_at(const std::vector<TimeNs>& start, TimeNs time, std::size_t low, std::size_t high) {
  if (low >= high) return high;
  return std::size_t(std::lower_bound(start.begin() + std::ptrdiff_t(low), start.begin() + std::ptrdiff_t(high), time) -
                     start.begin());
}

/// How one op of the transformer orders is tied, through the data flow and program order, to the
/// ops the vocabulary passes hang on: what it waits for, and what waits for it. The two are worked
/// out apart (forwards and backwards through the ops), so each has its own record.
struct Waits {
  int last_backward = -1;  ///< greatest x: the op waits for B(last stage, x); -1 if none
  int first_forward = -1;  ///< greatest x: the op waits for F(stage 0, x); -1 if none
};
constexpr int kNoMicrobatch = 1 << 30;
struct Feeds {
  int last_forward = kNoMicrobatch;    ///< least x: F(last stage, x) waits for the op; kNoMicrobatch if none
  int first_backward = kNoMicrobatch;  ///< least x: B(stage 0, x) waits for the op; kNoMicrobatch if none
};

/// The ties of every op, the devices' orders laid end to end (one record per op: the passes below
/// reach ops all over the schedule, one cache line each).
struct Reach {
  std::vector<std::size_t> first;  ///< where device d's ops start in `waits` and `feeds`; then the end
  std::vector<Waits> waits;
  std::vector<Feeds> feeds;
  std::vector<bool> last_forward_waits_backward;  ///< per x: F(last, x + 1) waits for B(last, x)
  template <class T>
  std::span<const T> of(const std::vector<T>& ties, std::size_t d) const {
    return std::span(ties).subspan(first[d], first[d + 1] - first[d]);
  }
};

/// `sequence`: every op after its inputs and its device's previous op (OrderCost::sequence).
/// The pass forwards (what each op waits for) and the pass backwards (what waits for it) share
/// nothing they write: on a large schedule they run on two threads.
Reach reach_of(const ScheduleContext& context, const DeviceOrders& orders,
               std::span<const std::pair<std::uint32_t, std::uint32_t>> sequence) {
  const int stages = context.layout.stage_count(), last = stages - 1, m = context.microbatches;
  Reach r;
  r.first.assign(orders.size() + 1, 0);
  for (std::size_t d = 0; d < orders.size(); ++d) r.first[d + 1] = r.first[d] + orders[d].size();
  // Where F, B and W of (stage, x) sit in `waits` and `feeds`.
  std::vector<std::uint32_t> where(std::size_t(3 * stages * m), 0);
  const auto key = [&](const ComputeStep& s) {
    return std::size_t((pass_index(s.kind) * stages + s.stage) * m + s.microbatch);
  };
  for (std::size_t d = 0; d < orders.size(); ++d)
    for (std::size_t i = 0; i < orders[d].size(); ++i) where[key(orders[d][i])] = std::uint32_t(r.first[d] + i);

  std::future<void> backwards = beside(context.worth_a_thread(), [&] {
    r.feeds.assign(r.first.back(), Feeds{});
    for (auto it = sequence.rbegin(); it != sequence.rend(); ++it) {
      const auto [d, i] = *it;
      const std::size_t at = r.first[d] + i;
      const ComputeStep& s = orders[d][i];
      Feeds& t = r.feeds[at];
      if (s.kind == OpKind::F && s.stage == last) t.last_forward = std::min(t.last_forward, s.microbatch);
      if (s.kind == OpKind::B && s.stage == 0) t.first_backward = std::min(t.first_backward, s.microbatch);
      // Hand the values to the inputs and the program-order predecessor.
      const auto hand = [&](std::size_t to) {
        Feeds& u = r.feeds[to];
        u.last_forward = std::min(u.last_forward, t.last_forward);
        u.first_backward = std::min(u.first_backward, t.first_backward);
      };
      for (const ComputeStep& input : data_inputs(s, stages)) hand(where[key(input)]);
      if (i > 0) hand(at - 1);
    }
  });

  r.waits.assign(r.first.back(), Waits{});
  for (const auto& [d, i] : sequence) {
    const std::size_t at = r.first[d] + i;
    const ComputeStep& s = orders[d][i];
    Waits& t = r.waits[at];
    if (i > 0) t = r.waits[at - 1];  // what the program-order predecessor waits for
    for (const ComputeStep& input : data_inputs(s, stages)) {
      const Waits& u = r.waits[where[key(input)]];
      t.last_backward = std::max(t.last_backward, u.last_backward);
      t.first_forward = std::max(t.first_forward, u.first_forward);
    }
    if (s.kind == OpKind::B && s.stage == last) t.last_backward = std::max(t.last_backward, s.microbatch);
    if (s.kind == OpKind::F && s.stage == 0) t.first_forward = std::max(t.first_forward, s.microbatch);
  }
  r.last_forward_waits_backward.assign(std::size_t(m), false);
  for (int x = 0; x + 1 < m; ++x)
    r.last_forward_waits_backward[std::size_t(x)] = r.waits[where[key({OpKind::F, last, x + 1})]].last_backward >= x;
  backwards.get();
  return r;
}

/// Per microbatch x: just past the last op whose `value` is <= x (a lower bound), or the first
/// whose `value` is >= x (an upper bound).
template <class T>
std::vector<std::size_t> past_last_at_most(std::span<const T> ties, int T::*value, int m) {
  std::vector<std::size_t> bound(std::size_t(m), 0);
  for (std::size_t i = 0; i < ties.size(); ++i)
    if (const int v = ties[i].*value; v < m) bound[std::size_t(v)] = std::max(bound[std::size_t(v)], i + 1);
  for (int x = 1; x < m; ++x) bound[std::size_t(x)] = std::max(bound[std::size_t(x)], bound[std::size_t(x - 1)]);
  return bound;
}
template <class T>
std::vector<std::size_t> first_at_least(std::span<const T> ties, int T::*value, int m) {
  std::vector<std::size_t> bound(std::size_t(m), ties.size());
  for (std::size_t i = 0; i < ties.size(); ++i)
    if (const int v = ties[i].*value; v >= 0)
      bound[std::size_t(std::min(v, m - 1))] = std::min(bound[std::size_t(std::min(v, m - 1))], i);
  for (int x = m - 2; x >= 0; --x) bound[std::size_t(x)] = std::min(bound[std::size_t(x)], bound[std::size_t(x + 1)]);
  return bound;
}

/// When (in the estimate) the op (kind, stage, x) starts and ends, for every microbatch x.
std::vector<std::pair<TimeNs, TimeNs>> op_times(const Layout& layout, const DeviceOrders& orders, const OrderCost& cost,
                                                OpKind kind, int stage, int m) {
  std::vector<std::pair<TimeNs, TimeNs>> times(std::size_t(m), {0, 0});
  const auto d = std::size_t(layout.stages[std::size_t(stage)].device);
  for (std::size_t i = 0; i < orders[d].size(); ++i)
    if (orders[d][i].kind == kind && orders[d][i].stage == stage)
      times[std::size_t(orders[d][i].microbatch)] = {cost.start[d][i], cost.end[d][i]};
  return times;
}

/// What placing the passes on any device reads: the transformer orders, their time estimate, the
/// ties of their ops, and (per microbatch) the estimated start and end of the ops the passes follow.
struct PassEstimate {
  const ScheduleContext& context;
  const DeviceOrders& orders;
  const OrderCost& cost;
  VocabPlacement vocab;
  Reach reach;
  std::vector<std::pair<TimeNs, TimeNs>> last_forward;    ///< X leaves the last stage
  std::vector<std::pair<TimeNs, TimeNs>> first_forward;   ///< the embedding is needed
  std::vector<std::pair<TimeNs, TimeNs>> first_backward;  ///< dY comes back
};

/// Where each pass may go without waiting for itself: S (and, for Algorithm 1 and interlaced,
/// T) after every op the last stage's forward of x waits for, and before every op that waits for
/// the last stage's backward of x; IF before every op that waits for the first stage's forward
/// of x; IB after every op the first stage's backward of x waits for.
struct PassWindows {
  std::vector<std::size_t> s_low, s_high, if_high, ib_low;
};

PassWindows pass_windows(const Reach& reach, std::size_t d, int m) {
  const std::span<const Waits> waits = reach.of(reach.waits, d);
  const std::span<const Feeds> feeds = reach.of(reach.feeds, d);
  return {past_last_at_most(feeds, &Feeds::last_forward, m), first_at_least(waits, &Waits::last_backward, m),
          first_at_least(waits, &Waits::first_forward, m), past_last_at_most(feeds, &Feeds::first_backward, m)};
}

/// S of every microbatch on device d, when X(x) arrives at every device (a cut across the
/// devices), within its window. Returns the slots.
std::vector<std::size_t> add_s_passes(const PassEstimate& e, std::size_t d, const PassWindows& w,
                                      std::vector<Insertion>& insertions) {
  const int m = e.context.microbatches;
  const auto clamp = [](std::size_t slot, std::size_t low, std::size_t high) {
    return std::max(low, std::min(slot, high));
  };
  std::vector<std::size_t> s_slot(static_cast<std::size_t>(m));
  for (int x = 0; x < m; ++x) {
    const auto i = std::size_t(x);
    const TimeNs arrives = e.last_forward[i].second;
    s_slot[i] = clamp(slot_at(e.cost.start[d], arrives, w.s_low[i], w.s_high[i]), w.s_low[i], w.s_high[i]);
    insertions.push_back({s_slot[i], arrives, 0, {OpKind::S, -1, x}});
  }
  return s_slot;
}

/// T of every microbatch on device d, placed by the S slots. Returns its slots.
std::vector<std::size_t> add_t_passes(const PassEstimate& e, const PassWindows& w,
                                      const std::vector<std::size_t>& s_slot, std::vector<Insertion>& insertions) {
  const int m = e.context.microbatches;
  const bool before_backward = e.vocab != VocabPlacement::Vocab2;  // T feeds C1, which the backward waits for
  std::vector<std::size_t> t_slot(static_cast<std::size_t>(m));
  for (int x = 0; x < m; ++x) {
    const auto i = std::size_t(x);
    std::size_t slot = s_slot[i];  // interlaced, or the last microbatch: right after S(x)
    TimeNs time = e.last_forward[i].second;
    // T(x) with S(x + 1) -- unless, for Algorithm 1, the last stage's forward of x + 1 waits for
    // its backward of x (no delay between them in this schedule): then right after S(x) ...
    if (e.vocab != VocabPlacement::Interlaced && x + 1 < m &&
        (!before_backward || !e.reach.last_forward_waits_backward[i])) {
      slot = s_slot[i + 1], time = e.last_forward[i + 1].second;
      if (before_backward && slot > w.s_high[i]) {  // ... or before the backward
        slot = w.s_high[i], time = e.last_forward[i].second;
      }
    }
    t_slot[i] = slot;
    insertions.push_back({slot, time, 1, {OpKind::T, -1, x}});
  }
  return t_slot;
}

/// IF of x just before the first stage needs it, IB of x once its gradient has come back; and,
/// because the barriers tie microbatches together, IF before and IB after the S and T passes of
/// the microbatches within `reach` of x (no schedule runs forwards further ahead of backwards).
void add_input_passes(const PassEstimate& e, std::size_t d, const PassWindows& w,
                      const std::vector<std::size_t>& s_slot, const std::vector<std::size_t>& t_slot,
                      std::vector<Insertion>& insertions) {
  const int m = e.context.microbatches;
  const int reach = 2 * e.context.layout.devices + e.context.vocab_delay + 2;
  // Per y: the least slot of S and T of microbatches y and later, and the greatest of y and earlier.
  std::vector<std::size_t> least_from(static_cast<std::size_t>(m)), greatest_to(static_cast<std::size_t>(m));
  for (int y = m - 1; y >= 0; --y)
    least_from[std::size_t(y)] = std::min({s_slot[std::size_t(y)], t_slot[std::size_t(y)],
                                           y + 1 < m ? least_from[std::size_t(y + 1)] : s_slot[std::size_t(y)]});
  for (int y = 0; y < m; ++y)
    greatest_to[std::size_t(y)] = std::max({s_slot[std::size_t(y)], t_slot[std::size_t(y)],
                                            y > 0 ? greatest_to[std::size_t(y - 1)] : s_slot[std::size_t(y)]});
  for (int x = 0; x < m; ++x) {
    const std::size_t latest = std::min(w.if_high[std::size_t(x)], least_from[std::size_t(std::max(0, x - reach))]);
    const TimeNs needed = e.first_forward[std::size_t(x)].first;
    const std::size_t just_before = slot_at(e.cost.start[d], needed, 0, latest);
    insertions.push_back(
        {std::min(just_before > 0 ? just_before - 1 : 0, latest), needed, -1, {OpKind::IF, -1, x}});
  }
  for (int x = 0; x < m; ++x) {
    const std::size_t earliest =
        std::max(w.ib_low[std::size_t(x)], greatest_to[std::size_t(std::min(m - 1, x + reach))]);
    const TimeNs returned = e.first_backward[std::size_t(x)].second;
    insertions.push_back(
        {slot_at(e.cost.start[d], returned, earliest, e.orders[d].size()), returned, 2, {OpKind::IB, -1, x}});
  }
}

/// `order` with `insertions` (S, T, IF and IB of each of m microbatches, in that order) put into it.
/// In one slot: IF first, then S and T by time (S(x + 1) before T(x)), IB last; then in the
/// order added. Every key differs (the kinds differ in group or rank), so any sort gives the one
/// order: here each kind's run (S, T, IF, IB, each in microbatch order, so mostly in order
/// already) is sorted where it is not, and the four are merged.
std::vector<ComputeStep> with_insertions(const std::vector<ComputeStep>& order,
                                         const std::vector<Insertion>& insertions, int m) {
  const auto group = [](const Insertion& i) {
    return i.step.kind == OpKind::IF ? 0 : i.step.kind == OpKind::IB ? 2 : 1;
  };
  std::vector<SortKey> keys(insertions.size());
  for (std::size_t i = 0; i < insertions.size(); ++i) {
    const Insertion& in = insertions[i];
    keys[i] = {in.slot, std::uint32_t(group(in)), in.time, in.rank, std::uint32_t(i)};
  }
  const auto run = [&](std::size_t k) { return keys.begin() + std::ptrdiff_t(k * std::size_t(m)); };
  for (std::size_t k = 0; k < 4; ++k)
    if (!std::is_sorted(run(k), run(k + 1))) std::sort(run(k), run(k + 1));
  std::inplace_merge(run(0), run(1), run(2));
  std::inplace_merge(run(2), run(3), run(4));
  std::inplace_merge(run(0), run(2), run(4));
  std::vector<ComputeStep> out;
  std::size_t next = 0;
  out.reserve(order.size() + keys.size());
  for (std::size_t i = 0; i <= order.size(); ++i) {
    while (next < keys.size() && keys[next].slot == i) out.push_back(insertions[keys[next++].index].step);
    if (i < order.size()) out.push_back(order[i]);
  }
  return out;
}

/// Device d's order with S, T, IF and IB of every microbatch inserted.
std::vector<ComputeStep> order_with_passes(const PassEstimate& e, std::size_t d) {
  const int m = e.context.microbatches;
  const PassWindows windows = pass_windows(e.reach, d, m);
  std::vector<Insertion> insertions;
  insertions.reserve(4 * std::size_t(m));  // S, T, IF and IB of every microbatch
  const std::vector<std::size_t> s_slot = add_s_passes(e, d, windows, insertions);
  const std::vector<std::size_t> t_slot = add_t_passes(e, windows, s_slot, insertions);
  add_input_passes(e, d, windows, s_slot, t_slot, insertions);
  return with_insertions(e.orders[d], insertions, m);
}

}  // namespace

DeviceOrders insert_vocab_passes(const ScheduleContext& context, const DeviceOrders& orders, const OrderCost& cost,
                                 VocabPlacement vocab) {
  if (vocab == VocabPlacement::OnStages) return orders;
  const Layout& layout = context.layout;
  const int m = context.microbatches, last = layout.stage_count() - 1;
  const PassEstimate estimate{context,
                              orders,
                              cost,
                              vocab,
                              reach_of(context, orders, cost.sequence),
                              op_times(layout, orders, cost, OpKind::F, last, m),
                              op_times(layout, orders, cost, OpKind::F, 0, m),
                              op_times(layout, orders, cost, OpKind::B, 0, m)};
  DeviceOrders result(orders.size());
  // From here each device is on its own: on a large schedule, half of them on a second thread.
  in_two_halves(orders.size(), context.worth_a_thread(), [&](std::size_t begin, std::size_t end) {
    for (std::size_t d = begin; d < end; ++d) result[d] = order_with_passes(estimate, d);
  });
  return result;
}

}  // namespace pipesim
