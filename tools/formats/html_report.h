#pragma once
/// `pipesim report`'s page: one self-contained HTML file (inline CSS, a few lines of inline script,
/// inline SVG; nothing fetched over a network, so it opens offline and can be mailed): compare's
/// table, sortable by a click on a column's header, each run's timeline and memory over time, and
/// tune's rows with their throughput-vs-memory scatter where tune ran.
#include <string>
#include <string_view>
#include <vector>

#include "report.h"

namespace pipesim {

/// How every report pipesim writes begins; a file that begins so may be replaced by a new report.
constexpr std::string_view kHtmlReportMarker = "<!DOCTYPE html>\n<!-- report written by pipesim -->\n";

/// A table as the page shows it: compare's columns and cells, or tune's.
struct HtmlTable {
  std::vector<Column> columns;
  std::vector<std::vector<std::string>> rows;
  std::string reference;  ///< what speedup and mem_vs_first are measured against, e.g. "row 1 (c.json, 1f1b, baseline)"
};

/// One compared run: its pictures as <svg> elements (svg_timeline, svg_memory).
struct HtmlRun {
  std::string heading;  ///< "configs/default.json: 1f1b / vocab-1"
  std::string timeline_svg;
  std::string memory_svg;
};

/// Tune's answer for one config.
struct HtmlTune {
  std::string config;
  HtmlTable table;
  std::string scatter_svg;
  std::string summary;  ///< what the search did: configurations evaluated, simulated, pruned
};

struct HtmlReport {
  std::vector<std::string> configs;
  HtmlTable comparison;  ///< one row per run, in `runs`' order
  std::vector<HtmlRun> runs;
  std::vector<HtmlTune> tunes;  ///< empty: tune did not run
};

/// The page, beginning with kHtmlReportMarker. Every text from outside (paths, names, cells) is escaped.
std::string html_report(const HtmlReport& report);

}  // namespace pipesim
