// The Chrome trace opens in Perfetto: valid JSON, one pid per device and one tid per stream, every
// op as an X event with its args, no overlap on a tid, a flow per transfer, a memory counter.
#include <map>
#include <nlohmann/json.hpp>

#include "chrome_trace.h"
#include "helpers.h"

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
