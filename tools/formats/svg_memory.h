#pragma once
/// Memory over time: one line per device (static memory plus its live activations, stepping at every
/// allocation and release, as the Chrome trace's memory counter does) on a GiB axis, with the
/// capacity the job's tensors may use drawn across, so a reader sees which device comes near it and
/// when.
#include <string>
#include <vector>

#include "svg_parts.h"
#include "task_graph.h"
#include "timeline.h"
#include "units.h"

namespace pipesim {

/// The <svg> element (svg_document makes it a file). `static_bytes` per device (the plan's);
/// `capacity_bytes` is hardware.memory_gib less reserved_gib (0: no capacity line). A line holds at
/// most three points per half pixel of time, each half pixel keeping its highest level, so the
/// picture stays small at any number of ops and no peak is lost.
std::string svg_memory(const TaskGraph& graph, const Timeline& timeline, const std::vector<Bytes>& static_bytes,
                       Bytes capacity_bytes, const std::string& title);

/// The colour of device `d` of `devices` in the memory plot.
std::string device_colour(int d, int devices);

}  // namespace pipesim
