// Config parsing: values land where they belong, presets fill the rest, and every bad input gets
// the full message (file, JSON path, what is wrong, what to do).
#include "config_writer.h"
#include "helpers.h"
#include "json_text.h"

using namespace pipesim;
using namespace pipesim::testing;

namespace {

const std::string kModel = R"json("model": {"layers": 8, "hidden": 64, "heads": 4, "seq_len": 32, "vocab": 1000})json";
const std::string kParallel = R"json("parallel": {"pp": 4, "microbatches": 8})json";
const std::string kBase = "{" + kModel + ", " + kParallel;

std::string error_of(const std::string& json, const std::vector<std::string>& overrides = {}) {
  Result<Config> config = parse_config(json, "c.json", overrides);
  if (config.ok()) {
    Result<Plan> plan = make_plan(config.value());
    if (!plan.ok()) return plan.error().message;
    const Plan& p = plan.value();
    Result<Timeline> timeline = simulate(p.graph, op_durations(*make_cost_model(p.config, p.layout), p.graph));
    return timeline.ok() ? "(no error)" : timeline.error().message;
  }
  return config.error().message;
}

/// A config, its --set overrides and the one error they must give.
using BadConfig = std::tuple<std::string, std::vector<std::string>, std::string>;

void check_refused(const BadConfig& c) {
  CAPTURE(std::get<0>(c), std::get<1>(c));
  CHECK(error_of(std::get<0>(c), std::get<1>(c)) == std::get<2>(c));
}

}  // namespace

TEST_CASE("a config is read field by field, with presets and defaults") {
  const Config c = parse_or_fail(R"json({
    "model": {"layers": 32, "hidden": 4096, "heads": 32, "seq_len": 2048, "vocab": 128000, "micro_batch_size": 2},
    "parallel": {"pp": 8, "tp": 2, "dp": 4, "microbatches": 64, "chunks": 2},
    "schedule": {"name": "interleaved-1f1b", "vocab": "redistribute", "layers_per_stage": "auto"},
    "hardware": {"preset": "a100-80gb", "inter_node_gbps": 12.5, "gpus_per_node": 4},
    "precision": {"distributed_optimizer": true}
  })json");
  CHECK(c.model.ffn_hidden == 4 * 4096);  // default 4h
  CHECK(c.model.micro_batch_size == 2);
  CHECK(c.parallel.tp == 2);
  CHECK(c.parallel.dp == 4);
  CHECK(c.schedule.layers_per_stage.empty());  // "auto"
  CHECK(c.hardware.peak_tflops == 312);        // from the preset
  CHECK(c.hardware.inter_node_gbps == 12.5);   // overridden
  CHECK(c.hardware.gpus_per_node == 4);
  CHECK(c.training.zero_stage == 1);  // precision.distributed_optimizer: the older name of stage 1
  CHECK_FALSE(c.costs.has_value());
}

TEST_CASE("--set overrides any field and creates missing objects") {
  const Config c = parse_or_fail(kBase + "}", {"parallel.pp=2", "hardware.preset=h200", "schedule.layers_per_stage=[3,5]",
                                               "costs.forward_ms=[1,2]", "costs.backward_ms=3", "schedule.name=gpipe"});
  CHECK(c.parallel.pp == 2);
  CHECK(c.hardware.peak_tflops == 989);
  CHECK(c.schedule.layers_per_stage == std::vector<int>{3, 5});
  CHECK(c.schedule.name == "gpipe");
  REQUIRE(c.costs.has_value());
  CHECK(c.costs->forward_ms == std::vector<double>{1, 2});
  CHECK(c.costs->backward_ms == std::vector<double>{3});
}

