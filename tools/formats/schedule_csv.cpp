#include "schedule_csv.h"

#include "files.h"
#include "schedule_csv_cells.h"
#include "sizes.h"
#include "spellcheck.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <map>
#include <optional>
#include <tuple>

namespace pipesim {
namespace {

/// An action and where it is; the file:line:column text is made only for a message.
struct Located {
  CsvAction action;
  int line = 0;
  int column = 0;
};
using Rows = std::vector<std::vector<Located>>;

std::string where(const std::string& source, const Located& l) { return fmt::format("{}:{}:{}", source, l.line, l.column); }

std::string name(const CsvAction& a) { return fmt::format("{}{}{}", a.stage, a.type, a.microbatch); }

/// The most stages a file for `devices` ranks may use, by pipesim's limits on chunks and layers.
std::int64_t most_stages(int devices) {
  return std::min<std::int64_t>(limits::kLayers, std::int64_t(devices) * limits::kChunks);
}

/// The most actions such a file can need: each stage runs F, B or I, W and four transfers per
/// microbatch, and a few per-step actions; 8 each is more than enough. A longer file is refused as
/// it is read, before it fills memory.
std::int64_t most_actions(int devices, int microbatches) {
  return most_stages(devices) * (std::int64_t(microbatches) + 1) * 8;
}

Result<Rows> read_rows(std::string_view text, const std::string& source, int devices, int microbatches) {
  Rows rows;
  const std::int64_t most = most_actions(devices, microbatches);
  std::int64_t count = 0;
  std::size_t line_start = 0;
  for (int line = 1; line_start < text.size(); ++line) {
    std::size_t line_end = text.find('\n', line_start);
    if (line_end == std::string_view::npos) line_end = text.size();
    const std::string_view row = text.substr(line_start, line_end - line_start);
    auto& actions = rows.emplace_back();
    for (std::size_t cell_start = 0; cell_start <= row.size();) {
      std::size_t cell_end = row.find(',', cell_start);
      if (cell_end == std::string_view::npos) cell_end = row.size();
      const std::string_view cell = row.substr(cell_start, cell_end - cell_start);
      const int column = int(cell_start) + 1;
      const std::optional<std::vector<CsvAction>> parsed = parse_csv_cell(cell);
      if (!parsed)
        return Error{fmt::format("{}:{}:{}: '{}' is not an action; {}", source, line, column,
                                 visible(abbreviate(trim_csv_cell(cell))), kCsvGrammar)};
      for (const CsvAction& a : *parsed) actions.push_back({a, line, column});
      if ((count += std::int64_t(parsed->size())) > most)
        return Error{fmt::format("{}:{}:{}: over {} actions, the most {} ranks can need for {} microbatches ({} stages "
                                 "at most, 8 actions per stage and microbatch); is it the right file?",
                                 source, line, column, most, devices, microbatches, most_stages(devices))};
      cell_start = cell_end + 1;
    }
    line_start = line_end + 1;
  }
  while (!rows.empty() && rows.back().empty()) rows.pop_back();  // trailing newlines
  return rows;
}

/// PyTorch 2.11's Schedule1F1B numbers its last rank's forwards 1 to m (its backwards 0 to m - 1):
/// a stage whose forwards are exactly 1..m while its backwards are 0..m-1 is read as 0..m-1.
std::vector<std::string> renumber_shifted_forwards(Rows& rows, const std::string& source, int stages, int m) {
  // One pass to gather each stage's microbatches, one to renumber: linear in the file.
  std::vector<std::vector<int>> forwards(static_cast<std::size_t>(stages)), backwards(forwards.size());
  for (const auto& row : rows)
    for (const Located& l : row)
      if (l.action.compute())
        (l.action.type == "F" ? forwards : backwards)[std::size_t(l.action.stage)].push_back(l.action.microbatch);
  std::vector<bool> shifted(std::size_t(stages), false);
  std::vector<std::string> notes;
  for (int s = 0; s < stages; ++s) {
    std::vector<int>& f = forwards[std::size_t(s)];
    std::vector<int>& b = backwards[std::size_t(s)];
    std::sort(f.begin(), f.end());
    std::sort(b.begin(), b.end());
    b.erase(std::unique(b.begin(), b.end()), b.end());
    bool shift = int(f.size()) == m && int(b.size()) == m;
    for (int x = 0; shift && x < m; ++x) shift = f[std::size_t(x)] == x + 1 && b[std::size_t(x)] == x;
    if (!shift) continue;
    shifted[std::size_t(s)] = true;
    notes.push_back(fmt::format("{}: stage {} numbers its forwards 1 to {} and its backwards 0 to {}, as PyTorch 2.11's "
                                "Schedule1F1B writes its last rank; read as forwards 0 to {}",
                                source, s, m, m - 1, m - 1));
  }
  for (auto& row : rows)
    for (Located& l : row)
      if (l.action.type == "F" && shifted[std::size_t(l.action.stage)]) --l.action.microbatch;
  return notes;
}

/// In a file that splits off W, B is a full backward: its input gradient (I) and its weight gradient
/// (W) both. An I or W of the same stage and microbatch runs one of them a second time.
Status check_full_backwards(const Rows& rows, const std::string& source) {
  std::map<std::pair<int, int>, const Located*> full;  // (stage, microbatch) -> its B
  for (const auto& row : rows)
    for (const Located& l : row)
      if (l.action.type == "B") full.emplace(std::pair{l.action.stage, l.action.microbatch}, &l);
  for (const auto& row : rows)
    for (const Located& l : row) {
      if (l.action.type != "I" && l.action.type != "W") continue;
      const auto b = full.find({l.action.stage, l.action.microbatch});
      if (b == full.end()) continue;
      const bool weight = l.action.type == "W";
      CsvAction other = l.action;
      other.type = weight ? "I" : "W";
      return Error{fmt::format("{}: {} computes the {} gradient that {} ({}) computes already: B is a full backward, "
                               "I and W; write {} instead of {}, or drop {}",
                               where(source, l), name(l.action), weight ? "weight" : "input", name(b->second->action),
                               where(source, *b->second), name(other), name(b->second->action), name(l.action))};
    }
  return Status::Ok();
}

/// Loop placement puts stage s on rank s mod p; V placement (2 chunks) folds the second half back.
std::optional<Placement> placement_of(const std::vector<int>& rank_of_stage, int devices) {
  const int stages = int(rank_of_stage.size());
  Layout loop{devices, stages / devices, Placement::Loop, {}}, v{devices, 2, Placement::V, {}};
  bool is_loop = true, is_v = stages == 2 * devices;
  for (int d = 0; d < devices; ++d)
    for (int c = 0; c < stages / devices; ++c) {
      is_loop &= rank_of_stage[std::size_t(loop.stage_of(d, c))] == d;
      if (is_v) is_v &= rank_of_stage[std::size_t(v.stage_of(d, c))] == d;
    }
  if (is_loop) return Placement::Loop;
  if (is_v) return Placement::V;
  return std::nullopt;
}

Result<Placement> check_stages(const Rows& rows, const std::string& source, int devices, int stages,
                               std::vector<int>& rank_of_stage) {
  if (stages % devices != 0)
    return Error{fmt::format("{}: uses {} stages, not a multiple of the {} ranks; every rank needs as many chunks",
                             source, stages, devices)};
  rank_of_stage.assign(std::size_t(stages), -1);
  for (int d = 0; d < devices; ++d)
    for (const Located& l : rows[std::size_t(d)]) {
      int& rank = rank_of_stage[std::size_t(l.action.stage)];
      if (rank >= 0 && rank != d)
        return Error{fmt::format("{}: stage {} already runs on rank {}; a stage lives on one rank", where(source, l),
                                 l.action.stage, rank)};
      rank = d;
    }
  for (int s = 0; s < stages; ++s)
    if (rank_of_stage[std::size_t(s)] < 0)
      return Error{fmt::format("{}: stage {} never runs; stages 0 to {} must all appear", source, s, stages - 1)};
  const std::optional<Placement> placement = placement_of(rank_of_stage, devices);
  if (!placement)
    return Error{fmt::format("{}: the stages are neither in loop placement (stage s on rank s mod {}) nor in V "
                             "placement (2 chunks, stage 2p-1-i on rank i)",
                             source, devices)};
  return *placement;
}

/// A file with SEND/RECV actions (PyTorch's compute_comms format) must name each transfer between
/// ranks once on each side, and no other: pipesim keeps its order rather than deriving one.
Status check_transfers(const Rows& rows, const std::vector<int>& rank_of_stage, const std::string& source, int m) {
  const int stages = int(rank_of_stage.size());
  std::map<std::tuple<std::string_view, int, int>, int> seen;  // (type, stage, microbatch) -> count
  for (const auto& row : rows)
    for (const Located& l : row) {
      const CsvAction& a = l.action;
      if (!a.transfer()) continue;
      const int peer = a.type == "SEND_F" || a.type == "RECV_B" ? a.stage + 1 : a.stage - 1;
      if (peer < 0 || peer >= stages || rank_of_stage[std::size_t(peer)] == rank_of_stage[std::size_t(a.stage)])
        return Error{fmt::format("{}: {}{}{} crosses no rank boundary (stage {} is on the same rank or does not exist)",
                                 where(source, l), a.stage, a.type, a.microbatch, peer)};
      if (++seen[{a.type, a.stage, a.microbatch}] > 1)
        return Error{fmt::format("{}: {}{}{} appears twice", where(source, l), a.stage, a.type, a.microbatch)};
    }
  if (seen.empty()) return Status::Ok();
  const auto need = [&](std::string_view type, int stage, int mb) -> Status {
    if (seen.count({type, stage, mb})) return Status::Ok();
    return Error{fmt::format("{}: has no {}{}{} (rank {}); a file with SEND/RECV actions needs every transfer between "
                             "ranks, or none",
                             source, stage, type, mb, rank_of_stage[std::size_t(stage)])};
  };
  for (int s = 0; s + 1 < stages; ++s)
    for (int mb = 0; mb < m && rank_of_stage[std::size_t(s)] != rank_of_stage[std::size_t(s + 1)]; ++mb)
      for (const Status& st : {need("SEND_F", s, mb), need("RECV_F", s + 1, mb), need("SEND_B", s + 1, mb),
                               need("RECV_B", s, mb)})
        if (!st.ok()) return st;
  return Status::Ok();
}

}  // namespace

Result<CustomSchedule> parse_schedule_csv(std::string_view text, const std::string& source, int devices,
                                          int microbatches) {
  Result<Rows> read = read_rows(text, source, devices, microbatches);
  if (!read.ok()) return read.error();
  Rows& rows = read.value();
  if (int(rows.size()) != devices)
    return Error{fmt::format("{}: has {} rows but parallel.pp is {}; write one row per rank", source, rows.size(),
                             devices)};
  int stages = 0;
  for (const auto& row : rows)
    for (const Located& l : row) stages = std::max(stages, l.action.stage + 1);
  // Before anything is sized by it: "999999999F0" would ask for gigabytes.
  if (stages > limits::kLayers)
    return Error{fmt::format("{}: uses {} stages; pipesim's limit is {} (one layer or more each)", source, stages,
                             limits::kLayers)};
  if (stages > devices * limits::kChunks)
    return Error{fmt::format("{}: uses {} stages, more than {} chunks on each of the {} ranks; pipesim's limit is {} "
                             "(parallel.chunks)",
                             source, stages, limits::kChunks, devices, limits::kChunks)};
  std::vector<std::string> notes = renumber_shifted_forwards(rows, source, stages, microbatches);

  int file_microbatches = 0;
  bool split_weight = false;
  for (const auto& row : rows)
    for (const Located& l : row) {
      file_microbatches = std::max(file_microbatches, l.action.microbatch + 1);
      split_weight |= l.action.type == "W" || l.action.type == "I";
    }
  if (file_microbatches != microbatches)
    return Error{fmt::format("{}: schedules {} microbatches but parallel.microbatches is {}; use --set "
                             "parallel.microbatches={}",
                             source, file_microbatches, microbatches, file_microbatches)};
  if (split_weight)
    if (Status s = check_full_backwards(rows, source); !s.ok()) return s.error();
  std::vector<int> rank_of_stage;
  Result<Placement> placement = check_stages(rows, source, devices, stages, rank_of_stage);
  if (!placement.ok()) return placement.error();
  if (Status s = check_transfers(rows, rank_of_stage, source, microbatches); !s.ok()) return s.error();

  CustomSchedule schedule{"file:" + source, placement.value(), stages / devices, DeviceOrders(std::size_t(devices)),
                          DeviceComms(std::size_t(devices)), std::move(notes)};
  for (int d = 0; d < devices; ++d)
    for (const Located& l : rows[std::size_t(d)]) {
      const CsvAction& a = l.action;
      auto& order = schedule.orders[std::size_t(d)];
      if (a.transfer()) {
        const std::optional<ComputeStep> after = order.empty() ? std::nullopt : std::optional(order.back());
        const Payload payload = a.type.ends_with('F') ? Payload::Activation : Payload::Gradient;
        schedule.comms[std::size_t(d)].push_back(
            {a.type.starts_with("SEND") ? OpKind::Send : OpKind::Recv, payload, a.stage, a.microbatch, after});
        continue;
      }
      if (!a.compute()) continue;  // UNSHARD, RESHARD, REDUCE_GRAD: nothing pipesim models per stage
      const OpKind kind = a.type == "F" ? OpKind::F : a.type == "W" ? OpKind::W : OpKind::B;
      order.push_back({kind, a.stage, a.microbatch});
      if (a.type == "B" && split_weight) order.push_back({OpKind::W, a.stage, a.microbatch});  // a full backward
    }
  bool has_transfers = false;
  for (const auto& comms : schedule.comms) has_transfers |= !comms.empty();
  if (!has_transfers) schedule.comms.clear();  // compute only: assemble derives the transfers
  return schedule;
}

std::string schedule_csv(const TaskGraph& graph) {
  const bool split_weight = graph.has(OpKind::W);
  std::string out;
  for (int d = 0; d < graph.devices(); ++d) {
    std::string row;
    for (TaskId id : graph.stream_order(d, Stream::Compute)) {
      const Task& t = graph.task(id);
      const char kind = t.kind == OpKind::F ? 'F' : t.kind == OpKind::W ? 'W' : t.kind == OpKind::B ? (split_weight ? 'I' : 'B') : 0;
      if (!kind) continue;
      row += fmt::format("{}{}{}{}", row.empty() ? "" : ",", t.stage, kind, t.microbatch);
    }
    out += row + "\n";
  }
  return out;
}

}  // namespace pipesim
