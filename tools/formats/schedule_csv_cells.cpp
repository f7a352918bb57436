#include "schedule_csv_cells.h"

#include <array>
#include <cctype>

namespace pipesim {
namespace {

// Longer names first, so that a prefix match finds REDUCE_GRAD before any one-letter type.
constexpr std::array<std::string_view, 11> kTypes = {"REDUCE_GRAD", "UNSHARD", "RESHARD", "SEND_F", "RECV_F", "SEND_B",
                                                     "RECV_B",      "F",       "I",       "B",      "W"};

bool takes_microbatch(std::string_view type) { return type != "REDUCE_GRAD" && type != "UNSHARD" && type != "RESHARD"; }

/// Reads up to 9 digits at `i`; false when there are none (or too many).
bool read_number(std::string_view text, std::size_t& i, int& out) {
  const std::size_t start = i;
  long value = 0;
  while (i < text.size() && std::isdigit(static_cast<unsigned char>(text[i])) && i - start < 10)
    value = value * 10 + (text[i++] - '0');
  out = int(value);
  return i > start && i - start < 10;
}

std::optional<CsvAction> parse_action(std::string_view text) {
  CsvAction a;
  std::size_t i = 0;
  if (!read_number(text, i, a.stage)) return std::nullopt;
  for (std::string_view type : kTypes)
    if (text.substr(i).starts_with(type)) {
      a.type = type;
      break;
    }
  if (a.type.empty()) return std::nullopt;
  i += a.type.size();
  if (takes_microbatch(a.type) && !read_number(text, i, a.microbatch)) return std::nullopt;
  if (i != text.size()) return std::nullopt;
  return a;
}

}  // namespace

std::string_view trim_csv_cell(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

std::optional<std::vector<CsvAction>> parse_csv_cell(std::string_view cell) {
  cell = trim_csv_cell(cell);
  if (cell.empty()) return std::vector<CsvAction>{};
  if (!cell.starts_with('(')) {
    std::optional<CsvAction> a = parse_action(cell);
    if (!a) return std::nullopt;
    return std::vector<CsvAction>{*a};
  }
  // (a;b)OVERLAP_F_B: compute actions that PyTorch runs overlapped on one rank.
  const std::size_t close = cell.find(')');
  if (close == std::string_view::npos || cell.substr(close + 1) != "OVERLAP_F_B") return std::nullopt;
  std::vector<CsvAction> actions;
  for (std::string_view inner = cell.substr(1, close - 1); !inner.empty();) {
    const std::size_t end = std::min(inner.find(';'), inner.size());
    std::optional<CsvAction> a = parse_action(trim_csv_cell(inner.substr(0, end)));
    if (!a || !a->compute()) return std::nullopt;
    actions.push_back(*a);
    inner.remove_prefix(std::min(end + 1, inner.size()));
  }
  if (actions.empty()) return std::nullopt;
  return actions;
}

}  // namespace pipesim
