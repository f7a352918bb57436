// The training job around the schedule: activation recomputation, sequence and context
// parallelism, ZeRO and the data-parallel collectives, reserved memory. Each figure is derived here
// from the published formula (Korthikanti et al. 2022, Table 2; Rajbhandari et al. 2020, §5).
#include <algorithm>
#include <map>

#include "helpers.h"
#include "kernels.h"
#include "model_math.h"
#include "schedule_csv.h"

using namespace pipesim;
using namespace pipesim::testing;

namespace {

/// GPT with f = 4h (Korthikanti's model): a = 16 heads, s = 2048, h = 1024, b = 2.
const char* kGpt = R"json({
  "model": {"layers": 3, "hidden": 1024, "heads": 16, "ffn_hidden": 4096, "seq_len": 2048, "vocab": 32000,
            "micro_batch_size": 2},
  "parallel": {"pp": 3, "microbatches": 6},
  "hardware": {"preset": "h100-sxm", "gpus_per_node": 8}
})json";

std::size_t count(const TaskGraph& graph, OpKind kind) {
  return std::size_t(std::count_if(graph.tasks().begin(), graph.tasks().end(), [&](const Task& t) { return t.kind == kind; }));
}

}  // namespace

TEST_CASE("a layer keeps what Korthikanti et al. Table 2 gives, for every tensor and sequence parallel setting") {
  const double s = 2048, b = 2, h = 1024, a = 16, sbh = s * b * h;
  const int t = GENERATE(1, 2, 4, 8);
  const bool flash = GENERATE(false, true);
  const auto bytes = [&](const std::vector<std::string>& settings) {
    std::vector<std::string> all = {fmt::format("parallel.tp={}", t), fmt::format("precision.flash_attention={}", flash)};
    all.insert(all.end(), settings.begin(), settings.end());
    const Config c = parse_or_fail(kGpt, all);
    return std::pair{layer_activation_bytes(c), hidden_activation_bytes(c)};
  };
  const double scores = flash ? 0 : 5 * a * s / h;  // the score matrices, split by t
  // No recomputation: tensor parallelism alone leaves 10 whole; sequence parallelism splits all 34.
  CHECK(bytes({"parallel.sequence_parallel=false"}).first == Approx(sbh * (10 + 24.0 / t + scores / t)));
  CHECK(bytes({"parallel.sequence_parallel=true"}).first == Approx(sbh * (34.0 / t + scores / t)));
  // Selective recomputation drops the scores (nothing to drop under flash attention).
  const std::string selective = "training.recompute_granularity=\"selective\"";
  CHECK(bytes({"parallel.sequence_parallel=false", selective}).first == Approx(sbh * (10 + 24.0 / t)));
  CHECK(bytes({"parallel.sequence_parallel=true", selective}).first == Approx(sbh * 34.0 / t));
  // Full recomputation keeps the layer's input: 2sbh, split by t under sequence parallelism.
  CHECK(bytes({"parallel.sequence_parallel=false"}).second == Approx(2 * sbh));
  CHECK(bytes({"parallel.sequence_parallel=true"}).second == Approx(2 * sbh / t));
  // t = 1: the table's first row, sbh(34 + 5as/h).
  if (t == 1) CHECK(bytes({}).first == Approx(sbh * (34 + scores)));
}

TEST_CASE("torchtitan's per-op checkpointing keeps every other product's output and reruns the rest") {
  // Llama-style: grouped-query attention (8 heads, 2 key/value heads of 128 channels), SwiGLU.
  const double s = 1024, b = 2, h = 1024, kv = 256, f = 2816, heads = 8, tokens = s * b;
  const int t = GENERATE(1, 2);
  const bool sp = GENERATE(false, true);
  const std::vector<std::string> sets = {
      "model.hidden=1024", "model.heads=8", "model.kv_heads=2", "model.mlp=\"swiglu\"", "model.ffn_hidden=2816",
      "model.seq_len=1024", "parallel.pp=1", "parallel.microbatches=1", fmt::format("parallel.tp={}", t),
      fmt::format("parallel.sequence_parallel={}", sp), "training.recompute_granularity=\"selective_op\""};
  const Config c = parse_or_fail(kGpt, sets);
  // Products in order q, k, v, o, gate, up, down: q, v, gate and down saved; k, o and up rerun.
  // Kept: the input (split under sequence parallelism); attention's output, q, v and the gate
  // (column-parallel: split); the down projection's partial sums (whole on every rank); under
  // sequence parallelism with t > 1 the reduce-scatters' outputs after o and down; fp32 log-sum-exp.
  const double input = sp ? h / t : h, scattered = sp && t > 1 ? 2 * h / t : 0;
  CHECK(layer_activation_bytes(c) ==
        Approx(tokens * (2 * (input + (h + h + kv + f) / t + h + scattered) + 4 * heads / t)));
  // R reruns k, o and up: 2·tokens·h·(kv + h + f)/t FLOPs a layer, on each of the stage's layers.
  const VirtualStage stage{.first_layer = 0, .layers = 3};
  const StageKernels kernels = stage_kernels(c, stage);
  CHECK(total(kernels.recompute, &Kernel::flops) == Approx(3 * 2 * tokens * h * (kv + h + f) / t));
  // ... and the tensor-parallel collectives it does not save: the two all-gathers, or both all-reduces.
  CHECK(kernels.tp_allreduces_recompute == 3 * (sp ? 1 : 2));
  // The backward rebuilds the rest of one layer.
  Config none = c;
  none.training.recompute_granularity = Recompute::None;
  const ActivationsKept kept = activations_kept(c, 0, 3);
  CHECK(kept.from_forward == Approx(3 * layer_activation_bytes(c)));
  CHECK(kept.rebuilt == Approx(layer_activation_bytes(none) - layer_activation_bytes(c)));
}

