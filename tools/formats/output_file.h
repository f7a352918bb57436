#pragma once
/// An output written a piece at a time, for outputs too large to hold whole (a Chrome trace of a large
/// run is several times the simulation's memory). write_output_file (files.h) is one in a single piece. The
/// pieces go to an exclusively created temporary next to `path` and an atomic rename puts the finished
/// file in place, so a failure or a crash never leaves half a file at `path`; an existing `path` is
/// replaced only when it is a regular file that starts with `marker`, and never when `marker` is empty.
#include <string>
#include <string_view>

#include "status.h"

namespace pipesim {

class OutputFile {
 public:
  /// Refuses, before anything is written, what write_output_file refuses, with the same messages.
  static Result<OutputFile> create(const std::string& path, std::string_view marker);
  OutputFile(OutputFile&& other) noexcept;
  OutputFile& operator=(OutputFile&&) = delete;
  OutputFile(const OutputFile&) = delete;
  OutputFile& operator=(const OutputFile&) = delete;
  /// An output never committed leaves nothing behind.
  ~OutputFile();

  /// Appends `piece`. The first piece must start with the marker (as write_output_file's content must).
  Status write(std::string_view piece);
  /// Closes the file and moves it into place; after an error nothing is left behind.
  Status commit();

 private:
  OutputFile(std::string path, std::string temporary, std::string marker, int fd);
  void discard();

  std::string path_;
  std::string temporary_;  ///< empty once moved into place or removed
  std::string marker_;
  int fd_ = -1;
  bool started_ = false;  ///< a piece has been written
};

}  // namespace pipesim
