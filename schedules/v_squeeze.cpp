#include "v_squeeze.h"

#include <algorithm>
#include <cstdint>
#include <numeric>

namespace pipesim {
namespace {

// Pass types in unit slots: F of chunk 0, F of chunk 1, B of chunk 1, B of chunk 0, then W (one
// list while squeezing; two, per chunk, in the final order).
enum { kF0, kF1, kB1, kB0, kW };
using Slots = std::vector<std::vector<int>>;  ///< per type, per microbatch: the slot it starts in
using Grid = std::vector<Slots>;              ///< per device

/// The last slot any pass takes. Each list rises (every pass follows the same pass of the
/// microbatch before it), so that is the largest of the lists' last entries.
int last_slot(const Slots& s) {
  int bound = 0;
  for (const auto& type : s)
    if (!type.empty()) bound = std::max(bound, type.back());
  return bound;
}

/// W passes into the free slots after their B (one list, or one per chunk), oldest first. `s` holds
/// the four F and B lists, at most one pass a slot.
Slots put_w(Slots s, bool split) {
  const int bound = last_slot(s);
  std::vector<std::int8_t> type_at(std::size_t(bound + 1), -1);  // per slot: its pass type, -1 when free
  for (int t = 0; t < 4; ++t)
    for (int slot : s[std::size_t(t)]) type_at[std::size_t(slot)] = std::int8_t(t);
  s.resize(split ? 6 : 5);
  int pending[2] = {0, 0};
  for (int slot = 0; slot <= bound + 2 * int(s[0].size()); ++slot) {
    const int type = slot <= bound ? type_at[std::size_t(slot)] : -1;
    if (type >= 0) {
      if (type >= kB1) ++pending[split ? type - kB1 : 0];
      continue;
    }
    for (int w = 0; w < 2; ++w)
      if (pending[w]) {
        s[std::size_t(kW + w)].push_back(slot), --pending[w];
        break;
      }
  }
  return s;
}

/// One device's activation bytes per chunk: what F keeps, what B leaves for W, and what the
/// recomputation just before B takes until B returns it (StageWork).
struct ChunkBytes {
  Bytes activation[2];
  Bytes weight_held[2];
  Bytes rebuilt[2];
};

int chunk_of(int type) { return type == kF0 || type == kB0 ? 0 : 1; }

/// One device's passes by slot and the activation bytes it holds before each slot, as the
/// simulator counts them: F adds its chunk's activation, B frees all but what W needs, W frees the
/// rest of the oldest pending B (implicit W in any free slot when the slots have no W list yet).
///
/// The squeeze asks of many free slots whether a pass may move there with the device staying
/// within a limit. Moving a pass from one slot to an earlier one changes nothing before the new
/// slot, and once the device's state after the old slot is again what it was (bytes and pending
/// B's alike), nothing after it either. As the device already fits, a check replays only from the
/// new slot to that meeting point, and an accepted move rewrites only that stretch.
class DeviceMemory {
 public:
  /// `s`: four lists (F0, F1, B1, B0), or five with one W list; at most one pass a slot.
  DeviceMemory(const Slots& s, const ChunkBytes& bytes) : bytes_(bytes), implicit_w_(s.size() == 4) {
    last_ = last_slot(s);
    type_at_.assign(std::size_t(last_ + 1), -1);
    for (std::size_t t = 0; t < s.size(); ++t)
      for (int slot : s[t]) type_at_[std::size_t(slot)] = int(t);
    backward_chunks_.reserve(s[kB1].size() + s[kB0].size());
    for (int type : type_at_)
      if (type == kB1 || type == kB0) backward_chunks_.push_back(chunk_of(type));
    states_.resize(std::size_t(last_ + 2));
    State state;
    for (int slot = 0; slot <= last_; ++slot) {
      step(state, type_at_[std::size_t(slot)], [&](int i) { return backward_chunks_[std::size_t(i)]; });
      states_[std::size_t(slot + 1)] = state;
    }
  }

  /// The most the device holds after any slot up to its last pass.
  Bytes peak() const {
    Bytes peak = 0;
    for (const State& state : states_) peak = std::max(peak, state.current);
    for (int slot = 0; slot <= last_; ++slot)  // and while a B's recomputation is live
      if (const int type = type_at_[std::size_t(slot)]; type == kB1 || type == kB0)
        peak = std::max(peak, states_[std::size_t(slot)].current + bytes_.rebuilt[chunk_of(type)]);
    return peak;
  }

  bool free(int slot) const { return type_at_[std::size_t(slot)] < 0; }