TEST_CASE("per-op checkpointing is refused where torchtitan's policy does not apply") {
  const std::string per_op = "training.recompute_granularity=\"selective_op\"";
  const Result<Config> unfused = parse_config(kGpt, "test.json", {per_op, "precision.flash_attention=false"});
  REQUIRE(!unfused.ok());
  CHECK_THAT(unfused.error().message, Catch::Contains("training.recompute_granularity") && Catch::Contains("flash"));
  const Result<Config> experts = load_config(std::string(std::getenv("PIPESIM_SOURCE")) + "/configs/moe-tiny.json", {per_op});
  REQUIRE(!experts.ok());
  CHECK_THAT(experts.error().message, Catch::Contains("has experts"));
}

TEST_CASE("context parallelism gives each rank s/cp of the tokens: 1/cp of the activations") {
  const int cp = GENERATE(2, 4);
  const Config one = parse_or_fail(kGpt, {"precision.flash_attention=false"});
  const Config split = parse_or_fail(kGpt, {"precision.flash_attention=false", fmt::format("parallel.cp={}", cp)});
  CHECK(layer_activation_bytes(split) == Approx(layer_activation_bytes(one) / cp));
  CHECK(hidden_activation_bytes(split) * cp == hidden_activation_bytes(one));
}

TEST_CASE("ZeRO shards the model states as Rajbhandari et al. count them: 2 + 2 + 12 bytes per parameter") {
  const PrecisionConfig p{.param_bytes = 2, .grad_bytes = 2, .optimizer_bytes = 12};  // the paper's mixed precision
  const int d = GENERATE(1, 4, 64);
  CHECK(ZeroSharding{0, d}.bytes_per_param(p) == Approx(16));
  CHECK(ZeroSharding{1, d}.bytes_per_param(p) == Approx(4 + 12.0 / d));
  CHECK(ZeroSharding{2, d}.bytes_per_param(p) == Approx(2 + 14.0 / d));
  CHECK(ZeroSharding{3, d}.bytes_per_param(p) == Approx(16.0 / d));
}

TEST_CASE("static memory follows the ZeRO stage; distributed_optimizer is stage 1") {
  const double h = 1024, f = 4096, d = 4;
  const double layer = 4 * h * h + 2 * h * f + 9 * h + f;  // the middle device's one layer
  const std::map<std::string, double> per_param = {{"training.zero_stage=0", 2 + 4 + 12},
                                                   {"training.zero_stage=1", 2 + 4 + 12 / d},
                                                   {"precision.distributed_optimizer=true", 2 + 4 + 12 / d},
                                                   {"training.zero_stage=2", 2 + (4 + 12) / d}};
  for (const auto& [setting, bytes] : per_param) {
    INFO(setting);
    const Plan plan = plan_or_fail(parse_or_fail(kGpt, {"parallel.dp=4", setting}));
    CHECK(plan.static_bytes[1] == std::llround(layer * bytes));
  }
  // Stage 3 shards the weights too, and holds two stages' weights whole: the one in use, the next.
  const Plan plan = plan_or_fail(parse_or_fail(kGpt, {"parallel.dp=4", "training.zero_stage=3"}));
  CHECK(plan.static_bytes[1] == std::llround(layer * 18 / d + 2 * layer * 2));
  CHECK(plan.static_bytes[0] > plan.static_bytes[1]);  // the embedding's shard and copy too
  // At pp 1, as FSDP wraps a model: one unit in use and the next, the largest unit here the
  // embedding's (or the LM head's) V x h, above a layer's.
  const double vocab = 32000 * h, all = 3 * layer + 2 * vocab + 2 * h;  // three layers, both ends, final norm
  const Plan fsdp = plan_or_fail(parse_or_fail(kGpt, {"parallel.pp=1", "parallel.dp=4", "training.zero_stage=3"}));
  CHECK(fsdp.static_bytes[0] == std::llround(all * 18 / d + 2 * vocab * 2));
}

