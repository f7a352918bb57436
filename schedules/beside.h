#pragma once
/// Candidate orders that do not depend on each other, built on two threads.
#include <cstdint>
#include <future>
#include <utility>

#include "schedule.h"

namespace pipesim {

/// Runs `work` on a thread of its own when the schedule is large enough to repay starting one (about
/// 0.1 ms, against tens of milliseconds for a candidate order at 2^16 stage-microbatches), otherwise
/// on the calling thread when its result is first asked for. Either way the result is the same;
/// get() it once.
template <class Work>
auto beside(const ScheduleContext& context, Work work) {
  constexpr std::int64_t kWorthAThread = std::int64_t(1) << 13;  // stage-microbatches
  const bool large = std::int64_t(context.times.size()) * context.microbatches >= kWorthAThread;
  return std::async(large ? std::launch::async : std::launch::deferred, std::move(work));
}

}  // namespace pipesim
