#include "vocab_passes.h"

#include <algorithm>
#include <tuple>

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

/// The first position in [low, high) whose op starts (in the estimate) at `time` or later; `high`
/// if none. A device's ops start in program order, so `start` is sorted.
std::size_t slot_at(const std::vector<TimeNs>& start, TimeNs time, std::size_t low, std::size_t high) {
  if (low >= high) return high;
  return std::size_t(std::lower_bound(start.begin() + std::ptrdiff_t(low), start.begin() + std::ptrdiff_t(high), time) -
                     start.begin());
}

/// How each op of the transformer orders is tied, through the data flow and program order, to the
/// ops the vocabulary passes hang on. Per device and position.
struct Reach {
  std::vector<std::vector<int>> waits_last_backward;  ///< greatest x: the op waits for B(last stage, x)
  std::vector<std::vector<int>> waits_first_forward;  ///< greatest x: the op waits for F(stage 0, x)
  std::vector<std::vector<int>> feeds_last_forward;   ///< least x: F(last stage, x) waits for the op
  std::vector<std::vector<int>> feeds_first_backward; ///< least x: B(stage 0, x) waits for the op
  std::vector<bool> last_forward_waits_backward;      ///< per x: F(last, x + 1) waits for B(last, x)
};

Reach reach_of(const Layout& layout, const DeviceOrders& orders, int m) {
  constexpr int kNone = 1 << 30;
  const int stages = layout.stage_count(), last = stages - 1;
  // Positions of F, B, W of (stage, x); then the ops in an order where every op follows its inputs.
  std::vector<std::pair<int, std::size_t>> where(std::size_t(3 * stages * m), {-1, 0});
  const auto key = [&](OpKind kind, int stage, int x) {
    return std::size_t((kind == OpKind::F ? 0 : kind == OpKind::B ? 1 : 2) * stages * m + stage * m + x);
  };
  for (std::size_t d = 0; d < orders.size(); ++d)
    for (std::size_t i = 0; i < orders[d].size(); ++i)
      where[key(orders[d][i].kind, orders[d][i].stage, orders[d][i].microbatch)] = {int(d), i};
  const auto at = [&](const ComputeStep& input) { return where[key(input.kind, input.stage, input.microbatch)]; };
  Reach r;
  std::vector<std::vector<bool>> done(orders.size());
  for (std::size_t d = 0; d < orders.size(); ++d) {
    done[d].assign(orders[d].size(), false);
    r.waits_last_backward.emplace_back(orders[d].size(), -1);
    r.waits_first_forward.emplace_back(orders[d].size(), -1);
    r.feeds_last_forward.emplace_back(orders[d].size(), kNone);
    r.feeds_first_backward.emplace_back(orders[d].size(), kNone);
  }
  std::vector<std::pair<int, std::size_t>> topo;
  std::vector<std::size_t> next(orders.size(), 0);
  for (bool progressed = true; progressed;) {
    progressed = false;
    for (std::size_t d = 0; d < orders.size(); ++d)
      for (; next[d] < orders[d].size(); ++next[d]) {
        const DataInputs in = data_inputs(orders[d][next[d]], stages);
        if (std::any_of(in.begin(), in.end(), [&](const ComputeStep& input) {
              const auto [e, j] = at(input);
              return !done[std::size_t(e)][j];
            }))
          break;
        done[d][next[d]] = true;
        topo.emplace_back(int(d), next[d]);
        progressed = true;
      }
  }
  for (const auto& [d, i] : topo) {  // forwards through the data flow and program order
    const ComputeStep& s = orders[std::size_t(d)][i];
    int& back = r.waits_last_backward[std::size_t(d)][i];
    int& front = r.waits_first_forward[std::size_t(d)][i];
    if (i > 0) back = r.waits_last_backward[std::size_t(d)][i - 1], front = r.waits_first_forward[std::size_t(d)][i - 1];
    for (const ComputeStep& input : data_inputs(s, stages)) {
      const auto [e, j] = at(input);
      back = std::max(back, r.waits_last_backward[std::size_t(e)][j]);
      front = std::max(front, r.waits_first_forward[std::size_t(e)][j]);
    }
    if (s.kind == OpKind::B && s.stage == last) back = std::max(back, s.microbatch);
    if (s.kind == OpKind::F && s.stage == 0) front = std::max(front, s.microbatch);
  }
  r.last_forward_waits_backward.assign(std::size_t(m), false);
  for (int x = 0; x + 1 < m; ++x) {
    const auto [d, i] = where[key(OpKind::F, last, x + 1)];
    r.last_forward_waits_backward[std::size_t(x)] = r.waits_last_backward[std::size_t(d)][i] >= x;
  }
  for (auto it = topo.rbegin(); it != topo.rend(); ++it) {  // and backwards
    const auto [d, i] = *it;
    const ComputeStep& s = orders[std::size_t(d)][i];
    int& forward = r.feeds_last_forward[std::size_t(d)][i];
    int& backward = r.feeds_first_backward[std::size_t(d)][i];
    if (s.kind == OpKind::F && s.stage == last) forward = std::min(forward, s.microbatch);
    if (s.kind == OpKind::B && s.stage == 0) backward = std::min(backward, s.microbatch);
    // Hand the values to the inputs and the program-order predecessor.
    const auto hand = [&](int e, std::size_t j) {
      r.feeds_last_forward[std::size_t(e)][j] = std::min(r.feeds_last_forward[std::size_t(e)][j], forward);
      r.feeds_first_backward[std::size_t(e)][j] = std::min(r.feeds_first_backward[std::size_t(e)][j], backward);
    };
    for (const ComputeStep& input : data_inputs(s, stages)) hand(at(input).first, at(input).second);
    if (i > 0) hand(d, i - 1);
  }
  return r;
}

