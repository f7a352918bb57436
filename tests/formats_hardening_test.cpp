// Hostile inputs to the file formats: every one is refused quickly, with one message naming the file
// (or the --set flag), the place and the reason, and nothing crashes, hangs or grows without bound.
#include <sys/stat.h>

#include <chrono>
#include <filesystem>
#include <fstream>

#include "config_includes.h"
#include "files.h"
#include "helpers.h"
#include "schedule_csv.h"

using namespace pipesim;
using namespace pipesim::testing;

namespace {

const std::string kBase = R"json({"model": {"layers": 8, "hidden": 64, "heads": 4, "seq_len": 32, "vocab": 1000},
  "parallel": {"pp": 4, "microbatches": 8})json";

/// A fresh folder for one test's files, removed at the end.
struct Scratch {
  std::filesystem::path dir;
  explicit Scratch(const std::string& name) : dir(std::filesystem::temp_directory_path() / ("pipesim-hardening-" + name)) {
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
  }
  ~Scratch() { std::filesystem::remove_all(dir); }
  std::string write(const std::string& name, const std::string& text) const {
    std::ofstream(dir / name, std::ios::binary) << text;
    return path(name);
  }
  std::string path(const std::string& name) const { return (dir / name).string(); }
};

}  // namespace

TEST_CASE("only regular files are read, and anything else is named for what it is") {
  const Scratch s("files");
  REQUIRE(::mkfifo(s.path("fifo").c_str(), 0600) == 0);
  // A FIFO used to block until a writer came; a device such as /dev/zero was read until the size cap.
  const std::pair<std::string, std::string> cases[] = {
      {s.path("fifo"), s.path("fifo") + ": is not a regular file (a FIFO); give a file"},
      {"/dev/zero", "/dev/zero: is not a regular file (a character device); give a file"},
      {"/dev/null", "/dev/null: is not a regular file (a character device); give a file"},
      {s.dir.string(), s.dir.string() + ": is a directory; give a file"},
      {s.path("nothing.json"), s.path("nothing.json") + ": cannot open: No such file or directory"},
  };
  for (const auto& [path, message] : cases) {
    CAPTURE(path);
    Result<std::string> text = read_text_file(path);
    REQUIRE_FALSE(text.ok());
    CHECK(text.error().message == message);
    // The config and the schedule file are read the same way.
    Result<Config> config = load_config(path, {});
    REQUIRE_FALSE(config.ok());
    CHECK(config.error().message == message);
    Result<std::optional<CustomSchedule>> csv = load_schedule_file(path, parse_or_fail(kBase + "}"));
    REQUIRE_FALSE(csv.ok());
    CHECK(csv.error().message == message);
  }
  // The size cap is checked before reading.
  const std::string big = s.write("big.json", std::string(100, ' '));
  Result<std::string> text = read_text_file(big, 99);
  REQUIRE_FALSE(text.ok());
  CHECK(text.error().message == big + ": larger than 0 MiB; pipesim reads small text files (is it the right file?)");
  CHECK(read_text_file(big, 100).value() == std::string(100, ' '));
}

TEST_CASE("bytes that do not show are written as \\xNN in messages") {
  CHECK(visible("0F0") == "0F0");
  CHECK(visible("\xEF\xBB\xBF" "0F0") == "\\xEF\\xBB\\xBF0F0");
  CHECK(visible(std::string("a\0b\tc\x7f", 6)) == "a\\x00b\\x09c\\x7F");
}
