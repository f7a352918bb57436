#pragma once
/// The worker pool `tune` and `sweep` share, and the progress bar they draw while it runs.
#include <atomic>
#include <chrono>
#include <cstddef>
#include <functional>
#include <mutex>

namespace pipesim {

/// One per core (std::thread::hardware_concurrency, at least 1).
unsigned worker_count();

/// Runs task(i) for every i in [0, count) on worker_count() std::jthreads and returns when all have
/// run. Each worker takes the next i from one shared atomic counter: a task here is a whole
/// simulation (milliseconds), so the counter is never contended enough to need queues or work
/// stealing. A task's exception (std::bad_alloc) is rethrown here once the workers have stopped.
/// Tasks write only to their own slot of the caller's results, so the results never depend on which
/// worker ran what.
void parallel_for(std::size_t count, const std::function<void(std::size_t)>& task);

/// One line on stderr: done/total, rate, ETA and the best tokens/s so far; redrawn with '\r' at most
/// 10 times a second, and cleared by finish() (or the destructor). Disabled, it draws nothing: the
/// commands enable it only for text output with stderr a terminal, so it never reaches a file, a
/// pipe or machine-readable output.
class ProgressBar {
 public:
  ProgressBar(std::size_t total, bool enabled);
  /// Clears the bar; a standard error that cannot be written to (a closed terminal) is not worth ending
  /// the program for here.
  ~ProgressBar();
  ProgressBar(const ProgressBar&) = delete;
  ProgressBar& operator=(const ProgressBar&) = delete;

  /// Thread-safe. `count` more items are done; `tokens_per_s` is a result among them (0: none).
  void advance(std::size_t count, double tokens_per_s = 0);
  void finish();

 private:
  using Clock = std::chrono::steady_clock;
  void draw(std::size_t done);  ///< with draw_mutex_ held

  const std::size_t total_;
  const bool enabled_;
  const Clock::time_point start_ = Clock::now();
  std::atomic<std::size_t> done_{0};
  std::atomic<double> best_{0};
  std::mutex draw_mutex_;
  Clock::time_point last_draw_;
  bool finished_ = false;
};

}  // namespace pipesim