TEST_CASE("full recomputation puts an R before each B that rebuilds the layers F no longer keeps") {
  const Config plain = parse_or_fail(kGpt);
  const Config recompute = parse_or_fail(kGpt, {"training.recompute_granularity=\"full\""});
  const Simulated a = simulate_or_fail(plain), b = simulate_or_fail(recompute);
  const TaskGraph& g = b.plan.graph;
  CHECK(count(a.plan.graph, OpKind::R) == 0);
  REQUIRE(count(g, OpKind::R) == count(g, OpKind::B));
  // On each compute stream, R comes right before the B of its stage and microbatch.
  for (int d = 0; d < g.devices(); ++d) {
    const std::span<const TaskId> order = g.stream_order(d, Stream::Compute);
    for (std::size_t i = 0; i < order.size(); ++i) {
      const Task& t = g.task(order[i]);
      if (t.kind != OpKind::B) continue;
      REQUIRE(i > 0);
      const Task& r = g.task(order[i - 1]);
      CHECK(r.kind == OpKind::R);
      CHECK((r.stage == t.stage && r.microbatch == t.microbatch));
    }
  }
  // The middle stage is one layer: its R is its F again, collectives included; its B is unchanged.
  const auto duration = [](const Simulated& s, OpKind kind, int stage) {
    for (TaskId id = 0; id < TaskId(s.plan.graph.size()); ++id)
      if (s.plan.graph.task(id).kind == kind && s.plan.graph.task(id).stage == stage) return s.durations[std::size_t(id)];
    return TimeNs(-1);
  };
  CHECK(duration(b, OpKind::R, 1) == duration(b, OpKind::F, 1));
  CHECK(duration(b, OpKind::B, 1) == duration(a, OpKind::B, 1));
  CHECK(b.metrics.iteration_ns > a.metrics.iteration_ns);
  // Memory of the middle device under 1F1B: when R runs for microbatch 0, microbatches 0 and 1 have
  // run F (one warm-up forward, one steady); F kept the layer's input for each, R rebuilt one layer.
  const double input = hidden_activation_bytes(recompute), layer = layer_activation_bytes(recompute);
  CHECK(b.metrics.devices[1].peak_activation_bytes == std::llround(2 * input) + std::llround(layer));
  CHECK(a.metrics.devices[1].peak_activation_bytes == 2 * std::llround(layer));
}

TEST_CASE("uniform recomputation keeps one input per group of layers; block keeps the rest whole") {
  // One device of 8 layers: its activations at the peak of a single microbatch.
  const std::string one = R"json({
    "model": {"layers": 8, "hidden": 1024, "heads": 16, "seq_len": 2048, "vocab": 32000},
    "parallel": {"pp": 1, "microbatches": 1}})json";
  const auto peak = [&](const std::vector<std::string>& settings) {
    const Simulated s = simulate_or_fail(parse_or_fail(one, settings));
    return s.metrics.devices[0].peak_activation_bytes;
  };
  const Config c = parse_or_fail(one);
  const double layer = layer_activation_bytes(c), input = hidden_activation_bytes(c);
  const Bytes head = peak({}) - std::llround(8 * layer);  // the LM head's logits and input, kept alike by all
  const std::string full = "training.recompute_granularity=\"full\"";
  // Uniform, groups of 2: four inputs kept, one group of two layers rebuilt at a time.
  CHECK(peak({full, "training.recompute_num_layers=2"}) == head + std::llround(4 * input) + std::llround(2 * layer));
  // Uniform, groups of 3: ceil(8/3) = 3 inputs; one group of 3 rebuilt.
  CHECK(peak({full, "training.recompute_num_layers=3"}) == head + std::llround(3 * input) + std::llround(3 * layer));
  // Block, 5 layers: their 5 inputs and 3 whole layers kept, one layer rebuilt at a time.
  CHECK(peak({full, "training.recompute_method=\"block\"", "training.recompute_num_layers=5"}) ==
        head + std::llround(5 * input + 3 * layer) + std::llround(layer));
}

TEST_CASE("recomputation holds for every schedule and vocabulary mode: R before B, no more memory, no less time") {
  for (const char* schedule : {"1f1b", "gpipe", "interleaved-1f1b", "zb-h1", "zb-v", "v-half", "dualpipe-v"})
    for (const char* vocab : {"baseline", "vocab-1", "vocab-2", "interlaced", "redistribute"}) {
      INFO(schedule << " " << vocab);
      std::vector<std::string> settings = {fmt::format("schedule.name=\"{}\"", schedule),
                                           fmt::format("schedule.vocab=\"{}\"", vocab), "parallel.chunks=2",
                                           "model.layers=8", "parallel.pp=2", "parallel.microbatches=4"};
      Result<Plan> plain = make_plan(parse_or_fail(kGpt, settings));
      if (!plain.ok()) continue;  // a combination the schedule does not support
      settings.push_back("training.recompute_granularity=\"full\"");
      const Simulated a = simulate_or_fail(parse_or_fail(kGpt, std::vector<std::string>(settings.begin(), settings.end() - 1)));
      const Simulated b = simulate_or_fail(parse_or_fail(kGpt, settings));
      // Every B of a stage with layers has its R (redistribute may leave a stage none: nothing to rebuild).
      std::size_t with_layers = 0;
      for (const Task& t : b.plan.graph.tasks())
        with_layers += t.kind == OpKind::B && b.plan.layout.stages[std::size_t(t.stage)].layers > 0;
      CHECK(count(b.plan.graph, OpKind::R) == with_layers);
      CHECK(b.metrics.iteration_ns >= a.metrics.iteration_ns);
      for (std::size_t d = 0; d < a.metrics.devices.size(); ++d)
        CHECK(b.metrics.devices[d].peak_activation_bytes <= a.metrics.devices[d].peak_activation_bytes);
    }
}

