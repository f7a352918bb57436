#include <fmt/format.h>

#include <algorithm>

#include "schedule.h"

namespace pipesim {
namespace {

/// Megatron's order of the k-th forward (or backward) on a device: microbatches advance in groups
/// of p, cycling through the v chunks (backwards visit the chunks in reverse).
ComputeStep step(const Layout& layout, OpKind kind, int k) {
  const int p = layout.devices, v = layout.chunks;
  const int group = k / (p * v);
  int chunk = (k / p) % v;
  if (kind == OpKind::B) chunk = v - 1 - chunk;
  return {kind, chunk, group * p + k % p};  // stage filled in by the caller (needs the device)
}

}  // namespace

/// Interleaved 1F1B (Narayanan et al. 2021): v chunks per device in loop placement (stage
/// c·p + d). Warm-up 2(p-1-d) + (v-1)p forwards, then 1F1B over all m·v chunk-microbatches.
/// Bubble (p-1)(F+B)/v for per-device F and B.
Result<DeviceOrders> generate_interleaved_1f1b(const ScheduleContext& context) {
  const Layout& layout = context.layout;
  const int microbatches = context.microbatches;
  const int p = layout.devices, v = layout.chunks;
  if (v < 2)
    return Error{fmt::format("parallel.chunks: interleaved-1f1b needs at least 2 chunks per device, got {}; set "
                             "parallel.chunks to 2 or more",
                             v)};
  if (microbatches % p != 0)
    return Error{fmt::format("parallel.microbatches: interleaved-1f1b needs a multiple of pp ({}), got {}; use {}",
                             p, microbatches, (microbatches / p + 1) * p)};
  const int total = microbatches * v;
  DeviceOrders orders(static_cast<std::size_t>(p));
  for (int d = 0; d < p; ++d) {
    auto& order = orders[static_cast<std::size_t>(d)];
    const auto push = [&](OpKind kind, int k) {
      ComputeStep s = step(layout, kind, k);
      s.stage = layout.stage_of(d, s.stage);
      order.push_back(s);
    };
    const int warmup = std::min(2 * (p - 1 - d) + (v - 1) * p + context.vocab_delay, total);
    int forwards = 0, backwards = 0;
    while (forwards < warmup) push(OpKind::F, forwards++);
    while (forwards < total) {
      push(OpKind::F, forwards++);
      push(OpKind::B, backwards++);
    }
    while (backwards < total) push(OpKind::B, backwards++);
  }
  return orders;
}

}  // namespace pipesim
