#include "walker.h"

#include <fmt/format.h>

#include <csignal>
#include <cstdio>
#include <thread>
#include <utility>

#include "issue_order.h"

namespace pipesim::runtime {
namespace {

/// The host's clock as a DeviceClock, for backends whose work is done when their call returns (the
/// CPU): a mark is the time it was taken.
class HostClock final : public DeviceClock {
 public:
  Mark mark() override {
    marks_.push_back(Clock::now());
    return marks_.size() - 1;
  }
  TimeNs elapsed(Mark from, Mark to) override {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(marks_.at(to) - marks_.at(from)).count();
  }

 private:
  std::vector<Clock::time_point> marks_;
};

}  // namespace

StreamWalker::StreamWalker(const TaskGraph& graph, int rank, Names names, Transport& comm, Backend& backend,
                           const RunOptions& options, bool compute_collectives)
    : graph_(graph), rank_(rank), names_(std::move(names)), comm_(comm), backend_(backend), options_(options), done_(graph.size()) {
  for (std::size_t s = graph_.first_stream(rank_); s < graph_.first_stream(rank_ + 1); ++s)
    if (!graph_.stream(s).empty() || s == graph_.first_stream(rank_)) streams_.push_back(s);
  for (const Task& t : graph_.tasks()) own_tasks_ += t.device == rank_;
  if (options_.ordered_issue) {
    sequence_ = IssueOrder(graph_).sequence(rank_, compute_collectives);
    sequence_index_.assign(graph_.size(), -1);
    for (std::size_t i = 0; i < sequence_.size(); ++i) sequence_index_[std::size_t(sequence_[i])] = std::int32_t(i);
  }
}

void StreamWalker::run_step(int step, Clock::time_point epoch, OpRunner& runner, OpObserver& observer) {
  step_ = step, epoch_ = epoch, runner_ = &runner, observer_ = &observer;
  for (std::atomic<char>& done : done_) done.store(0);
  completed_prefix_ = 0;
  cursor_.assign(streams_.size(), 0);
  in_flight_.clear();
  in_flight_.resize(streams_.size());
  try {
    walk();
  } catch (const CommError&) {
    // Another rank ended the run; say where this one stood.
    throw CommError(fmt::format("{} stopped waiting on {}", names_.self, waiting_on()));
  } catch (const RankFailure& e) {
    // This rank failed: end the run before `in_flight_` frees the buffers it lent to transfers and
    // collectives, which the other ranks may read until they see the abort.
    comm_.abort(e.what());
    in_flight_.clear();
    throw;
  } catch (const std::exception& e) {
    comm_.abort(failure(e));
    in_flight_.clear();
    throw RankFailure(failure(e));
  }
  in_flight_.clear();
}

std::string StreamWalker::failure(const std::exception& e) const {
  return fmt::format("{} failed: {}", names_.self, e.what());
}

// The compute stream runs on a thread of its own while this one drives the communication streams,
// as a GPU's compute stream runs while NCCL progresses on its own: a transfer never waits for the
// compute op in progress to end, so what is measured is the schedule, not the polling.
void StreamWalker::walk() {
  compute_cursor_ = 0, computed_ = 0, compute_failed_ = false, compute_busy_ = false;
  std::jthread worker([this](std::stop_token stop) { run_compute_stream(stop); });
  const std::size_t compute_ops = graph_.stream(streams_[0]).size();
  std::size_t remaining = own_tasks_ - compute_ops;  // communication ops
  std::size_t seen_computed = 0;
  auto last_progress = Clock::now();
  while (remaining > 0 || computed_ < compute_ops) {
    if (compute_failed_) std::rethrow_exception(compute_error_);
    bool progressed = false;
    for (std::size_t i = 1; i < streams_.size(); ++i) {
      const auto ops = graph_.stream(streams_[i]);
      if (cursor_[i] == ops.size()) continue;
      try {
        progressed |= step(ops[cursor_[i]], in_flight_[i], cursor_[i], remaining);
      } catch (const CommError&) {
        throw;  // another rank failed; run_step says where this one stood
      } catch (const RankFailure&) {
        throw;
      } catch (const std::exception& e) {  // a missing buffer, a size mismatch, a CUDA or NCCL error
        throw RankFailure(fmt::format("{} failed at {}: {}", names_.self, graph_.describe(ops[cursor_[i]]), e.what()));
      }
    }
    if (progressed || computed_ != seen_computed || compute_busy_) {
      seen_computed = computed_;
      last_progress = Clock::now();
      if (progressed) continue;
    }
    if (std::chrono::duration<double>(Clock::now() - last_progress).count() > options_.timeout_s) timed_out();
    comm_.wait_for_progress(0.001);
  }
  if (compute_failed_) std::rethrow_exception(compute_error_);
}

void StreamWalker::run_compute_stream(const std::stop_token& stop) {
  compute_stop_ = stop;
  try {
    std::unique_ptr<DeviceClock> clock = backend_.device_clock();
    if (!clock) clock = std::make_unique<HostClock>();
    // The clock's zero on the step's timeline: the device passes a mark on an idle stream as soon as
    // it is recorded.
    const TimeNs origin_ns = now();
    const DeviceClock::Mark origin = clock->mark();
    std::vector<MarkSpan> vocab_parts;
    const auto ops = graph_.stream(streams_[0]);
    for (; compute_cursor_ < ops.size(); ++compute_cursor_) {
      const TaskId id = ops[compute_cursor_];
      {
        std::unique_lock lock(wake_mutex_);
        if (!wake_.wait(lock, stop, [&] { return ready(id); })) return;  // stopped
      }
      inject_fault(id, stop);
      compute_busy_ = true;
      TimeNs end = 0, vocab_ns = 0;
      try {
        const DeviceClock::Mark begin = clock->mark();
        runner_->compute(id, *clock, vocab_parts);
        const DeviceClock::Mark finish = clock->mark();
        backend_.synchronize();
        observer_->started(id, origin_ns + clock->elapsed(origin, begin));
        end = origin_ns + clock->elapsed(origin, finish);
        for (const auto& [from, to] : vocab_parts) vocab_ns += clock->elapsed(from, to);
        vocab_parts.clear();
      } catch (const RankFailure&) {
        throw;
      } catch (const std::exception& e) {  // a missing buffer, a CUDA or cuBLAS error, out of memory
        throw RankFailure(fmt::format("{} failed at {}: {}", names_.self, graph_.describe(id), e.what()));
      }
      compute_busy_ = false;
      complete(id, end, vocab_ns);
      ++computed_;
    }
    backend_.release_thread();
  } catch (...) {
    compute_error_ = std::current_exception();
    compute_failed_ = true;
    comm_.wake();
  }
}

bool StreamWalker::step(TaskId id, InFlight& flight, std::size_t& cursor, std::size_t& remaining) {
  if (flight.id != kNoTask) {  // in flight: poll it
    if (!flight.request->done() || !runner_->advance(flight)) return false;
    complete(id, now(), 0);
    flight = InFlight{};
    ++cursor, --remaining;
    return true;
  }
  if (!ready(id) || !issue_turn(id)) return false;
  inject_fault(id, {});
  observer_->started(id, now());
  flight.id = id;
  runner_->start(flight);
  return true;
}

bool StreamWalker::ready(TaskId id) const {
  for (TaskId dep : graph_.deps(id))
    if (!done_[std::size_t(dep)].load(std::memory_order_acquire)) return false;
  return true;
}

void StreamWalker::complete(TaskId id, TimeNs end, TimeNs vocab_layer_ns) {
  observer_->finished(id, end, vocab_layer_ns);
  done_[std::size_t(id)].store(1, std::memory_order_release);
  {
    std::lock_guard lock(wake_mutex_);  // also: a waiter between its check and its wait sees the flag
    std::size_t prefix = completed_prefix_.load();
    while (prefix < sequence_.size() && done_[std::size_t(sequence_[prefix])].load()) ++prefix;
    completed_prefix_.store(prefix, std::memory_order_release);
  }
  wake_.notify_all();
  comm_.wake();
}

void StreamWalker::await_issue_turn() {
  const auto ops = graph_.stream(streams_[0]);
  const std::size_t at = compute_cursor_.load();
  if (sequence_.empty() || !runner_ || at >= ops.size()) return;  // outside a step nothing else is in flight
  const TaskId id = ops[at];
  const std::int32_t index = sequence_index_[std::size_t(id)];
  if (index < 0)
    throw std::logic_error(fmt::format("{} issued a collective, but the issue order leaves this rank's compute ops out",
                                       graph_.describe(id)));
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(options_.timeout_s));
  std::unique_lock lock(wake_mutex_);
  while (completed_prefix_.load() < std::size_t(index)) {
    if (compute_stop_.stop_requested()) throw CommError(fmt::format("{} was ended at {}", names_.self, graph_.describe(id)));
    if (Clock::now() >= deadline)
      throw RankFailure(fmt::format("{}: no progress for {:g} s; {} waits to issue a collective until {} completes",
                                    names_.self, options_.timeout_s, graph_.describe(id),
                                    graph_.describe(sequence_[completed_prefix_.load()])));
    wake_.wait_for(lock, compute_stop_, std::chrono::milliseconds(50),
                   [&] { return completed_prefix_.load() >= std::size_t(index); });
  }
}

