// tune end to end: its rows with their rank and knobs, measured against yours; --fix; --write-config,
// whose file simulate runs to the row's numbers; and the memory a fitting row leaves free.
//
// The full search of configs/default.json (33,699 candidates) runs once, for every test that reads it
// (full_search); the others search spaces of a few hundred candidates, pinned with --fix, in seconds
// under the sanitizers.
#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli_helpers.h"
#include "report.h"
#include "schedule.h"

using json = nlohmann::json;
using namespace pipesim::testing::cli;

namespace {

std::string file_text(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

json file_json(const std::filesystem::path& path) { return json::parse(file_text(path)); }

/// `pipesim tune ARGS --format json`, which must succeed.
json tune_json(const std::string& args) {
  const Output out = run("tune " + args + " --format json");
  REQUIRE(out.exit_code == 0);
  return json::parse(out.text);
}

/// A config file's field, or its default when the file leaves it out.
int field(const json& config, const char* block, const char* key, int fallback) {
  return config.contains(block) && config[block].contains(key) ? config[block][key].get<int>() : fallback;
}

/// The divisors of n, in increasing order: the values a pp x tp x dp factorisation can give pp.
std::string divisors(int n) {
  std::string out;
  for (int d = 1; d <= n; ++d)
    if (n % d == 0) out += (out.empty() ? "" : ", ") + std::to_string(d);
  return out;
}

/// The pins that keep a search of default.json to its config's schedule and vocabulary mode: 486
/// candidates at 8 GPUs, where pp, tp, dp, sp, the micro-batch, recomputation and ZeRO still vary.
const std::string kDefaultPins = " --fix schedule=1f1b --fix vocab=baseline --fix fp8=none";
/// The same for tiny.json: 4 microbatches (its global batch of 16 sequences in microbatches of 4, 2 or
/// 1 at dp 1, 2 or 4) and vocab-1, its config's mode: 468 candidates at 4 GPUs, every schedule among them.
const std::string kTinyPins = " --fix m=4 --fix vocab=vocab-1";

/// `pipesim tune configs/default.json --top 10 --format json`: the whole search, run once.
const json& full_search() {
  static const json result = tune_json(config("default.json") + " --top 10");
  return result;
}

/// A fresh folder for one test's files.
std::filesystem::path fresh_dir(const std::string& name) {
  const std::filesystem::path dir = scratch_dir() / name;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

}  // namespace

TEST_CASE("tune prints its top rows with what each changes, and its best beats compare's best that fits") {
  const json& r = full_search();
  CHECK(r["evaluated"].get<int>() == r["simulated"].get<int>() + r["pruned"].get<int>() + r["refused"].get<int>());
  CHECK(r["pruned"].get<int>() > 0);
  CHECK(r["seconds"].get<double>() > 0);
  REQUIRE(r["results"].size() == 10);
  for (const json& row : r["results"]) {
    for (const char* key : {"schedule", "vocab", "pp", "tp", "dp", "microbatches", "tokens_per_s", "peak_memory_bytes",
                            "fits_in_memory", "devices", "changes"})
      CHECK(row.contains(key));
    CHECK(row["fits_in_memory"] == true);
  }
  CHECK(r["results"][0]["tokens_per_s"].get<double>() >= r["results"][9]["tokens_per_s"].get<double>());
  double best = 0;
  for (const json& row : json::parse(run("compare " + config("default.json") + " --format json").text))
    if (row["fits_in_memory"] == true) best = std::max(best, row["tokens_per_s"].get<double>());
  CHECK(r["results"][0]["tokens_per_s"].get<double>() >= best);

  const Output csv = run("tune " + config("default.json") + kDefaultPins + " --top 3 --format csv");
  REQUIRE(csv.exit_code == 0);
  CHECK_THAT(csv.text, Catch::StartsWith("rank,config,schedule,vocab,pp,tp,dp,cp,sp,m,mbs,chunks,recompute,zero,fp8,iter_ms,"
                                         "tokens_per_s,tokens_per_s_per_gpu,mfu_pct,bubble_pct,peak_mem_gib,speedup,"
                                         "speedup_per_gpu,mem_vs_first,fits,headroom_gib,changes\n"));
  CHECK(std::count(csv.text.begin(), csv.text.end(), '\n') == 5);  // the header, yours, the top 3
  CHECK(csv.text.find(",\"pp 8→") != std::string::npos);  // the changes hold commas: quoted
}

TEST_CASE("tune measures its rows against the config as given, shown as yours, even when it cannot run") {
  const json& r = full_search();
  CHECK(r["reference"] == "yours");
  const json& yours = r["yours"];
  CHECK(yours["schedule"] == "1f1b");
  CHECK(yours["vocab"] == "baseline");
  CHECK(yours["speedup"] == 1.0);
  CHECK(yours["reference"] == true);
  CHECK(yours["changes"] == "yours");
  const double base = yours["tokens_per_s"].get<double>();
  for (const json& row : r["results"]) {
    CHECK(row["reference"] == false);
    CHECK(row["speedup"].get<double>() == Approx(row["tokens_per_s"].get<double>() / base));
  }
  const Output text = run("tune " + config("default.json") + kDefaultPins + " --top 3");
  REQUIRE(text.exit_code == 0);
  CHECK(text.text.find("\n   -  " + config("default.json") + "  1f1b ") != std::string::npos);  // yours has no rank
  CHECK(text.text.find("  yours\n") != std::string::npos);  // the first row, right under the header
  CHECK(text.text.find("  yours\n") < text.text.find("  pp 8→"));
  CHECK_THAT(text.text, Catch::EndsWith("\nspeedup = tokens/s ÷ those of yours (the config as given); mem_vs_first = "
                                        "peak memory ÷ its peak memory\n"));

  // Yours over the memory cap: still the reference, with why it does not fit (30 GiB less the preset's
  // 3 GiB reserved).
  const json tight = tune_json(config("default.json") + kDefaultPins + " --top 1 --memory-gib 30");
  CHECK(tight["reference"] == "yours");
  CHECK(tight["yours"]["fits_in_memory"] == false);
  CHECK_THAT(tight["yours"]["changes"].get<std::string>(),
             Catch::Matches("yours, which does not fit: [0-9.]+ GiB on its fullest device, over 27.00 GiB"));

  // Yours cannot run (DualPipeV needs m >= 2p): shown with the error; the fastest row is the reference.
  const std::string cannot =
      "tune " + config("tiny.json") + kTinyPins + " --top 2 --set schedule.name=dualpipe-v "
      "--set parallel.microbatches=4";
  const json failed = json::parse(run(cannot + " --format json").text);
  CHECK(failed["reference"] == "results[0]");
  CHECK(failed["yours"]["schedule"] == "dualpipe-v");
  CHECK_THAT(failed["yours"]["error"].get<std::string>(), Catch::StartsWith(config("tiny.json") + ": "));
  CHECK_THAT(failed["yours"]["changes"].get<std::string>(), Catch::StartsWith("yours, which cannot run: "));
  CHECK(failed["results"][0]["reference"] == true);
  CHECK(failed["results"][0]["speedup"] == 1.0);
  const Output failed_text = run(cannot);
  CHECK(failed_text.text.find("  -  yours, which cannot run: " + config("tiny.json") + ": ") != std::string::npos);
  CHECK_THAT(failed_text.text, Catch::EndsWith("\nspeedup = tokens/s ÷ those of rank 1 (the fastest; yours cannot "
                                               "run); mem_vs_first = peak memory ÷ its peak memory\n"));
}

TEST_CASE("tune --gpus shows tokens/s and the speedup per GPU beside the totals") {
  // tiny.json runs on 4 GPUs (pp 4); the rows on 8. Per GPU, a row's speedup is its total speedup x 4 / 8.
  const std::string args = config("tiny.json") + kTinyPins + " --gpus 8 --top 3";
  const json r = tune_json(args);
  const json& yours = r["yours"];
  CHECK(yours["tokens_per_s_per_gpu"].get<double>() == Approx(yours["tokens_per_s"].get<double>() / 4));
  CHECK(yours["speedup_per_gpu"] == 1.0);
  REQUIRE(r["results"].size() == 3);
  for (const json& row : r["results"]) {
    CHECK(row["pp"].get<int>() * row["tp"].get<int>() * row["dp"].get<int>() * row["cp"].get<int>() == 8);
    CHECK(row["tokens_per_s_per_gpu"].get<double>() == Approx(row["tokens_per_s"].get<double>() / 8));
    CHECK(row["speedup_per_gpu"].get<double>() == Approx(row["speedup"].get<double>() * 4 / 8));
  }
  // The table's cells say the same, each beside its total.
  const Output csv = run("tune " + args + " --format csv");
  REQUIRE(csv.exit_code == 0);
  std::istringstream lines(csv.text);
  std::string header, first;
  std::getline(lines, header);
  std::getline(lines, first);  // yours
  std::getline(lines, first);  // rank 1
  const auto cell = [](const std::string& line, std::size_t column) {
    std::size_t at = 0;
    for (std::size_t c = 0; c < column; ++c) at = line.find(',', at) + 1;
    return line.substr(at, line.find(',', at) - at);
  };
  CHECK(cell(header, 17) == "tokens_per_s_per_gpu");
  CHECK(cell(header, 22) == "speedup_per_gpu");
  const json& best = r["results"][0];
  CHECK(cell(first, 16) == fmt::format("{:.0f}", best["tokens_per_s"].get<double>()));
  CHECK(cell(first, 17) == fmt::format("{:.0f}", best["tokens_per_s_per_gpu"].get<double>()));
  CHECK(cell(first, 21) == fmt::format("{:.3f}", best["speedup"].get<double>()));
  CHECK(cell(first, 22) == fmt::format("{:.3f}", best["speedup_per_gpu"].get<double>()));
}

TEST_CASE("tune's progress bar is never drawn through a pipe") {
  // Standard error through a pipe: notes only, never a bar. cli_terminal_test draws it on a terminal.
  for (const char* format : {"text", "json", "csv"}) {
    // The bar starts drawn.
    const Output piped = run_stderr("tune " + config("tiny.json") + kTinyPins + " --format " + format);
    CHECK(piped.exit_code == 0);
    CHECK(piped.text.find('\r') == std::string::npos);
  }
}

TEST_CASE("tune says what would fit when nothing does") {
  const Output out = run_stderr("tune " + config("default.json") + kDefaultPins + " --memory-gib 10");
  CHECK(out.exit_code == 1);
  CHECK_THAT(out.text, Catch::StartsWith("pipesim: error: " + config("default.json") + ": nothing fits in 7.00 GiB per "
                                         "device (hardware.memory_gib, or --memory-gib, less hardware.reserved_gib 3.00): the "
                                         "smallest peak memory of any candidate is "));
  CHECK_THAT(out.text, Catch::Contains(" GiB, on device "));
  CHECK_THAT(out.text, Catch::Contains("; raise --memory-gib to at least "));
  CHECK_THAT(out.text, Catch::EndsWith(" or give more --gpus than 8, or drop a --fix\n"));
  // More GPUs make room (one schedule and vocabulary mode are enough to show it).
  CHECK(run_stderr("tune " + config("default.json") + kDefaultPins + " --gpus 64 --memory-gib 10").exit_code == 0);
}

TEST_CASE("tune shows each row's rank, pp, tp, dp, cp, sp, microbatches, micro-batch size, chunks, recomputation "
          "and ZeRO") {
  const json shipped = file_json(config("default.json"));
  const int pp = field(shipped, "parallel", "pp", 1), tp = field(shipped, "parallel", "tp", 1),
            dp = field(shipped, "parallel", "dp", 1), cp = field(shipped, "parallel", "cp", 1),
            m = field(shipped, "parallel", "microbatches", 1), mbs = field(shipped, "model", "micro_batch_size", 1);
  const bool sp = shipped["parallel"].value("sequence_parallel", true);
  // At 24 GiB the fastest rows recompute (docs/tune.md): both kinds of recompute cell are shown.
  const std::string args = config("default.json") + kDefaultPins + " --top 6 --memory-gib 24";
  const json r = tune_json(args);
  const json& yours = r["yours"];
  CHECK_FALSE(yours.contains("rank"));
  CHECK(yours["pp"] == pp);
  CHECK(yours["tp"] == tp);
  CHECK(yours["dp"] == dp);
  CHECK(yours["cp"] == cp);
  CHECK(yours["sequence_parallel"] == sp);
  CHECK(yours["microbatches"] == m);
  CHECK(yours["micro_batch_size"] == mbs);
  // The config says chunks 2 and runs 1F1B: the chunks shown are the schedule's own.
  CHECK(yours["chunks"] == pipesim::find_schedule(shipped["schedule"]["name"])->chunks);
  CHECK(yours["recompute_granularity"] == "none");
  CHECK_FALSE(yours.contains("recompute_method"));
  CHECK(yours["zero_stage"] == 0);

  bool recomputes = false;
  REQUIRE(r["results"].size() == 6);
  for (std::size_t i = 0; i < r["results"].size(); ++i) {
    const json& row = r["results"][i];
    const std::string changes = row["changes"];
    INFO(changes);
    CHECK(row["rank"] == i + 1);
    // Every row runs the config's GPUs and global batch.
    CHECK(row["pp"].get<int>() * row["tp"].get<int>() * row["dp"].get<int>() * row["cp"].get<int>() ==
          pp * tp * dp * cp);
    CHECK(row["microbatches"].get<int>() * row["micro_batch_size"].get<int>() * row["dp"].get<int>() == m * mbs * dp);
    CHECK((changes.find("cp ") != std::string::npos) == (row["cp"] != cp));
    CHECK((changes.find("sp o") != std::string::npos) == (row["sequence_parallel"] != sp));
    const bool full = changes.find("recompute full") != std::string::npos;
    recomputes = recomputes || full;
    CHECK(row["recompute_granularity"] == (full ? "full" : "none"));
    CHECK(row.contains("recompute_method") == full);
    if (full) {  // what tune tries: uniform groups of one layer, or the first half of each virtual stage's layers
      const int layers = file_json(config("hf/llama-3-8b.json"))["num_hidden_layers"];  // default.json's hf_config
      const int half = layers / (row["pp"].get<int>() * row["chunks"].get<int>()) / 2;
      CHECK(((row["recompute_method"] == "uniform" && row["recompute_num_layers"] == 1) ||
             (row["recompute_method"] == "block" && row["recompute_num_layers"] == half)));
    }
    const std::size_t zero = changes.find("zero 0→");
    CHECK(row["zero_stage"] == (zero == std::string::npos ? 0 : changes[zero + std::string("zero 0→").size()] - '0'));
  }
  CHECK(recomputes);

  // The table shows the same values, in columns named as --fix takes them; the search is deterministic.
  const Output csv = run("tune " + args + " --format csv");
  REQUIRE(csv.exit_code == 0);
  std::istringstream lines(csv.text);
  std::string line;
  std::getline(lines, line);
  CHECK(line == "rank,config,schedule,vocab,pp,tp,dp,cp,sp,m,mbs,chunks,recompute,zero,fp8,iter_ms,tokens_per_s,"
                "tokens_per_s_per_gpu,mfu_pct,bubble_pct,peak_mem_gib,speedup,speedup_per_gpu,mem_vs_first,fits,"
                "headroom_gib,changes");
  for (int k = -1; k < 6 && std::getline(lines, line); ++k) {
    const json& row = k < 0 ? yours : r["results"][std::size_t(k)];
    std::vector<std::string> cells;  // the first fifteen: none of them holds a comma
    for (std::size_t at = 0; cells.size() < 15; at = line.find(',', at) + 1)
      cells.push_back(line.substr(at, line.find(',', at) - at));
    std::string recompute = row["recompute_granularity"];
    if (row.contains("recompute_method"))
      recompute += "/" + row["recompute_method"].get<std::string>() + "/" + row["recompute_num_layers"].dump();
    CHECK(cells == std::vector<std::string>{k < 0 ? "-" : std::to_string(k + 1), row["config"], row["schedule"],
                                            row["vocab"], row["pp"].dump(), row["tp"].dump(), row["dp"].dump(),
                                            row["cp"].dump(), row["sequence_parallel"] == true ? "on" : "off",
                                            row["microbatches"].dump(), row["micro_batch_size"].dump(),
                                            row["chunks"].dump(), recompute, row["zero_stage"].dump(),
                                            row["fp8"].is_null() ? "none" : row["fp8"].get<std::string>()});
  }
}

TEST_CASE("tune --fix keeps the search to one value of a knob, or a list of them, by its column name or config key") {
  // tiny's space fits whole, so --top beyond it lists every candidate that runs, fastest first: a
  // search with one more pin must give exactly the first rows of it with the pinned value. The space is
  // kTinyPins' few hundred candidates, or for the knobs those pin, the same with the schedule and
  // recomputation pinned instead.
  const std::string tiny = config("tiny.json");
  const std::string schedule_pins = " --fix schedule=1f1b --fix recompute=none";
  std::map<std::string, json> all;  // each space's whole search, by its pins
  for (const std::string& pins : {kTinyPins, schedule_pins}) {
    all[pins] = tune_json(tiny + pins + " --top 100000");
    REQUIRE(all[pins]["results"].size() > 100);
  }
  struct Case {
    std::string fix;
    const char* field;
    json value;
    std::string pins = kTinyPins;
  };
  for (const Case& c : std::vector<Case>{{"pp=2", "pp", 2},
                                         {"parallel.tp=2", "tp", 2},
                                         {"dp=2", "dp", 2},
                                         {"m=4", "microbatches", 4, schedule_pins},
                                         {"model.micro_batch_size=1", "micro_batch_size", 1},
                                         {"chunks=4", "chunks", 4},
                                         {"schedule=zb-v", "schedule", "zb-v"},
                                         {"schedule.vocab=vocab-2", "vocab", "vocab-2", schedule_pins},
                                         {"recompute=full", "recompute_granularity", "full"},
                                         {"zero_stage=1", "zero_stage", 1},
                                         {"training.zero_stage=3", "zero_stage", 3}}) {
    INFO("--fix " + c.fix + c.pins);
    std::vector<std::pair<std::string, double>> expected;
    for (const json& row : all[c.pins]["results"])
      if (row[c.field] == c.value && expected.size() < 3)
        expected.emplace_back(row["changes"], row["iteration_time_s"]);
    REQUIRE(expected.size() == 3);
    const json pinned = tune_json(tiny + c.pins + " --top 3 --fix " + c.fix);
    std::vector<std::pair<std::string, double>> got;
    for (const json& row : pinned["results"]) got.emplace_back(row["changes"], row["iteration_time_s"]);
    CHECK(got == expected);
    CHECK(pinned["yours"]["changes"] == "yours");  // still shown, whatever it runs
    CHECK(pinned["evaluated"].get<int>() < all[c.pins]["evaluated"].get<int>());
  }
  // A list keeps what has any of its values: the first rows of the whole search with either mode.
  std::vector<std::pair<std::string, double>> either, listed;
  for (const json& row : all[schedule_pins]["results"])
    if ((row["vocab"] == "baseline" || row["vocab"] == "vocab-1") && either.size() < 3)
      either.emplace_back(row["changes"], row["iteration_time_s"]);
  const json list = tune_json(tiny + schedule_pins + " --top 3 --fix vocab=baseline,vocab-1");
  for (const json& row : list["results"]) listed.emplace_back(row["changes"], row["iteration_time_s"]);
  CHECK(listed == either);
  // Two pins keep what has both; a short name and a dotted key pin the same knob.
  const json both = tune_json(tiny + kTinyPins + " --top 2 --fix pp=2 --fix training.recompute_granularity=full");
  const json dotted = tune_json(tiny + kTinyPins + " --top 2 --fix parallel.pp=2 --fix recompute=full");
  REQUIRE(both["results"].size() == 2);
  for (std::size_t i = 0; i < 2; ++i) {
    CHECK(both["results"][i]["pp"] == 2);
    CHECK(both["results"][i]["recompute_granularity"] == "full");
    CHECK(both["results"][i]["changes"] == dotted["results"][i]["changes"]);
  }
}

TEST_CASE("tune --fix refuses an unknown key, a value the search never takes, a key twice, and pins nothing has") {
  const std::string tiny = config("tiny.json");
  const json shipped = file_json(tiny);
  const int gpus = field(shipped, "parallel", "pp", 1) * field(shipped, "parallel", "tp", 1) *
                   field(shipped, "parallel", "dp", 1);
  const std::string keys =
      "pp (parallel.pp), tp (parallel.tp), dp (parallel.dp), cp (parallel.cp), ep (parallel.ep), sp (sequence_parallel, "
      "parallel.sequence_parallel), m (microbatches, parallel.microbatches), mbs "
      "(micro_batch_size, model.micro_batch_size), chunks (parallel.chunks), schedule (schedule.name), vocab "
      "(schedule.vocab), recompute (recompute_granularity, training.recompute_granularity), zero (zero_stage, "
      "training.zero_stage), fp8 (precision.fp8)";
  std::string schedules;
  for (const std::string& name : pipesim::schedule_names()) schedules += (schedules.empty() ? "" : ", ") + name;
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"--fix ppp=2", "--fix 'ppp=2': unknown key 'ppp'; did you mean 'pp'? Keys: " + keys},
      {"--fix pp", "--fix 'pp': expected key=value, e.g. --fix pp=8 (or values, --fix pp=4,8); keys: " + keys},
      {"--fix pp=two", "--fix 'pp=two': pp takes a whole number, got 'two'"},
      {"--fix pp=3", fmt::format("--fix 'pp=3': the search on {} GPUs never takes pp 3. It takes {}", gpus,
                                 divisors(gpus))},
      // In a list, the value the search never takes is the one named.
      {"--fix pp=2,3", fmt::format("--fix 'pp=2,3': the search on {} GPUs never takes pp 3. It takes {}", gpus,
                                   divisors(gpus))},
      {"--fix schedule=zbv", fmt::format("--fix 'schedule=zbv': the search on {} GPUs never takes schedule zbv; did "
                                         "you mean 'zb-v'? It takes {}", gpus, schedules)},
      {"--fix pp=2 --fix parallel.pp=4", "--fix 'parallel.pp=4': pp is already fixed by --fix 'pp=2'; give each key once"},
      {fmt::format("--fix pp={} --fix dp=2", gpus),
       fmt::format("{}: no candidate on {} GPUs has all of --fix pp={}, --fix dp=2 (each on its own does); drop or "
                   "change one", tiny, gpus, gpus)},
  };
  for (const auto& [args, message] : cases) {
    const Output out = run_stderr("tune " + tiny + " " + args);
    CHECK(out.exit_code == 1);
    CHECK(out.text == "pipesim: error: " + message + "\n");
  }
}