TEST_CASE("bad config files are refused with the file, the path and the fix") {
  const BadConfig c = GENERATE_COPY(values<BadConfig>({
      // The stray '}' is the last character: column = length of the text.
      {kBase + ", }", {},
       fmt::format("c.json:1:{}: invalid JSON: syntax error while parsing object key - unexpected '}}'; expected "
                   "string literal",
                   (kBase + ", }").size())},
      {"{" + kParallel + "}", {}, "c.json: model: required; give layers, hidden, heads, seq_len and vocab"},
      {"{" + kModel + "}", {}, "c.json: parallel: required; give at least microbatches (and pp)"},
      {R"json({"model": {"hidden": 64, "heads": 4, "seq_len": 32, "vocab": 1000}, )json" + kParallel + "}", {},
       "c.json: model.layers: required; give an integer >= 1"},
      {R"json({"model": {"layers": "8", "hidden": 64, "heads": 4, "seq_len": 32, "vocab": 1000}, )json" + kParallel + "}",
       {}, "c.json: model.layers: expected an integer, got string \"8\""},
      {R"json({"model": {"layers": 8.5, "hidden": 64, "heads": 4, "seq_len": 32, "vocab": 1000}, )json" + kParallel + "}",
       {}, "c.json: model.layers: expected an integer, got 8.5"},
      {R"json({"model": {"layerz": 8, "layers": 8, "hidden": 64, "heads": 4, "seq_len": 32, "vocab": 1000}, )json" +
           kParallel + "}",
       {},
       "c.json: model.layerz: unknown key; did you mean 'layers'? Known keys here: layers, hidden, heads, kv_heads, "
       "ffn_hidden, seq_len, vocab, micro_batch_size, mlp, tied_embeddings"
       ", head_dim, kv_lora_rank, q_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim, num_experts, moe_router_topk, moe_ffn_hidden_size, moe_shared_expert_intermediate_size, moe_layer_freq, moe_capacity_factor, moe_imbalance, moe_router_num_groups, moe_router_group_topk, hf_config"},
      {kBase + R"json(, "hardwre": {}})json", {},
       "c.json: hardwre: unknown key; did you mean 'hardware'? Known keys here: model, parallel, schedule, hardware, "
       "precision, training, costs, description"},
      {kBase + R"json(, "hardware": {"preset": "h100"}})json", {},
       "c.json: hardware.preset: unknown preset 'h100'; did you mean 'h100-sxm' or 'h100-96gb-500w'? Presets: a100-80gb, h100-sxm, h100-96gb-500w, h200"},
      {kBase + R"json(, "hardware": {"compute_efficiency": 1.5}})json", {},
       "c.json: hardware.compute_efficiency: must be at most 1, got 1.5"},
      {kBase + R"json(, "hardware": {"hbm_gbps": 0}})json", {}, "c.json: hardware.hbm_gbps: must be greater than 0, got 0"},
      {kBase + R"json(, "precision": {"flash_attention": "yes"}})json", {},
       "c.json: precision.flash_attention: expected true or false, got string \"yes\""},
      {"[" + kBase + "}]", {}, "c.json: expected a JSON object at the top level, got an array; a config is {\"model\": "
                               "..., \"parallel\": ...}"},
      {kBase + R"json(, "parallel": {"pp": 2}})json", {}, "c.json: key \"parallel\" appears twice in one object; keep one"},
      {kBase + R"json(, "hardware": {"peak_tflops": 1e999}})json", {},
       "c.json:1:152: a number out of range: 1e999 is beyond what a double holds (about 1.8e308)"},
      // A speed near zero: durations past 2^62 ns saturate and are refused, never wrapped.
      {kBase + R"json(, "hardware": {"peak_tflops": 1e-300}})json", {},
       "the stage times add up to over 146 years (or one is not a number); check the hardware speeds, the costs and "
       "the model sizes"},
      {kBase + R"json(, "costs": {"forward_ms": 1, "backward_ms": 1, "optimizer_ms": 1e300}})json", {},
       "simulate: OPTIMIZER(d0) has no valid duration (negative, NaN or over 146 years); check the hardware speeds, "
       "the costs and the model sizes"},
      {kBase + R"json(, "costs": {"backward_ms": 2}})json", {},
       "c.json: costs.forward_ms: required in a costs block; give milliseconds per microbatch"},
      {kBase + R"json(, "costs": {"forward_ms": [1, 2], "backward_ms": 2}})json", {},
       "c.json: costs.forward_ms: has 2 entries; give one number or one per device (pp = 4)"},
      {kBase + R"json(, "costs": {"forward_ms": -1, "backward_ms": 2}})json", {},
       "c.json: costs.forward_ms: must be at least 0, got -1"},
  }));
  check_refused(c);
}

