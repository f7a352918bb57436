#pragma once
/// JSON text for every JSON pipesim prints or writes. Its strings come from the user too (a config's
/// file name, a --set or --grid value, a --preset), and those may hold any bytes: nlohmann's dump
/// throws on bytes that are not UTF-8, which would end the program. Here each such byte becomes
/// U+FFFD, so the output is valid JSON whatever the input.
#include <nlohmann/json.hpp>
#include <string>

namespace pipesim {

/// `value` as JSON text; `indent` as nlohmann's dump takes it (-1: one line).
template <class Json>
std::string json_text(const Json& value, int indent = -1) {
  return value.dump(indent, ' ', false, Json::error_handler_t::replace);
}

}  // namespace pipesim
