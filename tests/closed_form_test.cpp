// Closed-form makespans, bubbles and activation peaks of the classic schedules (docs/schedules.md),
// derived here from p, m, v and the explicit per-op costs -- never copied from a run.
#include "helpers.h"

using namespace pipesim;
using namespace pipesim::testing;

namespace {
constexpr double kForwardMs = 3, kBackwardMs = 5;  // unequal on purpose
constexpr TimeNs kF = 3 * kNsPerMs, kB = 5 * kNsPerMs;
constexpr Bytes kActivation = 1000;
}  // namespace

TEST_CASE("GPipe and 1F1B take (m + p - 1)(F + B) with per-device bubble (p - 1)(F + B) / time") {
  const std::string schedule = GENERATE("gpipe", "1f1b");
  const int p = GENERATE(1, 2, 3, 4, 7, 8);
  const int m = GENERATE(1, 2, 5, 8, 16, 33);
  CAPTURE(schedule, p, m);
  const Simulated s = simulate_or_fail(parse_or_fail(explicit_json(p, m, 1, kForwardMs, kBackwardMs, schedule)));
  const TimeNs expected = (m + p - 1) * (kF + kB);
  CHECK(s.metrics.iteration_ns == expected);
  for (const DeviceMetrics& d : s.metrics.devices) {
    CHECK(d.busy_ns == m * (kF + kB));
    CHECK(d.bubble_fraction == Approx(double((p - 1) * (kF + kB)) / double(expected)));
  }
}

TEST_CASE("1F1B holds min(p - i, m) microbatches of activations on device i; GPipe holds m") {
  const int p = GENERATE(2, 3, 4, 8);
  const int m = GENERATE(1, 3, 4, 9, 32);
  CAPTURE(p, m);
  const Simulated one_f_one_b = simulate_or_fail(parse_or_fail(explicit_json(p, m, 1, kForwardMs, kBackwardMs, "1f1b")));
  const Simulated gpipe = simulate_or_fail(parse_or_fail(explicit_json(p, m, 1, kForwardMs, kBackwardMs, "gpipe")));
  for (int i = 0; i < p; ++i) {
    CAPTURE(i);
    CHECK(one_f_one_b.metrics.devices[std::size_t(i)].peak_activation_bytes == std::min(p - i, m) * kActivation);
    CHECK(gpipe.metrics.devices[std::size_t(i)].peak_activation_bytes == m * kActivation);
  }
}

TEST_CASE("interleaved 1F1B with v chunks has bubble time (p - 1)(F + B) / v") {
  const int p = GENERATE(2, 3, 4, 8);
  const int v = GENERATE(2, 3, 4);
  const int rounds = GENERATE(1, 2, 3);
  const int m = rounds * p;
  CAPTURE(p, v, m);
  // Per-device F and B divisible by v, so each chunk's share is exact in nanoseconds.
  const Simulated s = simulate_or_fail(
      parse_or_fail(explicit_json(p, m, v, 12.0, 24.0, "interleaved-1f1b")));
  const TimeNs f = 12 * kNsPerMs, b = 24 * kNsPerMs;
  CHECK(s.metrics.iteration_ns == m * (f + b) + (p - 1) * (f + b) / v);
  for (const DeviceMetrics& d : s.metrics.devices) CHECK(d.busy_ns == m * (f + b));
}

TEST_CASE("a p2p cost adds 2(p - 1) transfers to the critical path of GPipe") {
  // The critical path goes down p - 1 links and back up p - 1 once; with F, B much larger than
  // the transfer, every other transfer overlaps compute. (1F1B exposes more: in its steady state
  // each backward waits for a round trip, so it has no such simple form.)
  const std::string schedule = "gpipe";
  const int p = GENERATE(2, 4, 6);
  const int m = GENERATE(8, 12);
  CAPTURE(schedule, p, m);
  Config c = parse_or_fail(explicit_json(p, m, 1, kForwardMs, kBackwardMs, schedule));
  c.costs->p2p_ms = 0.5;
  const Simulated s = simulate_or_fail(c);
  CHECK(s.metrics.iteration_ns == (m + p - 1) * (kF + kB) + 2 * (p - 1) * kNsPerMs / 2);
}

TEST_CASE("synchronous transfers (Megatron-LM without overlap_p2p_comm) cost the sender its transfer") {
  // 1F1B on 2 devices, 2 microbatches, F = 1, B = 2, a transfer x = 0.5 (ms). Overlapped, device 0
  // runs F(m0) [0, 1] and F(m1) [1, 2]; device 1 runs F(m0) [1.5, 2.5], B(m0) [2.5, 4.5], F(m1)
  // [4.5, 5.5], B(m1) [5.5, 7.5]; the gradients reach device 0 at 5 and 8, so its B(m1) ends at 10.
  // Synchronous, device 1's F(m1) waits for its gradient send to end (5), B(m1) runs [6, 8], its
  // gradient arrives at 8.5, and device 0's B(m1) ends at 10.5: one transfer more. Device 0's own
  // wait (F(m1) at 1.5) stays off the critical path.
  Config c = parse_or_fail(explicit_json(2, 2, 1, 1.0, 2.0, "1f1b"));
  c.costs->p2p_ms = 0.5;
  const Simulated overlapped = simulate_or_fail(c);
  CHECK(overlapped.metrics.iteration_ns == ns_from_ms(10.0));
  c.training.overlap_p2p_comm = false;
  const Simulated synchronous = simulate_or_fail(c);
  CHECK(synchronous.metrics.iteration_ns == ns_from_ms(10.5));
}
