#include "files.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdint>
#include <cstring>
#include <filesystem>
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

Status write_all(int fd, std::string_view content, const std::string& path) {
  while (!content.empty()) {
    const ssize_t n = ::write(fd, content.data(), content.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return Error{fmt::format("{}: write failed: {}", path, std::strerror(n < 0 ? errno : EIO))};
    content.remove_prefix(std::size_t(n));
  }
  return Status::Ok();
}

/// An existing `path` may be replaced only when it is a regular file that starts with `marker`.
Status check_replaceable(const std::string& path, std::string_view marker) {
  const Error refusal{fmt::format("{}: exists and was not written by pipesim; refusing to overwrite it (choose another "
                                  "path or remove the file)",
                                  path)};
  struct stat info {};
  if (::lstat(path.c_str(), &info) != 0) return Status::Ok();  // nothing there (yet)
  if (marker.empty()) return Error{fmt::format("{}: exists; refusing to overwrite it (choose another path or remove the file)", path)};
  if (!S_ISREG(info.st_mode)) return refusal;
  Fd fd(::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC));
  std::string head(marker.size(), '\0');
  if (fd.get() < 0 || ::read(fd.get(), head.data(), head.size()) != ssize_t(head.size()) || head != marker)
    return refusal;
  return Status::Ok();
}

/// Moves the finished temporary into place; with `replace` false, only where nothing exists yet.
Status move_into_place(const std::string& temporary, const std::string& path, bool replace) {
  int result = replace ? std::rename(temporary.c_str(), path.c_str())
                       : ::renameat2(AT_FDCWD, temporary.c_str(), AT_FDCWD, path.c_str(), RENAME_NOREPLACE);
  if (!replace && result != 0 && (errno == EINVAL || errno == ENOSYS)) {  // a file system without it: link instead
    result = ::link(temporary.c_str(), path.c_str());
    if (result == 0) ::unlink(temporary.c_str());
  }
  if (result == 0) return Status::Ok();
  const int error = errno;
  ::unlink(temporary.c_str());
  if (error == EEXIST)
    return Error{fmt::format("{}: exists; refusing to overwrite it (choose another path or remove the file)", path)};
  return Error{fmt::format("{}: cannot move the finished file into place: {}", path, std::strerror(error))};
}

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
  if (!marker.empty() && !std::string_view(content).starts_with(marker))
    return Error{fmt::format("{}: internal error: the output does not start with its marker", path)};
  if (Status s = check_replaceable(path, marker); !s.ok()) return s;
  // The temporary is created exclusively next to the target (same file system, so the rename is
  // atomic): an existing file or symlink of that name is never opened, let alone written through.
  const std::filesystem::path target(path);
  std::string temporary = (target.parent_path() / ("." + target.filename().string() + ".pipesim-XXXXXX")).string();
  Fd fd(::mkstemp(temporary.data()));
  if (fd.get() < 0) return Error{fmt::format("{}: cannot create a file next to it: {}", path, std::strerror(errno))};
  const mode_t umask_bits = ::umask(0);
  ::umask(umask_bits);
  ::fchmod(fd.get(), 0666 & ~umask_bits);  // mkstemp's 0600 is for the temporary only
  Status written = write_all(fd.get(), content, path);
  if (written.ok() && !fd.close()) written = Error{fmt::format("{}: write failed: {}", path, std::strerror(errno))};
  if (!written.ok()) {
    ::unlink(temporary.c_str());
    return written;
  }
  return move_into_place(temporary, path, !marker.empty());
}

}  // namespace pipesim