TEST_CASE("ZeRO's collectives: a reduce-scatter per device, the weights gathered after the step or before F") {
  const auto data = [](const Simulated& s) {
    std::map<CollectiveData, int> counts;
    for (const Task& t : s.plan.graph.tasks())
      if (t.kind == OpKind::DpAllReduce) ++counts[s.plan.graph.groups()[std::size_t(t.group)].data];
    return counts;
  };
  const std::vector<std::string> dp = {"parallel.dp=4"};
  const auto with = [&](std::vector<std::string> more) {
    more.insert(more.begin(), dp.begin(), dp.end());
    return simulate_or_fail(parse_or_fail(kGpt, more));
  };
  CHECK(data(with({})) == std::map<CollectiveData, int>{{CollectiveData::Gradients, 3}});
  CHECK(data(with({"training.zero_stage=1"})) ==
        std::map<CollectiveData, int>{{CollectiveData::GradientShards, 3}, {CollectiveData::Parameters, 3}});
  CHECK(data(with({"training.zero_stage=3"})) ==
        std::map<CollectiveData, int>{{CollectiveData::GradientShards, 3}, {CollectiveData::Parameters, 6}});
  // A reduce-scatter and an all-gather take the ring time of one all-reduce of the same bytes; with
  // bf16 weights and fp32 gradients, ZeRO 1 moves 6 bytes a parameter to the all-reduce's 8.
  const Simulated plain = with({}), zero = with({"training.zero_stage=1"});
  CHECK(zero.metrics.iteration_ns < plain.metrics.iteration_ns);
  // Gathering before each stage's first F instead of after the step: with one stage a device, the
  // first device's gather waits as long either way; with two, the second's hides behind the first's
  // forwards.
  const Simulated overlapped = with({"training.zero_stage=1", "training.overlap_param_gather=true"});
  CHECK(overlapped.metrics.iteration_ns <= zero.metrics.iteration_ns);
  const std::vector<std::string> chunks = {"training.zero_stage=1", "model.layers=6", "parallel.chunks=2",
                                           "schedule.name=\"interleaved-1f1b\""};
  std::vector<std::string> gather_early = chunks;
  gather_early.push_back("training.overlap_param_gather=true");
  CHECK(with(gather_early).metrics.iteration_ns < with(chunks).metrics.iteration_ns);
  // Overlapping the gradient reduction with the backward never lengthens the iteration.
  const Simulated reduce_early = with({"training.overlap_grad_reduce=true"});
  CHECK(reduce_early.metrics.iteration_ns <= plain.metrics.iteration_ns);
}

