#pragma once
/// What pipesim's pictures share (the timeline, memory over time, the tune scatter): text that is safe
/// in XML and HTML, axes with round ticks, an opaque canvas, and the file form of an SVG.
#include <string>
#include <string_view>
#include <vector>

namespace pipesim {

/// How every SVG file pipesim writes begins; a file that begins so may be replaced by a new picture.
constexpr std::string_view kSvgGenerator = "<!-- timeline written by pipesim -->\n";

/// `text` (a user's path, an op's name) as XML or HTML text or attribute value: markup characters
/// escaped, and U+FFFD for what XML cannot hold (bytes that are not UTF-8, control characters), which
/// would make the file unreadable.
std::string xml_escaped(std::string_view text);

/// Tick values 0, step, 2·step, ... up to `max` (at least two), the step 1, 2 or 5 × 10^k chosen so
/// that there are about `target` of them: what a person reads off an axis without arithmetic.
std::vector<double> round_ticks(double max, int target);
/// A tick value with as many decimals as its step needs (250, 0.5, 0.05), never "-0".
std::string tick_label(double value, double step);

/// The opening tag of a picture `width` × `height` px that scales (viewBox) when a page is narrower,
/// and a white background: an SVG is transparent, and a dark page or viewer would hide its text.
std::string svg_open(double width, double height);
/// A picture as a file: the generator line, then the element with the SVG namespace, which a
/// standalone SVG needs and HTML's inline <svg> does not.
std::string svg_document(std::string_view element);

/// A plot's frame in px.
struct PlotArea {
  double left = 0, top = 0, width = 0, height = 0;
  double right() const { return left + width; }
  double bottom() const { return top + height; }
};
/// A horizontal axis under `area` from 0 to `max` in `unit`, with light grid lines up through `area`
/// (drawn first, so that what is plotted over them stays on top).
std::string bottom_axis(const PlotArea& area, double max, const std::string& unit, int ticks);
/// The same for a stretch [from, to] of a longer axis (one side of a break): ticks at the round values
/// inside it, and `unit` written only when it is not empty.
std::string bottom_axis(const PlotArea& area, double from, double to, const std::string& unit, int ticks);
/// The same, vertical, at the left of `area`, 0 at the bottom.
std::string left_axis(const PlotArea& area, double max, const std::string& unit, int ticks);

}  // namespace pipesim
