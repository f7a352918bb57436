// The Chrome trace opens in Perfetto: valid JSON, one pid per device and one tid per stream, every
// op as an X event with its args, no overlap on a tid, a flow per transfer, a memory counter; it is
// written a piece at a time, to a file that is all there or not there.
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "chrome_trace.h"
#include "helpers.h"
#include "output_file.h"

using namespace pipesim;
using namespace pipesim::testing;
using json = nlohmann::json;

TEST_CASE("the Chrome trace holds every op, flows and memory, without overlap on a row") {
  const std::string schedule = GENERATE("1f1b", "interleaved-1f1b", "gpipe");
  CAPTURE(schedule);
  Config config = parse_or_fail(explicit_json(4, 8, 2, 1.5, 2.5, schedule));
  config.costs->p2p_ms = 0.25;
  const Simulated s = simulate_or_fail(config);
  const json trace = json::parse(chrome_trace(s.plan.graph, s.timeline, s.plan.static_bytes, "test"));
  REQUIRE(trace.at("otherData").at("generator") == "pipesim");

  std::map<std::pair<int, int>, std::vector<std::pair<double, double>>> rows;  // (pid, tid) -> (ts, dur)
  std::size_t ops = 0, flow_starts = 0, flow_ends = 0, thread_names = 0;
  std::map<int, Bytes> peak_bytes;
  for (const json& e : trace.at("traceEvents")) {
    const std::string ph = e.at("ph");
    if (ph == "X") {
      ++ops;
      CHECK(e.at("args").contains("stage"));
      CHECK(e.at("args").contains("chunk"));
      CHECK(e.at("args").contains("microbatch"));
      CHECK(e.at("args").contains("kind"));
      rows[{e.at("pid"), e.at("tid")}].emplace_back(e.at("ts"), e.at("dur"));
    } else if (ph == "s") {
      ++flow_starts;
    } else if (ph == "f") {
      ++flow_ends;
    } else if (ph == "M" && e.at("name") == "thread_name") {
      ++thread_names;
    } else if (ph == "C") {
      peak_bytes[e.at("pid")] = std::max(peak_bytes[e.at("pid")], e.at("args").at("bytes").get<Bytes>());
    }
  }
  CHECK(ops == s.plan.graph.size());
  std::size_t sends = 0;
  for (const Task& t : s.plan.graph.tasks()) sends += t.kind == OpKind::Send;
  CHECK(flow_starts == sends);
  CHECK(flow_ends == sends);
  std::size_t used_streams = 0;
  for (std::size_t stream = 0; stream < s.plan.graph.stream_count(); ++stream) used_streams += !s.plan.graph.stream(stream).empty();
  CHECK(thread_names == used_streams);
  for (auto& [row, events] : rows) {
    std::sort(events.begin(), events.end());
    for (std::size_t k = 1; k < events.size(); ++k) CHECK(events[k - 1].first + events[k - 1].second <= events[k].first + 1e-6);
  }
  for (const DeviceMetrics& d : s.metrics.devices)
    CHECK(peak_bytes[d.rank] == d.peak_memory_bytes);
}

TEST_CASE("the trace is written a piece at a time, the same bytes as whole, and a failed write stops it") {
  Config config = parse_or_fail(explicit_json(8, 256, 2, 1.5, 2.5, "interleaved-1f1b"));
  const Simulated s = simulate_or_fail(config);
  const std::string whole = chrome_trace(s.plan.graph, s.timeline, s.plan.static_bytes, "test");
  REQUIRE(whole.size() > std::size_t(3) << 20);  // several pieces
  std::string joined;
  std::size_t pieces = 0;
  REQUIRE(write_chrome_trace(s.plan.graph, s.timeline, s.plan.static_bytes, "test", {}, [&](std::string_view piece) {
            CHECK(piece.size() <= std::size_t(2) << 20);
            joined += piece, ++pieces;
            return Status::Ok();
          }).ok());
  CHECK(pieces >= 3);
  CHECK(joined == whole);

  pieces = 0;
  const auto full = [&](std::string_view) {
    ++pieces;
    return Status(Error{"disk full"});
  };
  const Status failed = write_chrome_trace(s.plan.graph, s.timeline, s.plan.static_bytes, "test", {}, full);
  REQUIRE(!failed.ok());
  CHECK(failed.error().message == "disk full");
  CHECK(pieces == 1);
}

TEST_CASE("a trace file is all there or not there: its own replaced, a user's file kept, no temporary left") {
  const Simulated s = simulate_or_fail(parse_or_fail(explicit_json(4, 8, 1, 1.0, 2.0)));
  const auto dir = std::filesystem::temp_directory_path() / ("pipesim-trace-test-" + std::to_string(getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::string trace = (dir / "trace.json").string();
  const auto contents = [](const std::filesystem::path& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  REQUIRE(write_chrome_trace_file(trace, s.plan.graph, s.timeline, s.plan.static_bytes, "first").ok());
  REQUIRE(write_chrome_trace_file(trace, s.plan.graph, s.timeline, s.plan.static_bytes, "second").ok());
  CHECK(contents(trace) == chrome_trace(s.plan.graph, s.timeline, s.plan.static_bytes, "second"));

  const std::string notes = (dir / "notes.json").string();
  std::ofstream(notes) << "{}";
  const Status refused = write_chrome_trace_file(notes, s.plan.graph, s.timeline, s.plan.static_bytes, "t");
  REQUIRE(!refused.ok());
  CHECK(refused.error().message == notes + ": exists and was not written by pipesim; refusing to overwrite it (choose "
                                           "another path or remove the file)");
  CHECK(contents(notes) == "{}");
  {
    Result<OutputFile> unfinished = OutputFile::create((dir / "unfinished.json").string(), kTraceGenerator);
    REQUIRE(unfinished.ok());
    REQUIRE(unfinished.value().write(std::string(kTraceGenerator) + "...").ok());
  }  // never committed
  std::vector<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) names.push_back(entry.path().filename().string());
  std::sort(names.begin(), names.end());
  CHECK(names == std::vector<std::string>{"notes.json", "trace.json"});
  std::filesystem::remove_all(dir);
}
