#pragma once
/// Throughput against memory: one point per configuration (a tune row), its peak memory across and its
/// tokens/s up, with the memory cap drawn as a line, so a reader sees what speed each GiB buys and how
/// close to the cap each choice runs.
#include <string>
#include <vector>

#include "svg_parts.h"

namespace pipesim {

struct ScatterPoint {
  double memory_gib = 0;    ///< the configuration's largest device peak
  double tokens_per_s = 0;
  std::string label;        ///< drawn next to the point ("1", "yours") unless it would overlap another label
  std::string detail;       ///< its tooltip: what the configuration is
  bool highlighted = false; ///< the user's own configuration: drawn apart from the rest
};

/// The <svg> element (svg_document makes it a file); `cap_gib` <= 0 draws no cap line.
std::string svg_scatter(const std::vector<ScatterPoint>& points, double cap_gib, const std::string& title);

}  // namespace pipesim
