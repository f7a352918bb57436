#pragma once
/// Chrome trace (JSON object form, ts/dur in µs) of one run, simulated or measured: one pid per
/// device, one tid per stream, X events with stage/chunk/microbatch/kind, flow arrows from each
/// SEND to its RECV, and a memory counter per device. Opens in Perfetto and chrome://tracing.
#include <span>
#include <string>
#include <vector>

#include "task_graph.h"
#include "timeline.h"
#include "units.h"

namespace pipesim {

/// How every trace pipesim writes begins; a file that begins so may be replaced by a new trace.
constexpr std::string_view kTraceGenerator = R"({"otherData":{"generator":"pipesim")";

/// The memory counter follows the ops' alloc/free bytes (the cost model's), or with `live_after` (per
/// op: the activation bytes its device held when it completed, as a runtime measures them) those.
std::string chrome_trace(const TaskGraph& graph, const Timeline& timeline, const std::vector<Bytes>& static_bytes,
                         const std::string& title, std::span<const Bytes> live_after = {});

}  // namespace pipesim
