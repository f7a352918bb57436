#pragma once
/// Units live in names and types: simulated time is an integer count of nanoseconds so that
/// schedules with explicit costs give exact closed-form makespans (no floating-point drift).
#include <cmath>
#include <cstdint>

namespace pipesim {

using TimeNs = std::int64_t;   ///< simulated or measured time, in nanoseconds
using Bytes = std::int64_t;    ///< memory or payload size, in bytes

constexpr TimeNs kNsPerMs = 1'000'000;
constexpr TimeNs kNsPerUs = 1'000;

/// What a conversion gives for NaN, infinity or a time past 2^62 ns (146 years), which no rounding
/// can hold; the simulator refuses any negative duration with the op named.
constexpr TimeNs kUnrepresentableNs = -1;

inline TimeNs ns_round(double ns) {
  return ns < 0x1p62 ? static_cast<TimeNs>(std::llround(ns)) : kUnrepresentableNs;  // false for NaN too
}
/// a + b for durations: kUnrepresentableNs when either is, or when the sum reaches 2^62.
inline TimeNs add_ns(TimeNs a, TimeNs b) {
  TimeNs sum = 0;
  if (a < 0 || b < 0 || __builtin_add_overflow(a, b, &sum) || sum >= (TimeNs(1) << 62)) return kUnrepresentableNs;
  return sum;
}
/// n × t for a duration repeated n >= 0 times, likewise.
inline TimeNs times_ns(std::int64_t n, TimeNs t) {
  TimeNs product = 0;
  if (n < 0 || t < 0 || __builtin_mul_overflow(n, t, &product) || product >= (TimeNs(1) << 62)) return kUnrepresentableNs;
  return product;
}
inline TimeNs ns_from_ms(double ms) { return ns_round(ms * 1e6); }
inline TimeNs ns_from_us(double us) { return ns_round(us * 1e3); }
inline TimeNs ns_from_s(double s) { return ns_round(s * 1e9); }
inline double seconds(TimeNs ns) { return static_cast<double>(ns) * 1e-9; }

}  // namespace pipesim