TEST_CASE("gradient buckets: Megatron's first stage and FSDP's layers beside their passes, the embedding's after") {
  // The tail's closed form: three buckets of 300 leave one after a long pass, and what they cannot
  // fit beside a short one; one bucket is the whole collective after the pass.
  CHECK(bucketed_tail(300, 3, 3000) == 300);
  CHECK(bucketed_tail(300, 3, 600) == 3 * 300 - 600 * 2 / 3);
  CHECK(bucketed_tail(300, 1, 3000) == 300);

  // 4M-parameter buckets: stage 0 holds the embedding (32000·1024) and one layer (12·1024² + 13·1024).
  const std::vector<std::string> zero = {"parallel.dp=2", "training.zero_stage=1", "training.overlap_grad_reduce=true",
                                         "training.overlap_param_gather=true", "training.bucket_size=4000000"};
  const Simulated s = simulate_or_fail(parse_or_fail(kGpt, zero));
  const double embedding = 32000.0 * 1024, layer = 12.0 * 1024 * 1024 + 13 * 1024;
  std::vector<std::string> large = zero;
  large.back() = "training.bucket_size=2000000000";
  const Simulated one_bucket = simulate_or_fail(parse_or_fail(kGpt, large));
  REQUIRE(one_bucket.plan.graph.size() == s.plan.graph.size());
  const CostModel& costs = *s.plan.costs;
  int bucketed = 0;
  for (TaskId id = 0; id < TaskId(s.plan.graph.size()); ++id) {
    const Task& t = s.plan.graph.task(id);
    if (t.kind != OpKind::DpAllReduce) continue;
    const TaskWork& w = s.plan.graph.work_of(t);
    INFO(s.plan.graph.describe(id));
    if (t.stage != 0) {  // Megatron-Core buckets the first model chunk of the first pipeline rank only
      CHECK(w.buckets == 1);
      CHECK(s.durations[std::size_t(id)] == one_bucket.durations[std::size_t(id)]);
      continue;
    }
    ++bucketed;
    const bool weights = s.plan.graph.group_of(id).data == CollectiveData::Parameters;
    const double bytes_each = weights ? 2 : 4;
    CHECK(w.buckets == 4);  // ceil(12.6M / 4M)
    CHECK(w.embedding_bytes == Approx(embedding * bytes_each));
    CHECK(w.bytes == Approx((embedding + layer) * bytes_each));
    const StageTimes& times = costs.stage(0);
    const TimeNs pass = weights ? times.forward : times.backward + times.weight;
    // Each bucket a collective of a quarter of the layer's bytes, the embedding's one of its own after
    // them; the whole collective (the same op in one bucket as large as the stage) takes longer.
    const CollectiveGroup& group = s.plan.graph.group_of(id);
    const TimeNs bucket = costs.collective_time(t, {.bytes = layer * bytes_each / 4}, group);
    const TimeNs embedding_time = costs.collective_time(t, {.bytes = embedding * bytes_each}, group);
    CHECK(s.durations[std::size_t(id)] == embedding_time + bucketed_tail(bucket, 4, pass));
    CHECK(s.durations[std::size_t(id)] < one_bucket.durations[std::size_t(id)]);
  }
  CHECK(bucketed == 2);  // the reduce-scatter and the gather
  // FSDP (ZeRO 3) goes a layer at a time on every stage, the embedding and the LM head (with the final
  // norm, 2h) in its root unit. The forward's gathers go beside the forward; the backward's gather
  // only its first layer ahead of it, the others beside the backward with the reduce-scatters, on the
  // same links: each bucket a layer's gather and a layer's reduce-scatter. A slow network (1 GB/s
  // between nodes, dp 16 over two nodes) leaves some of them past each pass.
  const Simulated fsdp = simulate_or_fail(parse_or_fail(
      kGpt, {"parallel.dp=16", "model.layers=6", "training.zero_stage=3", "hardware.inter_node_gbps=1"}));
  const CostModel& fsdp_costs = *fsdp.plan.costs;
  int units = 0, exposed = 0;
  for (TaskId id = 0; id < TaskId(fsdp.plan.graph.size()); ++id) {
    const Task& t = fsdp.plan.graph.task(id);
    if (t.kind != OpKind::DpAllReduce) continue;
    INFO(fsdp.plan.graph.describe(id));
    const TaskWork& w = fsdp.plan.graph.work_of(t);
    const VirtualStage& stage = fsdp.plan.layout.stages[std::size_t(t.stage)];
    const double root = (stage.has_embedding ? embedding : 0) + (stage.has_head ? embedding + 2 * 1024 : 0);
    const CollectiveGroup& group = fsdp.plan.graph.group_of(id);
    const bool weights = group.data == CollectiveData::Parameters;
    const double bytes_each = weights ? 2 : 4, n = stage.layers;
    CHECK(w.buckets == stage.layers);
    CHECK(w.embedding_bytes == Approx(root * bytes_each));
    const CollectiveGroup gather{.members = {}, .ranks = 16, .data = CollectiveData::Parameters};
    const TimeNs root_time = root > 0 ? fsdp_costs.collective_time(t, {.bytes = root * bytes_each}, group) : 0;
    const TimeNs layer_gather = fsdp_costs.collective_time(t, {.bytes = layer * 2}, gather);
    const StageTimes& times = fsdp_costs.stage(t.stage);
    TimeNs expected = root_time + bucketed_tail(layer_gather, int(n), times.forward);  // the forward's
    if (weights && t.payload == Payload::Gradient) expected = root_time + layer_gather;
    if (!weights) {
      CHECK(w.gathered_beside_bytes == Approx(n * layer * 2));
      const TimeNs layer_reduce = fsdp_costs.collective_time(t, {.bytes = layer * 4}, group);
      expected = root_time + bucketed_tail(layer_gather + layer_reduce, int(n), times.backward + times.weight);
      exposed += bucketed_tail(layer_gather + layer_reduce, int(n), times.backward + times.weight) > layer_gather + layer_reduce;
    }
    CHECK(std::abs(fsdp.durations[std::size_t(id)] - expected) <= 2);  // rounding to whole nanoseconds
    ++units;
  }
  CHECK(units == 9);  // per stage: two gathers and a reduce-scatter
  CHECK(exposed == 3);  // the slow network's reduce-scatters and gathers do not fit beside the backward
  // Without the flag (or under ZeRO 3) nothing goes in buckets.
  CHECK(gradient_bucket_params(parse_or_fail(kGpt, {"parallel.dp=2"})) == 0);
  CHECK(gradient_bucket_params(parse_or_fail(kGpt, {"parallel.dp=64", "training.overlap_grad_reduce=true"})) == 64e6);
  CHECK(gradient_bucket_params(parse_or_fail(kGpt, {"parallel.dp=2", "training.zero_stage=3",
                                                   "training.overlap_grad_reduce=true"})) == 0);
}

