// End-to-end: the pictures (`simulate --svg`, `--memory-svg`) read at real scale, and `pipesim report`
// writes one self-contained HTML page with compare's rows, each run's pictures and, with --tune, tune's.
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "cli_helpers.h"

using json = nlohmann::json;
using namespace pipesim::testing::cli;

namespace {

std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

/// Every match of `pattern`'s group 1..n in `text`.
std::vector<std::smatch> matches(const std::string& text, const std::string& pattern) {
  const std::regex re(pattern);
  return {std::sregex_iterator(text.begin(), text.end(), re), std::sregex_iterator()};
}

/// `simulate ARGS --svg FILE` (and --memory-svg), returning the picture; the run's JSON into `run`.
std::string picture(const std::string& args, const std::string& option, json* run = nullptr) {
  const auto file = scratch_dir() / "picture.svg";
  std::filesystem::remove(file);
  const Output out = ::run("simulate " + args + " --format json " + option + " " + file.string());
  REQUIRE(out.exit_code == 0);
  if (run) *run = json::parse(out.text);
  return read_file(file);
}

std::string fixed(double value, int decimals) {
  char text[64];
  std::snprintf(text, sizeof text, "%.*f", decimals, value);
  return text;
}

constexpr double kGiB = 1024.0 * 1024 * 1024;

/// An op's box: x, width, height, fill, and its tooltip.
struct Box {
  double x, width, height;
  std::string fill, title;
};
std::vector<Box> op_boxes(const std::string& svg) {
  std::vector<Box> boxes;
  for (const std::smatch& m : matches(svg, R"re(<rect x="([\d.]+)" y="[\d.]+" width="([\d.]+)" height="([\d.]+)" fill="(#[0-9a-f]{6})"[^>]*><title>([^<]*)</title>)re"))
    boxes.push_back({std::stod(m[1]), std::stod(m[2]), std::stod(m[3]), m[4], m[5]});
  return boxes;
}

/// The legend: its swatches' colours (one per entry, or one per chunk) and the words beside them.
std::map<std::string, std::string> legend(const std::string& svg) {
  std::map<std::string, std::string> entries;
  const std::string swatch = R"re(<rect x="\d+" y="\d+" width="\d+" height="11" fill="#[0-9a-f]{6}"/>)re";
  for (const std::smatch& m : matches(svg, "((?:" + swatch + ")+)<text[^>]*>([^<]*)</text>")) {
    const std::string swatches = m[1];
    for (const std::smatch& fill : matches(swatches, R"re(fill="(#[0-9a-f]{6})")re")) entries[fill[1]] = m[2];
  }
  return entries;
}

/// The legend's words, entry by entry.
std::set<std::string> legend_words(const std::string& svg) {
  std::set<std::string> words;
  for (const auto& [fill, text] : legend(svg)) words.insert(text);
  return words;
}

/// The cells of a page's table body rows (links and escapes undone), row by row.
std::vector<std::vector<std::string>> table_rows(const std::string& html) {
  std::vector<std::vector<std::string>> rows;
  for (const std::smatch& row : matches(html, R"re(<tr>(<td.*?)</tr>)re")) {
    std::vector<std::string> cells;
    const std::string text = row[1];
    for (const std::smatch& cell : matches(text, R"re(<td[^>]*>(?:<a href="#run-\d+">)?(.*?)(?:</a>)?</td>)re"))
      cells.push_back(std::regex_replace(std::string(cell[1]), std::regex("&amp;"), "&"));
    rows.push_back(cells);
  }
  return rows;
}

/// CSV rows as RFC 4180 reads them (a quoted cell may hold commas and doubled quotes), header dropped.
std::vector<std::vector<std::string>> csv_rows(const std::string& csv) {
  std::vector<std::vector<std::string>> rows;
  std::istringstream lines(csv);
  std::string line;
  std::getline(lines, line);
  while (std::getline(lines, line)) {
    std::vector<std::string> cells{""};
    bool quoted = false;
    for (std::size_t i = 0; i < line.size(); ++i) {
      const char c = line[i];
      if (quoted && c == '"' && i + 1 < line.size() && line[i + 1] == '"')
        cells.back() += '"', ++i;
      else if (c == '"')
        quoted = !quoted;
      else if (c == ',' && !quoted)
        cells.emplace_back();
      else
        cells.back() += c;
    }
    rows.push_back(cells);
  }
  return rows;
}

/// `args` writing to `path`, a file of the user's holding `content`: refused with exit 1, and the file kept.
void check_refuses_user_file(const std::string& args, const std::string& path, const std::string& content) {
  std::ofstream(path) << content;
  const Output refused = run_stderr(args);
  CHECK(refused.exit_code == 1);
  CHECK(refused.text == "pipesim: error: " + path +
                            ": exists and was not written by pipesim; refusing to overwrite it (choose another path "
                            "or remove the file)\n");
  CHECK(read_file(path) == content);
}

}  // namespace

TEST_CASE("the timeline has a time axis in ms that ends at the iteration time, on a white background") {
  json run;
  const std::string svg = picture(config("default.json"), "--svg", &run);
  CHECK(svg.rfind("<!-- timeline written by pipesim -->\n<svg xmlns=\"http://www.w3.org/2000/svg\" ", 0) == 0);
  CHECK(svg.find(R"(<rect width="100%" height="100%" fill="white"/>)") != std::string::npos);
  const std::string iteration = fixed(run["iteration_time_s"].get<double>() * 1e3, 2);
  CHECK(svg.find("— iteration " + iteration + " ms</text>") != std::string::npos);
  CHECK(svg.find(">iteration " + iteration + " ms</text>") != std::string::npos);  // the line where it ends
  CHECK(svg.find(">time (ms)</text>") != std::string::npos);
  // Ticks at round steps (1, 2 or 5 × 10^k ms) from 0, about ten, none past the iteration.
  std::vector<double> ticks;
  for (const std::smatch& m : matches(svg, R"re(text-anchor="middle" fill="#333">([\d.]+)</text>)re"))
    ticks.push_back(std::stod(m[1]));
  REQUIRE(ticks.size() >= 5);
  CHECK(ticks.size() <= 21);
  CHECK(ticks[0] == 0);
  const double step = ticks[1];
  const double decade = std::pow(10, std::floor(std::log10(step)));
  CHECK((step / decade == Approx(1) || step / decade == Approx(2) || step / decade == Approx(5)));
  for (std::size_t i = 1; i < ticks.size(); ++i) CHECK(ticks[i] - ticks[i - 1] == Approx(step));
  CHECK(ticks.back() <= std::stod(iteration));
}

TEST_CASE("the timeline labels a box with its microbatch only where the label fits") {
  // At 8 devices × 32 microbatches most boxes are a few px wide: those carry no label. The example
  // with 4 devices × 8 microbatches has room for most.
  const std::string example = config("examples/vocab-passes.json");
  for (const std::string& args : {config("default.json"), example}) {
    const std::string svg = picture(args, "--svg");
    std::size_t labels = 0;
    const std::string box = R"re(<rect x="[\d.]+" y="[\d.]+" width="([\d.]+)"[^>]*><title>[^<]*</title></rect>)re";
    for (const std::smatch& m : matches(svg, box + R"re(<text[^>]*>([A-Z]*)(\d+)</text>)re")) {
      const std::string label = std::string(m[2]) + std::string(m[3]);
      CHECK(std::stod(m[1]) >= label.size() * 6.2 + 3 - 0.05);  // widths are written to 0.1 px
      ++labels;
    }
    INFO(args);
    CHECK(op_boxes(svg).size() > labels);  // some boxes are too narrow
    CHECK(labels > 0);
  }
  // Where the box is wide enough, the label is the op and its microbatch: "F0".
  CHECK(picture(example, "--svg").find(">F0</text>") != std::string::npos);
}

TEST_CASE("collectives are drawn at least 2 px wide, however short") {
  const std::string svg = picture(config("default.json") + " --vocab vocab-1", "--svg");
  std::size_t collectives = 0;
  for (const Box& b : op_boxes(svg))
    if (b.height < 10) {  // the thin rows
      CHECK(b.width >= 2);
      ++collectives;
    }
  CHECK(collectives > 0);
}

TEST_CASE("the legend shows every colour drawn, each explained in words") {
  const std::string svg = picture(config("default.json") + " --schedule zb-v --vocab vocab-1 " +
                                      "--set training.recompute_granularity=full --set parallel.dp=2",
                                  "--svg");
  const std::map<std::string, std::string> key = legend(svg);
  std::set<std::string> drawn;
  for (const Box& b : op_boxes(svg)) drawn.insert(b.fill);
  for (const std::string& fill : drawn) {
    INFO(fill);
    CHECK(key.count(fill) == 1);
  }
  const std::set<std::string> words = legend_words(svg);
  for (const char* expected : {"F forward", "B backward, input gradient only (W is split off)",
                               "W weight gradient", "R recomputed forward, before its B",
                               "S vocabulary output pass: logits, max, sum of exp",
                               "T vocabulary output pass: softmax gradient, dW",
                               "IF vocabulary input pass: embedding lookup",
                               "IB vocabulary input pass: embedding gradient", "optimizer step",
                               "communication: collectives (thin rows), at least 2 px wide"}) {
    INFO(expected);
    CHECK(words.count(expected) == 1);
  }
  // zb-v's two chunks per device: a swatch per chunk, and what the shades mean.
  CHECK(svg.find(">shades, left to right: chunks 0 to 1 of a device (its virtual stages)</text>") != std::string::npos);
}

TEST_CASE("the legend names only the kinds the graph has, B as the whole backward unless W is split off") {
  // Plain 1F1B without vocabulary passes or recomputation: F, B (the full backward), the optimizer.
  const std::set<std::string> plain = legend_words(picture(config("tiny.json") + " --schedule 1f1b --vocab baseline", "--svg"));
  CHECK(plain.count("F forward") == 1);
  CHECK(plain.count("B backward: input and weight gradients") == 1);
  for (const std::string& words : plain) {
    INFO(words);
    CHECK(words.rfind("W ", 0) == std::string::npos);
    CHECK(words.rfind("R ", 0) == std::string::npos);
    CHECK(words.find("vocabulary") == std::string::npos);
    CHECK(words.find("input gradient only") == std::string::npos);
    CHECK(words.find("shades") == std::string::npos);  // one chunk per device
  }
  // Zero bubble splits W off: B is the input gradient alone, and W has its entry.
  const std::set<std::string> split = legend_words(picture(config("tiny.json") + " --schedule zb-h1 --vocab baseline", "--svg"));
  CHECK(split.count("B backward, input gradient only (W is split off)") == 1);
  CHECK(split.count("W weight gradient") == 1);
  CHECK(split.count("B backward: input and weight gradients") == 0);
  // R only with recomputation, the vocabulary passes only where the vocabulary is split.
  const std::set<std::string> full = legend_words(picture(config("tiny.json") + " --schedule 1f1b --vocab vocab-1 " +
                                                              "--set training.recompute_granularity=full", "--svg"));
  CHECK(full.count("R recomputed forward, before its B") == 1);
  CHECK(full.count("S vocabulary output pass: logits, max, sum of exp") == 1);
  CHECK(full.count("IF vocabulary input pass: embedding lookup") == 1);
}

TEST_CASE("chunks on one device are shades of their kind's colour, a swatch each in the legend") {
  // Loop placement: with 8 devices, stage s is chunk s / 8 of device s % 8.
  const std::string svg = picture(config("default.json") + " --schedule interleaved-1f1b --set parallel.chunks=4 " +
                                      "--vocab baseline", "--svg");
  std::map<int, std::set<std::string>> forward_fills;  // by chunk
  for (const Box& b : op_boxes(svg)) {
    std::smatch stage;
    if (std::regex_search(b.title, stage, std::regex(R"re(^F\(d\d+,s(\d+),)re")))
      forward_fills[std::stoi(stage[1]) / 8].insert(b.fill);
  }
  REQUIRE(forward_fills.size() == 4);
  std::set<std::string> shades;
  for (const auto& [chunk, fills] : forward_fills) {
    INFO(chunk);
    CHECK(fills.size() == 1);  // one shade per chunk
    shades.insert(*fills.begin());
  }
  CHECK(shades.size() == 4);  // a different one for each
  CHECK(forward_fills[0].count("#4e79a7") == 1);  // chunk 0 has the kind's own colour
  const std::map<std::string, std::string> key = legend(svg);
  for (const std::string& shade : shades) {
    INFO(shade);
    CHECK(key.count(shade) == 1);
    CHECK(key.at(shade) == "F forward");
  }
  CHECK(svg.find(">shades, left to right: chunks 0 to 3 of a device (its virtual stages)</text>") != std::string::npos);
  // V placement (zb-v): 2 chunks, 2 shades of F.
  std::set<std::string> v_fills;
  for (const Box& b : op_boxes(picture(config("tiny.json") + " --schedule zb-v --vocab baseline", "--svg")))
    if (b.title.rfind("F(", 0) == 0) v_fills.insert(b.fill);
  CHECK(v_fills.size() == 2);
}

TEST_CASE("a long run keeps its head and tail at a readable scale, with the elided middle marked") {
  json run;
  const std::string svg = picture(std::string(std::getenv("PIPESIM_SOURCE")) + "/tools/speed-p64-m1024.json", "--svg", &run);
  const double iteration = run["iteration_time_s"].get<double>() * 1e3;
  // The break: a band over the rows, and above them the elided time, from where to where.
  const std::vector<std::smatch> band = matches(svg, R"re(<rect class="elided" x="([\d.]+)" y="[\d.]+" width="([\d.]+)")re");
  REQUIRE(band.size() == 1);
  const double band_left = std::stod(band[0][1]), band_right = band_left + std::stod(band[0][2]);
  const std::vector<std::smatch> label = matches(svg, R"re(>⋯ ([\d.]+) ms elided \(([\d.]+)–([\d.]+) ms\) ⋯</text>)re");
  REQUIRE(label.size() == 1);
  const double elided = std::stod(label[0][1]), head_end = std::stod(label[0][2]), tail_start = std::stod(label[0][3]);
  CHECK(elided == Approx(tail_start - head_end).margin(0.01));
  CHECK(elided > iteration / 2);  // most of 1024 microbatches' steady state
  CHECK(head_end > 0);
  CHECK(tail_start < iteration);
  // Every box lies beside the band, and shows a part of its op outside the elided time.
  std::size_t boxes = 0;
  for (const Box& b : op_boxes(svg)) {
    std::smatch times;
    REQUIRE(std::regex_search(b.title, times, std::regex(R"re(([\d.]+)–([\d.]+) ms$)re")));
    INFO(b.title);
    CHECK((b.x + b.width <= band_left + 0.15 || b.x >= band_right - 0.15));
    CHECK((std::stod(times[1]) <= head_end || std::stod(times[2]) >= tail_start));
    ++boxes;
  }
  // Of the 131072 transformer ops, a few thousand are drawn: each device's fill and drain.
  CHECK(boxes > 64 * 20);
  CHECK(boxes < 20000);
  for (int d : {0, 63}) CHECK(svg.find("<title>F(d" + std::to_string(d) + ",") != std::string::npos);
  // Both sides have their ticks; the iteration's end is still marked.
  CHECK(svg.find(">iteration " + fixed(iteration, 2) + " ms</text>") != std::string::npos);
  CHECK(svg.size() < 2'000'000);  // 16.8 MB drawn whole
  // A run of 8 devices × 32 microbatches is drawn whole.
  CHECK(picture(config("default.json"), "--svg").find("elided") == std::string::npos);
}

TEST_CASE("--memory-svg plots one line per device on a GiB axis, with the capacity") {
  json run;
  const std::string svg = picture(config("default.json") + " --vocab vocab-1", "--memory-svg", &run);
  CHECK(svg.rfind("<!-- timeline written by pipesim -->\n<svg ", 0) == 0);
  CHECK(svg.find(R"(<rect width="100%" height="100%" fill="white"/>)") != std::string::npos);
  const std::size_t devices = run["devices"].size();
  CHECK(matches(svg, "<polyline ").size() == devices);
  CHECK(svg.find(">GiB</text>") != std::string::npos);
  CHECK(svg.find(">time (ms)</text>") != std::string::npos);
  const std::string capacity = fixed(run["memory_capacity_bytes"].get<double>() / kGiB, 2);
  CHECK(svg.find(">capacity " + capacity + " GiB (memory_gib less reserved_gib)</text>") != std::string::npos);
  // Each device's line peaks where simulate says it does: the legend and the line's tooltip say so.
  for (const json& d : run["devices"]) {
    const std::string peak = fixed(d["peak_memory_bytes"].get<double>() / kGiB, 2);
    const std::string rank = std::to_string(d["rank"].get<int>());
    CHECK(svg.find(">device " + rank + ": " + peak + " GiB</text>") != std::string::npos);
    // The time to the microsecond it is printed with (a time ending in 0.5 µs may round either way).
    const auto title = matches(svg, "<title>device " + rank + ": peak " + peak + " GiB at ([0-9.]+) ms</title>");
    REQUIRE(title.size() == 1);
    CHECK(std::stod(title[0][1]) == Approx(d["peak_time_s"].get<double>() * 1e3).margin(0.0006));
  }
  // The highest point drawn is the largest peak: every half pixel keeps its highest level.
  double lowest_y = 1e9;
  for (const std::smatch& m : matches(svg, R"re(points="([^"]*)")re")) {
    std::istringstream points(m[1]);
    for (std::string point; points >> point;) lowest_y = std::min(lowest_y, std::stod(point.substr(point.find(',') + 1)));
  }
  const std::vector<std::smatch> axis = matches(svg, R"re(<text x="[\d.]+" y="([\d.]+)" text-anchor="end" fill="#333">([\d.]+)</text>)re");
  REQUIRE(axis.size() >= 2);  // the GiB ticks: the px per GiB from the first two
  const double y0 = std::stod(axis[0][1]) - 4, y1 = std::stod(axis[1][1]) - 4;
  const double gib_per_px = (std::stod(axis[1][2]) - std::stod(axis[0][2])) / (y0 - y1);
  CHECK((y0 - lowest_y) * gib_per_px == Approx(run["peak_memory_bytes"].get<double>() / kGiB).epsilon(0.01));
}

TEST_CASE("--svg and --memory-svg are two files, and replace only pipesim's own") {
  const auto dir = scratch_dir();
  const std::string same = (dir / "same.svg").string(), user = (dir / "user.svg").string();
  const Output twice = run_stderr("simulate " + config("tiny.json") + " --svg " + same + " --memory-svg " + same);
  CHECK(twice.exit_code == 1);
  CHECK(twice.text == "pipesim: error: --memory-svg " + same + ": the same file as --svg " + same +
                          "; give each output a file of its own\n");
  check_refuses_user_file("simulate " + config("tiny.json") + " --memory-svg " + user, user, "<svg/>");
  std::filesystem::remove_all(dir);
}

TEST_CASE("report writes one page: compare's rows, sortable, and each run's timeline and memory") {
  const auto dir = scratch_dir();
  const std::string page = (dir / "report.html").string();
  std::filesystem::remove(page);
  const std::string selection = config("tiny.json") + " " + config("default.json") +
                                " --schedules 1f1b,zb-v --vocab baseline,vocab-1";
  const Output out = run_stderr("report " + selection + " -o " + page);
  REQUIRE(out.exit_code == 0);
  const std::string html = read_file(page);
  CHECK(out.text == "pipesim: wrote " + page + " (8 run(s), " + std::to_string((html.size() + 1023) / 1024) +
                        " KiB; open it in a browser, it needs no network)\n");
  CHECK(html.rfind("<!DOCTYPE html>\n<!-- report written by pipesim -->\n<html lang=\"en\">", 0) == 0);
  // The table is compare's, cell for cell, in compare's order.
  const Output csv = run("compare " + selection + " --format csv");
  REQUIRE(csv.exit_code == 0);
  CHECK(table_rows(html) == csv_rows(csv.text));
  CHECK(html.find("<th>config</th><th>schedule</th><th>vocab</th><th>iter_ms</th>") != std::string::npos);
  CHECK(html.find("speedup = tokens/s ÷ those of row 1 (" + config("tiny.json") + ", 1f1b, baseline)") !=
        std::string::npos);
  // Sortable: the table's class and the script that sorts it on a header's click.
  CHECK(html.find("<table class=\"sortable\">") != std::string::npos);
  CHECK(html.find("th.addEventListener('click'") != std::string::npos);
  // Each row links to its run, which has a timeline and a memory plot, inline.
  for (int i = 1; i <= 8; ++i) {
    CHECK(html.find("<a href=\"#run-" + std::to_string(i) + "\">") != std::string::npos);
    CHECK(html.find("<details id=\"run-" + std::to_string(i) + "\"") != std::string::npos);
  }
  CHECK(matches(html, "<svg ").size() == 16);
  CHECK(matches(html, " — iteration [\\d.]+ ms</text>").size() == 8);
  CHECK(matches(html, "memory per device \\(static \\+ live activations\\)</text>").size() == 8);
  // Self-contained: nothing to fetch, no SVG namespace URL either (inline SVG in HTML needs none).
  CHECK(html.find("http://") == std::string::npos);
  CHECK(html.find("https://") == std::string::npos);
  CHECK(html.find(" src=") == std::string::npos);
  CHECK(html.find("<link") == std::string::npos);
  std::filesystem::remove_all(dir);
}

TEST_CASE("report --tune adds tune's rows and a throughput-vs-memory scatter with the memory cap") {
  const auto dir = scratch_dir();
  const std::string page = (dir / "tuned.html").string();
  std::filesystem::remove(page);
  const std::string tiny = config("tiny.json");
  const Output out = run_stderr("report " + tiny + " --schedules 1f1b --vocab baseline --tune --top 3 --fix pp=4 -o " + page);
  REQUIRE(out.exit_code == 0);
  CHECK_THAT(out.text, Catch::Contains("pipesim: wrote " + page + " (1 run(s), tune of 1 config(s), "));
  const std::string html = read_file(page);
  // Tune's rows first (yours and ranks 1-3, as `tune --format csv` prints them), then the comparison's one.
  const Output tuned = run("tune " + tiny + " --top 3 --fix pp=4 --format csv");
  REQUIRE(tuned.exit_code == 0);
  const std::vector<std::vector<std::string>> rows = table_rows(html), expected = csv_rows(tuned.text);
  REQUIRE(rows.size() == 1 + expected.size());
  CHECK(std::vector(rows.begin(), rows.end() - 1) == expected);
  CHECK(html.find("<h2>Tune</h2>") < html.find("<h2>Comparison</h2>"));
  CHECK(html.find("<h2>Comparison</h2>") < html.find("<h2>Timelines and memory</h2>"));
  CHECK(expected.size() == 4);
  CHECK(html.find("<th>rank</th>") != std::string::npos);
  // One point per row (circles) and yours (a square), under the cap line.
  CHECK(matches(html, "<circle ").size() == 3);
  CHECK(matches(html, "<title>yours[^<]*tokens/s").size() == 1);
  const json run = json::parse(::run("simulate " + tiny + " --format json").text);
  CHECK(html.find(">memory cap " + fixed(run["memory_capacity_bytes"].get<double>() / kGiB, 2) + " GiB</text>") !=
        std::string::npos);
  CHECK(html.find(">peak memory on the fullest device (GiB)</text>") != std::string::npos);
  CHECK(html.find(">tokens/s</text>") != std::string::npos);
  std::filesystem::remove_all(dir);
}

TEST_CASE("report refuses a file it did not write, bad names and tune options without --tune") {
  const auto dir = scratch_dir() / "refusals";
  std::filesystem::create_directories(dir);
  const std::string tiny = config("tiny.json"), mine = (dir / "notes.html").string(), page = (dir / "r.html").string();
  check_refuses_user_file("report " + tiny + " -o " + mine, mine, "<p>my notes</p>");
  // Its own report is replaced.
  std::filesystem::remove(page);
  REQUIRE(run("report " + tiny + " --schedules 1f1b --vocab baseline -o " + page).exit_code == 0);
  REQUIRE(run("report " + tiny + " --schedules gpipe --vocab baseline -o " + page).exit_code == 0);
  CHECK(read_file(page).find(": gpipe / baseline</summary>") != std::string::npos);

  const Output misspelt = run_stderr("report " + tiny + " --schedules 1f1x -o " + (dir / "x.html").string());
  CHECK(misspelt.exit_code == 1);
  CHECK(misspelt.text ==
        "pipesim: error: --schedules: unknown name '1f1x'; did you mean '1f1b'? Known names: gpipe, 1f1b, "
        "interleaved-1f1b, zb-h1, zb-h2, zb-1p, zb-2p, zb-auto, v-half, v-min, zb-v, dualpipe-v (`pipesim list` describes them)\n");
  CHECK(!std::filesystem::exists(dir / "x.html"));
  // A config that does not load fails as compare fails on it, and nothing is written.
  const std::string missing = (dir / "missing.json").string();
  const Output unloaded = run_stderr("report " + missing + " -o " + (dir / "x.html").string());
  CHECK(unloaded.exit_code == 1);
  CHECK(unloaded.text == run_stderr("compare " + missing).text);
  CHECK(unloaded.text.find(missing) != std::string::npos);
  CHECK(!std::filesystem::exists(dir / "x.html"));
  const Output top = run_stderr("report " + tiny + " --top 3 -o " + (dir / "x.html").string());
  CHECK(top.exit_code == 1);
  CHECK(top.text == "pipesim: error: --top requires --tune (see pipesim --help)\n");
  const Output no_output = run_stderr("report " + tiny);
  CHECK(no_output.exit_code == 1);
  CHECK(no_output.text == "pipesim: error: --output is required (see pipesim --help)\n");
  // No temporary is left behind.
  std::vector<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) names.push_back(entry.path().filename().string());
  std::sort(names.begin(), names.end());
  CHECK(names == std::vector<std::string>{"notes.html", "r.html"});
  std::filesystem::remove_all(dir);
}

TEST_CASE("report escapes what it quotes: a config's path is text on the page, never markup") {
  const auto dir = scratch_dir() / "escapes";
  std::filesystem::create_directories(dir);
  // <, & and " are markup in HTML; \xff is not UTF-8, which the page holds as U+FFFD.
  const std::string config = (dir / "a<b&c\"\xff.json").string(), page = (dir / "page.html").string();
  std::filesystem::copy_file(::config("tiny.json"), config);
  REQUIRE(run("report '" + config + "' --schedules 1f1b --vocab baseline -o " + page).exit_code == 0);
  const std::string html = read_file(page);
  const std::string escaped = "a&lt;b&amp;c&quot;\xEF\xBF\xBD.json";
  CHECK(html.find("<title>pipesim report: " + (dir / escaped).string() + "</title>") != std::string::npos);
  CHECK(html.find(escaped + ": 1f1b / baseline</summary>") != std::string::npos);
  CHECK(html.find(escaped + ": 1f1b / baseline — iteration ") != std::string::npos);  // in the pictures too
  CHECK(html.find("a<b") == std::string::npos);
  CHECK(html.find('\xff') == std::string::npos);
  std::filesystem::remove_all(dir);
}
