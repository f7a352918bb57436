#pragma once
/// Chrome trace (JSON object form, ts/dur in µs) of one run, simulated or measured: one pid per
/// device, one tid per stream, X events with stage/chunk/microbatch/kind, flow arrows from each
/// SEND to its RECV, and a memory counter per device. Opens in Perfetto and chrome://tracing.
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "status.h"
#include "task_graph.h"
#include "timeline.h"
#include "units.h"

namespace pipesim {

/// How every trace pipesim writes begins; a file that begins so may be replaced by a new trace.
constexpr std::string_view kTraceGenerator = R"({"otherData":{"generator":"pipesim")";

/// A span inside one of a device's compute ops, shown on a row of its own: a measured run's
/// tensor-parallel collectives, which the graph charges inside F, B and R.
struct InnerSlice {
  int device = 0;
  TimeNs start = 0, end = 0;
  std::string_view name;
};

/// Receives a trace a piece at a time, in order; an error stops the writing and is returned.
using TraceSink = std::function<Status(std::string_view piece)>;

/// The trace in pieces of about 1 MiB: a large run's trace is several times the size of its
/// simulation, so it is never held whole. The memory counter follows the ops' alloc/free bytes (the
/// cost model's), or with `live_after` (per op: the activation bytes its device held when it
/// completed, as a runtime measures them) those.
Status write_chrome_trace(const TaskGraph& graph, const Timeline& timeline, const std::vector<Bytes>& static_bytes,
                          const std::string& title, std::span<const Bytes> live_after, const TraceSink& sink,
                          std::span<const InnerSlice> inner = {});

/// The trace into the file `path`, as write_output_file writes (files.h), a piece at a time.
Status write_chrome_trace_file(const std::string& path, const TaskGraph& graph, const Timeline& timeline,
                               const std::vector<Bytes>& static_bytes, const std::string& title,
                               std::span<const Bytes> live_after = {}, std::span<const InnerSlice> inner = {});

/// The whole trace as one string (small runs, tests).
std::string chrome_trace(const TaskGraph& graph, const Timeline& timeline, const std::vector<Bytes>& static_bytes,
                         const std::string& title, std::span<const Bytes> live_after = {});

}  // namespace pipesim
