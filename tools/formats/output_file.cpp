#include "output_file.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <utility>

namespace pipesim {
namespace {

Error exists(const std::string& path) {
  return Error{fmt::format("{}: exists; refusing to overwrite it (choose another path or remove the file)", path)};
}

/// An existing `path` may be replaced only when it is a regular file that starts with `marker`.
Status check_replaceable(const std::string& path, std::string_view marker) {
  const Error refusal{fmt::format("{}: exists and was not written by pipesim; refusing to overwrite it (choose another "
                                  "path or remove the file)",
                                  path)};
  struct stat info {};
  if (::lstat(path.c_str(), &info) != 0) return Status::Ok();  // nothing there (yet)
  if (marker.empty()) return exists(path);
  if (!S_ISREG(info.st_mode)) return refusal;
  const int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  std::string head(marker.size(), '\0');
  const bool ours = fd >= 0 && ::read(fd, head.data(), head.size()) == ssize_t(head.size()) && head == marker;
  if (fd >= 0) ::close(fd);
  return ours ? Status::Ok() : Status(refusal);
}

}  // namespace

Result<OutputFile> OutputFile::create(const std::string& path, std::string_view marker) {
  if (Status s = check_replaceable(path, marker); !s.ok()) return s.error();
  // Next to the target (same file system, so the rename is atomic), created exclusively: an
  // existing file or symlink of that name is never opened, let alone written through.
  const std::filesystem::path target(path);
  std::string temporary = (target.parent_path() / ("." + target.filename().string() + ".pipesim-XXXXXX")).string();
  const int fd = ::mkstemp(temporary.data());
  if (fd < 0) return Error{fmt::format("{}: cannot create a file next to it: {}", path, std::strerror(errno))};
  const mode_t umask_bits = ::umask(0);
  ::umask(umask_bits);
  ::fchmod(fd, 0666 & ~umask_bits);  // mkstemp's 0600 is for the temporary only
  return OutputFile(path, std::move(temporary), std::string(marker), fd);
}

OutputFile::OutputFile(std::string path, std::string temporary, std::string marker, int fd)
    : path_(std::move(path)), temporary_(std::move(temporary)), marker_(std::move(marker)), fd_(fd) {}

OutputFile::OutputFile(OutputFile&& other) noexcept
    : path_(std::move(other.path_)),
      temporary_(std::exchange(other.temporary_, {})),
      marker_(std::move(other.marker_)),
      fd_(std::exchange(other.fd_, -1)),
      started_(other.started_) {}

OutputFile::~OutputFile() { discard(); }

void OutputFile::discard() {
  if (fd_ >= 0) ::close(std::exchange(fd_, -1));
  if (!temporary_.empty()) ::unlink(std::exchange(temporary_, {}).c_str());
}

Status OutputFile::write(std::string_view piece) {
  if (fd_ < 0) return Error{fmt::format("{}: internal error: written after it was finished", path_)};
  if (!started_ && !piece.starts_with(marker_))
    return Error{fmt::format("{}: internal error: the output does not start with its marker", path_)};
  started_ = true;
  while (!piece.empty()) {
    const ssize_t n = ::write(fd_, piece.data(), piece.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const Error failed{fmt::format("{}: write failed: {}", path_, std::strerror(n < 0 ? errno : EIO))};
      discard();
      return failed;
    }
    piece.remove_prefix(std::size_t(n));
  }
  return Status::Ok();
}

Status OutputFile::commit() {
  if (fd_ < 0) return Error{fmt::format("{}: internal error: written after it was finished", path_)};
  if (::close(std::exchange(fd_, -1)) != 0) {  // a delayed write failure
    const Error failed{fmt::format("{}: write failed: {}", path_, std::strerror(errno))};
    discard();
    return failed;
  }
  const bool replace = !marker_.empty();
  int result = replace ? std::rename(temporary_.c_str(), path_.c_str())
                       : ::renameat2(AT_FDCWD, temporary_.c_str(), AT_FDCWD, path_.c_str(), RENAME_NOREPLACE);
  if (!replace && result != 0 && (errno == EINVAL || errno == ENOSYS)) {  // a file system without it: link instead
    result = ::link(temporary_.c_str(), path_.c_str());
    if (result == 0) ::unlink(temporary_.c_str());
  }
  if (result == 0) {
    temporary_.clear();
    return Status::Ok();
  }
  const int error = errno;
  discard();
  if (error == EEXIST) return exists(path_);
  return Error{fmt::format("{}: cannot move the finished file into place: {}", path_, std::strerror(error))};
}

}  // namespace pipesim
