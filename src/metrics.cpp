#include "metrics.h"

#include <algorithm>
#include <limits>

#include "model_math.h"
#include "parallel_shape.h"
#include "two_threads.h"

namespace pipesim {
namespace {

struct Interval {
  TimeNs start, end;
};

/// Sorts `items`, made of consecutive runs each nearly or wholly in order (`ends`: where each run
/// ends), by merging neighbouring runs: O(n log runs) instead of O(n log n), and stable, so the
/// result is std::stable_sort's. A device's streams run in program order, so what is read from
/// each comes in runs of rising times.
template <class T, class Less>
void sort_runs(std::vector<T>& items, std::vector<std::size_t> ends, Less less) {
  const auto at = [&](std::size_t i) { return items.begin() + std::ptrdiff_t(i); };
  for (std::size_t run = 0, begin = 0; run < ends.size(); begin = ends[run++])
    if (!std::is_sorted(at(begin), at(ends[run]), less)) std::stable_sort(at(begin), at(ends[run]), less);
  while (ends.size() > 1) {
    std::size_t kept = 0, begin = 0;
    for (std::size_t run = 0; run < ends.size(); run += 2) {
      if (run + 1 < ends.size()) std::inplace_merge(at(begin), at(ends[run]), at(ends[run + 1]), less);
      begin = ends[kept++] = ends[std::min(run + 1, ends.size() - 1)];
    }
    ends.resize(kept);
  }
}

/// Merges intervals sorted by start into disjoint ones, in place.
void merge_overlaps(std::vector<Interval>& intervals) {
  std::size_t kept = 0;
  for (Interval i : intervals) {
    if (kept > 0 && i.start <= intervals[kept - 1].end)
      intervals[kept - 1].end = std::max(intervals[kept - 1].end, i.end);
    else
      intervals[kept++] = i;
  }
  intervals.resize(kept);
}

/// The ops on streams [first, past).
std::size_t stream_ops(const TaskGraph& graph, std::size_t first, std::size_t past) {
  std::size_t ops = 0;
  for (std::size_t s = first; s < past; ++s) ops += graph.stream(s).size();
  return ops;
}

TimeNs length(const std::vector<Interval>& disjoint) {
  TimeNs sum = 0;
  for (Interval i : disjoint) sum += i.end - i.start;
  return sum;
}

/// Time covered by `a` but not by `b`; both disjoint and sorted.
TimeNs uncovered(const std::vector<Interval>& a, const std::vector<Interval>& b) {
  TimeNs overlap = 0;
  std::size_t j = 0;
  for (Interval i : a) {
    while (j < b.size() && b[j].end <= i.start) ++j;
    for (std::size_t k = j; k < b.size() && b[k].start < i.end; ++k)
      overlap += std::min(i.end, b[k].end) - std::max(i.start, b[k].start);
  }
  return length(a) - overlap;
}

void track_memory(const TaskGraph& graph, const Timeline& timeline, DeviceMetrics& device) {
  Bytes current = 0;
  for (const MemoryChange& c : memory_changes(graph, timeline, device.rank)) {
    current += c.delta;
    if (current > device.peak_activation_bytes) {
      device.peak_activation_bytes = current;
      device.peak_op = c.op;
      device.peak_time_ns = c.time;
    }
  }
}

/// Busy time, communication and peak activation memory of one device (its bubbles need the
/// iteration's length: the caller's), and the earliest start and latest end of its ops in `span`.
DeviceMetrics measure_device(const TaskGraph& graph, const Timeline& timeline, int d, Bytes static_bytes,
                             Interval& span) {
  DeviceMetrics device;
  device.rank = d;
  std::vector<Interval> compute, comm;
  std::vector<std::size_t> comm_ends;  // one run per communication stream
  const std::size_t compute_ops = graph.stream(graph.first_stream(d)).size();  // a device's first stream
  compute.reserve(compute_ops);
  comm.reserve(stream_ops(graph, graph.first_stream(d), graph.first_stream(d + 1)) - compute_ops);
  span = {std::numeric_limits<TimeNs>::max(), 0};
  for (std::size_t s = graph.first_stream(d); s < graph.first_stream(d + 1); ++s) {
    std::vector<Interval>& into = graph.stream_kind_of(s) == Stream::Compute ? compute : comm;
    for (TaskId id : graph.stream(s)) {
      const Interval ran{timeline.start[static_cast<std::size_t>(id)], timeline.end[static_cast<std::size_t>(id)]};
      span = {std::min(span.start, ran.start), std::max(span.end, ran.end)};
      into.push_back(ran);
    }
    if (&into == &comm && !graph.stream(s).empty()) comm_ends.push_back(comm.size());
  }
  const auto by_start = [](Interval a, Interval b) { return a.start < b.start; };
  sort_runs(compute, {compute.size()}, by_start);
  sort_runs(comm, std::move(comm_ends), by_start);
  merge_overlaps(compute);  // now the times the device computes
  merge_overlaps(comm);     // and those it communicates
  device.busy_ns = length(compute);
  device.comm_ns = length(comm);
  device.exposed_comm_ns = uncovered(comm, compute);
  device.static_bytes = static_bytes;
  track_memory(graph, timeline, device);
  device.peak_memory_bytes = device.static_bytes + device.peak_activation_bytes;
  return device;
}

}  // namespace

std::vector<MemoryChange> memory_changes(const TaskGraph& graph, const Timeline& timeline, int device) {
  // Per stream, its allocations and then its releases, each run in time order as the stream runs.
  // Where only compute ops hold memory (as assemble builds graphs), the device's first stream.
  const std::size_t first = graph.first_stream(device);
  const std::size_t past = graph.memory_on_compute_only() ? first + 1 : graph.first_stream(device + 1);
  const std::size_t ops = stream_ops(graph, first, past);
  std::vector<MemoryChange> changes, releases;
  std::vector<std::size_t> ends;
  changes.reserve(2 * ops);
  releases.reserve(ops);
  for (std::size_t s = first; s < past; ++s) {
    for (TaskId id : graph.stream(s)) {
      const TaskWork& w = graph.work(id);
      if (w.alloc_bytes) changes.push_back({timeline.start[static_cast<std::size_t>(id)], w.alloc_bytes, id});
      if (w.free_bytes) releases.push_back({timeline.end[static_cast<std::size_t>(id)], -w.free_bytes, id});
    }
    for (std::size_t run : {changes.size(), changes.size() + releases.size()})
      if (ends.empty() || ends.back() != run) ends.push_back(run);
    changes.insert(changes.end(), releases.begin(), releases.end());
    releases.clear();
  }
  // A release never ties with an allocation (their deltas differ in sign), and ties within either
  // keep stream order: the same order as a stable sort of the changes op by op.
  sort_runs(changes, std::move(ends), [](const MemoryChange& a, const MemoryChange& b) {
    return a.time != b.time ? a.time < b.time : a.delta < b.delta;
  });
  return changes;
}

RunMetrics compute_metrics(const Config& config, const TaskGraph& graph, const Timeline& timeline,
                           const std::vector<Bytes>& static_bytes) {
  RunMetrics run;
  // Devices are independent: on a large graph, half of them are measured on a second thread. Every
  // op runs on a device, so the iteration ends with the last of theirs -- or, where no device waits
  // for the others at the optimizer step, iterations follow each other at the longest device span:
  // shifted by it, every device's next iteration keeps the times this one had relative to the others.
  run.devices.resize(std::size_t(graph.devices()));
  std::vector<Interval> spans(run.devices.size(), Interval{0, 0});
  in_two_halves(run.devices.size(), graph.size() >= kOpsWorthAThread, [&](std::size_t begin, std::size_t end) {
    for (std::size_t d = begin; d < end; ++d)
      run.devices[d] = measure_device(graph, timeline, int(d), static_bytes[d], spans[d]);
  });
  for (const Interval& span : spans)
    run.iteration_ns = std::max(run.iteration_ns, config.training.optimizer_post_validation && span.end > span.start
                                                      ? span.end - span.start
                                                      : span.end);
  for (DeviceMetrics& d : run.devices)
    d.bubble_fraction = 1.0 - double(d.busy_ns) / double(std::max<TimeNs>(run.iteration_ns, 1));
  const double iteration_s = std::max(seconds(run.iteration_ns), 1e-12);
  const ModelConfig& m = config.model;
  const ParallelConfig& p = config.parallel;
  run.tokens_per_s = double(m.micro_batch_size) * p.microbatches * p.dp * m.seq_len / iteration_s;
  run.mfu = paper_iteration_flops(config) /
            (iteration_s * double(p.pp) * p.tp * p.dp * p.cp * config.hardware.peak_tflops * 1e12);
  run.memory_capacity_bytes = memory_capacity_bytes(config.hardware);

  Bytes most = 0, least = run.devices.empty() ? 0 : run.devices.front().peak_memory_bytes;
  for (const DeviceMetrics& d : run.devices) {
    run.bubble_fraction += d.bubble_fraction / double(run.devices.size());
    most = std::max(most, d.peak_memory_bytes);
    least = std::min(least, d.peak_memory_bytes);
  }
  run.memory_imbalance = least > 0 ? double(most) / double(least) : 1.0;
  run.fits_in_memory = most <= run.memory_capacity_bytes;
  run.headroom_bytes = run.memory_capacity_bytes - most;
  return run;
}

}  // namespace pipesim