TEST_CASE("bad overrides and settings are refused with the file, the path and the fix") {
  const BadConfig c = GENERATE_COPY(values<BadConfig>({
      {kBase + "}", {"parallel.pp=0"}, "c.json: parallel.pp (from --set): must be at least 1, got 0"},
      {kBase + "}", {"parallel.microbatches=0"}, "c.json: parallel.microbatches (from --set): must be at least 1, got 0"},
      {kBase + "}", {"parallel.pp=2000"}, "c.json: parallel.pp (from --set): must be at most 1024, got 2000 (pipesim's limit; docs/config.md says why)"},
      {kBase + "}", {"parallel.pp=16"},
       "c.json: model.layers: 8 layers cannot fill 16 virtual stages: 1f1b runs one stage per device, so pp 16 needs 16; "
       "use parallel.pp of at most 8 or at least 16 layers"},
      // Each schedule is checked with its own chunk count, and its own fixes: parallel.chunks only where it is read.
      {kBase + "}", {"parallel.pp=8", "schedule.name=zb-v"},
       "c.json: model.layers: 8 layers cannot fill 16 virtual stages: zb-v runs 2 chunks per device, so pp 8 needs 16; "
       "use parallel.pp of at most 4, at least 16 layers or a schedule with one stage per device (gpipe, 1f1b, zb-h1, zb-h2, zb-1p, zb-2p, zb-auto)"},
      {kBase + "}", {"parallel.chunks=4", "schedule.name=interleaved-1f1b"},
       "c.json: model.layers: 8 layers cannot fill 16 virtual stages: interleaved-1f1b runs parallel.chunks = 4 chunks "
       "per device, so pp 4 needs 16; use parallel.chunks of at most 2, parallel.pp of at most 2 or at least 16 layers"},
      {kBase + "}", {"model.heads=5"}, "c.json: model.heads (from --set): 5 heads do not divide hidden size 64; choose a divisor of 64"},
      {kBase + "}", {"parallel.tp=8"}, "c.json: parallel.tp (from --set): tp 8 does not divide 4 heads; choose a divisor of 4"},
      {kBase + "}", {"schedule.vocab=redistribute", "schedule.layers_per_stage=[1,2,5]"},
       "schedule.layers_per_stage: has 3 entries; 1f1b runs one stage per device, so on 4 devices (pp) it takes 4, "
       "one per device; give 4 counts or \"auto\""},
      {kBase + "}", {"schedule.layers_per_stage=[1,2,3,3]"},
       "c.json: schedule.layers_per_stage (from --set): counts sum to 9 but model.layers is 8; make them sum to 8"},
      {kBase + "}", {"schedule.layers_per_stage=[1,2,-3,3]"},
       "c.json: schedule.layers_per_stage[2] (from --set): expected a layer count (integer >= 0), got -3"},
      // A long value is quoted cut short, never echoed whole.
      {kBase + "}", {"schedule.layers_per_stage=" + std::string(100, 'x')},
       "c.json: schedule.layers_per_stage (from --set): expected \"auto\" or an array of layer counts, got string \"" +
           std::string(40, 'x') + "... (100 bytes)\""},
      {kBase + R"json(, "costs": {"forward_ms": 1e12, "backward_ms": 1e12}})json", {"parallel.microbatches=1000"},
       "the stage times add up to over 146 years (or one is not a number); check the hardware speeds, the costs and "
       "the model sizes"},
      {kBase + "}", {"schedule.layers_per_stage=even"},
       "c.json: schedule.layers_per_stage (from --set): expected \"auto\" or an array of layer counts, got string \"even\""},
      {kBase + "}", {"parallel.layerz=3"},
       "c.json: parallel.layerz (from --set): unknown key. Known keys here: pp, tp, dp, cp, microbatches, chunks, sequence_parallel, ep, etp"},
      {kBase + "}", {"parallel"}, "--set 'parallel': expected key.path=value, e.g. --set parallel.pp=4"},
      {kBase + "}", {"model.layers.x=3"}, "--set 'model.layers.x=3': 'model.layers' is not an object"},
      {kBase + "}", {"schedule.name=gpipe2"},
       "schedule.name: unknown schedule 'gpipe2'; did you mean 'gpipe'? Schedules: gpipe, 1f1b, interleaved-1f1b, "
       "zb-h1, zb-h2, zb-1p, zb-2p, zb-auto, v-half, v-min, zb-v, dualpipe-v (`pipesim list` describes them)"},
      {kBase + "}", {"schedule.name=pipedream"},
       "schedule.name: unknown schedule 'pipedream'; did you mean '1f1b'? Schedules: gpipe, 1f1b, interleaved-1f1b, "
       "zb-h1, zb-h2, zb-1p, zb-2p, zb-auto, v-half, v-min, zb-v, dualpipe-v (`pipesim list` describes them)"},
      {kBase + "}", {"schedule.vocab=vocab-9"},
       "c.json: schedule.vocab (from --set): unknown vocabulary mode 'vocab-9'; did you mean 'vocab-1' or 'vocab-2'? "
       "Modes: baseline, redistribute, vocab-1, vocab-2, interlaced (`pipesim list` describes them)"},
      {kBase + "}", {"schedule.vocab=tied"},
       "c.json: schedule.vocab (from --set): unknown vocabulary mode 'tied'. Modes: baseline, redistribute, vocab-1, "
       "vocab-2, interlaced (`pipesim list` describes them)"},
      {kBase + "}", {"schedule.name=interleaved-1f1b"},
       "parallel.chunks: interleaved-1f1b needs at least 2 chunks per device, got 1; set parallel.chunks to 2 or more"},
      {kBase + "}", {"schedule.name=interleaved-1f1b", "parallel.chunks=2", "parallel.microbatches=6"},
       "parallel.microbatches: interleaved-1f1b needs a multiple of pp (4), got 6; use 8"},
  }));
  check_refused(c);
}

