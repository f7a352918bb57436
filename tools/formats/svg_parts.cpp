#include "svg_parts.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

namespace pipesim {
namespace {

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

double step_of(const std::vector<double>& ticks) { return ticks.size() > 1 ? ticks[1] - ticks[0] : 1; }

}  // namespace

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
    else if (c == '"')
      out += "&quot;";
    else
      out.append(text.substr(0, length));
    text.remove_prefix(std::max<std::size_t>(length, 1));
  }
  return out;
}

std::vector<double> round_ticks(double max, int target) {
  if (!(max > 0) || !std::isfinite(max)) return {0, 1};
  const double rough = max / std::max(target, 1);
  const double power = std::pow(10.0, std::floor(std::log10(rough)));
  double step = power * 10;
  for (double factor : {1.0, 2.0, 5.0})
    if (power * factor >= rough) {
      step = power * factor;
      break;
    }
  std::vector<double> ticks;
  for (int i = 0; i * step <= max * (1 + 1e-9); ++i) ticks.push_back(i * step);
  if (ticks.size() < 2) ticks.push_back(step);
  return ticks;
}

std::string tick_label(double value, double step) {
  const int decimals = step >= 1 ? 0 : int(std::ceil(-std::log10(step) - 1e-9));
  const std::string label = fmt::format("{:.{}f}", value, decimals);
  return label.find_first_not_of("-0.") == std::string::npos ? fmt::format("{:.{}f}", 0.0, decimals) : label;
}

std::string svg_open(double width, double height) {
  return fmt::format(
      R"(<svg width="{0:.0f}" height="{1:.0f}" viewBox="0 0 {0:.0f} {1:.0f}" font-family="sans-serif" font-size="11">)"
      "\n"
      R"(<rect width="100%" height="100%" fill="white"/>)"
      "\n",
      width, height);
}

std::string svg_document(std::string_view element) {
  constexpr std::string_view kOpen = "<svg ";
  if (!element.starts_with(kOpen)) return std::string(kSvgGenerator) + std::string(element);
  return std::string(kSvgGenerator) + R"(<svg xmlns="http://www.w3.org/2000/svg" )" +
         std::string(element.substr(kOpen.size()));
}

std::string bottom_axis(const PlotArea& area, double max, const std::string& unit, int ticks) {
  return bottom_axis(area, 0, max, unit, ticks);
}

std::string bottom_axis(const PlotArea& area, double from, double to, const std::string& unit, int ticks) {
  std::vector<double> values = round_ticks(to - from, ticks);
  const double step = step_of(values);
  if (from > 0) {  // the same step, at its multiples from `from` on
    const double first = std::ceil(from / step - 1e-9) * step;
    values.clear();
    for (int i = 0; first + i * step <= to * (1 + 1e-9); ++i) values.push_back(first + i * step);
  }
  std::string out = fmt::format(R"(<line x1="{:.1f}" y1="{:.1f}" x2="{:.1f}" y2="{:.1f}" stroke="#444"/>)", area.left,
                                area.bottom(), area.right(), area.bottom()) + "\n";
  for (double v : values) {
    if (v > to * (1 + 1e-9)) break;
    const double x = area.left + (to > from ? (v - from) / (to - from) : 0) * area.width;
    out += fmt::format(R"(<line x1="{0:.1f}" y1="{1:.1f}" x2="{0:.1f}" y2="{2:.1f}" stroke="#e4e4e4"/>)"
                       R"(<line x1="{0:.1f}" y1="{2:.1f}" x2="{0:.1f}" y2="{3:.1f}" stroke="#444"/>)"
                       R"(<text x="{0:.1f}" y="{4:.1f}" text-anchor="middle" fill="#333">{5}</text>)",
                       x, area.top, area.bottom(), area.bottom() + 4, area.bottom() + 15, tick_label(v, step)) + "\n";
  }
  if (!unit.empty())
    out += fmt::format(R"(<text x="{:.1f}" y="{:.1f}" text-anchor="end" fill="#333">{}</text>)", area.right(),
                       area.bottom() + 28, xml_escaped(unit)) + "\n";
  return out;
}

std::string left_axis(const PlotArea& area, double max, const std::string& unit, int ticks) {
  const std::vector<double> values = round_ticks(max, ticks);
  const double step = step_of(values);
  std::string out = fmt::format(R"(<line x1="{:.1f}" y1="{:.1f}" x2="{:.1f}" y2="{:.1f}" stroke="#444"/>)", area.left,
                                area.top, area.left, area.bottom()) + "\n";
  for (double v : values) {
    if (v > max * (1 + 1e-9)) break;
    const double y = area.bottom() - (max > 0 ? v / max : 0) * area.height;
    out += fmt::format(R"(<line x1="{0:.1f}" y1="{1:.1f}" x2="{2:.1f}" y2="{1:.1f}" stroke="#e4e4e4"/>)"
                       R"(<line x1="{3:.1f}" y1="{1:.1f}" x2="{0:.1f}" y2="{1:.1f}" stroke="#444"/>)"
                       R"(<text x="{4:.1f}" y="{5:.1f}" text-anchor="end" fill="#333">{6}</text>)",
                       area.left, y, area.right(), area.left - 4, area.left - 6, y + 4, tick_label(v, step)) + "\n";
  }
  out += fmt::format(R"(<text x="{:.1f}" y="{:.1f}" fill="#333">{}</text>)", area.left - 6, area.top - 8,
                     xml_escaped(unit)) + "\n";
  return out;
}

}  // namespace pipesim
