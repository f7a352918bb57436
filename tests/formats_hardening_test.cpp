// Hostile inputs to the file formats: every one is refused quickly, with one message naming the file
// (or the --set flag), the place and the reason, and nothing crashes, hangs or grows without bound.
#include <sys/stat.h>
#include <unistd.h>

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

/// A fresh folder for one test's files, removed at the end; the process id keeps two builds' test
/// runs on one machine out of each other's folders.
struct Scratch {
  std::filesystem::path dir;
  explicit Scratch(const std::string& name)
      : dir(std::filesystem::temp_directory_path() /
            ("pipesim-hardening-" + name + "-" + std::to_string(getpid()))) {
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

std::string error_of(const std::string& text, const std::string& source = "c.json",
                     const std::vector<std::string>& overrides = {}) {
  Result<Config> config = parse_config(text, source, overrides);
  return config.ok() ? "(no error)" : config.error().message;
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

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

TEST_CASE("a NUL byte in a config is refused with its offset, not taken for the end") {
  // nlohmann stops at a NUL: the keys after it were silently dropped.
  const std::string text = kBase + std::string(1, '\0') + R"json(, "schedule": {"name": "gpipe"}})json";
  CHECK(error_of(text) == "c.json:2:43: a NUL byte at offset 123; JSON is text and has none (is it the right file?)");
}

TEST_CASE("nesting deeper than 64 levels is refused before anything recursive sees it") {
  // 60,000 levels overflowed the stack in the recursive copy of the document.
  const std::string deep = std::string(60000, '[') + std::string(60000, ']');
  CHECK(error_of(R"json({"model": {"x": )json" + deep + "}}") ==
        "c.json:1:79: model.x[0][0]...: nesting deeper than 64 levels; pipesim configs nest at most 3 levels "
        "(costs.forward_ms: [...])");
  CHECK(error_of(deep) == "c.json:1:65: [0][0][0][0]...: nesting deeper than 64 levels; pipesim configs nest at most 3 "
                          "levels (costs.forward_ms: [...])");
  // Brackets in strings are text; 64 levels are JSON like any other.
  CHECK(parse_json_text(R"json({"a": ")json" + std::string(100, '[') + R"json("})json", "c.json", "").ok());
  CHECK(parse_json_text(std::string(64, '[') + std::string(64, ']'), "c.json", "").ok());
  std::string escaped = R"json({"a\"[": [{"b": )json";
  for (int i = 0; i < 70; ++i) escaped += R"json({"c": )json";
  CHECK(too_deep(escaped)->path == R"(a\"[[0].b.c...)");

  // A --set value, and a --set path, which makes one object per key.
  CHECK(error_of(kBase + "}", "c.json", {"model.x=" + deep}) ==
        "--set 'model.x=[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[... (120008 bytes)': the value nests deeper than 64 levels; "
        "pipesim configs nest at most 3 levels (costs.forward_ms: [...])");
  std::string path;
  for (int i = 0; i < 30000; ++i) path += "a.";
  CHECK(error_of(kBase + "}", "c.json", {path + "a=1"}) ==
        "--set 'a.a.a.a.a.a.a.a.a.a.a.a.a.a.a.a.a.a.a.a.... (60003 bytes)': a path of more than 64 keys; config fields "
        "are at most 2 keys deep (e.g. parallel.pp)");
}

TEST_CASE("a key twice in one object is found in linear time, and refused with the same message") {
  // The check compared each key with every earlier one: 200,000 keys never finished.
  std::string text = R"json({"description": {)json";
  for (int i = 0; i < 200000; ++i) text += fmt::format("\"k{}\": 0, ", i);
  const auto start = std::chrono::steady_clock::now();
  CHECK(error_of(text + R"json("k0": 1}})json") == "c.json: key \"k0\" appears twice in one object; keep one");
  CHECK(seconds_since(start) < 30);  // well under a second unsanitized; the quadratic check took hours
  // The same object may repeat its keys in different objects.
  CHECK(parse_json_text(R"json({"a": {"x": 1}, "b": {"x": 1}})json", "c.json", "").ok());
  CHECK(error_of(kBase + "}", "c.json", {R"(hardware={"peak_tflops": 1, "peak_tflops": 2})"}) ==
        "--set hardware: key \"peak_tflops\" appears twice in one object; keep one");
}

TEST_CASE("bad JSON is named by line and column, with the reason") {
  const std::pair<std::string, std::string> cases[] = {
      {kBase + "}\n  {}", "c.json:3:3: unexpected text after the JSON value; a file holds one value (remove what follows it)"},
      {kBase + "} garbage", "c.json:2:45: unexpected text after the JSON value; a file holds one value (remove what "
                            "follows it)"},
      {kBase + R"json(, "hardware": {"peak_tflops": 1e999}})json",
       "c.json:2:73: a number out of range: 1e999 is beyond what a double holds (about 1.8e308)"},
      {kBase + ", \"description\": \"\xff\"}",
       "c.json:2:61: invalid JSON: syntax error while parsing value - invalid string: ill-formed UTF-8 byte; last "
       "read: '\"\\xFF'"},
  };
  for (const auto& [text, message] : cases) {
    CAPTURE(text);
    CHECK(error_of(text) == message);
  }
}

TEST_CASE("an included file is read as strictly as the config, and its errors name that file") {
  const Scratch s("includes");
  const std::string config = s.path("c.json"), hf = s.path("hf.json"), hw = s.path("hw.json");
  const std::string llama = R"json({"num_hidden_layers": 8, "hidden_size": 64, "num_attention_heads": 4,
  "intermediate_size": 256, "vocab_size": 1000})json";
  const auto with_hf = [&](const std::string& text, const std::string& model_extra = "") {
    s.write("hf.json", text);
    return error_of(R"json({"model": {"hf_config": "hf.json", "seq_len": 32)json" + model_extra +
                        R"json(}, "parallel": {"pp": 4, "microbatches": 8}})json",
                    config);
  };
  const auto with_hw = [&](const std::string& text) {
    s.write("hw.json", text);
    return error_of(kBase + R"json(, "hardware": {"file": "hw.json"}})json", config);
  };
  const std::string in_hf = config + ": model.hf_config: " + hf, in_hw = config + ": hardware.file: " + hw;
  CHECK(with_hf(llama) == "(no error)");
  // A mixture-of-experts model is read with its experts (Mixtral's and Qwen-MoE's names); one expert, or
  // none, is a dense model. What pipesim's attention cannot describe is refused by name, not miscosted.
  const std::string moe = llama.substr(0, llama.size() - 1);
  for (const char* key : {"num_local_experts", "num_experts"})
    CHECK(with_hf(moe + ", \"" + key + "\": 8, \"num_experts_per_tok\": 2}") == "(no error)");
  CHECK(with_hf(moe + ", \"num_experts\": 1}") == "(no error)");
  CHECK(with_hf(moe + ", \"num_experts\": null}") == "(no error)");
  CHECK(with_hf(moe + ", \"num_experts\": 8, \"mlp_only_layers\": [8]}") ==
        in_hf + ": mlp_only_layers: 8 is not a layer of 8");
  CHECK(with_hf(moe + ", \"n_routed_experts\": 8, \"kv_lora_rank\": 32}") ==
        in_hf + ": qk_nope_head_dim: missing; pipesim reads Llama/Qwen/Mistral-style config.json files (or give "
                "model.qk_nope_head_dim in the config)");
  CHECK(with_hf(moe + ", \"head_dim\": 32}") == "(no error)");  // Qwen3's heads: wider than hidden / heads
  CHECK(with_hf(moe + ", \"head_dim\": 16}") == "(no error)");
  // Was "not a JSON object" for each of these, or accepted.
  CHECK(with_hf(llama + "\n}") == in_hf + ":3:1: unexpected text after the JSON value; a file holds one value (remove "
                                          "what follows it)");
  CHECK(with_hf(R"json({"num_hidden_layers": 1e999})json") ==
        in_hf + ":1:23: a number out of range: 1e999 is beyond what a double holds (about 1.8e308)");
  CHECK(with_hf(R"json({"vocab_size": 1, "vocab_size": 2})json") ==
        in_hf + ": key \"vocab_size\" appears twice in one object; keep one");
  CHECK(with_hf(R"json({"rope_scaling": )json" + std::string(100, '[')) ==
        in_hf + ":1:81: rope_scaling[0][0][0]...: nesting deeper than 64 levels; a Hugging Face config.json nests a "
                "few levels");
  CHECK(with_hf(std::string("{\0}", 3)) ==
        in_hf + ":1:2: a NUL byte at offset 1; JSON is text and has none (is it the right file?)");
  CHECK(with_hf(llama.substr(0, 40)) == in_hf + ":1:41: invalid JSON: syntax error while parsing value - unexpected end "
                                                 "of input; expected '[', '{', or a literal");
  CHECK(with_hw(R"json({"peak_tflops": 900, "memory_gib": 80, "peak_tflops": 1000})json") ==
        in_hw + ": key \"peak_tflops\" appears twice in one object; keep one");
  CHECK(with_hw(R"json({"peak_tflops": 900} {})json") ==
        in_hw + ":1:22: unexpected text after the JSON value; a file holds one value (remove what follows it)");
  CHECK(with_hw("[1]") == in_hw + ": not a JSON object (expected a hardware file (as `pipesim calibrate` writes))");
  // The included file is read as any input is: a regular file, named for what it is otherwise.
  CHECK(error_of(kBase + R"json(, "hardware": {"file": "/dev/zero"}})json", config) ==
        config + ": hardware.file: /dev/zero: is not a regular file (a character device); give a file");
  CHECK(error_of(kBase + R"json(, "hardware": {"file": "."}})json", config) ==
        config + ": hardware.file: " + (s.dir / ".").string() + ": is a directory; give a file");
  s.write("big.json", std::string((1 << 20) + 1, ' '));
  CHECK(error_of(kBase + R"json(, "hardware": {"file": "big.json"}})json", config) ==
        config + ": hardware.file: " + s.path("big.json") +
            ": larger than 1 MiB; pipesim reads small text files (is it the right file?)");
  CHECK(error_of(kBase + R"json(, "hardware": {"file": [[1]]}})json", config) ==
        config + ": hardware.file: expected the path of a hardware file (as `pipesim calibrate` writes), got an array");

  // A value the file gives, and the config does not, is the file's mistake: the message says so.
  CHECK(with_hw(R"json({"peak_tflops": 0})json") ==
        config + ": hardware.peak_tflops (from " + hw + "): must be greater than 0, got 0");
  CHECK(with_hw(R"json({"peak_tflop": 900})json") ==
        config + ": hardware.peak_tflop (from " + hw + "): unknown key; did you mean 'peak_tflops'? Known keys here: "
                 "preset, peak_tflops, compute_efficiency, attention_efficiency, flash2_attention_efficiency, attention_overhead_tokens, hbm_gbps, hbm_efficiency, "
                 "intra_node_gbps, intra_node_efficiency, intra_node_latency_us, nvls_allreduce_gbps, inter_node_gbps, inter_node_latency_us, gpus_per_node, "
                 "memory_gib, reserved_gib, kernel_launch_us, sms, comm_sms, peak_fp8_tflops, fp8_efficiency, sustained_compute_fraction");
  CHECK(with_hf(R"json({"num_hidden_layers": 5000, "hidden_size": 64, "num_attention_heads": 4,
    "intermediate_size": 256, "vocab_size": 1000})json") ==
        config + ": model.layers (from " + hf + " num_hidden_layers): must be at most 4096, got 5000 (pipesim's limit; "
                 "docs/config.md says why)");
  CHECK(with_hf(llama, R"json(, "layers": 5000)json") ==
        config + ": model.layers: must be at most 4096, got 5000 (pipesim's limit; docs/config.md says why)");
}

TEST_CASE("a config float that becomes an integer is bounded, and the error names its field") {
  // 1e10 GiB used to wrap to a negative capacity: "DOES NOT FIT".
  CHECK(error_of(kBase + "}", "c.json", {"hardware.memory_gib=1e10"}) ==
        "c.json: hardware.memory_gib (from --set): must be at most 67108864 (64 PiB), got 10000000000 (pipesim's limit; "
        "docs/config.md says why)");
  const Simulated largest = simulate_or_fail(parse_or_fail(kBase + "}", {"hardware.memory_gib=67108864"}));
  CHECK(largest.metrics.memory_capacity_bytes == (Bytes(1) << 56) - (Bytes(3) << 30));  // h100-sxm reserves 3 GiB
  CHECK(largest.metrics.fits_in_memory);

  // activation_bytes is a device's even share; a redistributed stage may hold up to pp shares of it.
  const std::string costs = R"json({"model": {"layers": 512, "hidden": 64, "heads": 4, "seq_len": 32, "vocab": 1000},
    "parallel": {"pp": 256, "microbatches": 1}, "costs": {"forward_ms": 1, "backward_ms": 1}})json";
  CHECK(error_of(costs, "c.json", {"costs.activation_bytes=72057594037927936"}) ==
        "c.json: costs.activation_bytes (from --set): 7.21e+16 bytes per microbatch x pp 256 x 1 microbatches is over "
        "pipesim's limit of 7.21e+16 bytes; give the bytes one microbatch keeps on one device");
  // Was reported as costs.activation_bytes.
  CHECK(error_of(costs, "c.json", {"costs.output_activation_bytes=1e17"}) ==
        "c.json: costs.output_activation_bytes (from --set): 1e+17 bytes per microbatch x 1 microbatches is over "
        "pipesim's limit of 7.21e+16 bytes; give the bytes the output layer keeps for one microbatch");
  // At the limit, with all but 255 layers on one stage (257 shares), the bytes stay positive.
  std::string split = "[257";
  for (int s = 1; s < 256; ++s) split += ", 1";
  const Simulated uneven = simulate_or_fail(parse_or_fail(
      costs, {"costs.activation_bytes=" + std::to_string((std::int64_t(1) << 56) / 256), "costs.output_activation_bytes=1",
              "schedule.vocab=redistribute", "schedule.layers_per_stage=" + split + "]"}));
  CHECK(uneven.plan.layout.stages[0].layers == 257);
  CHECK(uneven.metrics.devices[0].peak_activation_bytes == Approx(double(std::int64_t(1) << 56) / 256 * 257 / 2));

  // Layers so fast that they take 0 ns: the balanced split divided by that time and printed INT_MIN.
  const Plan fast = plan_or_fail(parse_or_fail(
      kBase + "}", {"schedule.vocab=redistribute", "hardware.peak_tflops=1e300", "hardware.hbm_gbps=1e300"}));
  for (const VirtualStage& stage : fast.layout.stages) CHECK(stage.layers == 2);
}

