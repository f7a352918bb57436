#include "schedule_csv.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <optional>

#include "sizes.h"
#include "spellcheck.h"

namespace pipesim {
namespace {

struct Action {
  int stage;
  char kind;  ///< F, I, B or W
  int microbatch;
};

/// `{digits}{F|I|B|W}{digits}`, nothing else.
std::optional<Action> parse_action(std::string_view cell) {
  std::size_t i = 0;
  const auto number = [&](int& out) {
    const std::size_t start = i;
    long value = 0;
    while (i < cell.size() && std::isdigit(static_cast<unsigned char>(cell[i])) && value < 1'000'000'000)
      value = value * 10 + (cell[i++] - '0');
    out = int(value);
    return i > start && i - start < 10;
  };
  Action a{};
  if (!number(a.stage) || i >= cell.size()) return std::nullopt;
  a.kind = cell[i++];
  if (a.kind != 'F' && a.kind != 'I' && a.kind != 'B' && a.kind != 'W') return std::nullopt;
  if (!number(a.microbatch) || i != cell.size()) return std::nullopt;
  return a;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
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

/// Where an action is in the file, printed as source:line:column.
struct Place {
  std::string_view source;
  int line;
  std::size_t column;
};

}  // namespace
}  // namespace pipesim

template <>
struct fmt::formatter<pipesim::Place> : fmt::formatter<std::string_view> {
  auto format(const pipesim::Place& p, format_context& ctx) const {
    return fmt::format_to(ctx.out(), "{}:{}:{}", p.source, p.line, p.column);
  }
};

namespace pipesim {

Result<CustomSchedule> parse_schedule_csv(std::string_view text, const std::string& source, int devices,
                                          int microbatches) {
  // Each action with its line and column: a string per action would multiply a big file's memory.
  std::vector<std::vector<std::pair<Action, Place>>> rows;
  std::size_t line_start = 0;
  for (int line = 1; line_start < text.size(); ++line) {
    std::size_t line_end = text.find('\n', line_start);
    if (line_end == std::string_view::npos) line_end = text.size();
    const std::string_view row = text.substr(line_start, line_end - line_start);
    auto& actions = rows.emplace_back();
    for (std::size_t cell_start = 0; cell_start <= row.size();) {
      std::size_t cell_end = row.find(',', cell_start);
      if (cell_end == std::string_view::npos) cell_end = row.size();
      const std::string_view cell = trim(row.substr(cell_start, cell_end - cell_start));
      const Place where{source, line, cell_start + 1};
      if (!cell.empty()) {
        const std::optional<Action> action = parse_action(cell);
        if (!action)
          return Error{fmt::format("{}: '{}' is not an action; write [stage][F|I|B|W][microbatch], e.g. 0F0", where,
                                   abbreviate(cell))};
        // Each stage runs F, B (or I) and W once per microbatch: more than that cannot be a schedule,
        // and is refused before a huge file's actions fill memory.
        if (actions.size() >= std::size_t(3) * std::size_t(microbatches) * std::size_t(limits::kLayers))
          return Error{fmt::format("{}: too many actions in one row; each stage runs F, B (or I) and W once per "
                                   "microbatch",
                                   where)};
        actions.emplace_back(*action, where);
      }
      cell_start = cell_end + 1;
    }
    line_start = line_end + 1;
    if (int(rows.size()) > devices) {  // only trailing empty lines may follow the last rank's row
      if (!rows.back().empty())
        return Error{fmt::format("{}: has more than {} rows but parallel.pp is {}; write one row per rank", source,
                                 devices, devices)};
      rows.pop_back();
    }
  }
  while (!rows.empty() && rows.back().empty()) rows.pop_back();  // trailing newlines
  if (int(rows.size()) != devices)
    return Error{fmt::format("{}: has {} rows but parallel.pp is {}; write one row per rank", source, rows.size(),
                             devices)};

  int stages = 0, file_microbatches = 0;
  bool split_weight = false;
  for (const auto& row : rows)
    for (const auto& [a, where] : row) {
      stages = std::max(stages, a.stage + 1);
      file_microbatches = std::max(file_microbatches, a.microbatch + 1);
      split_weight |= a.kind == 'W' || a.kind == 'I';
    }
  // Before rank_of_stage is sized by it: "999999999F0" would ask for gigabytes.
  if (stages > limits::kLayers)
    return Error{fmt::format("{}: uses {} stages; pipesim's limit is {} (one layer or more each)", source, stages,
                             limits::kLayers)};
  if (stages % devices != 0)
    return Error{fmt::format("{}: uses {} stages, not a multiple of the {} ranks; every rank needs as many chunks",
                             source, stages, devices)};
  if (file_microbatches != microbatches)
    return Error{fmt::format("{}: schedules {} microbatches but parallel.microbatches is {}; use --set "
                             "parallel.microbatches={}",
                             source, file_microbatches, microbatches, file_microbatches)};
  std::vector<int> rank_of_stage(std::size_t(stages), -1);
  for (int d = 0; d < devices; ++d)
    for (const auto& [a, where] : rows[std::size_t(d)]) {
      int& rank = rank_of_stage[std::size_t(a.stage)];
      if (rank >= 0 && rank != d)
        return Error{fmt::format("{}: stage {} already runs on rank {}; a stage lives on one rank", where, a.stage, rank)};
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

  CustomSchedule schedule{"file:" + source, *placement, stages / devices, DeviceOrders(std::size_t(devices))};
  for (int d = 0; d < devices; ++d)
    for (const auto& [a, where] : rows[std::size_t(d)]) {
      auto& order = schedule.orders[std::size_t(d)];
      const OpKind kind = a.kind == 'F' ? OpKind::F : a.kind == 'W' ? OpKind::W : OpKind::B;
      order.push_back({kind, a.stage, a.microbatch});
      if (a.kind == 'B' && split_weight) order.push_back({OpKind::W, a.stage, a.microbatch});  // a full backward
    }
  return schedule;
}

std::string schedule_csv(const TaskGraph& graph) {
  bool split_weight = false;
  for (const Task& t : graph.tasks()) split_weight |= t.kind == OpKind::W;
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
