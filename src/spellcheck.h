#pragma once
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace pipesim {

/// The candidates closest to `word`, in their order: every one that `word` abbreviates (starts), else
/// every one at the smallest edit distance that still reads as a typo (as ninja's SpellcheckString
/// does); empty when nothing is that close.
std::vector<std::string> closest_matches(std::string_view word, std::span<const std::string> candidates);

/// "; did you mean 'x'?" (or "'x' or 'y'?") when close candidates exist, else ".": ends the sentence
/// it is appended to, so a further sentence (the valid names) can follow either way.
std::string did_you_mean(std::string_view word, std::span<const std::string> candidates);

/// did_you_mean's sentence for `matches` found otherwise (by meaning): "." when there are none.
std::string did_you_mean_names(std::span<const std::string> matches);

/// `text` for an error message: whole when short, else its first `keep` bytes (never splitting a
/// UTF-8 sequence) and "... (N bytes)", so a huge input is never echoed back whole.
std::string abbreviate(std::string_view text, std::size_t keep = 40);

}  // namespace pipesim