TEST_CASE("tune --write-config writes the row of --rank as a config simulate runs to the row's numbers") {
  const std::filesystem::path dir = fresh_dir("write-config");
  struct Case {
    std::string args;
    int rank;  ///< 0: --rank left out (1)
    int global_batch = 0;  ///< the --set training.global_batch_size, which the file keeps; 0: none
  };
  // default.json pinned to its microbatch count and vocab-1: its top rows run interleaved-1f1b at 4 and
  // 8 chunks and, at 24 GiB, recompute.
  const std::string pins = " --fix m=32 --fix vocab=vocab-1";
  for (const Case& c : std::vector<Case>{{config("default.json") + pins + " --top 3", 0},
                                         {config("default.json") + pins + " --top 3", 3},
                                         {config("default.json") + pins + " --top 2 --memory-gib 24", 2},
                                         {config("tiny.json") + kTinyPins + " --top 2 --fix zero=1 --gpus 8", 1},
                                         // tiny's 16 sequences as a global batch, split on dp 2 as the row runs.
                                         {config("tiny.json") + kTinyPins +
                                              " --set training.global_batch_size=16 --top 1 --fix dp=2 --gpus 8",
                                          1, 16}}) {
    const std::filesystem::path file = dir / fmt::format("row-{}-{}.json", c.args.size(), c.rank);
    INFO(c.args << " --rank " << c.rank);
    const json tuned =
        tune_json(c.args + " --write-config " + file.string() + (c.rank ? " --rank " + std::to_string(c.rank) : ""));
    const json& row = tuned["results"][std::size_t(std::max(c.rank, 1) - 1)];
    const json written = file_json(file);
    CHECK(written["description"] ==
          fmt::format("written by pipesim tune from {}, rank {} of {}: {}", row["config"].get<std::string>(),
                      std::max(c.rank, 1), tuned["results"].size(), row["changes"].get<std::string>()));
    for (const char* block : {"model", "parallel", "schedule", "hardware", "precision", "training"})
      CHECK(written.contains(block));  // complete: nothing left to a preset's or a default's future value
    // A global batch is kept, and the microbatches left to follow from it (4 here: 16 / (mbs 2 x dp 2)).
    CHECK(written["parallel"].contains("microbatches") == (c.global_batch == 0));
    if (c.global_batch) CHECK(written["training"]["global_batch_size"] == c.global_batch);
    const Output simulated = run("simulate " + file.string() + " --format json");
    REQUIRE(simulated.exit_code == 0);
    const json s = json::parse(simulated.text);
    for (const char* key : {"schedule", "vocab", "pp", "tp", "dp", "chunks", "microbatches", "layers_per_stage",
                            "iteration_time_s", "tokens_per_s", "peak_memory_bytes", "memory_capacity_bytes",
                            "fits_in_memory"})
      CHECK(s[key] == row[key]);
    for (std::size_t d = 0; d < s["devices"].size(); ++d)
      CHECK(s["devices"][d]["peak_memory_bytes"] == row["devices"][d]["peak_memory_bytes"]);
  }
}