TEST_CASE("a --set error names the --set flag, and its text must be UTF-8") {
  // The objects a --set creates are its own: `a` was blamed on the config file.
  CHECK(error_of(kBase + "}", "c.json", {"a.b.c.d=1"}) ==
        "c.json: a (from --set): unknown key. Known keys here: model, parallel, schedule, hardware, precision, training, costs, "
        "description");
  CHECK(error_of(kBase + "}", "c.json", {"model.x.y=1"}) ==
        "c.json: model.x (from --set): unknown key. Known keys here: layers, hidden, heads, kv_heads, ffn_hidden, "
        "seq_len, vocab, micro_batch_size, mlp, tied_embeddings"
        ", head_dim, kv_lora_rank, q_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim, num_experts, moe_router_topk, moe_ffn_hidden_size, moe_shared_expert_intermediate_size, moe_layer_freq, moe_capacity_factor, moe_imbalance, moe_router_num_groups, moe_router_group_topk, hf_config");
  CHECK(error_of(kBase + "}", "c.json", {"parallel.pp=2"}) == "(no error)");
  // A byte that is not UTF-8 used to abort pipesim when a message quoted it.
  CHECK(error_of(kBase + "}", "c.json", {"model.layers=\xff"}) ==
        "--set 'model.layers=\\xFF': byte 14 is not UTF-8 text; write the key and value as text");
  CHECK(error_of(kBase + "}", "c.json", {"schedule.name=1f1b\xc3"}) ==
        "--set 'schedule.name=1f1b\\xC3': byte 19 is not UTF-8 text; write the key and value as text");
  CHECK(error_of(kBase + "}", "c.json", {"description=caf\xc3\xa9"}) == "(no error)");
  // Invisible bytes in a key show.
  CHECK(error_of(kBase + R"json(, "\u00a0description": ""})json") ==
        "c.json: \\xC2\\xA0description: unknown key; did you mean 'description'? Known keys here: model, parallel, "
        "schedule, hardware, precision, training, costs, description");
}

