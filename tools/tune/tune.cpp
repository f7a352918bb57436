// The search behind `pipesim tune`: bounds for every candidate, then simulations in order of their
// time bound, batch by batch, skipping what the bounds show cannot fit or cannot reach the top K.
#include "tune.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <queue>

#include "simulate_config.h"
#include "worker_pool.h"

namespace pipesim {
namespace {

enum class Outcome : std::uint8_t { Pending, Simulated, Refused, PrunedByMemory, PrunedByTime };

struct Evaluation {
  Outcome outcome = Outcome::Pending;
  LowerBounds bounds;
  std::optional<RunReport> report;  ///< when simulated
  std::string error;                ///< when refused
};

/// The largest value and its device.
std::pair<Bytes, int> most(const std::vector<Bytes>& per_device) {
  const auto it = std::max_element(per_device.begin(), per_device.end());
  return {*it, int(it - per_device.begin())};
}

std::vector<Bytes> peaks(const RunReport& report) {
  std::vector<Bytes> out;
  for (const DeviceMetrics& d : report.metrics.devices) out.push_back(d.peak_memory_bytes);
  return out;
}

/// The K shortest iteration times of fitting runs so far. Every candidate in the space runs the same
/// global batch, so the shortest iteration is the most tokens/s: comparing integer nanoseconds
/// ranks exactly as tokens/s does, with no rounding in between.
class FastestK {
 public:
  explicit FastestK(std::size_t k) : k_(k) {}
  void add(TimeNs t) {
    times_.push(t);
    if (times_.size() > k_) times_.pop();
  }
  bool full() const { return times_.size() == k_; }
  /// The K-th shortest: a candidate whose bound is longer cannot enter the top K.
  TimeNs bar() const { return times_.top(); }

 private:
  std::size_t k_;
  std::priority_queue<TimeNs> times_;  // the longest on top
};

std::string describe_candidate(const Candidate& c) {
  const ScheduleInfo* schedule = find_schedule(c.schedule);
  TrainingConfig recompute;
  recompute.recompute_granularity = c.recompute;
  recompute.recompute_method = c.recompute_method, recompute.recompute_num_layers = c.recompute_num_layers;
  return fmt::format("{} / {}, pp {} tp {} dp {}{}{}, m {} x {}{}{}{}{}", c.schedule, vocab_mode_name(c.vocab), c.parallel.pp,
                     c.parallel.tp, c.parallel.dp, c.parallel.cp > 1 ? fmt::format(" cp {}", c.parallel.cp) : "",
                     c.parallel.tp > 1 ? (c.parallel.sequence_parallel ? ", sp on" : ", sp off") : "",
                     c.parallel.microbatches, c.micro_batch_size,
                     schedule && schedule->chunks == 0 ? fmt::format(", chunks {}", c.parallel.chunks) : "",
                     c.split_change.empty() ? "" : ", " + c.split_change,
                     c.recompute == Recompute::None ? "" : ", recompute " + recompute_text(recompute),
                     c.zero_stage == 0 ? "" : fmt::format(", zero {}", c.zero_stage));
}

std::string memory_text(Bytes bytes) {
  if (bytes < Bytes(1) << 30) return fmt::format("{:.2f} MiB", double(bytes) / double(1 << 20));
  return fmt::format("{:.2f} GiB", double(bytes) / double(1 << 30));
}

/// Bounds for every candidate; those that cannot fit are pruned (when pruning) and those the checks
/// refuse are refused, here already.
void bound_all(const Config& config, const std::vector<Candidate>& space, const TuneSearch& search,
               std::vector<Evaluation>& evaluations, ProgressBar& progress) {
  const Bytes capacity = memory_capacity_bytes(config.hardware);
  parallel_for(space.size(), [&](std::size_t i) {
    Evaluation& e = evaluations[i];
    Result<LowerBounds> bounds = lower_bounds(apply_candidate(config, space[i]));
    if (!bounds.ok()) {
      e.outcome = Outcome::Refused;
      e.error = bounds.error().message;
    } else {
      e.bounds = std::move(bounds).value();
      if (search.prune && most(e.bounds.memory_bytes).first > capacity) e.outcome = Outcome::PrunedByMemory;
    }
    if (e.outcome != Outcome::Pending) progress.advance(1);
  });
}

void simulate_one(const Config& config, const Candidate& candidate, Evaluation& e, ProgressBar& progress) {
  Result<SimulatedRun> run = simulate_config(apply_candidate(config, candidate));
  if (!run.ok()) {
    e.outcome = Outcome::Refused;
    e.error = run.error().message;
    progress.advance(1);
    return;
  }
  e.outcome = Outcome::Simulated;
  e.report = std::move(run.value().report);
  progress.advance(1, e.report->metrics.fits_in_memory ? e.report->metrics.tokens_per_s : 0);
}

/// Simulates the pending candidates, shortest time bound first, a batch at a time; between batches
/// the K-th fastest fitting run so far becomes the bar, and once the next bound is beyond it, every
/// candidate left is too (they are sorted), so all of them are pruned.
void simulate_pending(const Config& config, const std::vector<Candidate>& space, const TuneSearch& search,
                      std::vector<Evaluation>& evaluations, ProgressBar& progress) {
  std::vector<std::size_t> order;
  for (std::size_t i = 0; i < space.size(); ++i)
    if (evaluations[i].outcome == Outcome::Pending) order.push_back(i);
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return evaluations[a].bounds.iteration_ns < evaluations[b].bounds.iteration_ns;
  });
  FastestK fastest(search.top);
  std::size_t next = 0;
  while (next < order.size()) {
    auto end = order.begin() + std::ptrdiff_t(std::min(order.size(), next + std::max<std::size_t>(search.batch, 1)));
    if (search.prune && fastest.full())  // a bound equal to the bar may still tie, and win on order
      end = std::partition_point(order.begin() + std::ptrdiff_t(next), end,
                                 [&](std::size_t i) { return evaluations[i].bounds.iteration_ns <= fastest.bar(); });
    const auto count = std::size_t(end - order.begin()) - next;
    if (count == 0) break;
    parallel_for(count, [&](std::size_t k) {
      const std::size_t i = order[next + k];
      simulate_one(config, space[i], evaluations[i], progress);
    });
    for (std::size_t k = next; k < next + count; ++k)
      if (const Evaluation& e = evaluations[order[k]]; e.report && e.report->metrics.fits_in_memory)
        fastest.add(e.report->metrics.iteration_ns);
    next += count;
  }
  progress.advance(order.size() - next);
  for (; next < order.size(); ++next) evaluations[order[next]].outcome = Outcome::PrunedByTime;
}

