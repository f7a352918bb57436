#include "svg_memory.h"

#include <fmt/format.h>

#include <algorithm>

#include "metrics.h"

namespace pipesim {
namespace {

constexpr double kWidth = 1200, kLeft = 64, kLegend = 180, kTop = 44, kPlotHeight = 280, kEntry = 14;
constexpr double kGiB = double(1ull << 30);

/// One device's level at each moment, as points of a step line: x in px, the level in bytes.
struct StepLine {
  std::vector<std::pair<double, Bytes>> points;
  Bytes peak = 0;
  TimeNs peak_time = 0;
};

/// The device's memory as a step line, each half pixel of time collapsed to its level before, its
/// highest level and its level after.
StepLine device_line(const TaskGraph& graph, const Timeline& timeline, int d, Bytes static_bytes, const PlotArea& area,
                     double ns_per_px) {
  StepLine line{.points = {}, .peak = static_bytes, .peak_time = 0};
  Bytes level = static_bytes;
  long bin = -1;
  Bytes bin_max = level;
  double bin_x = area.left;
  const auto close_bin = [&] {
    if (bin < 0) return;
    line.points.push_back({bin_x, bin_max});
    line.points.push_back({bin_x, level});
  };
  line.points.push_back({area.left, level});
  for (const MemoryChange& c : memory_changes(graph, timeline, d)) {
    const double x = area.left + double(c.time) / ns_per_px;
    const long b = long(x * 2);
    if (b != bin) {
      close_bin();
      bin = b, bin_x = x;
      line.points.push_back({x, level});
      bin_max = level;
    }
    level += c.delta;
    bin_max = std::max(bin_max, level);
    if (level > line.peak) line.peak = level, line.peak_time = c.time;
  }
  close_bin();
  line.points.push_back({area.right(), level});
  return line;
}

std::string polyline(const StepLine& line, const std::string& colour, int d, const PlotArea& area,
                     double bytes_per_px) {
  std::string points;
  for (const auto& [x, level] : line.points)
    points += fmt::format("{:.1f},{:.1f} ", x, area.bottom() - double(level) / bytes_per_px);
  if (!points.empty()) points.pop_back();
  return fmt::format(R"(<polyline fill="none" stroke="{}" stroke-width="1.5" points="{}"><title>device {}: peak {:.2f} GiB at {:.3f} ms</title></polyline>)",
                     colour, points, d, double(line.peak) / kGiB, line.peak_time / 1e6) + "\n";
}

}  // namespace

std::string device_colour(int d, int devices) {
  // Ten colours people tell apart (Tableau 10); past ten devices, a ramp from blue to red in device
  // order, where neighbours are told apart by position rather than hue.
  static constexpr const char* kTen[] = {"#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f",
                                         "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#79706e"};
  if (devices <= 10) return kTen[d];
  return fmt::format("hsl({:.0f},70%,45%)", 240.0 * (1 - double(d) / double(devices - 1)));
}

std::string svg_memory(const TaskGraph& graph, const Timeline& timeline, const std::vector<Bytes>& static_bytes,
                       Bytes capacity_bytes, const std::string& title) {
  TimeNs end = 1;
  for (TimeNs t : timeline.end) end = std::max(end, t);
  const int devices = graph.devices();
  const PlotArea area{.left = kLeft, .top = kTop, .width = kWidth - kLeft - kLegend, .height = kPlotHeight};
  // The scale's top: the highest peak or the capacity, with room above.
  Bytes top = std::max<Bytes>(capacity_bytes, 1);
  std::vector<StepLine> lines;
  for (int d = 0; d < devices; ++d) {
    lines.push_back(device_line(graph, timeline, d, static_bytes[std::size_t(d)], area, double(end) / area.width));
    top = std::max(top, lines.back().peak);
  }
  const double max_gib = double(top) * 1.08 / kGiB;
  const double bytes_per_px = max_gib * kGiB / area.height;
  const double height = std::max(area.bottom() + 40, kTop + devices * kEntry + 10);
  std::string out = svg_open(kWidth, height) +
                    fmt::format(R"(<text x="{}" y="18" font-size="13">{} — memory per device (static + live activations)</text>)",
                                kLeft, xml_escaped(title)) + "\n";
  out += left_axis(area, max_gib, "GiB", 6);
  out += bottom_axis(area, double(end) / 1e6, "time (ms)", 10);
  if (capacity_bytes > 0) {
    const double y = area.bottom() - double(capacity_bytes) / bytes_per_px;
    out += fmt::format(R"(<line x1="{0:.1f}" y1="{1:.1f}" x2="{2:.1f}" y2="{1:.1f}" stroke="#c00" stroke-dasharray="6 4"/>)"
                       R"(<text x="{3:.1f}" y="{4:.1f}" fill="#c00">capacity {5:.2f} GiB (memory_gib less reserved_gib)</text>)",
                       area.left, y, area.right(), area.left + 6, y - 4, double(capacity_bytes) / kGiB) + "\n";
  }
  for (int d = 0; d < devices; ++d)
    out += polyline(lines[std::size_t(d)], device_colour(d, devices), d, area, bytes_per_px);
  for (int d = 0; d < devices; ++d) {
    const double y = kTop + d * kEntry;
    out += fmt::format(R"(<line x1="{0:.0f}" y1="{1:.1f}" x2="{2:.0f}" y2="{1:.1f}" stroke="{3}" stroke-width="3"/>)"
                       R"(<text x="{4:.0f}" y="{5:.1f}">device {6}: {7:.2f} GiB</text>)",
                       area.right() + 12, y, area.right() + 30, device_colour(d, devices), area.right() + 34, y + 4, d,
                       double(lines[std::size_t(d)].peak) / kGiB) + "\n";
  }
  return out + "</svg>\n";
}

}  // namespace pipesim
