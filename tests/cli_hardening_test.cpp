// End-to-end, the classes of input that used to end pipesim badly: strings that are not UTF-8,
// closed pipes and full devices, malformed integer options, two outputs at one path, and inputs
// whose time or memory ran away (out of memory itself: cli_out_of_memory_test.cpp, which a sanitizer
// build skips). Each case runs the binary as a user does (cli_helpers.h).
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "cli_helpers.h"

using namespace pipesim::testing::cli;
using json = nlohmann::json;

namespace {

/// U+FFFD, which JSON, the trace and the SVG hold in place of each byte that is not UTF-8.
const std::string kReplacement = "\xEF\xBF\xBD";

std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

/// `text` as one line of its own: pipesim's every failure is one line on standard error.
bool one_line(const std::string& text) { return !text.empty() && text.find('\n') == text.size() - 1; }

/// Runs a shell command line and returns the exit status of `pipesim ARGS` alone, its standard output
/// read by `reader` (a pipe that may close early), and its standard error.
Output run_into(const std::string& args, const std::string& reader) {
  const auto dir = scratch_dir();
  const std::string status = (dir / "status").string(), error = (dir / "stderr").string();
  run_command("{ " + pipesim_binary() + " " + args + " 2>" + error + "; echo $? >" + status + "; } | " + reader);
  return {std::stoi(read_file(status)), read_file(error)};
}

}  // namespace

TEST_CASE("a file name, --set, --grid, --schedule-file or --preset that is not UTF-8 never ends the program") {
  const auto dir = scratch_dir();
  const std::string config = (dir / "config\xff.json").string();
  std::filesystem::copy_file(::config("tiny.json"), config, std::filesystem::copy_options::overwrite_existing);
  const std::string replaced = (dir / ("config" + kReplacement + ".json")).string();

  SECTION("JSON reports, compare and tune") {
    const Output simulated = run("simulate '" + config + "' --format json");
    REQUIRE(simulated.exit_code == 0);
    CHECK(json::parse(simulated.text)["config"] == replaced);
    const Output compared = run("compare '" + config + "' --schedules 1f1b --vocab baseline --format json");
    REQUIRE(compared.exit_code == 0);
    CHECK(json::parse(compared.text)[0]["config"] == replaced);
    const Output tuned = run("tune '" + config + "' --top 1 --format json");
    REQUIRE(tuned.exit_code == 0);
    CHECK(json::parse(tuned.text)["results"][0]["config"] == replaced);
  }
  SECTION("the trace and the SVG timeline") {
    const std::string trace = (dir / "trace.json").string(), svg = (dir / "timeline.svg").string();
    std::filesystem::remove(trace), std::filesystem::remove(svg);
    REQUIRE(run("simulate '" + config + "' --trace " + trace + " --svg " + svg).exit_code == 0);
    CHECK(json::parse(read_file(trace))["otherData"]["title"] == replaced + " 1f1b vocab-1 (simulated)");
    const std::string picture = read_file(svg);
    CHECK(picture.find(replaced + ": 1f1b / vocab-1") != std::string::npos);
    CHECK(picture.find('\xff') == std::string::npos);
  }
  SECTION("a measured run's report, trace and profile") {
    const std::string trace = (dir / "measured.json").string(), profile = (dir / "profile.json").string();
    std::filesystem::remove(trace), std::filesystem::remove(profile);
    const Output out = run("run '" + config + "' --format json --trace " + trace + " --profile " + profile);
    REQUIRE(out.exit_code == 0);
    CHECK(json::parse(out.text)["config"] == replaced);
    CHECK(json::parse(read_file(profile))["config"] == replaced);
    CHECK(json::parse(read_file(trace))["otherData"]["title"].get<std::string>().starts_with(replaced));
  }
  SECTION("a --set value and a --grid value") {
    const Output set = run_stderr("simulate " + ::config("tiny.json") + " --set 'schedule.name=\xff' --format json");
    CHECK(set.exit_code == 1);
    CHECK(one_line(set.text));
    const Output grid = run("sweep " + ::config("tiny.json") + " --grid 'schedule.name=\xfe,1f1b' --format json");
    REQUIRE(grid.exit_code == 0);
    const json rows = json::parse(grid.text);
    REQUIRE(rows.size() == 2);
    CHECK(rows[0]["schedule.name"] == kReplacement);
    // The grid point is a --set, refused for its byte as any --set is (and the row says so).
    CHECK(rows[0]["error"].get<std::string>().find("is not UTF-8 text") != std::string::npos);
    CHECK(rows[1]["schedule"] == "1f1b");
  }
  SECTION("a --schedule-file path") {
    const std::string csv = (dir / "orders\xff.csv").string();
    std::filesystem::remove(csv);
    REQUIRE(run("export " + ::config("tiny.json") + " -o '" + csv + "'").exit_code == 0);
    const Output out = run("simulate " + ::config("tiny.json") + " --schedule-file '" + csv + "' --format json");
    REQUIRE(out.exit_code == 0);
    CHECK(json::parse(out.text)["schedule"] == "file:" + (dir / ("orders" + kReplacement + ".csv")).string());
  }
  SECTION("calibrate --preset") {
    const std::string ops = (dir / "ops.json").string();
    std::ofstream(ops) << R"({"ops": [{"flops": 1e12, "bytes": 1e6, "ms": 3}, {"flops": 1e9, "bytes": 1e9, "ms": 1},
                                      {"flops": 0, "bytes": 0, "ms": 0.01}]})";
    const Output out = run_stderr("calibrate " + ops + " --preset '\xff'");
    CHECK(out.exit_code == 1);
    CHECK(out.text == "pipesim: error: --preset: hardware.preset: unknown preset '" + kReplacement +
                          "'. Presets: a100-80gb, h100-sxm, h100-96gb-500w, h200\n");
  }
  std::filesystem::remove_all(dir);
}