TEST_CASE("the data-parallel collectives carry a device's vocabulary shards, per device or after its stages") {
  // Per device and direction (gradients, weights), the bytes the collectives move, and how many.
  struct Moved {
    double bytes = 0;
    int ops = 0, shard_ops = 0;
  };
  const auto moved = [](const Simulated& s, int device, bool weights) {
    Moved m;
    for (TaskId id = 0; id < TaskId(s.plan.graph.size()); ++id) {
      const Task& t = s.plan.graph.task(id);
      if (t.kind != OpKind::DpAllReduce || t.device != device) continue;
      if ((s.plan.graph.group_of(id).data == CollectiveData::Parameters) != weights) continue;
      m.bytes += s.plan.graph.work_of(t).bytes, ++m.ops;
      if (t.stage < 0) ++m.shard_ops;
    }
    return m;
  };
  for (const std::string vocab : {"baseline", "vocab-1"}) {
    const std::vector<std::string> common = {"parallel.dp=2", "schedule.vocab=\"" + vocab + "\"", "model.layers=6",
                                             "parallel.chunks=2", "schedule.name=\"interleaved-1f1b\""};
    std::vector<std::string> per_stage = common;
    per_stage.insert(per_stage.end(), {"training.zero_stage=1", "training.overlap_grad_reduce=true",
                                       "training.overlap_param_gather=true"});
    std::vector<std::string> per_device = common;
    per_device.push_back("training.zero_stage=1");
    const Simulated whole = simulate_or_fail(parse_or_fail(kGpt, per_device));
    const Simulated split = simulate_or_fail(parse_or_fail(kGpt, per_stage));
    // The vocabulary-parallel modes put 2·V'/p·h parameters on every device, in no stage (V' the
    // vocabulary padded to a multiple of the p = 3 devices): 4 bytes each as fp32 gradients, 2 as
    // bf16 weights.
    const double shard = vocab == "baseline" ? 0 : 2.0 * (32001.0 / 3) * 1024;
    for (int d = 0; d < 3; ++d)
      for (const bool weights : {false, true}) {
        INFO(vocab << ", device " << d << (weights ? ", weights" : ", gradients"));
        const Moved once = moved(whole, d, weights), staged = moved(split, d, weights);
        CHECK(once.ops == 1);
        CHECK(staged.bytes == Approx(once.bytes));  // the same tensors, in more collectives
        CHECK(staged.ops == 2 + (shard > 0 ? 1 : 0));  // two chunks, and the shards' own
        CHECK(staged.shard_ops == (shard > 0 ? 1 : 0));
        if (shard > 0) {
          double stages = 0;
          for (const VirtualStage& v : split.plan.layout.stages)
            if (v.device == d) stages += v.layers * layer_params(split.plan.config.model);
          CHECK(once.bytes == Approx((stages + shard) * (weights ? 2 : 4)));
        }
      }
  }
}

TEST_CASE("tied embeddings: a device holding both uses holds one matrix, two devices a copy each") {
  // V·h parameters saved where one device holds both uses: a shard of V'/p rows (V' = 32001, the
  // vocabulary padded to the p = 3 devices), or in V placement the whole matrix on device 0.
  const double h = 1024, per_parameter = ZeroSharding{0, 1}.bytes_per_param(parse_or_fail(kGpt).precision);
  for (const auto& [schedule, vocab] : {std::pair{"1f1b", "vocab-1"}, {"zb-v", "baseline"}, {"1f1b", "baseline"}}) {
    const auto held = [&](bool tied) {
      return plan_or_fail(parse_or_fail(kGpt, {"model.layers=6", fmt::format("schedule.name=\"{}\"", schedule),
                                               fmt::format("schedule.vocab=\"{}\"", vocab),
                                               fmt::format("model.tied_embeddings={}", tied)}))
          .static_bytes;
    };
    const std::vector<Bytes> untied = held(false), tied = held(true);
    for (int d = 0; d < 3; ++d) {
      INFO(schedule << " / " << vocab << ", device " << d);
      const double rows = vocab == std::string("vocab-1") ? 32001.0 / 3 : schedule == std::string("zb-v") && d == 0 ? 32000 : 0;
      CHECK(double(untied[std::size_t(d)] - tied[std::size_t(d)]) == Approx(rows * h * per_parameter));
    }
  }
}

TEST_CASE("tied embeddings on two devices: their gradients summed, V·h of fp32, before either device's optimizer") {
  const auto simulated = [](const std::string& schedule, bool tied) {
    return simulate_or_fail(parse_or_fail(kGpt, {"model.layers=6", fmt::format("schedule.name=\"{}\"", schedule),
                                                 fmt::format("model.tied_embeddings={}", tied)}));
  };
  const Simulated apart = simulated("1f1b", true);
  std::vector<int> devices;
  for (TaskId id = 0; id < TaskId(apart.plan.graph.size()); ++id) {
    const Task& t = apart.plan.graph.task(id);
    if (t.group < 0 || apart.plan.graph.group_of(id).data != CollectiveData::TiedEmbedding) continue;
    devices.push_back(t.device);
    CHECK(t.kind == OpKind::AllReduce);
    CHECK(apart.plan.graph.group_of(id).ranks == 2);
    CHECK(apart.plan.graph.work_of(t).bytes == 32000.0 * 1024 * 4);
    // The optimizer step of its device waits for it.
    for (TaskId other = 0; other < TaskId(apart.plan.graph.size()); ++other)
      if (apart.plan.graph.task(other).kind == OpKind::Optimizer && apart.plan.graph.task(other).device == t.device) {
        const auto deps = apart.plan.graph.deps(other);
        CHECK(std::find(deps.begin(), deps.end(), id) != deps.end());
        CHECK(apart.timeline.start[std::size_t(other)] >= apart.timeline.end[std::size_t(id)]);
      }
  }
  CHECK(devices == std::vector<int>{0, 2});
  CHECK(apart.metrics.iteration_ns > simulated("1f1b", false).metrics.iteration_ns);
  // V placement holds both uses on device 0: nothing to sum.
  CHECK_FALSE(simulated("zb-v", true).plan.graph.has(OpKind::AllReduce));
}

