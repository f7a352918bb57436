#pragma once
/// A picture of a run: one row per device (its compute stream) and a thin row under it for its
/// collectives, ops as coloured boxes labelled with their microbatch. SVG, so it shows in browsers
/// and Markdown; small runs only (labels need room).
#include <string>

#include "task_graph.h"
#include "timeline.h"

namespace pipesim {

/// How every SVG pipesim writes begins; a file that begins so may be replaced by a new timeline.
constexpr std::string_view kSvgGenerator = "<!-- timeline written by pipesim -->\n";

std::string svg_timeline(const TaskGraph& graph, const Timeline& timeline, const std::string& title);

}  // namespace pipesim
