#include "svg_scatter.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

namespace pipesim {

std::string svg_scatter(const std::vector<ScatterPoint>& points, double cap_gib, const std::string& title) {
  constexpr double kWidth = 900, kHeight = 420;
  const PlotArea area{.left = 80, .top = 44, .width = kWidth - 80 - 30, .height = kHeight - 44 - 50};
  double max_x = std::max(cap_gib, 0.0), max_y = 0;
  for (const ScatterPoint& p : points) max_x = std::max(max_x, p.memory_gib), max_y = std::max(max_y, p.tokens_per_s);
  // Both axes from 0, so distances read as ratios; a margin keeps the outermost points inside.
  max_x = max_x > 0 ? max_x * 1.1 : 1, max_y = max_y > 0 ? max_y * 1.1 : 1;
  const auto px = [&](double gib) { return area.left + gib / max_x * area.width; };
  const auto py = [&](double tokens) { return area.bottom() - tokens / max_y * area.height; };
  std::string out = svg_open(kWidth, kHeight) +
                    fmt::format(R"(<text x="{}" y="18" font-size="13">{}</text>)", area.left, xml_escaped(title)) + "\n";
  out += left_axis(area, max_y, "tokens/s", 6);
  out += bottom_axis(area, max_x, "peak memory on the fullest device (GiB)", 8);
  if (cap_gib > 0)
    out += fmt::format(R"(<line x1="{0:.1f}" y1="{1:.1f}" x2="{0:.1f}" y2="{2:.1f}" stroke="#c00" stroke-dasharray="6 4"/>)"
                       R"(<text x="{3:.1f}" y="{4:.1f}" fill="#c00" text-anchor="end">memory cap {5:.2f} GiB</text>)",
                       px(cap_gib), area.top, area.bottom(), px(cap_gib) - 4, area.top + 12, cap_gib) + "\n";
  // The user's own point last, so that no other covers it.
  std::vector<const ScatterPoint*> order;
  for (const ScatterPoint& p : points) order.push_back(&p);
  std::stable_partition(order.begin(), order.end(), [](const ScatterPoint* p) { return !p->highlighted; });
  // A label that would overlap one already drawn is left out (the point's tooltip still names it):
  // the user's own first, then in the given order (tune's rank), so the best-placed are named.
  std::vector<std::pair<double, double>> labelled;
  const auto free_for_label = [&labelled](double x, double y) {
    for (const auto& [lx, ly] : labelled)
      if (std::abs(lx - x) < 16 && std::abs(ly - y) < 11) return false;
    return true;
  };
  std::vector<bool> named(order.size(), false);
  for (std::size_t pass = 0; pass < 2; ++pass)
    for (std::size_t i = 0; i < order.size(); ++i)
      if (order[i]->highlighted == (pass == 0)) {
        const double x = px(order[i]->memory_gib), y = py(order[i]->tokens_per_s);
        if (order[i]->highlighted || free_for_label(x, y)) named[i] = true, labelled.push_back({x, y});
      }
  for (std::size_t i = 0; i < order.size(); ++i) {
    const ScatterPoint* p = order[i];
    const double x = px(p->memory_gib), y = py(p->tokens_per_s);
    const std::string tip = fmt::format("{}: {:.0f} tokens/s, {:.2f} GiB", xml_escaped(p->detail), p->tokens_per_s,
                                        p->memory_gib);
    if (p->highlighted)
      out += fmt::format(R"(<rect x="{:.1f}" y="{:.1f}" width="10" height="10" fill="#e15759" stroke="#333"><title>{}</title></rect>)",
                         x - 5, y - 5, tip);
    else
      out += fmt::format(R"(<circle cx="{:.1f}" cy="{:.1f}" r="4.5" fill="#4e79a7" fill-opacity="0.8" stroke="#234"><title>{}</title></circle>)",
                         x, y, tip);
    if (named[i])
      out += fmt::format(R"(<text x="{:.1f}" y="{:.1f}" font-size="10" fill="#333">{}</text>)", x + 7, y - 5,
                         xml_escaped(p->label));
    out += "\n";
  }
  return out + "</svg>\n";
}

}  // namespace pipesim
