#include "files.h"

#include "output_file.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <utility>

namespace pipesim {
namespace {

/// Closes a file descriptor on every path out.
class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() { close(); }
  int get() const { return fd_; }
  /// Closes now; false when the close reported an error (a delayed write failure).
  bool close() {
    const int fd = std::exchange(fd_, -1);
    return fd < 0 || ::close(fd) == 0;
  }

 private:
  int fd_;
};

/// What a path that is not a regular file is, for the message.
std::string_view kind_of_file(mode_t mode) {
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a file";
}

}  // namespace

Result<std::string> read_text_file(const std::string& path, std::size_t max_bytes) {
  // O_NONBLOCK: opening a FIFO must not wait for a writer before fstat can refuse it.
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK));
  if (fd.get() < 0) return Error{fmt::format("{}: cannot open: {}", path, std::strerror(errno))};
  struct stat info {};
  if (::fstat(fd.get(), &info) != 0) return Error{fmt::format("{}: cannot read: {}", path, std::strerror(errno))};
  if (S_ISDIR(info.st_mode)) return Error{fmt::format("{}: is a directory; give a file", path)};
  if (!S_ISREG(info.st_mode))
    return Error{fmt::format("{}: is not a regular file ({}); give a file", path, kind_of_file(info.st_mode))};
  const Error too_large{fmt::format("{}: larger than {} MiB; pipesim reads small text files (is it the right file?)",
                                    path, max_bytes >> 20)};
  if (std::uintmax_t(info.st_size) > max_bytes) return too_large;
  std::string text;
  char buffer[1 << 16];
  while (true) {
    const ssize_t n = ::read(fd.get(), buffer, sizeof buffer);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Error{fmt::format("{}: read failed: {}", path, std::strerror(errno))};
    if (n == 0) return text;
    if (text.size() + std::size_t(n) > max_bytes) return too_large;  // it grew while being read
    text.append(buffer, std::size_t(n));
  }
}

std::string visible(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  for (const char c : bytes) {
    const auto byte = static_cast<unsigned char>(c);
    if (byte >= 0x20 && byte < 0x7f) out += c;
    else out += fmt::format("\\x{:02X}", byte);
  }
  return out;
}

Status write_output_file(const std::string& path, const std::string& content, std::string_view marker) {
  Result<OutputFile> out = OutputFile::create(path, marker);
  if (!out.ok()) return out.error();
  if (Status written = out.value().write(content); !written.ok()) return written;
  return out.value().commit();
}

}  // namespace pipesim