TEST_CASE("no exception leaves pipesim: every failure is one line and status 1") {
  // Values read as a config field of another type: the field's error, or at worst one line saying
  // it is pipesim's fault, never an abort.
  for (const std::string set : {"model.layers=\xff", "parallel.pp=\xff", "costs.forward_ms=\xff",
                                "schedule.layers_per_stage=\xff", "precision.flash_attention=\xff"}) {
    const Output out = run_stderr("simulate " + config("default.json") + " --set '" + set + "'");
    INFO(set);
    CHECK(out.exit_code == 1);
    CHECK(one_line(out.text));
    CHECK(out.text.starts_with("pipesim: "));
  }
}

TEST_CASE("a reader that stops reading ends pipesim quietly; a full device or no file is an error") {
  // Larger than a pipe's buffer, so that pipesim is still writing when `head` has gone.
  for (const std::string& args : {"export " + config("default.json") + " --set parallel.microbatches=4096",
                                 "sweep " + config("tiny.json") + " --grid hardware.kernel_launch_us=1,2,3,4,5,6,7,8 "
                                 "--grid parallel.microbatches=1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16 --format json",
                                 std::string("--help")}) {
    const Output out = run_into(args, "head -c1 >/dev/null");
    INFO(args);
    CHECK(out.exit_code == 0);
    CHECK(out.text.empty());
  }
  const Output help = run_stderr("--help", ">/dev/full");
  CHECK(help.exit_code == 1);
  CHECK(help.text == "pipesim: error: cannot write to standard output: No space left on device\n");
  const Output command_help = run_stderr("sweep --help", ">/dev/full");
  CHECK(command_help.exit_code == 1);
  CHECK(command_help.text == "pipesim: error: cannot write to standard output: No space left on device\n");
  // An empty output path wrote nothing and said nothing.
  const auto dir = scratch_dir();
  std::ofstream(dir / "ops.json") << R"({"ops": [{"flops": 1e12, "bytes": 1e6, "ms": 3},
                                                {"flops": 1e9, "bytes": 1e9, "ms": 1},
                                                {"flops": 0, "bytes": 0, "ms": 0.01}]})";
  for (const std::string option : {"-o", "--preset"}) {
    const Output out = run_stderr("calibrate " + (dir / "ops.json").string() + " " + option + " ''");
    INFO(option);
    CHECK(out.exit_code == 1);
    CHECK(out.text == "pipesim: error: " + std::string(option == "-o" ? "--output" : option) +
                          ": an empty value; give one, or leave the option out (see pipesim --help)\n");
  }
  std::filesystem::remove_all(dir);
}

