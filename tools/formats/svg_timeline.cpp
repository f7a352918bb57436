#include "svg_timeline.h"

#include <fmt/format.h>

#include <algorithm>

namespace pipesim {
namespace {

const char* colour(OpKind kind) {
  switch (kind) {
    case OpKind::F: return "#4e79a7";
    case OpKind::B: return "#59a14f";
    case OpKind::W: return "#76b7b2";
    case OpKind::S: return "#f28e2b";
    case OpKind::T: return "#e15759";
    case OpKind::IF: return "#b07aa1";
    case OpKind::IB: return "#ff9da7";
    case OpKind::Optimizer: return "#bab0ac";
    default: return "#9c755f";  // communication
  }
}

/// The title is a user's path: escape what XML would read as markup.
std::string xml_escaped(const std::string& text) {
  std::string out;
  for (char c : text) {
    switch (c) {
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '&': out += "&amp;"; break;
      default: out += c;
    }
  }
  return out;
}

}  // namespace

std::string svg_timeline(const TaskGraph& graph, const Timeline& timeline, const std::string& title) {
  constexpr double kWidth = 1200, kLeft = 60, kRow = 26, kCommRow = 8, kTop = 30;
  TimeNs end = 1;
  for (TimeNs t : timeline.end) end = std::max(end, t);
  const double scale = (kWidth - kLeft - 10) / double(end);
  const double height = kTop + graph.devices() * (kRow + kCommRow + 6) + 30;
  std::string out = std::string(kSvgGenerator) + fmt::format(
      R"(<svg xmlns="http://www.w3.org/2000/svg" width="{}" height="{:.0f}" font-family="sans-serif" font-size="10">)"
      "\n<text x=\"{}\" y=\"16\" font-size=\"13\">{}</text>\n",
      kWidth, height, kLeft, xml_escaped(title));
  for (int d = 0; d < graph.devices(); ++d) {
    const double y = kTop + d * (kRow + kCommRow + 6);
    out += fmt::format("<text x=\"4\" y=\"{:.1f}\">device {}</text>\n", y + kRow * 0.65, d);
    for (std::size_t s = graph.first_stream(d); s < graph.first_stream(d + 1); ++s) {
      const Stream kind = graph.stream_kind_of(s);
      if (kind != Stream::Compute && kind != Stream::Collective) continue;
      const double top = kind == Stream::Compute ? y : y + kRow + 2, h = kind == Stream::Compute ? kRow : kCommRow;
      for (TaskId id : graph.stream(s)) {
        const Task& t = graph.task(id);
        const double x = kLeft + double(timeline.start[std::size_t(id)]) * scale;
        const double w = std::max(0.5, double(timeline.end[std::size_t(id)] - timeline.start[std::size_t(id)]) * scale);
        out += fmt::format(R"(<rect x="{:.2f}" y="{:.1f}" width="{:.2f}" height="{:.1f}" fill="{}" stroke="white" stroke-width="0.5"><title>{}</title></rect>)",
                           x, top, w, h, colour(t.kind), graph.describe(id));
        if (kind == Stream::Compute && w > 14 && t.microbatch >= 0)
          out += fmt::format(R"(<text x="{:.2f}" y="{:.1f}" fill="white" text-anchor="middle">{}{}</text>)", x + w / 2,
                             top + kRow * 0.65, op_kind_name(t.kind), t.microbatch);
        out += "\n";
      }
    }
  }
  double x = kLeft;
  for (OpKind kind : {OpKind::F, OpKind::B, OpKind::W, OpKind::S, OpKind::T, OpKind::IF, OpKind::IB, OpKind::AllReduce}) {
    out += fmt::format(R"(<rect x="{:.0f}" y="{:.0f}" width="10" height="10" fill="{}"/><text x="{:.0f}" y="{:.0f}">{}</text>)",
                       x, height - 18, colour(kind), x + 13, height - 9,
                       kind == OpKind::AllReduce ? "collectives (thin rows)" : std::string(op_kind_name(kind)));
    out += "\n";
    x += kind == OpKind::AllReduce ? 160 : 45;
  }
  return out + "</svg>\n";
}

}  // namespace pipesim