  /// Moves the pass in slot `from` to the earlier free slot `to` if the device then holds at most
  /// `limit` after every slot; says whether it did. The device must hold at most `limit` already.
  bool move_within(int from, int to, Bytes limit) {
    const int type = type_at_[std::size_t(from)];
    // Without the pass in `from`, the last pass may come earlier: the slots after it do not count.
    int last = last_;
    if (from == last_)
      for (last = from - 1; last > to && type_at_[std::size_t(last)] < 0;) --last;
    // A B moved before other B's takes its place in the pending order ahead of theirs: entries
    // first..moved of backward_chunks_ shift by one.
    const bool backward = type == kB1 || type == kB0;
    const int first = states_[std::size_t(to)].backwards, moved = states_[std::size_t(from)].backwards;
    const auto pending_chunk = [&](int i) {
      if (!backward || i < first || i > moved) return backward_chunks_[std::size_t(i)];
      return i == first ? chunk_of(type) : backward_chunks_[std::size_t(i - 1)];
    };
    // The pending B's are the same as before the move once every entry that differs is done.
    int differs = -1;
    for (int i = first; backward && i <= moved; ++i)
      if (pending_chunk(i) != backward_chunks_[std::size_t(i)]) differs = i;
    State state = states_[std::size_t(to)];
    replayed_.clear();
    for (int slot = to; slot <= last; ++slot) {
      if (step(state, slot == to ? type : slot == from ? -1 : type_at_[std::size_t(slot)], pending_chunk) > limit)
        return false;
      replayed_.push_back(state);
      // After `from` the passes are the unmoved device's: from the same state on, so is the rest.
      if (slot >= from && state == states_[std::size_t(slot + 1)] && state.weights > differs) break;
    }
    std::copy(replayed_.begin(), replayed_.end(), states_.begin() + to + 1);
    type_at_[std::size_t(to)] = type;
    type_at_[std::size_t(from)] = -1;
    if (backward)
      std::rotate(backward_chunks_.begin() + first, backward_chunks_.begin() + moved,
                  backward_chunks_.begin() + moved + 1);
    last_ = last;
    states_.resize(std::size_t(last_ + 2));
    return true;
  }

 private:
  /// Before a slot: the bytes held, the B passes done and the W passes that freed one; the pending
  /// B's, oldest first, are entries weights..backwards - 1 of backward_chunks_.
  struct State {
    Bytes current = 0;
    int backwards = 0, weights = 0;
    bool operator==(const State&) const = default;
  };

  /// Advances `state` over one slot holding pass `type` (-1: none); `pending_chunk(i)` is the
  /// chunk of the i-th B. Returns the most the device holds during the slot.
  template <class PendingChunk>
  Bytes step(State& state, int type, PendingChunk pending_chunk) const {
    Bytes high = 0;
    if (type == kF0 || type == kF1) {
      state.current += bytes_.activation[chunk_of(type)];
    } else if (type == kB1 || type == kB0) {
      high = state.current + bytes_.rebuilt[chunk_of(type)];
      state.current -= bytes_.activation[chunk_of(type)] - bytes_.weight_held[chunk_of(type)];
      ++state.backwards;
    } else if ((type == kW || (type < 0 && implicit_w_)) && state.weights < state.backwards) {
      state.current -= bytes_.weight_held[pending_chunk(state.weights++)];
    }
    return std::max(high, state.current);
  }

