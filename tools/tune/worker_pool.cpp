#include "worker_pool.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <exception>
#include <thread>
#include <vector>

namespace pipesim {
namespace {

constexpr auto kRedrawInterval = std::chrono::milliseconds(100);

std::string duration_text(double seconds) {
  if (seconds < 60) return fmt::format("{:.0f} s", seconds);
  return fmt::format("{:.0f} min {:.0f} s", std::floor(seconds / 60), std::fmod(seconds, 60));
}

}  // namespace

unsigned worker_count() { return std::max(1u, std::thread::hardware_concurrency()); }

void parallel_for(std::size_t count, const std::function<void(std::size_t)>& task) {
  std::atomic<std::size_t> next{0};
  std::exception_ptr failure;
  std::mutex failure_mutex;
  {
    std::vector<std::jthread> workers;
    const unsigned threads = unsigned(std::min<std::size_t>(worker_count(), count));
    for (unsigned w = 0; w < threads; ++w)
      workers.emplace_back([&] {
        for (std::size_t i = next++; i < count; i = next++) {
          try {
            task(i);
          } catch (...) {
            const std::lock_guard lock(failure_mutex);
            if (!failure) failure = std::current_exception();
            next = count;  // the others stop after their current task
          }
        }
      });
  }  // the jthreads join here
  if (failure) std::rethrow_exception(failure);
}

ProgressBar::ProgressBar(std::size_t total, bool enabled)
    : total_(total), enabled_(enabled), last_draw_(start_ - kRedrawInterval) {
  if (!enabled_) return;
  const std::lock_guard lock(draw_mutex_);
  draw(0);
}

ProgressBar::~ProgressBar() {
  try {
    finish();
  } catch (const std::exception&) {  // fmt::print's std::system_error
  }
}

void ProgressBar::advance(std::size_t count, double tokens_per_s) {
  if (!enabled_) return;
  const std::size_t done = done_ += count;
  for (double best = best_; tokens_per_s > best && !best_.compare_exchange_weak(best, tokens_per_s);) {
  }
  // A worker that finds another drawing goes back to work: the next one draws.
  std::unique_lock lock(draw_mutex_, std::try_to_lock);
  if (lock && !finished_ && Clock::now() - last_draw_ >= kRedrawInterval) draw(done);
}

void ProgressBar::draw(std::size_t done) {
  last_draw_ = Clock::now();
  const double elapsed = std::chrono::duration<double>(last_draw_ - start_).count();
  const double rate = elapsed > 0 ? double(done) / elapsed : 0;
  const std::string eta = rate > 0 ? duration_text(double(total_ - std::min(done, total_)) / rate) : "?";
  const double best = best_;
  fmt::print(stderr, "\r[{}/{}] {:.0f}/s, ETA {}{}\033[K", done, total_, rate, eta,
             best > 0 ? fmt::format(", best {:.0f} tokens/s", best) : "");
}

void ProgressBar::finish() {
  if (!enabled_) return;
  const std::lock_guard lock(draw_mutex_);
  if (!finished_) fmt::print(stderr, "\r\033[K");
  finished_ = true;
}

}  // namespace pipesim
