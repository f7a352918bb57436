#pragma once
#include <string>

#include "status.h"

namespace pipesim {

Result<std::string> read_text_file(const std::string& path);

/// Writes `content` to `path` through a temporary file and a rename, so a crash never leaves half
/// a file. Refuses to replace an existing file that pipesim did not write (its first bytes lack
/// `marker`): nothing the user wrote is ever overwritten.
Status write_output_file(const std::string& path, const std::string& content, std::string_view marker);

}  // namespace pipesim
