#include "chrome_trace.h"

#include <fmt/format.h>

#include <algorithm>
#include <iterator>
#include <nlohmann/json.hpp>

#include "json_text.h"
#include "metrics.h"
#include "output_file.h"

namespace pipesim {
namespace {

double us(TimeNs ns) { return double(ns) / 1e3; }

std::string op_name(const TaskGraph& graph, const Task& t) {
  switch (t.kind) {
    case OpKind::Send:
    case OpKind::Recv:
      return fmt::format("{} {} m{}", op_kind_name(t.kind), t.payload == Payload::Activation ? "act" : "grad",
                         t.microbatch);
    case OpKind::DpAllReduce:  // named for what it does: an all-reduce, or ZeRO's halves of one
      switch (graph.groups()[std::size_t(t.group)].data) {
        case CollectiveData::GradientShards: return "DP_REDUCE_SCATTER";
        case CollectiveData::Parameters: return "DP_ALLGATHER";
        default: return std::string(op_kind_name(t.kind));
      }
    case OpKind::Optimizer: return std::string(op_kind_name(t.kind));
    case OpKind::AllToAll:
      return fmt::format("{} {} s{} m{}", op_kind_name(t.kind), t.payload == Payload::Activation ? "fwd" : "bwd",
                         t.stage, t.microbatch);
    case OpKind::S:
    case OpKind::T:
    case OpKind::IF:
    case OpKind::IB:
    case OpKind::AllReduce:
    case OpKind::Broadcast:
    case OpKind::Reduce: return fmt::format("{} m{}", op_kind_name(t.kind), t.microbatch);
    default: return fmt::format("{} s{} m{}", op_kind_name(t.kind), t.stage, t.microbatch);
  }
}

/// The trace's text, handed to the sink whenever a piece is complete.
class TraceText {
 public:
  explicit TraceText(const TraceSink& sink) : sink_(sink) {}

  template <class... Args>
  void append(fmt::format_string<Args...> format, Args&&... args) {
    fmt::format_to(std::back_inserter(buffer_), format, std::forward<Args>(args)...);
  }
  /// One trace event (and the comma that separates it from the previous one).
  template <class... Args>
  void event(fmt::format_string<Args...> format, Args&&... args) {
    buffer_.push_back(',');
    append(format, std::forward<Args>(args)...);
    buffer_.push_back('\n');
    if (buffer_.size() >= kPiece) flush();
  }
  /// False once the sink has failed: the rest is not worth formatting.
  bool ok() const { return status_.ok(); }
  Status finish() {
    flush();
    return status_;
  }

 private:
  static constexpr std::size_t kPiece = std::size_t(1) << 20;
  void flush() {
    if (status_.ok() && buffer_.size() > 0) status_ = sink_(std::string_view(buffer_.data(), buffer_.size()));
    buffer_.clear();
  }