  ChunkBytes bytes_;
  bool implicit_w_;
  int last_ = -1;                     ///< the slot of the last pass
  std::vector<int> type_at_;          ///< per slot up to the last pass: its pass type, -1 when free
  std::vector<int> backward_chunks_;  ///< the chunk of each B, in slot order
  std::vector<State> states_;         ///< before each slot up to the one after the last pass
  std::vector<State> replayed_;       ///< a move's states from its new slot on, while checking it
};

int& slot_of(Grid& g, int d, int t, int x) { return g[std::size_t(d)][std::size_t(t)][std::size_t(x)]; }

/// Calls visit(device, type, microbatch) for every pass of `g` in slot order, ties by device, then
/// type, as the reference generator visits them. `visit` may move the pass it is given, and only
/// that one: every other pass is still in its slot when it comes, so the order is known up front
/// (a counting sort by slot, filled in device, type and microbatch order).
template <class Visit>
void in_slot_order(const Grid& g, Visit visit) {
  const int types = int(g[0].size());
  int bound = 0;
  for (const Slots& s : g) bound = std::max(bound, last_slot(s));
  std::vector<std::size_t> start(std::size_t(bound + 2), 0);  // per slot: where its passes start in `order`
  for (const Slots& s : g)
    for (const auto& list : s)
      for (int slot : list) ++start[std::size_t(slot + 1)];
  std::partial_sum(start.begin(), start.end(), start.begin());
  std::vector<std::pair<int, int>> order(start.back());  // (device * types + type, microbatch)
  for (int k = 0; k < int(g.size()) * types; ++k) {
    const auto& list = g[std::size_t(k / types)][std::size_t(k % types)];
    for (int x = 0; x < int(list.size()); ++x) order[start[std::size_t(list[std::size_t(x)])]++] = {k, x};
  }
  for (const auto& [k, x] : order) visit(k / types, k % types, x);
}

/// The slot of a device's n-th B of either chunk (from 0): each chunk's B slots rise, so it is the
/// (n + 1)-th smallest of two sorted lists, found by a binary search for how many come from chunk 1.
int nth_backward(const Slots& s, int n) {
  const std::vector<int>& b1 = s[kB1];
  const std::vector<int>& b0 = s[kB0];
  const int k = n + 1;  // passes taken from the two lists together
  // The fewest taken from b1 such that its next is not below the last taken from b0.
  int low = std::max(0, k - int(b0.size())), high = std::min(k, int(b1.size()));
  while (low < high) {
    const int i = (low + high) / 2;
    if (b1[std::size_t(i)] < b0[std::size_t(k - i - 1)]) low = i + 1;
    else high = i;
  }
  const int from_b1 = low, from_b0 = k - low;
  return std::max(from_b1 > 0 ? b1[std::size_t(from_b1 - 1)] : -1, from_b0 > 0 ? b0[std::size_t(from_b0 - 1)] : -1);
}

/// The last slot a pass must follow: its input on the neighbouring device (down the V for F of
/// chunk 0 and B of chunk 1, up for the others), the pass before it on its device, its B for a W,
/// and the same pass of the previous microbatch.
int inputs_done(Grid& g, int d, int t, int x) {
  const int p = int(g.size());
  int last = -1;
  const auto after = [&](int dd, int tt, int xx) { last = std::max(last, slot_of(g, dd, tt, xx)); };
  if ((t == kF0 || t == kB1) && d > 0) after(d - 1, t, x);
  if ((t == kF1 || t == kB0) && d + 1 < p) after(d + 1, t, x);
  if (t > kF0 && t < kW) after(d, t - 1, x);
  if (t == kW) last = std::max(last, nth_backward(g[std::size_t(d)], x));  // one W list: the x-th W follows the x-th B
  if (x > 0) after(d, t, x - 1);
  return last;
}

/// The paper's squeeze: passes of the warm-up (with W) and of the cool-down move to the earliest
/// free slot their inputs allow that keeps the device within `limit`; the steady state between
/// the first B of chunk 0 on device 0 and the last forward stays as it is. Passes are visited in
/// slot order (ties by device, then type), so a free slot below the current one stays free.
Grid squeeze(Grid g, bool with_w, const std::vector<ChunkBytes>& bytes) {
  const int p = int(g.size());
  if (with_w)
    for (Slots& s : g) s = put_w(s, false);
  std::vector<DeviceMemory> memory;
  for (int d = 0; d < p; ++d) memory.emplace_back(g[std::size_t(d)], bytes[std::size_t(d)]);
  // The bound is the most any device holds before the pass: one device may grow to what another
  // already holds, as the peak memory a user sees is the largest device's.
  Bytes limit = 0;
  for (const DeviceMemory& device : memory) limit = std::max(limit, device.peak());
  const int m = int(g[0][0].size());
  int phase = 0;
  in_slot_order(g, [&](int d, int t, int x) {
    if (t == kB0 && d == 0 && phase == 0) phase = 1;
    if (phase == 1) {  // the steady state, up to the last forward, stays as it is
      if (t == kF0 && x == m - 1) phase = 2;
      return;
    }
    if (phase == 0 && !with_w) return;
    int& slot = slot_of(g, d, t, x);
    DeviceMemory& device = memory[std::size_t(d)];
    for (int candidate = inputs_done(g, d, t, x) + 1; candidate < slot; ++candidate)
      if (device.free(candidate) && device.move_within(slot, candidate, limit)) {
        slot = candidate;
        break;
      }
  });
  if (!with_w)
    for (Slots& s : g) s = put_w(s, false);
  return g;
}

}  // namespace

VPattern v_half_pattern(int p, int delayed_periods) {
  constexpr int kPeriod = 6;  // F, B and W of both chunks, one slot each
  const int delta = (p % 2 == 0 ? 3 : 0) + kPeriod * delayed_periods;
  VPattern pattern;
  for (int i = 0; i < p; ++i) pattern.push_back({2 * i, 3 * p - i - 2, 3 * p + delta + 2 * i - 1, 6 * p + delta - i - 2});
  return pattern;
}

/// The slots compacted as the reference generator does between its passes: visited in slot order,
/// every pass starts in the first slot its inputs (one slot each) and its device allow.
Grid compacted(Grid g) {
  const int p = int(g.size());
  // The grid becomes each pass's end slot as the passes are visited (one slot after its start; an
  // input not yet visited is read at its old slot), then every start, one slot before.
  Grid& end = g;
  std::vector<int> device_free(std::size_t(p), 0);
  in_slot_order(g, [&](int d, int t, int x) {
    int ready = device_free[std::size_t(d)];
    const auto after = [&](int dd, int tt, int xx) { ready = std::max(ready, slot_of(end, dd, tt, xx)); };
    if ((t == kF0 || t == kB1) && d > 0) after(d - 1, t, x);
    if ((t == kF1 || t == kB0) && d + 1 < p) after(d + 1, t, x);
    if (t > kF0 && t < kW) after(d, t - 1, x);
    if (x > 0) after(d, t, x - 1);
    slot_of(end, d, t, x) = device_free[std::size_t(d)] = ready + 1;
  });
  for (Slots& s : g)
    for (std::vector<int>& list : s)
      for (int& slot : list) --slot;
  return g;
}

DeviceOrders squeezed_v_orders(const ScheduleContext& context, const VPattern& pattern, SqueezeMemory memory) {
  const Layout& layout = context.layout;
  const int p = layout.devices, m = context.microbatches;
  Grid g;
  for (int d = 0; d < p; ++d) {
    Slots s(4);
    for (int t = 0; t < 4; ++t)
      for (int x = 0; x < m; ++x) s[std::size_t(t)].push_back(pattern[std::size_t(d)][std::size_t(t)] + 6 * x);
    g.push_back(std::move(s));
  }
  std::vector<ChunkBytes> bytes;
  for (int d = 0; d < p; ++d) {
    const StageWork& w0 = context.work[std::size_t(layout.stage_of(d, 0))];
    const StageWork& w1 = context.work[std::size_t(layout.stage_of(d, 1))];
    if (memory == SqueezeMemory::ReferenceUnits)
      bytes.push_back({{1, 1}, {1, 1}, {0, 0}});  // W holds all F took: B frees nothing
    else
      bytes.push_back({{w0.activation_bytes, w1.activation_bytes},
                       {w0.weight_held_bytes, w1.weight_held_bytes},
                       {w0.recompute_alloc(true), w1.recompute_alloc(true)}});
  }
  // As the reference generator: squeeze with the W passes placed, compact, drop the W passes,
  // squeeze again (W implicit in free slots), compact.
  g = compacted(squeeze(std::move(g), true, bytes));
  for (Slots& s : g) s.resize(4);
  g = compacted(squeeze(std::move(g), false, bytes));
  DeviceOrders orders(static_cast<std::size_t>(p));
  for (int d = 0; d < p; ++d) {
    Slots s = g[std::size_t(d)];
    s.resize(4);
    s = put_w(s, true);
    const int chunk0 = layout.stage_of(d, 0), chunk1 = layout.stage_of(d, 1);
    const ComputeStep kinds[6] = {{OpKind::F, chunk0, 0}, {OpKind::F, chunk1, 0}, {OpKind::B, chunk1, 0},
                                  {OpKind::B, chunk0, 0}, {OpKind::W, chunk1, 0}, {OpKind::W, chunk0, 0}};
    // The passes by (slot, type, microbatch): a counting sort by slot of the passes listed by type,
    // then microbatch, which keeps that order among equal slots.
    std::vector<std::size_t> first(std::size_t(last_slot(s) + 2), 0);  // per slot: where its passes go
    for (const auto& list : s)
      for (int slot : list) ++first[std::size_t(slot + 1)];
    std::partial_sum(first.begin(), first.end(), first.begin());
    std::vector<ComputeStep>& order = orders[std::size_t(d)];
    order.resize(first.back());
    for (int t = 0; t < 6; ++t)
      for (int x = 0; x < int(s[std::size_t(t)].size()); ++x) {
        ComputeStep step = kinds[t];
        step.microbatch = x;
        order[first[std::size_t(s[std::size_t(t)][std::size_t(x)])]++] = step;
      }
  }
  return orders;
}

}  // namespace pipesim
