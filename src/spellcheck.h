#pragma once
#include <span>
#include <string>
#include <string_view>

namespace pipesim {

/// The closest candidate to `word` by edit distance, or "" when nothing is close enough to be a
/// plausible typo (as ninja's SpellcheckString does).
std::string closest_match(std::string_view word, std::span<const std::string> candidates);

/// "; did you mean 'x'?" when a close candidate exists, else ".": ends the sentence it is appended
/// to, so a further sentence can follow either way.
std::string did_you_mean(std::string_view word, std::span<const std::string> candidates);

}  // namespace pipesim