TEST_CASE("tune --write-config never replaces a file it did not write, and refuses a rank past the rows shown") {
  const std::filesystem::path dir = fresh_dir("write-config-refusals");
  const std::string tiny = config("tiny.json");
  const std::filesystem::path mine = dir / "mine.json", written = dir / "tuned.json", absent = dir / "absent.json";
  std::ofstream(mine) << "{\"model\": \"the user's\"}\n";
  const Output refused = run_stderr("tune " + tiny + " --write-config " + mine.string());
  CHECK(refused.exit_code == 1);
  CHECK(refused.text == "pipesim: error: --write-config: " + mine.string() +
                            ": exists and was not written by pipesim; refusing to overwrite it (choose another path "
                            "or remove the file)\n");
  CHECK(file_text(mine) == "{\"model\": \"the user's\"}\n");

  // Its own file a later --write-config replaces.
  REQUIRE(run("tune " + tiny + kTinyPins + " --top 2 --write-config " + written.string()).exit_code == 0);
  const json first = file_json(written);
  REQUIRE(run("tune " + tiny + kTinyPins + " --top 2 --rank 2 --write-config " + written.string()).exit_code == 0);
  CHECK(file_json(written)["description"] != first["description"]);

  const Output past_top =
      run_stderr("tune " + tiny + kTinyPins + " --top 3 --rank 4 --write-config " + absent.string());
  CHECK(past_top.exit_code == 1);
  CHECK(past_top.text == "pipesim: error: --rank 4: only 3 row(s) are shown (--top 3); give a rank from 1 to 3\n");
  // Fewer rows fit than --top asks for: those are all there is.
  const std::string few = tiny + kTinyPins + " --fix pp=1 --fix schedule=gpipe --top 100000";
  const std::size_t fitting = tune_json(few)["results"].size();
  const Output past_fitting =
      run_stderr(fmt::format("tune {} --rank {} --write-config {}", few, fitting + 1, absent.string()));
  CHECK(past_fitting.exit_code == 1);
  CHECK(past_fitting.text == fmt::format("pipesim: error: --rank {}: only {} row(s) are shown (all that fit); give a "
                                         "rank from 1 to {}\n", fitting + 1, fitting, fitting));
  CHECK_FALSE(std::filesystem::exists(absent));
  // Nothing else was left behind: no temporary of a refused or failed write.
  CHECK(std::distance(std::filesystem::directory_iterator(dir), std::filesystem::directory_iterator()) == 2);

  const Output alone = run_stderr("tune " + tiny + " --rank 2");
  CHECK(alone.exit_code != 0);
  CHECK_THAT(alone.text, Catch::Contains("--rank requires --write-config"));
}

