#include "svg_timeline.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <vector>

namespace pipesim {
namespace {

constexpr double kWidth = 1200, kLeft = 64, kRight = 16, kRow = 22, kCommRow = 8, kRowGap = 6, kTop = 40;
/// An estimate of a label's width at font-size 10: sans-serif digits and capitals are about 6 px.
constexpr double kCharPx = 6.2;

/// The kinds the legend shows, in its order; every collective kind is one entry (communication).
constexpr OpKind kLegendKinds[] = {OpKind::F, OpKind::B,  OpKind::W,  OpKind::R,         OpKind::S,
                                   OpKind::T, OpKind::IF, OpKind::IB, OpKind::Optimizer, OpKind::AllReduce};

/// A long run's steady state is elided when the busiest device's compute ops, spread evenly over the
/// full width, would get less than kElideBelowPx each: below that its boxes lose their white edges and
/// the row reads as one bar (configs/default.json's 8 × 32 runs get 2.9 px or more, a 64 × 1024 one 0.3 px).
constexpr double kElideBelowPx = 2.5;
/// What an elided picture aims at instead: the head and tail it keeps grow until the median
/// transformer op (F, B, W, R) would be this wide, so that the pipeline's fill and drain, which set
/// the bubble, are drawn at a size where each box shows.
constexpr double kElidedOpPx = 6;
/// However long the fill and drain, a few ops of the steady state stay on each side of the break, so
/// that the pattern the elided middle repeats is seen.
constexpr double kSteadyOps = 6;
/// The break's width: a grey band with torn edges, where the elided time would be.
constexpr double kBreakPx = 28;

bool is_collective(OpKind kind) { return stream_kind(kind) == Stream::Collective; }
/// The kinds that run per (virtual) stage, and so per chunk; the rest run once per device.
bool per_stage(OpKind kind) { return pass_index(kind) >= 0 || kind == OpKind::R; }

/// A stretch of the time axis and where it is drawn: the whole iteration, or one side of a break.
struct Segment {
  TimeNs from = 0, to = 0;
  double x0 = kLeft;  ///< where `from` is drawn
};

/// What the picture shows of the iteration [0, end], at `scale` px per ns.
struct TimeAxis {
  std::vector<Segment> segments;  ///< one, or the head and the tail around the elided middle
  double scale = 0;
  bool elided() const { return segments.size() > 1; }
};

TimeAxis time_axis(const TaskGraph& graph, const Timeline& timeline, TimeNs end) {
  const double width = kWidth - kLeft - kRight;
  TimeAxis whole{.segments = {{.from = 0, .to = end, .x0 = kLeft}}, .scale = width / double(end)};
  const auto first = [&](std::span<const TaskId> ops, OpKind kind) {
    const auto at = std::find_if(ops.begin(), ops.end(), [&](TaskId id) { return graph.task(id).kind == kind; });
    return at == ops.end() ? TimeNs(0) : timeline.start[std::size_t(*at)];
  };
  // The pipeline has turned around once every device has started its first backward (has begun its
  // steady state), is full once every device has started its first forward, and drains from when
  // the first device has finished its last microbatch op.
  std::size_t busiest = 0;
  TimeNs turned = 0, full = 0, draining = end;
  for (int d = 0; d < graph.devices(); ++d) {
    const std::span<const TaskId> ops = graph.stream(graph.first_stream(d));
    busiest = std::max(busiest, ops.size());
    turned = std::max(turned, first(ops, OpKind::B));
    full = std::max(full, first(ops, OpKind::F));
    const auto last = std::find_if(ops.rbegin(), ops.rend(), [&](TaskId id) { return graph.task(id).microbatch >= 0; });
    if (last != ops.rend()) draining = std::min(draining, timeline.end[std::size_t(*last)]);
  }
  if (busiest == 0 || width / double(busiest) >= kElideBelowPx) return whole;
  std::vector<TimeNs> durations;
  for (TaskId id = 0; id < TaskId(graph.size()); ++id)
    if (per_stage(graph.task(id).kind)) durations.push_back(timeline.end[std::size_t(id)] - timeline.start[std::size_t(id)]);
  if (durations.empty()) return whole;
  const auto middle = durations.begin() + std::ptrdiff_t(durations.size() / 2);
  std::nth_element(durations.begin(), middle, durations.end());
  const double kept = double(*middle) * (width - kBreakPx) / kElidedOpPx;  // the time shown at that scale
  // The head keeps the fill up to the turn, where each device's first bubble ends; a schedule that
  // runs every forward before any backward (GPipe) turns a third of the way in, and keeps the fill alone.
  const double filled = double(turned) <= double(end) / 5 ? double(turned) : double(full);
  const double per_op = double(end) / double(busiest);  // the busiest device's mean op, bubbles included
  const double context = std::max(kSteadyOps * per_op, (kept - filled - double(end - draining)) / 2);
  const auto head_end = TimeNs(std::llround(filled + context));
  const auto tail_start = TimeNs(std::llround(double(draining) - context));
  if (head_end >= tail_start) return whole;
  const double scale = (width - kBreakPx) / double(head_end + end - tail_start);
  return {.segments = {{.from = 0, .to = head_end, .x0 = kLeft},
                       {.from = tail_start, .to = end, .x0 = kLeft + double(head_end) * scale + kBreakPx}},
          .scale = scale};
}

/// "F12" where it fits, "12" where only the number does, nothing where neither does.
std::string label(const Task& t, double width) {
  if (t.microbatch < 0) return "";
  const std::string full = fmt::format("{}{}", op_kind_name(t.kind), t.microbatch);
  if (width >= full.size() * kCharPx + 4) return full;
  const std::string number = std::to_string(t.microbatch);
  return width >= number.size() * kCharPx + 3 ? number : "";
}

/// `colour` (#rrggbb) darkened for chunk `chunk` of `chunks`: chunk 0 as it is, the last half as bright.
std::string shade(std::string_view colour, int chunk, int chunks) {
  if (chunks <= 1 || chunk <= 0) return std::string(colour);
  const double kept = 1 - 0.5 * double(chunk) / double(chunks - 1);
  const auto channel = [&](std::size_t at) {
    const int value = std::stoi(std::string(colour.substr(at, 2)), nullptr, 16);
    return int(std::lround(value * kept));
  };
  return fmt::format("#{:02x}{:02x}{:02x}", channel(1), channel(3), channel(5));
}

/// The colour of an op's box: its kind's, shaded by its chunk where a device holds several.
std::string box_colour(const Task& t, int chunks) {
  return per_stage(t.kind) ? shade(op_colour(t.kind), t.chunk, chunks) : std::string(op_colour(t.kind));
}

/// An op's box, or its part inside `segment` (none when it lies outside): clipped at a break, it
/// keeps its whole times in its tooltip.
std::string op_box(const TaskGraph& graph, const Timeline& timeline, TaskId id, const Segment& segment, double scale,
                   int chunks, double top, double height) {
  const Task& t = graph.task(id);
  const TimeNs op_start = timeline.start[std::size_t(id)], op_end = timeline.end[std::size_t(id)];
  const TimeNs from = std::max(op_start, segment.from), to = std::min(op_end, segment.to);
  // An op of no duration is drawn where it happens; one of some duration where a part of it is.
  if (op_start == op_end ? op_start < segment.from || op_start > segment.to : from >= to) return "";
  const double exact = double(to - from) * scale;
  const double w = std::max(exact, is_collective(t.kind) ? kMinCollectivePx : 0.6);
  double left = segment.x0 + double(from - segment.from) * scale;
  // A part cut off at the break is widened leftwards, so that it never reaches into the break.
  if (op_end > segment.to) left = std::min(left, segment.x0 + double(segment.to - segment.from) * scale - w);
  // A white edge separates adjacent boxes; on a box a few px wide it would hide the colour.
  const std::string_view edge = w >= 4 ? R"( stroke="white" stroke-width="0.5")" : "";
  std::string out = fmt::format(R"(<rect x="{:.1f}" y="{:.1f}" width="{:.1f}" height="{:.1f}" fill="{}"{}><title>{} {:.3f}–{:.3f} ms</title></rect>)",
                                left, top, w, height, box_colour(t, chunks), edge, xml_escaped(graph.describe(id)),
                                op_start / 1e6, op_end / 1e6);
  if (stream_kind(t.kind) == Stream::Compute)
    if (const std::string text = label(t, w); !text.empty())
      out += fmt::format(R"(<text x="{:.2f}" y="{:.1f}" fill="white" font-size="10" text-anchor="middle">{}</text>)",
                         left + w / 2, top + height * 0.7, text);
  return out + "\n";
}

/// The break between the head and the tail: a grey band with torn edges down through every row, a
/// cut in the axis, and the elided time written above the rows (and in the band's tooltip).
std::string elision_mark(const TimeAxis& axis, const PlotArea& rows) {
  const Segment &head = axis.segments.front(), &tail = axis.segments.back();
  const double left = head.x0 + double(head.to - head.from) * axis.scale, right = tail.x0;
  const double elided_ms = double(tail.from - head.to) / 1e6;
  const std::string what = fmt::format("{:.2f} ms elided ({:.2f}–{:.2f} ms)", elided_ms, head.to / 1e6, tail.from / 1e6);
  std::string out = fmt::format(R"(<rect class="elided" x="{:.1f}" y="{:.1f}" width="{:.1f}" height="{:.1f}" fill="#eeeeee"><title>{}: the steady state, not drawn</title></rect>)",
                                left, rows.top, right - left, rows.height + 4, what) + "\n";
  // Torn edges: a zigzag 3 px either side of each edge, a step every 6 px down.
  for (double x : {left, right}) {
    std::string points;
    for (int i = 0; rows.top + 6 * i <= rows.bottom() + 4; ++i)
      points += fmt::format("{}{:.1f},{:.1f}", i ? " " : "", x + (i % 2 ? 3 : -3), rows.top + 6 * i);
    out += fmt::format(R"(<polyline points="{}" fill="none" stroke="#888"/>)", points) + "\n";
  }
  // Over the break where there is room, else kept clear of the iteration's label at the right end of
  // the same line (about 130 px); 6 px a character, counting the dash's three bytes as about one.
  const double half = (double(what.size()) + 4) * 3;
  const double x = std::max(rows.left + half, std::min((left + right) / 2, rows.right() - 140 - half));
  out += fmt::format(R"(<text x="{:.1f}" y="{:.1f}" text-anchor="middle" fill="#555">⋯ {} ⋯</text>)", x, rows.top - 8, what) + "\n";
  return out;
}

/// The legend's entries for the kinds drawn, wrapped into lines across the picture; returns the
/// elements and sets `lines`. Where a device holds several chunks, a per-stage kind shows a swatch
/// per chunk, and a last entry says what the shades are.
std::string legend(const TaskGraph& graph, int chunks, double y, int& lines) {
  std::string out;
  double x = kLeft;
  lines = 1;
  const auto entry = [&](const std::vector<std::string>& swatches, const std::string& text) {
    const double swatch_w = swatches.size() > 1 ? 8 : 11, swatches_w = swatch_w * double(swatches.size());
    const double width = swatches_w + 5 + text.size() * 5.6 + 18;
    if (x + width > kWidth - kRight && x > kLeft) x = kLeft, y += 16, ++lines;
    for (std::size_t i = 0; i < swatches.size(); ++i)
      out += fmt::format(R"(<rect x="{:.0f}" y="{:.0f}" width="{:.0f}" height="11" fill="{}"/>)",
                         x + swatch_w * double(i), y - 9, swatch_w, swatches[i]);
    out += fmt::format(R"(<text x="{:.0f}" y="{:.0f}">{}</text>)", x + (swatches_w + 4), y, xml_escaped(text)) + "\n";
    x += width;
  };
  for (OpKind kind : kLegendKinds) {
    const bool drawn = kind == OpKind::AllReduce
                           ? graph.has(OpKind::AllReduce) || graph.has(OpKind::Broadcast) ||
                                 graph.has(OpKind::Reduce) || graph.has(OpKind::DpAllReduce) ||
                                 graph.has(OpKind::AllToAll)
                           : graph.has(kind);
    if (!drawn) continue;
    std::vector<std::string> swatches;
    for (int c = 0; c < (per_stage(kind) ? chunks : 1); ++c) swatches.push_back(shade(op_colour(kind), c, chunks));
    entry(swatches, std::string(op_meaning(kind, graph.has(OpKind::W))));
  }
  if (chunks > 1)
    entry({}, fmt::format("shades, left to right: chunks 0 to {} of a device (its virtual stages)", chunks - 1));
  return out;
}

/// The most chunks a device holds: 1 unless the schedule gives each device several stages.
int chunks_per_device(const TaskGraph& graph) {
  int chunks = 1;
  for (const Task& t : graph.tasks())
    if (per_stage(t.kind)) chunks = std::max(chunks, t.chunk + 1);
  return chunks;
}

}  // namespace

std::string_view op_colour(OpKind kind) {
  switch (kind) {
    case OpKind::F: return "#4e79a7";
    case OpKind::B: return "#59a14f";
    case OpKind::W: return "#76b7b2";
    case OpKind::R: return "#8cd17d";
    case OpKind::S: return "#f28e2b";
    case OpKind::T: return "#e15759";
    case OpKind::IF: return "#b07aa1";
    case OpKind::IB: return "#ff9da7";
    case OpKind::Optimizer: return "#bab0ac";
    case OpKind::Send:
    case OpKind::Recv:
    case OpKind::AllReduce:
    case OpKind::Broadcast:
    case OpKind::Reduce:
    case OpKind::DpAllReduce:
    case OpKind::AllToAll: return "#9c755f";
  }
  return "#000000";
}

std::string_view op_meaning(OpKind kind, bool split_backward) {
  switch (kind) {
    case OpKind::F: return "F forward";
    case OpKind::B: return split_backward ? "B backward, input gradient only (W is split off)"
                                          : "B backward: input and weight gradients";
    case OpKind::W: return "W weight gradient";
    case OpKind::R: return "R recomputed forward, before its B";
    case OpKind::S: return "S vocabulary output pass: logits, max, sum of exp";
    case OpKind::T: return "T vocabulary output pass: softmax gradient, dW";
    case OpKind::IF: return "IF vocabulary input pass: embedding lookup";
    case OpKind::IB: return "IB vocabulary input pass: embedding gradient";
    case OpKind::Optimizer: return "optimizer step";
    case OpKind::Send:
    case OpKind::Recv:
    case OpKind::AllReduce:
    case OpKind::Broadcast:
    case OpKind::Reduce:
    case OpKind::DpAllReduce:
    case OpKind::AllToAll: return "communication: collectives (thin rows), at least 2 px wide";
  }
  return "";
}

std::string svg_timeline(const TaskGraph& graph, const Timeline& timeline, const std::string& title) {
  TimeNs end = 1;
  for (TimeNs t : timeline.end) end = std::max(end, t);
  const TimeAxis axis = time_axis(graph, timeline, end);
  const int chunks = chunks_per_device(graph);
  const double row_pitch = kRow + kCommRow + kRowGap;
  const PlotArea rows{.left = kLeft, .top = kTop, .width = kWidth - kLeft - kRight, .height = graph.devices() * row_pitch};
  int legend_lines = 0;
  const std::string key = legend(graph, chunks, rows.bottom() + 48, legend_lines);
  const double height = rows.bottom() + 48 + 16 * legend_lines;
  const double iteration_ms = double(end) / 1e6;
  std::string out = svg_open(kWidth, height) +
                    fmt::format(R"(<text x="{}" y="18" font-size="13">{} — iteration {:.2f} ms</text>)", kLeft,
                                xml_escaped(title), iteration_ms) + "\n";
  if (!axis.elided()) {
    out += bottom_axis(rows, iteration_ms, "time (ms)", 10);
  } else {
    // Each side of the break has its own ticks, about as many per px as an unbroken axis has.
    for (const Segment& s : axis.segments) {
      const double width = double(s.to - s.from) * axis.scale;
      const PlotArea part{.left = s.x0, .top = rows.top, .width = width, .height = rows.height};
      out += bottom_axis(part, s.from / 1e6, s.to / 1e6, &s == &axis.segments.back() ? "time (ms)" : "",
                         std::max(2, int(std::lround(10 * width / rows.width))));
    }
  }
  for (int d = 0; d < graph.devices(); ++d) {
    const double y = kTop + d * row_pitch + kRowGap / 2;
    out += fmt::format(R"(<text x="4" y="{:.1f}">device {}</text>)", y + kRow * 0.7, d) + "\n";
    for (std::size_t s = graph.first_stream(d); s < graph.first_stream(d + 1); ++s) {
      const Stream kind = graph.stream_kind_of(s);
      if (kind != Stream::Compute && kind != Stream::Collective) continue;
      const double top = kind == Stream::Compute ? y : y + kRow + 1, h = kind == Stream::Compute ? kRow : kCommRow - 1;
      for (const Segment& segment : axis.segments)
        for (TaskId id : graph.stream(s)) out += op_box(graph, timeline, id, segment, axis.scale, chunks, top, h);
    }
  }
  if (axis.elided()) out += elision_mark(axis, rows);
  // Where the iteration ends: every box lies left of it.
  out += fmt::format(R"(<line x1="{0:.1f}" y1="{1:.1f}" x2="{0:.1f}" y2="{2:.1f}" stroke="#c00" stroke-dasharray="4 3"/>)"
                     R"(<text x="{0:.1f}" y="{3:.1f}" text-anchor="end" fill="#c00">iteration {4:.2f} ms</text>)",
                     rows.right(), kTop - 4, rows.bottom(), kTop - 8, iteration_ms) + "\n";
  return out + key + "</svg>\n";
}

}  // namespace pipesim
