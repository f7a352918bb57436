#include "svg_timeline.h"

#include <fmt/format.h>

#include <algorithm>
#include <vector>

namespace pipesim {
namespace {

constexpr double kWidth = 1200, kLeft = 64, kRight = 16, kRow = 22, kCommRow = 8, kRowGap = 6, kTop = 40;
/// An estimate of a label's width at font-size 10: sans-serif digits and capitals are about 6 px.
constexpr double kCharPx = 6.2;

/// The kinds the legend shows, in its order; every collective kind is one entry (communication).
constexpr OpKind kLegendKinds[] = {OpKind::F, OpKind::B,  OpKind::W,  OpKind::R,         OpKind::S,
                                   OpKind::T, OpKind::IF, OpKind::IB, OpKind::Optimizer, OpKind::AllReduce};

bool is_collective(OpKind kind) { return stream_kind(kind) == Stream::Collective; }

/// "F12" where it fits, "12" where only the number does, nothing where neither does.
std::string label(const Task& t, double width) {
  if (t.microbatch < 0) return "";
  const std::string full = fmt::format("{}{}", op_kind_name(t.kind), t.microbatch);
  if (width >= full.size() * kCharPx + 4) return full;
  const std::string number = std::to_string(t.microbatch);
  return width >= number.size() * kCharPx + 3 ? number : "";
}

std::string op_box(const TaskGraph& graph, const Timeline& timeline, TaskId id, double scale, double top, double height) {
  const Task& t = graph.task(id);
  const double start = double(timeline.start[std::size_t(id)]) * scale;
  const double exact = double(timeline.end[std::size_t(id)] - timeline.start[std::size_t(id)]) * scale;
  const double w = std::max(exact, is_collective(t.kind) ? kMinCollectivePx : 0.6);
  // A white edge separates adjacent boxes; on a box a few px wide it would hide the colour.
  const std::string_view edge = w >= 4 ? R"( stroke="white" stroke-width="0.5")" : "";
  std::string out = fmt::format(R"(<rect x="{:.1f}" y="{:.1f}" width="{:.1f}" height="{:.1f}" fill="{}"{}><title>{} {:.3f}–{:.3f} ms</title></rect>)",
                                kLeft + start, top, w, height, op_colour(t.kind), edge, xml_escaped(graph.describe(id)),
                                timeline.start[std::size_t(id)] / 1e6, timeline.end[std::size_t(id)] / 1e6);
  if (stream_kind(t.kind) == Stream::Compute)
    if (const std::string text = label(t, w); !text.empty())
      out += fmt::format(R"(<text x="{:.2f}" y="{:.1f}" fill="white" font-size="10" text-anchor="middle">{}</text>)",
                         kLeft + start + w / 2, top + height * 0.7, text);
  return out + "\n";
}

/// The legend's entries for the kinds drawn, wrapped into lines across the picture; returns the
/// elements and sets `lines`.
std::string legend(const TaskGraph& graph, double y, int& lines) {
  std::string out;
  double x = kLeft;
  lines = 1;
  for (OpKind kind : kLegendKinds) {
    const bool drawn = kind == OpKind::AllReduce
                           ? graph.has(OpKind::AllReduce) || graph.has(OpKind::Broadcast) ||
                                 graph.has(OpKind::Reduce) || graph.has(OpKind::DpAllReduce)
                           : graph.has(kind);
    if (!drawn) continue;
    const std::string text = std::string(op_meaning(kind));
    const double width = 16 + text.size() * 5.6 + 18;
    if (x + width > kWidth - kRight && x > kLeft) x = kLeft, y += 16, ++lines;
    out += fmt::format(R"(<rect x="{:.0f}" y="{:.0f}" width="11" height="11" fill="{}"/><text x="{:.0f}" y="{:.0f}">{}</text>)",
                       x, y - 9, op_colour(kind), x + 15, y, xml_escaped(text)) + "\n";
    x += width;
  }
  return out;
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
    case OpKind::DpAllReduce: return "#9c755f";
  }
  return "#000000";
}

std::string_view op_meaning(OpKind kind) {
  switch (kind) {
    case OpKind::F: return "F forward";
    case OpKind::B: return "B backward (input gradient only, where W is split off)";
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
    case OpKind::DpAllReduce: return "communication: collectives (thin rows), at least 2 px wide";
  }
  return "";
}

std::string svg_timeline(const TaskGraph& graph, const Timeline& timeline, const std::string& title) {
  TimeNs end = 1;
  for (TimeNs t : timeline.end) end = std::max(end, t);
  const double scale = (kWidth - kLeft - kRight) / double(end);
  const double row_pitch = kRow + kCommRow + kRowGap;
  const PlotArea rows{.left = kLeft, .top = kTop, .width = kWidth - kLeft - kRight, .height = graph.devices() * row_pitch};
  int legend_lines = 0;
  const std::string key = legend(graph, rows.bottom() + 48, legend_lines);
  const double height = rows.bottom() + 48 + 16 * legend_lines;
  const double iteration_ms = double(end) / 1e6;
  std::string out = svg_open(kWidth, height) +
                    fmt::format(R"(<text x="{}" y="18" font-size="13">{} — iteration {:.2f} ms</text>)", kLeft,
                                xml_escaped(title), iteration_ms) + "\n";
  out += bottom_axis(rows, iteration_ms, "time (ms)", 10);
  for (int d = 0; d < graph.devices(); ++d) {
    const double y = kTop + d * row_pitch + kRowGap / 2;
    out += fmt::format(R"(<text x="4" y="{:.1f}">device {}</text>)", y + kRow * 0.7, d) + "\n";
    for (std::size_t s = graph.first_stream(d); s < graph.first_stream(d + 1); ++s) {
      const Stream kind = graph.stream_kind_of(s);
      if (kind != Stream::Compute && kind != Stream::Collective) continue;
      const double top = kind == Stream::Compute ? y : y + kRow + 1, h = kind == Stream::Compute ? kRow : kCommRow - 1;
      for (TaskId id : graph.stream(s)) out += op_box(graph, timeline, id, scale, top, h);
    }
  }
  // Where the iteration ends: every box lies left of it.
  out += fmt::format(R"(<line x1="{0:.1f}" y1="{1:.1f}" x2="{0:.1f}" y2="{2:.1f}" stroke="#c00" stroke-dasharray="4 3"/>)"
                     R"(<text x="{0:.1f}" y="{3:.1f}" text-anchor="end" fill="#c00">iteration {4:.2f} ms</text>)",
                     rows.right(), kTop - 4, rows.bottom(), kTop - 8, iteration_ms) + "\n";
  return out + key + "</svg>\n";
}

}  // namespace pipesim