/// The memory a candidate needs on its fullest device, and that device: simulated, or its bound.
std::pair<Bytes, int> requirement(const Evaluation& e) {
  return most(e.report ? peaks(*e.report) : e.bounds.memory_bytes);
}

/// When nothing fits: simulates the candidates whose memory bound pruned them, smallest bound first,
/// while a bound is no larger than the smallest peak simulated so far, so that the smallest peak
/// named is the real one, the same as an exhaustive search finds.
void settle_smallest_peak(const Config& config, const std::vector<Candidate>& space, const TuneSearch& search,
                          std::vector<Evaluation>& evaluations) {
  std::optional<Bytes> smallest;
  const auto update = [&](const Evaluation& e) {
    if (e.outcome == Outcome::Simulated) smallest = std::min(smallest.value_or(requirement(e).first), requirement(e).first);
  };
  std::vector<std::size_t> order;
  for (std::size_t i = 0; i < space.size(); ++i) {
    update(evaluations[i]);
    if (evaluations[i].outcome == Outcome::PrunedByMemory) order.push_back(i);
  }
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return requirement(evaluations[a]).first < requirement(evaluations[b]).first;
  });
  ProgressBar quiet(0, false);
  for (std::size_t next = 0; next < order.size();) {
    std::size_t end = next;
    while (end < order.size() && end - next < std::max<std::size_t>(search.batch, 1) &&
           (!smallest || requirement(evaluations[order[end]]).first <= *smallest))
      ++end;
    if (end == next) return;
    parallel_for(end - next, [&](std::size_t k) {
      const std::size_t i = order[next + k];
      simulate_one(config, space[i], evaluations[i], quiet);
    });
    for (; next < end; ++next) update(evaluations[order[next]]);
  }
}

