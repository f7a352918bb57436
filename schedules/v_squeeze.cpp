#include "v_squeeze.h"

#include <algorithm>
#include <limits>
#include <queue>
#include <tuple>

namespace pipesim {
namespace {

// Pass types in unit slots: F of chunk 0, F of chunk 1, B of chunk 1, B of chunk 0, then W (one
// list while squeezing; two, per chunk, in the final order).
enum { kF0, kF1, kB1, kB0, kW };
using Slots = std::vector<std::vector<int>>;  ///< per type, per microbatch: the slot it starts in
using Grid = std::vector<Slots>;              ///< per device

int last_slot(const Slots& s) {
  int bound = 0;
  for (const auto& type : s)
    for (int t : type) bound = std::max(bound, t);
  return bound;
}

/// W passes into the free slots after their B (one list, or one per chunk), oldest first.
Slots put_w(Slots s, bool split) {
  const int bound = last_slot(s);
  s.resize(split ? 6 : 5);
  std::vector<std::size_t> next(4, 0);
  int pending[2] = {0, 0};
  for (int slot = 0; slot <= bound + 2 * int(s[0].size()); ++slot) {
    int type = -1;
    for (int t = 0; t < 4; ++t)
      if (next[std::size_t(t)] < s[std::size_t(t)].size() && s[std::size_t(t)][next[std::size_t(t)]] == slot) type = t;
    if (type >= 0) {
      ++next[std::size_t(type)];
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

/// One device's activation bytes per chunk: what F keeps, and what B leaves for W.
struct ChunkBytes {
  Bytes activation[2];
  Bytes weight_held[2];
};

/// Peak activation bytes of one device over its slots, as the simulator counts them: F adds its
/// chunk's activation, B frees all but what W needs, W frees the rest (the oldest pending B's,
/// when W is one list; implicit W in free slots when the slots have no W list yet). Stops at the
/// first value above `limit`: callers ask only whether the device fits.
Bytes held(const Slots& s, const ChunkBytes& bytes, Bytes limit) {
  const bool has_w = s.size() > 4, split = s.size() > 5;
  // Each type's slots rise with the microbatch, so merging the lists visits the passes in
  // (slot, type) order without sorting them.
  std::array<std::size_t, 6> next{};
  const auto next_event = [&](int& slot, int& type) {
    type = -1;
    for (std::size_t t = 0; t < s.size(); ++t)
      if (next[t] < s[t].size() && (type < 0 || s[t][next[t]] < slot)) slot = s[t][next[t]], type = int(t);
    return type >= 0;
  };
  std::vector<int> pending;  // chunks whose B has run and W has not, oldest first
  Bytes current = 0, peak = 0;
  const auto weight = [&](int chunk) {
    const auto it = chunk < 0 ? pending.begin() : std::find(pending.begin(), pending.end(), chunk);
    if (it == pending.end()) return;
    current -= bytes.weight_held[*it];
    pending.erase(it);
  };
  int event_slot = 0, type = -1;
  bool more = next_event(event_slot, type);
  for (int slot = 0; more && peak <= limit; ++slot) {
    if (event_slot <= slot) {
      ++next[std::size_t(type)];
      // W lists: one (the oldest pending B's chunk) or, split, chunk 1's then chunk 0's.
      const int chunk = type == kF0 || type == kB0 ? 0 : type == kF1 || type == kB1 ? 1 : type == kW && !split ? -1 : type == kW;
      if (type <= kF1) current += bytes.activation[chunk];
      if (type == kB1 || type == kB0) current -= bytes.activation[chunk] - bytes.weight_held[chunk], pending.push_back(chunk);
      if (type >= kW) weight(chunk);
      more = next_event(event_slot, type);
    } else if (!has_w && !pending.empty()) {
      weight(-1);
    }
    peak = std::max(peak, current);
  }
  return peak;
}

int& slot_of(Grid& g, int d, int t, int x) { return g[std::size_t(d)][std::size_t(t)][std::size_t(x)]; }

/// Calls visit(device, type, microbatch) for every pass of `g` in slot order, ties by device, then
/// type, as the reference generator visits them. A pass's slot is read once the pass before it in
/// its list has been visited, so `visit` may move the pass it is given.
template <class Visit>
void in_slot_order(const Grid& g, Visit visit) {
  const int types = int(g[0].size());
  using Head = std::tuple<int, int, int>;  // (slot, device * types + type, microbatch)
  std::priority_queue<Head, std::vector<Head>, std::greater<>> heads;
  for (int k = 0; k < int(g.size()) * types; ++k)
    if (!g[std::size_t(k / types)][std::size_t(k % types)].empty()) heads.emplace(g[std::size_t(k / types)][std::size_t(k % types)][0], k, 0);
  while (!heads.empty()) {
    const auto [slot, k, x] = heads.top();
    heads.pop();
    visit(k / types, k % types, x);
    if (const auto& list = g[std::size_t(k / types)][std::size_t(k % types)]; std::size_t(x + 1) < list.size())
      heads.emplace(list[std::size_t(x + 1)], k, x + 1);
  }
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
  if (t == kW) {  // one W list: the x-th W follows the x-th B of either chunk
    std::vector<int> backwards = g[std::size_t(d)][kB1];
    backwards.insert(backwards.end(), g[std::size_t(d)][kB0].begin(), g[std::size_t(d)][kB0].end());
    std::sort(backwards.begin(), backwards.end());
    last = std::max(last, backwards[std::size_t(x)]);
  }
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
  // The bound is the most any device holds before the pass: one device may grow to what another
  // already holds, as the peak memory a user sees is the largest device's.
  Bytes limit = 0;
  for (int d = 0; d < p; ++d)
    limit = std::max(limit, held(g[std::size_t(d)], bytes[std::size_t(d)], std::numeric_limits<Bytes>::max()));
  const int m = int(g[0][0].size());
  std::vector<std::vector<bool>> occupied;
  for (const Slots& s : g) occupied.emplace_back(std::size_t(last_slot(s) + 1), false);
  int phase = 0;
  in_slot_order(g, [&](int d, int t, int x) {
    int& slot = slot_of(g, d, t, x);
    if (t == kB0 && d == 0 && phase == 0) phase = 1;
    const bool fixed = phase == 1 || (phase == 0 && !with_w);
    if (phase == 1 && t == kF0 && x == m - 1) phase = 2;
    const int original = slot;
    for (int candidate = fixed ? original : inputs_done(g, d, t, x) + 1; candidate < original; ++candidate) {
      if (occupied[std::size_t(d)][std::size_t(candidate)]) continue;
      slot = candidate;
      if (held(g[std::size_t(d)], bytes[std::size_t(d)], limit) <= limit) break;
      slot = original;
    }
    occupied[std::size_t(d)][std::size_t(slot)] = true;
  });
  if (!with_w)
    for (Slots& s : g) s = put_w(s, false);
  return g;
}

}  // namespace

VPattern v_half_pattern(int p) {
  const int delta = p % 2 == 0 ? 3 : 0;
  VPattern pattern;
  for (int i = 0; i < p; ++i) pattern.push_back({2 * i, 3 * p - i - 2, 3 * p + delta + 2 * i - 1, 6 * p + delta - i - 2});
  return pattern;
}

VPattern v_min_pattern(int p) {
  const int delta = p % 3 == 0 ? 2 : 0;
  VPattern pattern;
  for (int i = 0; i < p; ++i) pattern.push_back({i, 2 * p - i - 1, 2 * p + delta + i, 4 * p + delta - i - 1});
  return pattern;
}

/// The slots compacted as the reference generator does between its passes: visited in slot order,
/// every pass starts in the first slot its inputs (one slot each) and its device allow.
Grid compacted(const Grid& g) {
  const int p = int(g.size());
  Grid start = g, end = g;
  std::vector<int> device_free(std::size_t(p), 0);
  in_slot_order(g, [&](int d, int t, int x) {
    int ready = device_free[std::size_t(d)];
    const auto after = [&](int dd, int tt, int xx) { ready = std::max(ready, slot_of(end, dd, tt, xx)); };
    if ((t == kF0 || t == kB1) && d > 0) after(d - 1, t, x);
    if ((t == kF1 || t == kB0) && d + 1 < p) after(d + 1, t, x);
    if (t > kF0 && t < kW) after(d, t - 1, x);
    if (x > 0) after(d, t, x - 1);
    slot_of(start, d, t, x) = ready;
    slot_of(end, d, t, x) = device_free[std::size_t(d)] = ready + 1;
  });
  return start;
}

DeviceOrders squeezed_v_orders(const ScheduleContext& context, const VPattern& pattern) {
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
    bytes.push_back({{w0.activation_bytes, w1.activation_bytes}, {w0.weight_held_bytes, w1.weight_held_bytes}});
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
    std::vector<std::tuple<int, int, int>> timed;  // (slot, type, microbatch)
    for (int t = 0; t < 6; ++t)
      for (int x = 0; x < int(s[std::size_t(t)].size()); ++x) timed.emplace_back(s[std::size_t(t)][std::size_t(x)], t, x);
    std::sort(timed.begin(), timed.end());
    for (const auto& [slot, t, x] : timed) {
      ComputeStep step = kinds[t];
      step.microbatch = x;
      orders[std::size_t(d)].push_back(step);
    }
  }
  return orders;
}

}  // namespace pipesim
