#include "svg_timeline.h"

#include <fmt/format.h>

#include <algorithm>
#include <string_view>

namespace pipesim {
namespace {

const char* colour(OpKind kind) {
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
    default: return "#9c755f";  // communication
  }
}

/// The length of the UTF-8 sequence that `text` starts with (1 to 4), or 0 when it starts with none
/// (RFC 3629: no overlong forms, no surrogates, nothing past U+10FFFF).
std::size_t utf8_length(std::string_view text) {
  const auto byte = [&](std::size_t i) { return static_cast<unsigned char>(text[i]); };
  const unsigned char lead = byte(0);
  if (lead < 0x80) return 1;
  std::size_t length = 0;
  unsigned char low = 0x80, high = 0xBF;  // the second byte's range
  if (lead >= 0xC2 && lead <= 0xDF) {
    length = 2;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    length = 3, low = lead == 0xE0 ? 0xA0 : 0x80, high = lead == 0xED ? 0x9F : 0xBF;
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    length = 4, low = lead == 0xF0 ? 0x90 : 0x80, high = lead == 0xF4 ? 0x8F : 0xBF;
  } else {
    return 0;
  }
  if (text.size() < length || byte(1) < low || byte(1) > high) return 0;
  for (std::size_t i = 2; i < length; ++i)
    if (byte(i) < 0x80 || byte(i) > 0xBF) return 0;
  return length;
}

/// The title is a user's path: escape what XML would read as markup, and put U+FFFD for what XML
/// cannot hold (bytes that are not UTF-8, control characters), which would make the file unreadable.
std::string xml_escaped(std::string_view text) {
  std::string out;
  while (!text.empty()) {
    const std::size_t length = utf8_length(text);
    const char c = text.front();
    if (length == 0 || (length == 1 && static_cast<unsigned char>(c) < 0x20 && c != '\t' && c != '\n' && c != '\r'))
      out += "\xEF\xBF\xBD";  // U+FFFD
    else if (c == '<')
      out += "&lt;";
    else if (c == '>')
      out += "&gt;";
    else if (c == '&')
      out += "&amp;";
    else
      out.append(text.substr(0, length));
    text.remove_prefix(std::max<std::size_t>(length, 1));
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
  for (OpKind kind : {OpKind::F, OpKind::B, OpKind::W, OpKind::R, OpKind::S, OpKind::T, OpKind::IF, OpKind::IB,
                      OpKind::AllReduce}) {
    if (kind == OpKind::R && !graph.has(OpKind::R)) continue;
    out += fmt::format(R"(<rect x="{:.0f}" y="{:.0f}" width="10" height="10" fill="{}"/><text x="{:.0f}" y="{:.0f}">{}</text>)",
                       x, height - 18, colour(kind), x + 13, height - 9,
                       kind == OpKind::AllReduce ? "collectives (thin rows)" : std::string(op_kind_name(kind)));
    out += "\n";
    x += kind == OpKind::AllReduce ? 160 : 45;
  }
  return out + "</svg>\n";
}

}  // namespace pipesim