TEST_CASE("integer options take whole numbers; one file is not two outputs") {
  const auto dir = scratch_dir();
  const std::string d = dir.string(), tiny = config("tiny.json");
  const std::string help = " (see pipesim --help)\n";
  const std::pair<std::string, std::string> cases[] = {
      {"run " + tiny + " --steps 1.5", "--steps: '1.5' is not a whole number from 1 to 1000000" + help},
      {"run " + tiny + " --steps 1e3", "--steps: '1e3' is not a whole number from 1 to 1000000" + help},
      {"run " + tiny + " --steps 0", "--steps: '0' is not a whole number from 1 to 1000000" + help},
      {"run " + tiny + " --ranks 2.5", "--ranks: '2.5' is not a whole number from 1 to 64" + help},
      {"tune " + tiny + " --gpus 8.0", "--gpus: '8.0' is not a whole number from 1 to 16777216" + help},
      {"tune " + tiny + " --top 99999999999999999999",
       "--top: '99999999999999999999' is not a whole number from 1 to 1000000" + help},
      {"run " + tiny + " --trace " + d + "/x.json --profile " + d + "/./x.json",
       "--profile " + d + "/./x.json: the same file as --trace " + d + "/x.json; give each output a file of its own\n"},
      {"simulate " + tiny + " --trace " + d + "/x.svg --svg " + d + "/../" + dir.filename().string() + "/x.svg",
       "--svg " + d + "/../" + dir.filename().string() + "/x.svg: the same file as --trace " + d +
           "/x.svg; give each output a file of its own\n"},
  };
  for (const auto& [args, message] : cases) {
    const Output out = run_stderr(args);
    INFO(args);
    CHECK(out.exit_code == 1);
    CHECK(out.text == "pipesim: error: " + message);
  }
  // Refused before anything was written.
  CHECK(!std::filesystem::exists(dir / "x.json"));
  CHECK(!std::filesystem::exists(dir / "x.svg"));
  std::filesystem::remove_all(dir);
}

TEST_CASE("inputs whose work would run away are refused, naming the field") {
  const auto dir = scratch_dir();
  const std::string d = dir.string();
  // A layer op of a profile is the device's share of the layers, layers / pp of them.
  const std::string profile = R"({"model": {"layers": 8, "hidden": 64, "heads": 4, "seq_len": 32, "vocab": 128},
                                  "costs": {"forward_ms": [1.0], "backward_ms": [2.0]}, "pp": )";
  for (const std::string pp : {"2e-5", "0", "1.5", "1025", "\"4\""}) {
    std::ofstream(dir / "profile.json") << profile << pp << "}";
    const Output out = run_stderr("calibrate " + d + "/profile.json");
    INFO(pp);
    CHECK(out.exit_code == 1);
    CHECK(out.text == "pipesim: error: " + d + "/profile.json: pp: expected the pipeline devices the profile was "
                      "measured on, a whole number from 1 to 1024 (as `pipesim run --profile` writes)\n");
  }
  // The fit's time grows with the ops measured.
  std::string ops = R"({"ops": [)";
  for (int i = 0; i < 100'000; ++i) ops += R"({"flops": 1e9, "bytes": 1e6, "ms": 0.1}, )";
  std::ofstream(dir / "ops.json") << ops << R"({"flops": 1e9, "bytes": 1e6, "ms": 0.1}]})";
  const Output many = run_stderr("calibrate " + d + "/ops.json");
  CHECK(many.exit_code == 1);
  CHECK(many.text == "pipesim: error: " + d + "/ops.json: more than 100000 measured ops in the profiles so far; the fit "
                     "takes about a second per 10,000: give fewer or smaller profiles\n");
  std::filesystem::remove_all(dir);
}

TEST_CASE("a note on a slow plan is given once, however many plans of the config a sweep or tune makes") {
  // Two points of about 21 million tasks (a note each, before the schedule refuses them at once:
  // interleaved-1f1b needs a multiple of pp microbatches).
  const Output out = run_stderr("sweep " + config("default.json") + " --set schedule.name=interleaved-1f1b "
                                "--grid parallel.microbatches=190001,190003");
  CHECK(out.exit_code == 1);
  CHECK(out.text == "pipesim: note: " + config("default.json") + ": about 21 million tasks (~5.5 GiB); building and "
                    "simulating may take minutes\npipesim: error: no point of the sweep could run; the error column "
                    "says why\n");
}