/// Per microbatch x: just past the last position whose value is <= x (a lower bound), or the first
/// position whose value is >= x (an upper bound).
std::vector<std::size_t> past_last_at_most(const std::vector<int>& values, int m) {
  std::vector<std::size_t> bound(std::size_t(m), 0);
  for (std::size_t i = 0; i < values.size(); ++i)
    if (values[i] < m) bound[std::size_t(values[i])] = std::max(bound[std::size_t(values[i])], i + 1);
  for (int x = 1; x < m; ++x) bound[std::size_t(x)] = std::max(bound[std::size_t(x)], bound[std::size_t(x - 1)]);
  return bound;
}
std::vector<std::size_t> first_at_least(const std::vector<int>& values, int m) {
  std::vector<std::size_t> bound(std::size_t(m), values.size());
  for (std::size_t i = 0; i < values.size(); ++i)
    if (values[i] >= 0) bound[std::size_t(std::min(values[i], m - 1))] = std::min(bound[std::size_t(std::min(values[i], m - 1))], i);
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

}  // namespace

Result<DeviceOrders> insert_vocab_passes(const ScheduleContext& context, const DeviceOrders& orders,
                                         VocabPlacement vocab) {
  if (vocab == VocabPlacement::OnStages) return orders;
  const Layout& layout = context.layout;
  const int m = context.microbatches, last = layout.stage_count() - 1;
  Result<OrderCost> estimate = evaluate_orders(context, orders, OpTimes::Record);
  if (!estimate.ok()) return estimate.error();
  const OrderCost& cost = estimate.value();

  const Reach reach_of_ops = reach_of(layout, orders, m);
  const auto last_forward = op_times(layout, orders, cost, OpKind::F, last, m);  // X leaves the last stage
  const auto first_forward = op_times(layout, orders, cost, OpKind::F, 0, m);    // the embedding is needed
  const auto first_backward = op_times(layout, orders, cost, OpKind::B, 0, m);   // dY comes back
  DeviceOrders result(orders.size());
  // From here each device is on its own: on a large schedule, half of them on a second thread.
  in_two_halves(orders.size(), context.worth_a_thread(), [&](std::size_t begin, std::size_t end) {
    for (std::size_t d = begin; d < end; ++d) {
      // Where each pass may go without waiting for itself: S (and, for Algorithm 1 and interlaced,
      // T) after every op the last stage's forward of x waits for, and before every op that waits for
      // the last stage's backward of x; IF before every op that waits for the first stage's forward
      // of x; IB after every op the first stage's backward of x waits for.
      const auto s_low = past_last_at_most(reach_of_ops.feeds_last_forward[d], m);
      const auto s_high = first_at_least(reach_of_ops.waits_last_backward[d], m);
      const auto if_high = first_at_least(reach_of_ops.waits_first_forward[d], m);
      const auto ib_low = past_last_at_most(reach_of_ops.feeds_first_backward[d], m);
      const auto clamp = [](std::size_t slot, std::size_t low, std::size_t high) {
        return std::max(low, std::min(slot, high));
      };
      std::vector<Insertion> insertions;
      std::vector<std::size_t> s_slot(static_cast<std::size_t>(m));
      std::vector<TimeNs> s_time(static_cast<std::size_t>(m));
      for (int x = 0; x < m; ++x) {  // S when X(x) arrives at every device: a cut across the devices
        const auto i = std::size_t(x);
        s_time[i] = last_forward[i].second;
        s_slot[i] = clamp(slot_at(cost.start[d], s_time[i], s_low[i], s_high[i]), s_low[i], s_high[i]);
        insertions.push_back({s_slot[i], s_time[i], 0, {OpKind::S, -1, x}});
      }
      std::vector<std::size_t> t_slot(static_cast<std::size_t>(m));
      for (int x = 0; x < m; ++x) {
        const auto i = std::size_t(x);
        const bool before_backward = vocab != VocabPlacement::Vocab2;  // T feeds C1, which the backward waits for
        std::size_t slot = s_slot[i];  // interlaced, or the last microbatch: right after S(x)
        TimeNs time = s_time[i];
        // T(x) with S(x + 1) -- unless, for Algorithm 1, the last stage's forward of x + 1 waits for
        // its backward of x (no delay between them in this schedule): then right after S(x) ...
        if (vocab != VocabPlacement::Interlaced && x + 1 < m &&
            (!before_backward || !reach_of_ops.last_forward_waits_backward[i])) {
          slot = s_slot[i + 1], time = s_time[i + 1];
          if (before_backward && slot > s_high[i]) slot = s_high[i], time = s_time[i];  // ... or before the backward
        }
        t_slot[i] = slot;
        insertions.push_back({slot, time, 1, {OpKind::T, -1, x}});
      }
      // IF of x just before the first stage needs it, IB of x once its gradient has come back; and,
      // because the barriers tie microbatches together, IF before and IB after the S and T passes of
      // the microbatches within `reach` of x (no schedule runs forwards further ahead of backwards).
      const int reach = 2 * layout.devices + context.vocab_delay + 2;
      // Per y: the least slot of S and T of microbatches y and later, and the greatest of y and earlier.
      std::vector<std::size_t> least_from(static_cast<std::size_t>(m)), greatest_to(static_cast<std::size_t>(m));
      for (int y = m - 1; y >= 0; --y)
        least_from[std::size_t(y)] = std::min({s_slot[std::size_t(y)], t_slot[std::size_t(y)],
                                               y + 1 < m ? least_from[std::size_t(y + 1)] : s_slot[std::size_t(y)]});
      for (int y = 0; y < m; ++y)
        greatest_to[std::size_t(y)] = std::max({s_slot[std::size_t(y)], t_slot[std::size_t(y)],
                                                y > 0 ? greatest_to[std::size_t(y - 1)] : s_slot[std::size_t(y)]});
      for (int x = 0; x < m; ++x) {
        const std::size_t latest = std::min(if_high[std::size_t(x)], least_from[std::size_t(std::max(0, x - reach))]);
        const TimeNs needed = first_forward[std::size_t(x)].first;
        const std::size_t just_before = slot_at(cost.start[d], needed, 0, latest);
        insertions.push_back(
            {std::min(just_before > 0 ? just_before - 1 : 0, latest), needed, -1, {OpKind::IF, -1, x}});

        const std::size_t earliest =
            std::max(ib_low[std::size_t(x)], greatest_to[std::size_t(std::min(m - 1, x + reach))]);
        const TimeNs returned = first_backward[std::size_t(x)].second;
        insertions.push_back(
            {slot_at(cost.start[d], returned, earliest, orders[d].size()), returned, 2, {OpKind::IB, -1, x}});
      }
      std::stable_sort(insertions.begin(), insertions.end(), [](const Insertion& a, const Insertion& b) {
        // In one slot: IF first, then S and T by time (S(x + 1) before T(x)), IB last.
        const auto group = [](const Insertion& i) {
          return i.step.kind == OpKind::IF ? 0 : i.step.kind == OpKind::IB ? 2 : 1;
        };
        return std::tuple(a.slot, group(a), a.time, a.rank) < std::tuple(b.slot, group(b), b.time, b.rank);
      });
      auto& out = result[d];
      std::size_t next = 0;
      for (std::size_t i = 0; i <= orders[d].size(); ++i) {
        while (next < insertions.size() && insertions[next].slot == i) out.push_back(insertions[next++].step);
        if (i < orders[d].size()) out.push_back(orders[d][i]);
      }
    }
  });
  return result;
}

}  // namespace pipesim
