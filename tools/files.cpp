#include "files.h"

#include <fmt/format.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace pipesim {

Result<std::string> read_text_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Error{fmt::format("{}: cannot open: {}", path, std::strerror(errno))};
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) return Error{fmt::format("{}: read failed", path)};
  return text.str();
}

Status write_output_file(const std::string& path, const std::string& content, std::string_view marker) {
  std::error_code ec;
  if (std::filesystem::exists(path, ec)) {
    std::ifstream existing(path, std::ios::binary);
    std::string head(512, '\0');
    existing.read(head.data(), static_cast<std::streamsize>(head.size()));
    head.resize(static_cast<std::size_t>(existing.gcount()));
    if (head.find(marker) == std::string::npos)
      return Error{fmt::format("{}: exists and was not written by pipesim; refusing to overwrite it (choose another "
                               "path or remove the file)",
                               path)};
  }
  const std::string temporary = path + ".pipesim-tmp";
  {
    std::ofstream out(temporary, std::ios::binary | std::ios::trunc);
    if (!out) return Error{fmt::format("{}: cannot write: {}", path, std::strerror(errno))};
    out << content;
    if (!out.flush()) return Error{fmt::format("{}: write failed: {}", path, std::strerror(errno))};
  }
  std::filesystem::rename(temporary, path, ec);
  if (ec) return Error{fmt::format("{}: cannot move the finished file into place: {}", path, ec.message())};
  return Status::Ok();
}

}  // namespace pipesim