TEST_CASE("training.global_batch_size makes the microbatches, after every --set") {
  const std::string gbs = "{" + kModel + R"json(, "parallel": {"pp": 4, "dp": 2}, "training": {"global_batch_size": 48}})json";
  const auto microbatches = [&](const std::vector<std::string>& overrides) {
    const Config c = parse_or_fail(gbs, overrides);
    CHECK(c.training.global_batch_size == 48);
    return c.parallel.microbatches;
  };
  CHECK(microbatches({}) == 48 / (1 * 2));
  CHECK(microbatches({"parallel.dp=4"}) == 48 / (1 * 4));  // the batch is kept, the microbatches halve
  CHECK(microbatches({"model.micro_batch_size=3"}) == 48 / (3 * 2));
  // Given alongside and agreeing, microbatches are accepted as they are.
  CHECK(microbatches({"parallel.microbatches=24", "training.global_batch_size=48"}) == 24);
  // A --set of one of the two restates the batch: the other, as the file gives it, follows.
  CHECK(parse_or_fail(kBase + "}", {"training.global_batch_size=32"}).parallel.microbatches == 32 / (1 * 1));
  const Config restated = parse_or_fail(gbs, {"parallel.microbatches=5"});
  CHECK(restated.parallel.microbatches == 5);
  CHECK_FALSE(restated.training.global_batch_size.has_value());
}