TEST_CASE("a row fits only when its peak memory leaves hardware.reserved_gib of the device free") {
  // The fastest row with nothing reserved, then a device 0.5 GiB larger than its peak: it fits there
  // with nothing reserved, and not with 1 GiB reserved, where every row shown leaves 1 GiB free.
  const std::string base = config("default.json") + kDefaultPins + " --top 10";
  const json unreserved = tune_json(base + " --set hardware.reserved_gib=0");
  const json& fastest = unreserved["results"][0];
  const double peak = fastest["peak_memory_bytes"].get<double>(), gib = double(1 << 30);
  const std::string memory = fmt::format(" --memory-gib {:.6f}", peak / gib + 0.5);
  CHECK(tune_json(base + memory + " --set hardware.reserved_gib=0")["results"][0]["changes"] == fastest["changes"]);
  const json reserved = tune_json(base + memory + " --set hardware.reserved_gib=1");
  REQUIRE(reserved["results"].size() == 10);
  for (const json& row : reserved["results"]) {
    CHECK(row["changes"] != fastest["changes"]);
    CHECK(row["fits_in_memory"] == true);
    CHECK(std::stod(memory.substr(std::string(" --memory-gib ").size())) * gib -
              row["peak_memory_bytes"].get<double>() >= 1 * gib);
  }
}