void StreamWalker::inject_fault(TaskId id, const std::stop_token& stop) {
  const Task& t = graph_.task(id);
  const std::optional<InjectedFault>& fault = options_.fault;
  if (!fault || fault->at_setup || fault->rank != rank_ || fault->kind != t.kind || fault->microbatch != t.microbatch ||
      step_ != 0)
    return;
  if (fault->kill) {  // no message, no abort: the other ranks must find out for themselves
    std::fflush(nullptr);
    std::raise(SIGKILL);
  }
  if (!fault->hang) throw RankFailure(fmt::format("{} failed at {}: injected fault", names_.self, graph_.describe(id)));
  // A hung rank answers nothing until the run is ended around it.
  while (!comm_.aborted() && !stop.stop_requested()) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  throw RankFailure(fmt::format("{} hung at {} (injected fault)", names_.self, graph_.describe(id)));
}

std::string StreamWalker::waiting_on() const {
  std::vector<std::string> waiting;
  for (std::size_t i = 0; i < streams_.size() && i < cursor_.size(); ++i) {
    const auto ops = graph_.stream(streams_[i]);
    const std::size_t next = i == 0 ? compute_cursor_.load() : cursor_[i];
    if (next >= ops.size()) continue;
    const TaskId id = ops[next];
    const Task& t = graph_.task(id);
    // Waits on this rank's own ops, or (ordered issue) its turn after an earlier op, itself listed.
    if (i > 0 && in_flight_[i].id == kNoTask && (!ready(id) || !issue_turn(id))) continue;
    if (i == 0 && !ready(id)) continue;
    if (i == 0)
      waiting.push_back(fmt::format("its own {} (started, not finished)", graph_.describe(id)));
    else if (t.kind == OpKind::Send || t.kind == OpKind::Recv)
      waiting.push_back(fmt::format("{} ({} {})", graph_.describe(id), names_.peer, t.peer));
    else
      waiting.push_back(graph_.describe(id));
  }
  return waiting.empty() ? std::string("nothing it can name") : fmt::format("{}", fmt::join(waiting, ", "));
}

void StreamWalker::timed_out() const {
  throw RankFailure(fmt::format("{}: no progress for {:g} s; waiting on {}", names_.self, options_.timeout_s, waiting_on()));
}

}  // namespace pipesim::runtime
