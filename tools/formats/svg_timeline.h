#pragma once
/// A picture of a run: one row per device (its compute stream) and a thin row under it for its
/// collectives, ops as coloured boxes on a time axis in ms that ends at the iteration time. Made to
/// read at real scale (8 devices × 32 microbatches and beyond): a box is labelled with its microbatch
/// only where the label fits, a collective is drawn at least kMinCollectivePx wide however short it
/// is, chunks on one device (virtual stages) are shades of their kind's colour, and the legend names
/// every colour drawn, in words. A run too long to draw whole (64 × 1024) keeps its head (the fill and
/// some steady state) and its tail (some steady state and the drain) at a readable scale, with a
/// marked break between them that gives the elided time.
#include <string>
#include <string_view>

#include "svg_parts.h"
#include "task_graph.h"
#include "timeline.h"

namespace pipesim {

/// The narrowest a collective is drawn: a 0.1 ms all-reduce in a 2 s iteration would be a twentieth
/// of a pixel, and the vocabulary passes' barriers are what a reader looks for.
constexpr double kMinCollectivePx = 2;

/// The <svg> element (for a page); svg_document makes it a file.
std::string svg_timeline(const TaskGraph& graph, const Timeline& timeline, const std::string& title);

/// The colour of an op's box (the first chunk's, where a device holds several), and what the legend
/// says it is: B is the whole backward unless the graph splits W off (`split_backward`).
std::string_view op_colour(OpKind kind);
std::string_view op_meaning(OpKind kind, bool split_backward);

}  // namespace pipesim
