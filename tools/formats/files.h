#pragma once
#include <cstddef>
#include <string>
#include <string_view>

#include "status.h"

namespace pipesim {

/// Inputs (configs, profiles, schedule CSVs) are small text files; anything larger is refused
/// before it is read whole.
constexpr std::size_t kMaxInputBytes = std::size_t(64) << 20;

/// The contents of the regular file at `path`, up to `max_bytes`. Anything else is refused before a
/// byte is read, saying what it is (a directory, a FIFO, a device such as /dev/zero, a socket):
/// reading a FIFO would wait for a writer forever and a device may never end.
Result<std::string> read_text_file(const std::string& path, std::size_t max_bytes = kMaxInputBytes);

/// `bytes` as a message may quote them: printable ASCII as is, anything else (control characters,
/// a byte-order mark, bytes that are not ASCII) as \xNN, so that what a file really holds shows.
std::string visible(std::string_view bytes);

/// Writes `content` to `path` through an exclusively created temporary in the same folder and an
/// atomic rename, so a crash never leaves half a file and nothing at the temporary's name is
/// followed. An existing `path` is replaced only when it is a regular file that starts with
/// `marker` (pipesim's own output; `content` must start with it too); with an empty marker an
/// existing path is never replaced. Nothing the user wrote is ever overwritten.
Status write_output_file(const std::string& path, const std::string& content, std::string_view marker);

}  // namespace pipesim
