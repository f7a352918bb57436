#pragma once
#include <cstddef>
#include <string>
#include <string_view>

#include "status.h"

namespace pipesim {

/// Inputs (configs, profiles, schedule CSVs) are small text files; anything larger is refused
/// before it is read whole (a mistaken path such as /dev/zero never ends).
constexpr std::size_t kMaxInputBytes = std::size_t(64) << 20;

Result<std::string> read_text_file(const std::string& path, std::size_t max_bytes = kMaxInputBytes);

/// Writes `content` to `path` through an exclusively created temporary in the same folder and an
/// atomic rename, so a crash never leaves half a file and nothing at the temporary's name is
/// followed. An existing `path` is replaced only when it is a regular file that starts with
/// `marker` (pipesim's own output; `content` must start with it too); with an empty marker an
/// existing path is never replaced. Nothing the user wrote is ever overwritten.
Status write_output_file(const std::string& path, const std::string& content, std::string_view marker);

}  // namespace pipesim