TEST_CASE("a global batch that does not split, or disagrees with the microbatches, is refused with the fix") {
  const std::string gbs = "{" + kModel + R"json(, "parallel": {"pp": 4, "dp": 2}, "training": {"global_batch_size": 30}})json";
  check_refused(GENERATE_COPY(values<BadConfig>({
      // 30 = 2 x 15: an odd share per replica, so no even micro-batch; 28 and 32 are the multiples of 2 x 2 around it.
      {gbs, {"model.micro_batch_size=2"},
       "c.json: training.global_batch_size: 30 sequences do not split over dp 2 (parallel.dp) in micro-batches of 2 "
       "(model.micro_batch_size): the global batch must be a multiple of 2 x 2 = 4; use 28 or 32, or a "
       "micro_batch_size of 1 or 3"},
      // dp 4 does not divide 30, so no micro-batch size can help: only global batches are offered.
      {gbs, {"parallel.dp=4"},
       "c.json: training.global_batch_size: 30 sequences do not split over dp 4 (parallel.dp) in micro-batches of 1 "
       "(model.micro_batch_size): the global batch must be a multiple of 1 x 4 = 4; use 28 or 32"},
      {gbs, {"parallel.dp=32"},
       "c.json: training.global_batch_size: 30 sequences do not split over dp 32 (parallel.dp) in micro-batches of 1 "
       "(model.micro_batch_size): the global batch must be a multiple of 1 x 32 = 32; use 32"},
      {kBase + R"json(, "training": {"global_batch_size": 16}})json", {},
       "c.json: parallel.microbatches: 8 microbatches x micro_batch_size 1 x dp 1 make a global batch of 8 sequences, "
       "but training.global_batch_size is 16; give one of the two (the global batch alone makes 16 microbatches)"},
      {"{" + kModel + R"json(, "parallel": {"pp": 4}})json", {},
       "c.json: parallel.microbatches: required; give an integer >= 1, or training.global_batch_size (sequences per "
       "iteration) to derive it from"},
      {gbs, {"training.global_batch_size=0"}, "c.json: training.global_batch_size (from --set): must be at least 1, got 0"},
      // 2 x 2^20 + 2 sequences over dp 2: one microbatch past the limit.
      {gbs, {"training.global_batch_size=2097154"},
       "c.json: training.global_batch_size (from --set): 2097154 sequences over dp 2 in micro-batches of 1 make 1048577 "
       "microbatches per pipeline, over pipesim's limit of 1048576; use a larger micro_batch_size or dp, or a global "
       "batch of at most 2097152"},
  })));
}

TEST_CASE("a written config reads back as the same config, and simulates the same") {
  // Every shipped kind: a Hugging Face include, several presets, explicit costs, recomputation and ZeRO.
  const std::vector<Config> configs = {
      source_config("default.json"),
      source_config("llama-3-70b.json"),
      source_config("examples/explicit-costs.json"),
      source_config("tiny.json", {"training.recompute_granularity=full", "training.recompute_method=block",
                                  "training.recompute_num_layers=2", "parallel.dp=2", "training.zero_stage=3",
                                  "hardware.preset=a100-80gb", "hardware.reserved_gib=1.25"}),
      source_config("tiny.json", {"training.global_batch_size=32", "parallel.dp=2"}),
  };
  for (const Config& config : configs) {
    const std::string text = json_text(config_json(config, "round trip"), 2);
    INFO(text);
    const Config again = parse_or_fail(text);
    // A fixed point: what is read back writes the same text, so no field was lost or changed on the way.
    CHECK(json_text(config_json(again, "round trip"), 2) == text);
    const Simulated before = simulate_or_fail(config), after = simulate_or_fail(again);
    CHECK(after.metrics.iteration_ns == before.metrics.iteration_ns);
    for (std::size_t d = 0; d < before.metrics.devices.size(); ++d)
      CHECK(after.metrics.devices[d].peak_memory_bytes == before.metrics.devices[d].peak_memory_bytes);
  }
}

TEST_CASE("a written config with a global batch leaves the microbatches to follow from it, as its source does") {
  const Config config = source_config("tiny.json", {"training.global_batch_size=32", "parallel.dp=2"});
  const std::string text = json_text(config_json(config, "written"), 2);
  CHECK(text.find("\"microbatches\"") == std::string::npos);
  CHECK(text.find("\"global_batch_size\": 32") != std::string::npos);
  CHECK(parse_or_fail(text).parallel.microbatches == 32 / (2 * 2));  // micro_batch_size 2, dp 2
  // So a new dp keeps the batch on the written file as on its source, never contradicting a written count.
  CHECK(parse_or_fail(text, {"parallel.dp=4"}).parallel.microbatches == 32 / (2 * 4));
}

TEST_CASE("a written config starts with its description, which marks pipesim's own files") {
  const std::string text = json_text(config_json(source_config("tiny.json"), "written by pipesim tune"), 2);
  CHECK_THAT(text, Catch::StartsWith("{\n  \"description\": \"written by pipesim tune\",\n  \"model\": {"));
}
