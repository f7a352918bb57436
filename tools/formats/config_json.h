#pragma once
/// JSON config -> Config, with errors that name the file, the JSON path and the fix. Takes the
/// text, not a file, so tests can feed it strings; the CLI does the reading.
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "config.h"
#include "status.h"

namespace pipesim {

/// `overrides` are `key.path=value` strings from --set, applied before checking; a value that
/// parses as JSON is used as such (numbers, true, [1,2]), anything else as a string.
Result<Config> parse_config(std::string_view text, const std::string& source,
                            const std::vector<std::string>& overrides = {});

/// parse_config's error when it fails on a key rather than a value: a field the config does not have,
/// or an override's path through something that is not an object. How `sweep` tells a mistyped
/// --grid key (refused up front) from a value that fails only its own points.
std::optional<Error> key_error(std::string_view text, const std::string& source,
                               const std::vector<std::string>& overrides);

/// A `costs` block alone (e.g. from a measured profile); errors name `source` and the `costs.` path.
Result<ExplicitCosts> parse_costs(std::string_view text, const std::string& source);

}  // namespace pipesim