TEST_CASE("under explicit costs a device's per-stage data-parallel collectives share its dp_allreduce_ms by bytes") {
  // Two chunks a device, each stage's gradients reduced on their own, the vocabulary shards too: the
  // device's reductions add up to the one all-reduce that dp_allreduce_ms times.
  for (const std::string vocab : {"baseline", "vocab-1"}) {
    const Simulated s = simulate_or_fail(parse_or_fail(
        kGpt, {"parallel.dp=2", "model.layers=6", "parallel.chunks=2", "schedule.name=\"interleaved-1f1b\"",
               "schedule.vocab=\"" + vocab + "\"", "training.overlap_grad_reduce=true",
               "costs={\"forward_ms\": 1, \"backward_ms\": 2, \"dp_allreduce_ms\": 10}"}));
    std::vector<TimeNs> per_device(3, 0);
    std::vector<int> ops(3, 0);
    for (TaskId id = 0; id < TaskId(s.plan.graph.size()); ++id)
      if (s.plan.graph.task(id).kind == OpKind::DpAllReduce) {
        per_device[std::size_t(s.plan.graph.task(id).device)] += s.durations[std::size_t(id)];
        ++ops[std::size_t(s.plan.graph.task(id).device)];
      }
    for (int d = 0; d < 3; ++d) {
      INFO(vocab << ", device " << d);
      CHECK(ops[std::size_t(d)] == (vocab == "baseline" ? 2 : 3));
      CHECK(std::abs(per_device[std::size_t(d)] - ns_from_ms(10)) <= 2);  // rounding, one ns an op
    }
  }
}

TEST_CASE("reserved memory comes off the device before a config fits; the rest is the headroom") {
  const Simulated s = simulate_or_fail(parse_or_fail(kGpt, {"hardware.memory_gib=80", "hardware.reserved_gib=5"}));
  CHECK(s.metrics.memory_capacity_bytes == Bytes(75) << 30);
  Bytes most = 0;
  for (const DeviceMetrics& d : s.metrics.devices) most = std::max(most, d.peak_memory_bytes);
  CHECK(s.metrics.headroom_bytes == s.metrics.memory_capacity_bytes - most);
  // The preset's default, documented in docs/config.md.
  CHECK(parse_or_fail(kGpt).hardware.reserved_gib == 3.0);
}

TEST_CASE("tensor-parallel communication overlapped with its GEMMs shortens the passes, never lengthens them") {
  const Simulated a = simulate_or_fail(parse_or_fail(kGpt, {"parallel.tp=4"}));
  const Simulated b = simulate_or_fail(parse_or_fail(kGpt, {"parallel.tp=4", "training.tp_comm_overlap=true"}));
  CHECK(b.metrics.iteration_ns < a.metrics.iteration_ns);
}

TEST_CASE("Transformer Engine's overlapped reduce-scatters slow their GEMMs by the SMs they take and expose their last split") {
  // tp 2 with sequence parallelism on a 32-SM GPU whose memory never limits: the attention output
  // projection's and the MLP down projection's forward GEMMs (T x h by h/t, T x h by f/t, T = b·s)
  // keep 32 - 16 SMs, twice their time on all 32, and each forward reduce-scatter's last quarter runs
  // after its GEMM. Middle stage (one layer, no embedding or head); F against the same with no margin.
  const auto forward_ns = [](int sms) {
    const Simulated s = simulate_or_fail(parse_or_fail(
        kGpt, {"parallel.tp=2", "parallel.sequence_parallel=true", "training.tp_comm_overlap=true",
               "hardware.sms=32", "hardware.hbm_gbps=1e7", fmt::format("training.tp_comm_overlap_proj_sms={}", sms),
               fmt::format("training.tp_comm_overlap_fc2_sms={}", sms)}));
    for (TaskId id = 0; id < TaskId(s.plan.graph.size()); ++id)
      if (s.plan.graph.task(id).kind == OpKind::F && s.plan.graph.task(id).stage == 1) return s.durations[std::size_t(id)];
    FAIL("no forward of stage 1");
    return TimeNs(0);
  };
  const HardwareConfig h = parse_or_fail(kGpt).hardware;
  const double t = 2, tokens = 2 * 2048, hidden = 1024, ffn = 4096;
  const double flops_per_s = h.peak_tflops * 1e12 * h.compute_efficiency * h.sustained_compute_fraction;
  const double proj_s = 2 * tokens * hidden * hidden / t / flops_per_s, fc2_s = 2 * tokens * hidden * ffn / t / flops_per_s;
  const double reduce_scatter_s = h.intra_node_latency_us * 1e-6 + tokens * hidden * 2 / t / (nvlink_gbps(h) * 1e9);
  const double expected_s = proj_s + fc2_s + 2 * reduce_scatter_s / 4;
  CHECK(std::abs(double(forward_ns(16) - forward_ns(0)) - expected_s * 1e9) < 4);
}