/// Why nothing fits: the candidate with the smallest peak memory (simulated; a bound only where
/// every candidate that could have beaten it was refused), its device, and the cap.
Error nothing_fits(const Config& config, const std::vector<Candidate>& space, const std::vector<Evaluation>& evaluations,
                   int gpus, bool pinned) {
  std::optional<std::size_t> smallest;
  for (std::size_t i = 0; i < space.size(); ++i) {
    const Outcome o = evaluations[i].outcome;
    if ((o == Outcome::Simulated || o == Outcome::PrunedByMemory) &&
        (!smallest || requirement(evaluations[i]).first < requirement(evaluations[*smallest]).first))
      smallest = i;
  }
  if (!smallest) {
    const auto refused = std::find_if(evaluations.begin(), evaluations.end(),
                                      [](const Evaluation& e) { return e.outcome == Outcome::Refused; });
    return Error{fmt::format("{}: no candidate on {} GPUs could run{}", config.source, gpus,
                             refused == evaluations.end() ? "" : "; the first refused: " + refused->error)};
  }
  const auto [least, device] = requirement(evaluations[*smallest]);
  const bool bound = evaluations[*smallest].outcome == Outcome::PrunedByMemory;
  const double least_gib = std::ceil(double(least) / double(1 << 30) * 100) / 100;  // rounded up: it then fits
  return Error{fmt::format(
      "{}: nothing fits in {:.2f} GiB per device (hardware.memory_gib, or --memory-gib{}): the smallest peak memory of "
      "any candidate is {}{}{}, on device {}, for {}; raise --memory-gib to at least {:.2f} or give more --gpus than {}{}",
      config.source, double(memory_capacity_bytes(config.hardware)) / double(1 << 30),
      config.hardware.reserved_gib > 0 ? fmt::format(", less hardware.reserved_gib {:.2f}", config.hardware.reserved_gib)
                                       : "",
      bound ? "at least " : "", memory_text(least), bound ? " (a bound; not simulated)" : "", device,
      describe_candidate(space[*smallest]), least_gib + config.hardware.reserved_gib, gpus,
      pinned ? ", or drop a --fix" : "")};
}

}  // namespace

Result<TuneResult> tune(const Config& requested, const TuneSearch& search) {
  const Config config = as_run_by(search.framework, requested);
  const auto start = std::chrono::steady_clock::now();
  const ParallelConfig& given = config.parallel;
  const int gpus = search.gpus > 0 ? search.gpus : given.pp * given.tp * given.dp * given.cp;
  if (search.top == 0) return Error{"--top: keep at least 1 row"};
  std::vector<Candidate> space = tune_space(config, gpus);
  if (space.empty())
    return Error{fmt::format(
        "{}: nothing to search on {} GPUs: pp x tp x dp x cp must make {} with dp dividing the global batch ({} sequences), "
        "tp dividing the {} heads and at most hardware.gpus_per_node ({}), and pp at most the {} layers{}; choose "
        "another --gpus",
        config.source, gpus, gpus, std::int64_t(given.microbatches) * config.model.micro_batch_size * given.dp,
        config.model.heads, config.hardware.gpus_per_node, config.model.layers,
        config.costs ? fmt::format(" (explicit costs: pp {} and tp {}, the config's)", given.pp, given.tp) : "")};
  if (Result<std::vector<Candidate>> pinned = pin_space(config, std::move(space), search.pins, gpus); pinned.ok())
    space = std::move(pinned).value();
  else
    return pinned.error();
  if (search.framework != Framework::Any) {
    std::erase_if(space, [&](const Candidate& c) {
      return !unsupported(search.framework, apply_candidate(config, c), c.layers_per_stage.empty() ? c.auto_split
                                                                                                  : c.layers_per_stage)
                  .empty();
    });
    if (space.empty())
      return Error{fmt::format("--framework {}: none of the candidates on {} GPUs is one it runs (docs/frameworks.md)",
                               framework_name(search.framework), gpus)};
  }
  std::vector<Evaluation> evaluations(space.size());
  {
    ProgressBar progress(space.size(), search.progress);
    bound_all(config, space, search, evaluations, progress);
    simulate_pending(config, space, search, evaluations, progress);
  }

  TuneResult result;
  result.evaluated = space.size();
  for (std::size_t i = 0; i < space.size(); ++i) {
    Evaluation& e = evaluations[i];
    switch (e.outcome) {
      case Outcome::Simulated: ++result.simulated; break;
      case Outcome::Refused: ++result.refused; break;
      case Outcome::PrunedByMemory: ++result.pruned_by_memory; break;
      case Outcome::PrunedByTime: ++result.pruned_by_time; break;
      case Outcome::Pending: break;  // not reached: every candidate is decided above
    }
    if (e.report && e.report->metrics.fits_in_memory)
      result.rows.push_back({i, describe_changes(config, space[i]), apply_candidate(config, space[i]), std::move(*e.report)});
  }
  if (result.rows.empty()) {
    settle_smallest_peak(config, space, search, evaluations);
    return nothing_fits(config, space, evaluations, gpus, !search.pins.empty());
  }
  std::sort(result.rows.begin(), result.rows.end(), [](const TuneRow& a, const TuneRow& b) {
    const TimeNs ta = a.report.metrics.iteration_ns, tb = b.report.metrics.iteration_ns;
    return ta != tb ? ta < tb : a.candidate < b.candidate;
  });
  if (result.rows.size() > search.top) result.rows.resize(search.top);
  if (Result<SimulatedRun> yours = simulate_config(config); yours.ok())
    result.yours = std::move(yours.value().report);
  else
    result.yours_error = yours.error().message;
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result;
}

}  // namespace pipesim
