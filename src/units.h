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

inline TimeNs ns_from_ms(double ms) { return static_cast<TimeNs>(std::llround(ms * 1e6)); }
inline TimeNs ns_from_us(double us) { return static_cast<TimeNs>(std::llround(us * 1e3)); }
inline TimeNs ns_from_s(double s) { return static_cast<TimeNs>(std::llround(s * 1e9)); }
inline double seconds(TimeNs ns) { return static_cast<double>(ns) * 1e-9; }

}  // namespace pipesim