TEST_CASE("the training keys are checked, each error naming its field and the fix") {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"training.recompute_granularity=\"most\""},
       "test.json: training.recompute_granularity (from --set): expected \"none\", \"selective\" (core attention), "
       "\"selective_op\" (torchtitan's per-op policy) or \"full\" (whole layers), got \"most\""},
      {{"training.zero_stage=4"}, "test.json: training.zero_stage (from --set): must be at most 3, got 4"},
      {{"training.tp_comm_overlap=true"},
       "test.json: training.tp_comm_overlap (from --set): overlaps the all-gathers and reduce-scatters of sequence "
       "parallelism, so it needs parallel.tp > 1 and parallel.sequence_parallel true; set it to false"},
      {{"parallel.tp=2", "parallel.sequence_parallel=true", "training.tp_comm_overlap=true",
        "training.tp_comm_overlap_fc2_sms=132"},
       "test.json: training.tp_comm_overlap_fc2_sms (from --set): a reduce-scatter cannot take all 132 of the GPU's SMs "
       "(hardware.sms) from its GEMM; give fewer (Transformer Engine's default is 16)"},
      {{"training.bucket_size=1000000"},
       "test.json: training.bucket_size (from --set): sizes the gradient buckets that training.overlap_grad_reduce "
       "reduces during the backward, and it is off; set it to true or remove bucket_size"},
      {{"training.overlap_param_gather=true"},
       "test.json: training.overlap_param_gather (from --set): gathers parameters that a sharded optimizer updated, so "
       "it needs training.zero_stage >= 1; set it to false or shard"},
      {{"parallel.cp=3"},
       "test.json: parallel.cp (from --set): cp 3 needs seq_len (2048) divisible by 2 x cp = 6: each rank takes two "
       "chunks of the sequence, one early and one late, to balance causal attention; choose a cp that divides 1024"},
      {{"precision.distributed_optimizer=true", "training.zero_stage=0"},
       "test.json: training.zero_stage (from --set): is 0 but precision.distributed_optimizer is true (ZeRO stage 1); "
       "remove one of them or make them agree"},
      {{"hardware.reserved_gib=100"}, "test.json: hardware.reserved_gib (from --set): must be at most 79.6, got 100"},
  };
  for (const auto& [settings, message] : cases) {
    INFO(settings.front());
    const Result<Config> c = parse_config(kGpt, "test.json", settings);
    REQUIRE(!c.ok());
    CHECK(c.error().message == message);
  }
  const Result<Config> explicit_costs =
      parse_config(explicit_json(2, 4, 1, 1.0, 2.0), "test.json", {"training.recompute_granularity=\"full\""});
  REQUIRE(!explicit_costs.ok());
  CHECK_THAT(explicit_costs.error().message, Catch::Contains("training.recompute_granularity"));
}

TEST_CASE("export leaves the R ops out and import puts them back: the same simulation") {
  for (const char* schedule : {"1f1b", "interleaved-1f1b", "zb-v"}) {
    INFO(schedule);
    const Config c = parse_or_fail(kGpt, {"training.recompute_granularity=\"full\"", "model.layers=8", "parallel.pp=2",
                                          "parallel.chunks=2", fmt::format("schedule.name=\"{}\"", schedule)});
    const Simulated generated = simulate_or_fail(c);
    const std::string csv = schedule_csv(generated.plan.graph);
    CHECK(csv.find('R') == std::string::npos);
    Result<CustomSchedule> loaded = parse_schedule_csv(csv, "s.csv", 2, 6);
    if (!loaded.ok()) FAIL(loaded.error().message);
    Result<Plan> plan = make_plan(c, &loaded.value());
    if (!plan.ok()) FAIL(plan.error().message);
    CHECK(count(plan.value().graph, OpKind::R) == count(generated.plan.graph, OpKind::R));
    const std::vector<TimeNs> durations =
        op_durations(*make_cost_model(plan.value().config, plan.value().layout), plan.value().graph);
    Result<Timeline> timeline = simulate(plan.value().graph, durations);
    REQUIRE(timeline.ok());
    CHECK(*std::max_element(timeline.value().end.begin(), timeline.value().end.end()) == generated.metrics.iteration_ns);
  }
}

TEST_CASE("a data-parallel ring across nodes leaves each node through as many ports as it has members there") {
  // pp 1 and dp 16 on 8-GPU nodes: tp 1 puts 8 members of the group in a node, whose rings leave it
  // over 8 ports (min(NVLink, 8 x port)); tp 8 puts one there, which has its own port. The ZeRO 0
  // all-reduce is 2(n - 1) steps of bytes / n, each a latency plus its bytes at that speed.
  for (const int tp : {1, 8}) {
    CAPTURE(tp);
    const Simulated s = simulate_or_fail(parse_or_fail(
        kGpt, {"parallel.pp=1", "parallel.dp=16", fmt::format("parallel.tp={}", tp), "model.layers=2"}));
    const HardwareConfig& h = s.plan.config.hardware;
    const double gbps = tp == 1 ? std::min(nvlink_gbps(h), 8 * h.inter_node_gbps) : h.inter_node_gbps;
    for (TaskId id = 0; id < TaskId(s.plan.graph.size()); ++id) {
      const Task& t = s.plan.graph.task(id);
      if (t.kind != OpKind::DpAllReduce) continue;
      const double step_s = h.inter_node_latency_us * 1e-6 + s.plan.graph.work_of(t).bytes / 16 / (gbps * 1e9);
      CHECK(std::abs(double(s.timeline.end[std::size_t(id)] - s.timeline.start[std::size_t(id)]) - 30 * step_s * 1e9) < 30);
    }
  }
}
