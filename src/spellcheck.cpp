#include "spellcheck.h"

#include <algorithm>
#include <vector>

namespace pipesim {
namespace {

std::size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diagonal = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t substitute = diagonal + (a[i - 1] == b[j - 1] ? 0 : 1);
      diagonal = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, substitute});
    }
  }
  return row[b.size()];
}

}  // namespace

std::vector<std::string> closest_matches(std::string_view word, std::span<const std::string> candidates) {
  // A word that starts a candidate is an abbreviation of it ('h100' for 'h100-sxm', 'zb' for zb-h1 and zb-v).
  std::vector<std::string> matches;
  for (const std::string& candidate : candidates)
    if (word.size() >= 2 && candidate.starts_with(word)) matches.push_back(candidate);
  if (!matches.empty()) return matches;
  // A third of the word (at least 2 edits) still reads as a typo; more than that is a different word.
  const std::size_t max_distance = std::max<std::size_t>(2, word.size() / 3);
  std::size_t best_distance = max_distance + 1;
  for (const std::string& candidate : candidates) {
    // The length difference alone bounds the distance from below: skip the quadratic work (a long word).
    const std::size_t gap = word.size() > candidate.size() ? word.size() - candidate.size() : candidate.size() - word.size();
    if (gap > max_distance) continue;
    const std::size_t d = edit_distance(word, candidate);
    if (d > max_distance) continue;
    if (d < best_distance) best_distance = d, matches.clear();
    if (d == best_distance) matches.push_back(candidate);
  }
  return matches;
}

std::string did_you_mean_names(std::span<const std::string> matches) {
  if (matches.empty()) return ".";
  std::string names;
  for (std::size_t i = 0; i < matches.size(); ++i)
    names += (i == 0 ? "" : i + 1 == matches.size() ? " or " : ", ") + ("'" + matches[i] + "'");
  return "; did you mean " + names + "?";
}

std::string did_you_mean(std::string_view word, std::span<const std::string> candidates) {
  return did_you_mean_names(closest_matches(word, candidates));
}

std::string abbreviate(std::string_view text, std::size_t keep) {
  if (text.size() <= keep + 16) return std::string(text);  // short enough: the suffix would not save much
  while (keep > 0 && (static_cast<unsigned char>(text[keep]) & 0xC0) == 0x80) --keep;  // a continuation byte
  return std::string(text.substr(0, keep)) + "... (" + std::to_string(text.size()) + " bytes)";
}

}  // namespace pipesim
