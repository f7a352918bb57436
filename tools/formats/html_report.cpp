#include "html_report.h"

#include <fmt/format.h>

#include "svg_parts.h"

namespace pipesim {
namespace {

constexpr std::string_view kStyle = R"css(
body { font-family: sans-serif; margin: 1.5em; color: #222; background: white; overflow-wrap: anywhere; }
h1 { font-size: 1.5em; } h2 { font-size: 1.2em; margin-top: 1.6em; }
table { border-collapse: collapse; font-size: 0.85em; }
th, td { border: 1px solid #ccc; padding: 0.2em 0.5em; white-space: nowrap; }
div.wide { overflow-x: auto; max-width: 100%; }
th, td { overflow-wrap: normal; }
td.number { text-align: right; font-variant-numeric: tabular-nums; }
th { background: #f0f0f0; cursor: pointer; user-select: none; white-space: nowrap; }
th[aria-sort=ascending]::after { content: " \25B2"; }
th[aria-sort=descending]::after { content: " \25BC"; }
tr:hover td { background: #f7f7ff; }
svg { max-width: 100%; height: auto; display: block; margin: 0.5em 0; }
details { margin: 0.4em 0; } summary { cursor: pointer; font-weight: bold; }
p.note { color: #555; font-size: 0.9em; }
)css";

/// Sorts a table's body by the clicked column: numbers as numbers (n/a and - last), text as text; a
/// second click reverses. Rows keep their link to the run they show.
constexpr std::string_view kSortScript = R"js(
document.querySelectorAll('table.sortable th').forEach(function (th) {
  th.addEventListener('click', function () {
    var table = th.closest('table'), body = table.tBodies[0], column = th.cellIndex;
    var ascending = th.getAttribute('aria-sort') !== 'ascending';
    table.querySelectorAll('th').forEach(function (h) { h.removeAttribute('aria-sort'); });
    th.setAttribute('aria-sort', ascending ? 'ascending' : 'descending');
    var key = function (row) {
      var text = row.cells[column].textContent.trim(), number = Number(text);
      return text !== '' && !isNaN(number) ? [0, number] : [text === 'n/a' || text === '-' ? 2 : 1, text];
    };
    var rows = Array.prototype.slice.call(body.rows);
    rows.sort(function (a, b) {
      var x = key(a), y = key(b);
      if (x[0] !== y[0]) return x[0] - y[0];
      var order = x[1] < y[1] ? -1 : x[1] > y[1] ? 1 : 0;
      return ascending ? order : -order;
    });
    rows.forEach(function (row) { body.appendChild(row); });
  });
});
)js";

/// A table's rows; `links[i]`, when given, makes row i's first cell a link to that anchor.
std::string table(const HtmlTable& t, const std::vector<std::string>& links) {
  // One line per row, however long tune's `changes` are: a wide table scrolls in its own box.
  std::string out = "<div class=\"wide\">\n<table class=\"sortable\">\n<thead><tr>";
  for (const Column& c : t.columns) out += "<th>" + xml_escaped(c.name) + "</th>";
  out += "</tr></thead>\n<tbody>\n";
  for (std::size_t i = 0; i < t.rows.size(); ++i) {
    out += "<tr>";
    for (std::size_t k = 0; k < t.rows[i].size(); ++k) {
      const bool left = k < t.columns.size() && t.columns[k].left;
      const std::string cell = xml_escaped(t.rows[i][k]);
      out += left ? "<td>" : "<td class=\"number\">";
      out += k == 0 && i < links.size() ? fmt::format("<a href=\"#{}\">{}</a>", links[i], cell) : cell;
      out += "</td>";
    }
    out += "</tr>\n";
  }
  out += "</tbody>\n</table>\n</div>\n";
  if (!t.reference.empty())
    out += "<p class=\"note\">speedup = tokens/s ÷ those of " + xml_escaped(t.reference) +
           "; mem_vs_first = peak memory ÷ its peak memory. Click a column's header to sort by it.</p>\n";
  return out;
}

std::string runs(const HtmlReport& report) {
  std::string out = "<h2>Timelines and memory</h2>\n<p class=\"note\">Per device: compute ops on the thick row, "
                    "collectives on the thin row under it; hover over a box for the op and its times. Then each "
                    "device's memory (static + live activations) over the iteration, against the capacity.</p>\n";
  for (std::size_t i = 0; i < report.runs.size(); ++i) {
    const HtmlRun& run = report.runs[i];
    out += fmt::format("<details id=\"run-{}\"{}>\n<summary>{}. {}</summary>\n", i + 1, i == 0 ? " open" : "", i + 1,
                       xml_escaped(run.heading));
    out += run.timeline_svg + run.memory_svg + "</details>\n";
  }
  return out;
}

std::string tunes(const HtmlReport& report) {
  if (report.tunes.empty()) return "";
  std::string out = "<h2>Tune</h2>\n";
  for (const HtmlTune& t : report.tunes) {
    out += "<h3>" + xml_escaped(t.config) + "</h3>\n<p class=\"note\">" + xml_escaped(t.summary) + "</p>\n";
    out += table(t.table, {}) + t.scatter_svg;
  }
  return out;
}

}  // namespace

std::string html_report(const HtmlReport& report) {
  std::string configs;
  for (const std::string& c : report.configs) configs += (configs.empty() ? "" : ", ") + xml_escaped(c);
  std::vector<std::string> links;
  for (std::size_t i = 0; i < report.runs.size(); ++i) links.push_back(fmt::format("run-{}", i + 1));
  std::string out(kHtmlReportMarker);
  out += "<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>pipesim report: " + configs + "</title>\n";
  out += "<style>" + std::string(kStyle) + "</style>\n</head>\n<body>\n";
  out += "<h1>pipesim report</h1>\n<p>" + configs + "</p>\n";
  // Tune's answer first where it ran: what to change is what the page is read for, and the
  // comparison's runs, each with its pictures, can be many.
  out += tunes(report) + "<h2>Comparison</h2>\n" + table(report.comparison, links) + runs(report);
  out += "<script>" + std::string(kSortScript) + "</script>\n</body>\n</html>\n";
  return out;
}

}  // namespace pipesim