TEST_CASE("a schedule file's invisible bytes show, and a clash names both actions") {
  const auto error = [](const std::string& text, int devices = 2, int microbatches = 1) {
    Result<CustomSchedule> s = parse_schedule_csv(text, "s.csv", devices, microbatches);
    return s.ok() ? "(no error)" : s.error().message;
  };
  // A byte-order mark (as some editors save) was printed as is: an invisible difference.
  CHECK(error("\xEF\xBB\xBF" "0F0,0B0\n1F0,1B0\n") ==
        "s.csv:1:1: '\\xEF\\xBB\\xBF0F0' is not an action; write [stage][F|I|B|W][microbatch] (e.g. 0F0), "
        "[stage][SEND_F|RECV_F|SEND_B|RECV_B][microbatch], [stage][UNSHARD|RESHARD|REDUCE_GRAD] or "
        "([action];[action])OVERLAP_F_B");
  CHECK(error("0F0,0B\x01" "0\n1F0,1B0\n") ==
        "s.csv:1:5: '0B\\x010' is not an action; write [stage][F|I|B|W][microbatch] (e.g. 0F0), "
        "[stage][SEND_F|RECV_F|SEND_B|RECV_B][microbatch], [stage][UNSHARD|RESHARD|REDUCE_GRAD] or "
        "([action];[action])OVERLAP_F_B");
  // B is a full backward: with W split off it was read as I and W, and the clash reported as
  // "W(s0,m0) appears twice", an op the file never names twice.
  CHECK(error("0F0,0B0,0W0\n1F0,1I0,1W0\n") ==
        "s.csv:1:9: 0W0 computes the weight gradient that 0B0 (s.csv:1:5) computes already: B is a full backward, I "
        "and W; write 0I0 instead of 0B0, or drop 0W0");
  CHECK(error("0F0,0I0,0B0\n1F0,1I0,1W0\n") ==
        "s.csv:1:5: 0I0 computes the input gradient that 0B0 (s.csv:1:9) computes already: B is a full backward, I "
        "and W; write 0W0 instead of 0B0, or drop 0I0");
  CHECK(error("0F0,0B0\n1F0,1I0,1W0\n") == "(no error)");  // a full backward beside split ones is fine

  // Stages past what the ranks can hold, and cells past what any schedule needs, are refused at once.
  CHECK(error("0F0,0B0,4095F0\n1F0,1B0\n") ==
        "s.csv: uses 4096 stages, more than 127 chunks on each of the 2 ranks; pipesim's limit is 127 (parallel.chunks)");
  std::string many = "4095F0";
  for (int i = 0; i < 2000000; ++i) many += ",0F0";
  auto start = std::chrono::steady_clock::now();
  CHECK(error(many + "\n1F0\n", 2, 8) ==
        "s.csv:1:73156: over 18288 actions, the most 2 ranks can need for 8 microbatches (254 stages at most, 8 "
        "actions per stage and microbatch); is it the right file?");
  CHECK(seconds_since(start) < 10);
  // With 1024 ranks, 4096 stages are allowed and a million cells may be read: what follows is
  // linear in them (renumbering PyTorch's shifted forwards looked at every cell once per stage).
  std::string wide = "4095F0";
  for (int i = 0; i < 1000000; ++i) wide += ",0F0";
  for (int d = 1; d < 1024; ++d) wide += fmt::format("\n{}F0", d);
  start = std::chrono::steady_clock::now();
  CHECK(error(wide, 1024, 1024) ==
        "s.csv: schedules 1 microbatches but parallel.microbatches is 1024; use --set parallel.microbatches=1");
  CHECK(seconds_since(start) < 10);
}
