#pragma once
/// Options several commands share, and CLI11 checks for values CLI11's own validators let through:
/// empty strings, NaN (every comparison with it is false, so CLI::PositiveNumber accepts it) and
/// integers that wrap on conversion.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "fmt/format.h"
#include "report.h"
#include "spellcheck.h"
#include "status.h"

namespace pipesim {

/// The files a command writes, by option: none may be the file another names, which the second write
/// would find there and refuse, or replace. Empty paths (not given) are skipped.
Status check_distinct_outputs(const std::vector<std::pair<std::string, std::string>>& outputs);

/// --format NAME, restricted to `names`, stored into `format` once parsed.
void add_format_option(CLI::App& command, Format& format, const std::vector<std::string>& names);

/// The positional config and --schedule, --vocab, --set (simulate, run and export).
void add_selection_options(CLI::App& command, std::string& config, std::string& schedule, std::string& vocab,
                           std::vector<std::string>& overrides);

/// An option given with an empty value would otherwise read as not given at all.
inline const CLI::Validator kNonEmpty(
    [](const std::string& value) {
      return value.empty() ? std::string("an empty value; give one, or leave the option out") : std::string();
    },
    "", "NONEMPTY");

/// A finite number in [low, high] (NaN and infinities refused).
inline CLI::Validator finite_from(double low, double high) {
  return CLI::Validator(
      [=](const std::string& value) {
        double number = 0;
        const auto [end, error] = std::from_chars(value.data(), value.data() + value.size(), number);
        if (error != std::errc() || end != value.data() + value.size() || !std::isfinite(number) || number < low ||
            number > high)
          return fmt::format("'{}' is not a number from {} to {}", value, low, high);
        return std::string();
      },
      fmt::format("NUMBER in [{}, {}]", low, high), "FINITE");
}

/// A finite number in (low, high].
inline CLI::Validator finite_in(double low, double high) {
  return CLI::Validator(
      [=](const std::string& value) {
        double number = 0;
        const auto [end, error] = std::from_chars(value.data(), value.data() + value.size(), number);
        if (error != std::errc() || end != value.data() + value.size() || !std::isfinite(number) || number <= low ||
            number > high)
          return fmt::format("'{}' is not a number above {} and at most {}", value, low, high);
        return std::string();
      },
      fmt::format("NUMBER in ({}, {}]", low, high), "FINITE");
}

/// A whole number in [low, high], in decimal: CLI11's Range says "Value 1.5 not in range", which does not
/// say that the fraction is the problem.
inline CLI::Validator whole_from(long long low, long long high) {
  return CLI::Validator(
      [=](const std::string& value) {
        long long number = 0;
        const auto [end, error] = std::from_chars(value.data(), value.data() + value.size(), number);
        if (value.empty() || error != std::errc() || end != value.data() + value.size() || number < low ||
            number > high)
          return fmt::format("'{}' is not a whole number from {} to {}", value, low, high);
        return std::string();
      },
      fmt::format("INT in [{} - {}]", low, high), "WHOLE");  // as CLI::Range shows it
}

/// One of `names`, exactly; any other value is refused with the closest names (spellcheck.h) and all of
/// them, as the config's name lists are.
inline CLI::Validator one_of(std::vector<std::string> names) {
  const std::string all = CLI::detail::join(names, ", ");
  return CLI::Validator(
      [names, all](const std::string& value) {
        if (std::find(names.begin(), names.end(), value) != names.end()) return std::string();
        return fmt::format("'{}' is not one of {}{}", abbreviate(value), all,
                           closest_matches(value, names).empty() ? "" : did_you_mean(value, names));
      },
      "{" + CLI::detail::join(names, ",") + "}", "ONE_OF");
}

/// Decimal digits only, within 64 bits: strtoull would wrap "-1" and saturate past 2^64.
inline const CLI::Validator kUint64(
    [](const std::string& value) {
      std::uint64_t number = 0;
      const auto [end, error] = std::from_chars(value.data(), value.data() + value.size(), number);
      if (value.empty() || error != std::errc() || end != value.data() + value.size())
        return fmt::format("'{}' is not an integer from 0 to {}", value, UINT64_MAX);
      return std::string();
    },
    "UINT64", "UINT64");

}  // namespace pipesim
