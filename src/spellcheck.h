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

/// `text` for an error message: whole when short, else its first `keep` bytes (never splitting a
/// UTF-8 sequence) and "... (N bytes)", so a huge input is never echoed back whole.
std::string abbreviate(std::string_view text, std::size_t keep = 40);

}  // namespace pipesim
