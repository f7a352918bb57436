#pragma once
/// Independent work on a second thread, where it repays starting one (about 0.1 ms). Planning a
/// large schedule has a few such pieces: candidate orders that do not depend on each other, the
/// graph's structure checks beside its simulation, per-device work. The results never depend on
/// whether a thread was used.
#include <cstddef>
#include <future>
#include <utility>

namespace pipesim {

/// Inputs from this size (ops, or stage-microbatches for schedule generators) take long enough to
/// split: at a few hundred ns per op, 2^16 ops are tens of milliseconds.
constexpr std::size_t kOpsWorthAThread = std::size_t(1) << 16;

/// Runs `work` on a thread of its own when `worth_a_thread`, otherwise on the calling thread when its
/// result is first asked for. get() the result once.
template <class Work>
auto beside(bool worth_a_thread, Work work) {
  return std::async(worth_a_thread ? std::launch::async : std::launch::deferred, std::move(work));
}

/// Calls work(begin, end) for the two halves of [0, n): the first on a second thread when
/// `worth_a_thread`, the second on this one.
template <class Work>
void in_two_halves(std::size_t n, bool worth_a_thread, Work work) {
  std::future<void> first = beside(worth_a_thread, [&] { work(std::size_t(0), n / 2); });
  work(n / 2, n);
  first.get();
}

}  // namespace pipesim