  const TraceSink& sink_;
  fmt::memory_buffer buffer_;
  Status status_;
};

/// A stream's row within its device's process: compute first, then collective, sends, receives.
std::size_t tid(const TaskGraph& graph, std::size_t stream) {
  return stream - graph.first_stream(graph.stream_device(stream));
}

}  // namespace

Status write_chrome_trace(const TaskGraph& graph, const Timeline& timeline, const std::vector<Bytes>& static_bytes,
                          const std::string& title, std::span<const Bytes> live_after, const TraceSink& sink,
                          std::span<const InnerSlice> inner) {
  TraceText out(sink);
  out.append(R"({},"title":{}}},"displayTimeUnit":"ms","traceEvents":[)", kTraceGenerator,
             json_text(nlohmann::json(title)));
  out.append("\n");
  out.append(R"({{"ph":"M","pid":0,"name":"process_name","args":{{"name":"device 0"}}}})");
  out.append("\n");
  for (int d = 0; d < graph.devices(); ++d) {
    if (d > 0) out.event(R"({{"ph":"M","pid":{},"name":"process_name","args":{{"name":"device {}"}}}})", d, d);
    out.event(R"({{"ph":"M","pid":{},"name":"process_sort_index","args":{{"sort_index":{}}}}})", d, d);
    for (std::size_t s = graph.first_stream(d); s < graph.first_stream(d + 1); ++s)
      if (!graph.stream(s).empty())
        out.event(R"({{"ph":"M","pid":{},"tid":{},"name":"thread_name","args":{{"name":"{}"}}}})", d, tid(graph, s),
                  graph.stream_name(s));
  }
  for (std::size_t i = 0; i < graph.size() && out.ok(); ++i) {
    const Task& t = graph.task(TaskId(i));
    const TimeNs start = timeline.start[i], end = timeline.end[i];
    out.event(R"({{"ph":"X","pid":{},"tid":{},"ts":{:.3f},"dur":{:.3f},"name":"{}","cat":"{}",)"
              R"("args":{{"kind":"{}","stage":{},"chunk":{},"microbatch":{}}}}})",
              t.device, tid(graph, graph.stream_of(t)), us(start), us(end - start), op_name(graph, t), op_kind_name(t.kind),
              op_kind_name(t.kind), t.stage, t.chunk, t.microbatch);
    if (t.kind == OpKind::Send) {
      const Task& r = graph.task(t.partner);
      out.event(R"({{"ph":"s","id":{},"pid":{},"tid":{},"ts":{:.3f},"name":"p2p","cat":"p2p"}})", i, t.device,
                tid(graph, graph.stream_of(t)), us(start));
      out.event(R"({{"ph":"f","bp":"e","id":{},"pid":{},"tid":{},"ts":{:.3f},"name":"p2p","cat":"p2p"}})", i, r.device,
                tid(graph, graph.stream_of(r)), us(timeline.start[std::size_t(t.partner)]));
    }
  }
  // Inner slices on a row after the device's streams.
  const auto inner_row = [&graph](int d) { return graph.first_stream(d + 1) - graph.first_stream(d); };
  std::vector<bool> named(std::size_t(graph.devices()), false);
  for (const InnerSlice& slice : inner) {
    if (!out.ok()) break;
    if (!named[std::size_t(slice.device)]) {
      named[std::size_t(slice.device)] = true;
      out.event(R"({{"ph":"M","pid":{},"tid":{},"name":"thread_name","args":{{"name":"tensor-parallel collectives, inside compute ops"}}}})",
                slice.device, inner_row(slice.device));
    }
    out.event(R"({{"ph":"X","pid":{},"tid":{},"ts":{:.3f},"dur":{:.3f},"name":"TP {}","cat":"tensor-parallel"}})",
              slice.device, inner_row(slice.device), us(slice.start), us(slice.end - slice.start), slice.name);
  }
  // Memory counter: static + live activations, stepping at each allocation and release (modelled) or
  // at each op's end (measured).
  for (int d = 0; d < graph.devices() && out.ok(); ++d) {
    std::vector<MemoryChange> changes{{0, 0, kNoTask}};
    if (live_after.empty()) {
      for (const MemoryChange& c : memory_changes(graph, timeline, d)) changes.push_back(c);
    } else {
      for (TaskId id = 0; id < TaskId(graph.size()); ++id)
        if (graph.task(id).device == d) changes.push_back({timeline.end[std::size_t(id)], live_after[std::size_t(id)], id});
      std::stable_sort(changes.begin(), changes.end(), [](const MemoryChange& a, const MemoryChange& b) { return a.time < b.time; });
      for (std::size_t k = changes.size() - 1; k > 0; --k) changes[k].delta -= changes[k - 1].delta;  // levels -> steps
    }
    Bytes live = static_bytes[std::size_t(d)];
    for (std::size_t k = 0; k < changes.size(); ++k) {
      live += changes[k].delta;
      if (k + 1 < changes.size() && changes[k + 1].time == changes[k].time) continue;  // one sample per time
      out.event(R"({{"ph":"C","pid":{},"ts":{:.3f},"name":"memory","args":{{"bytes":{}}}}})", d, us(changes[k].time),
                live);
    }
  }
  out.append("]}}\n");
  return out.finish();
}

Status write_chrome_trace_file(const std::string& path, const TaskGraph& graph, const Timeline& timeline,
                               const std::vector<Bytes>& static_bytes, const std::string& title,
                               std::span<const Bytes> live_after, std::span<const InnerSlice> inner) {
  Result<OutputFile> file = OutputFile::create(path, kTraceGenerator);
  if (!file.ok()) return file.error();
  OutputFile& f = file.value();
  if (Status s = write_chrome_trace(graph, timeline, static_bytes, title, live_after,
                                    [&f](std::string_view piece) { return f.write(piece); }, inner);
      !s.ok())
    return s;
  return f.commit();
}

std::string chrome_trace(const TaskGraph& graph, const Timeline& timeline, const std::vector<Bytes>& static_bytes,
                         const std::string& title, std::span<const Bytes> live_after) {
  std::string text;
  // Appending to a string cannot fail (but for memory, which throws).
  const auto append = [&text](std::string_view piece) {
    text += piece;
    return Status::Ok();
  };
  static_cast<void>(write_chrome_trace(graph, timeline, static_bytes, title, live_after, append));
  return text;
}

}  // namespace pipesim
