// The analytic cost model against docs/cost-model.md ("Analytic"), re-derived here from the
// formulas: roofline time of a transformer layer, α-β links that know node boundaries, static
// memory, and the paper's MFU.
#include <cmath>

#include "calibration.h"
#include "model_math.h"
#include "helpers.h"

using namespace pipesim;
using namespace pipesim::testing;

namespace {

const char* kThreeStages = R"json({
  "model": {"layers": 3, "hidden": 1024, "heads": 16, "ffn_hidden": 4096, "seq_len": 2048, "vocab": 32000},
  "parallel": {"pp": 3, "microbatches": 6},
  "hardware": {"preset": "h100-sxm", "gpus_per_node": 2}
})json";

/// The message parse_config gives `json` with `overrides`; a config it accepts fails the test.
std::string parse_error(const std::string& json, const std::vector<std::string>& overrides) {
  const Result<Config> config = parse_config(json, "test.json", overrides);
  if (config.ok()) FAIL("the config was accepted");
  return config.error().message;
}

}  // namespace

TEST_CASE("a transformer layer is the sum of its kernels' roofline times, each with a launch") {
  const Config c = parse_or_fail(kThreeStages);
  const Plan plan = plan_or_fail(c);
  const auto model = make_cost_model(plan.config, plan.layout);
  const double T = 2048, s = 2048, h = 1024, f = 4096;  // tokens (b = 1), sequence, hidden, FFN
  const HardwareConfig& hw = c.hardware;
  const auto kernel = [&](double flops, double bytes, double efficiency) {
    return std::max(flops / (hw.peak_tflops * 1e12 * efficiency * hw.sustained_compute_fraction),
                    bytes / (hw.hbm_gbps * 1e9 * hw.hbm_efficiency)) +
           hw.kernel_launch_us * 1e-6;
  };
  // A GEMM's output runs as 128×128 tiles on the H100's 132 SMs: with fewer tiles than SMs the rest idle.
  REQUIRE(hw.sms == 132);
  const auto fill = [](double rows, double cols) {
    const double tiles = std::ceil(rows / 128) * std::ceil(cols / 128);
    return rows * cols / (128.0 * 128 * std::max(tiles, 132.0));
  };
  const auto gemm = [&](double rows, double cols, double k, double bytes) {
    return kernel(2 * rows * cols * k, bytes, hw.compute_efficiency * fill(rows, cols));
  };
  // GPT's four linears (out, in): QKV, projection, MLP up and down; bf16 operands, fp32 gradients.
  const std::pair<double, double> linears[] = {{3 * h, h}, {h, h}, {f, h}, {h, f}};
  double forward = 0, backward = 0, weight = 0;
  for (const auto& [n_out, n_in] : linears) {
    forward += gemm(T, n_out, n_in, 2 * (T * n_in + n_in * n_out + T * n_out));
    backward += gemm(T, n_in, n_out, 2 * (T * n_out + n_out * n_in + T * n_in));
    weight += gemm(n_out, n_in, T, 2 * T * n_out + 2 * T * n_in + 8 * n_out * n_in);
  }
  // The projection's gradient (1024 × 1024 = 64 tiles) fills under half the SMs.
  CHECK(fill(h, h) == Approx(64.0 / 132));
  // Causal attention: half of 4bs²h forward, 2.5× that backward; Q, K, V, O read or written once;
  // over s keys at s / (s + attention_overhead_tokens) of its long-sequence efficiency, and over its
  // grid of N blocks (16 heads × 16 tiles of 128 queries) at N / (N + SMs).
  const double blocks = 16 * (s / 128);
  const double attention = hw.attention_efficiency * s / (s + hw.attention_overhead_tokens) * blocks / (blocks + 132);
  forward += kernel(2 * T * s * h, 4 * T * h * 2, attention);
  backward += kernel(2.5 * 2 * T * s * h, 8 * T * h * 2, attention);
  // Memory-bound: norms, residual sums and GELU (10h + 2f), their backward (16h + 3f), bias gradients
  // (3h + 2h + f).
  forward += kernel(0, T * (10 * h + 2 * f) * 2, 1);
  backward += kernel(0, T * (16 * h + 3 * f) * 2, 1);
  weight += kernel(0, T * (5 * h + f) * 2, 1);
  // Stage 1 holds one layer and no vocabulary layer.
  CHECK(model->stage(1).forward == Approx(forward * 1e9).margin(2));
  CHECK(model->stage(1).backward == Approx(backward * 1e9).margin(2));
  CHECK(model->stage(1).weight == Approx(weight * 1e9).margin(2));
}

TEST_CASE("a GEMM runs whole 128x128 output tiles on the SMs: ragged edges and a part wave cost time") {
  const auto gemm = [](double rows, double cols) { return Kernel{2 * rows * cols * 4096, 0, false, rows, cols}; };
  CHECK(tile_fill(gemm(2048, 3072), 132) == 1);                                 // 384 whole tiles: three waves
  CHECK(tile_fill(gemm(2048, 1000), 132) == Approx(2048.0 * 1000 / (16384 * 132)));  // 16 × 8 tiles, the last column ragged
  CHECK(tile_fill(gemm(4096, 1000), 132) == Approx(1000.0 / 1024));                 // 256 tiles: only the edge costs
  CHECK(tile_fill(gemm(2048, 1000), 0) == 1);                                    // sms 0: shape does not matter
  CHECK(tile_fill(Kernel{0, 1e9, false, 0, 0}, 132) == 1);                       // not a GEMM
  // Through a config: at tp 8 a 2048-wide model's GEMMs split into part waves; more tokens a
  // microbatch fill them, so a layer's time per token falls with the micro-batch size.
  const auto per_token = [](int micro_batch_size) {
    const Config c = parse_or_fail(fmt::format(R"json({{
      "model": {{"layers": 2, "hidden": 2048, "heads": 16, "ffn_hidden": 8192, "seq_len": 1024, "vocab": 32000,
                 "micro_batch_size": {}}},
      "parallel": {{"pp": 2, "tp": 8, "microbatches": 4}}, "hardware": {{"preset": "h100-sxm"}}}})json",
                                               micro_batch_size));
    const Plan plan = plan_or_fail(c);
    return double(make_cost_model(plan.config, plan.layout)->stage(1).forward) / micro_batch_size;
  };
  CHECK(per_token(4) < 0.8 * per_token(1));
}

TEST_CASE("without flash attention, the score matrix goes through HBM: two batched GEMMs, softmax and dropout") {
  const Plan flash = plan_or_fail(parse_or_fail(kThreeStages));
  const Plan unfused = plan_or_fail(parse_or_fail(kThreeStages, {"precision.flash_attention=false"}));
  const HardwareConfig& hw = flash.config.hardware;
  const double T = 2048, s = 2048, h = 1024, a = 16;  // tokens (b = 1), keys, hidden, heads
  const auto kernel = [&](double flops, double bytes, double efficiency) {
    return std::max(flops / (hw.peak_tflops * 1e12 * efficiency * hw.sustained_compute_fraction),
                    bytes / (hw.hbm_gbps * 1e9 * hw.hbm_efficiency));
  };
  const double products = 2 * T * s * h, qkvo = 4 * T * h * 2;  // QKᵀ unmasked; Q, K, V, O in bf16
  const double scores = T * s * a, score_bytes = 2 * scores;
  const double product = kernel(products, qkvo / 2 + score_bytes, hw.compute_efficiency);
  const double forward = 2 * product + kernel(0, 2 * score_bytes, 1) + kernel(0, 2 * score_bytes + scores, 1);
  const double backward = 4 * product + kernel(0, 2 * score_bytes + scores, 1) + kernel(0, 3 * score_bytes, 1);
  // Flash attention's one kernel: half the products (causal) forward, 2.5× that backward; its
  // grid: a block for each head's 128 queries.
  const double blocks = a * s / 128;
  const double at_keys = s / (s + hw.attention_overhead_tokens) * blocks / (blocks + hw.sms);
  const double flash_forward = kernel(products, qkvo, hw.attention_efficiency * at_keys);
  const double flash_backward = kernel(2.5 * products, 2 * qkvo, hw.attention_efficiency * at_keys);
  const auto time = [](const Plan& plan) { return make_cost_model(plan.config, plan.layout)->stage(1); };
  CHECK(double(time(unfused).forward - time(flash).forward) == Approx((forward - flash_forward) * 1e9).margin(4));
  CHECK(double(time(unfused).backward - time(flash).backward) == Approx((backward - flash_backward) * 1e9).margin(4));
  // Selective recomputation runs the score part again before the backward.
  const Plan selective = plan_or_fail(parse_or_fail(
      kThreeStages, {"precision.flash_attention=false", "training.recompute_granularity=selective"}));
  CHECK(double(time(selective).backward - time(unfused).backward) == Approx(forward * 1e9).margin(4));
}

TEST_CASE("fused attention over L keys runs at L / (L + attention_overhead_tokens) of its efficiency and over N "
          "blocks at N / (N + SMs); under context parallelism each call sees its rank's keys") {
  const double s = 2048, h = 1024, heads = 16;  // keys (= tokens, b = 1), hidden
  const auto attention_ns = [&](const std::vector<std::string>& overrides) {
    const Plan plan = plan_or_fail(parse_or_fail(kThreeStages, overrides));
    const StageTimes with = make_cost_model(plan.config, plan.layout)->stage(1);
    std::vector<std::string> without_overhead = overrides;
    without_overhead.push_back("hardware.attention_overhead_tokens=0");
    const Plan bare = plan_or_fail(parse_or_fail(kThreeStages, without_overhead));
    const StageTimes without = make_cost_model(bare.config, bare.layout)->stage(1);
    return std::pair{double(with.forward - without.forward), double(with.backward - without.backward)};
  };
  const HardwareConfig hw = parse_or_fail(kThreeStages).hardware;
  REQUIRE(hw.attention_overhead_tokens > 0);
  // The kernel's time at its keys, less at no overhead; `blocks` tiles of 128 queries, a head each.
  const auto seconds = [&](double flops, double keys, double blocks) {
    const double rate = hw.peak_tflops * 1e12 * hw.attention_efficiency * hw.sustained_compute_fraction *
                        blocks / (blocks + hw.sms);
    return flops / rate * hw.attention_overhead_tokens / keys;
  };
  const double forward = 2 * s * s * h;  // causal: half of 4·T·s·h
  const auto [f, b] = attention_ns({});
  CHECK(f == Approx(seconds(forward, s, heads * s / 128) * 1e9).margin(2));
  CHECK(b == Approx(seconds(2.5 * forward, s, heads * s / 128) * 1e9).margin(2));
  // cp = 2: a rank's 1024 queries against 2048 keys, in calls over 1024 keys each (ring attention;
  // its K/V exchange made instant, so none of it shows past the attention beside it).
  const auto [f_cp, b_cp] =
      attention_ns({"parallel.cp=2", "hardware.intra_node_gbps=1e9", "hardware.intra_node_latency_us=0"});
  CHECK(f_cp == Approx(seconds(forward / 2, s / 2, heads * s / 2 / 128) * 1e9).margin(2));
  CHECK(b_cp == Approx(seconds(2.5 * forward / 2, s / 2, heads * s / 2 / 128) * 1e9).margin(2));
  // tp = 2: a rank's 8 heads, half the FLOPs over half the blocks (its collectives are the same
  // with and without the overhead, so they cancel).
  const auto [f_tp, b_tp] = attention_ns({"parallel.tp=2"});
  CHECK(f_tp == Approx(seconds(forward / 2, s, heads / 2 * s / 128) * 1e9).margin(2));
  CHECK(b_tp == Approx(seconds(2.5 * forward / 2, s, heads / 2 * s / 128) * 1e9).margin(2));
  CHECK_THAT(parse_error(kThreeStages, {"hardware.attention_overhead_tokens=-1"}),
             Catch::Contains("hardware.attention_overhead_tokens"));
}

TEST_CASE("FlashAttention-2 runs attention at the hardware's flash2 efficiency, FlashAttention-1 at half of it; "
          "sequence-first activations are copied to batch-first and back around either") {
  const Plan cudnn = plan_or_fail(parse_or_fail(kThreeStages));
  const Plan flash2 = plan_or_fail(parse_or_fail(kThreeStages, {"precision.attention_kernel=flash2"}));
  const Plan flash1 = plan_or_fail(parse_or_fail(kThreeStages, {"precision.attention_kernel=flash1"}));
  const HardwareConfig& hw = cudnn.config.hardware;
  REQUIRE(hw.flash2_attention_efficiency < hw.attention_efficiency);
  const double T = 2048, s = 2048, h = 1024, blocks = 16 * s / 128;  // tokens (b = 1), keys, hidden; 16 heads
  const auto attention = [&](double flops, double efficiency) {
    const double at_keys = s / (s + hw.attention_overhead_tokens) * blocks / (blocks + hw.sms);
    return flops / (hw.peak_tflops * 1e12 * efficiency * at_keys * hw.sustained_compute_fraction);
  };
  const double forward = 2 * T * s * h, backward = 2.5 * forward;  // causal: half of 4Tsh, 2.5x backward
  const auto time = [](const Plan& plan) { return make_cost_model(plan.config, plan.layout)->stage(1); };
  // Transformer Engine's FlashAttention backend copies Q, K, V (3h a token, multi-head) to batch-first
  // and the output (h) back, each read and written, and autograd does the same for their gradients:
  // 2 · 4h elements of 2 bytes a token each way, at HBM's rate. cuDNN takes the layout as it is.
  const double copies = 2 * 4 * T * h * 2 / (hw.hbm_gbps * 1e9 * hw.hbm_efficiency);
  const double slower_forward =
      attention(forward, hw.flash2_attention_efficiency) - attention(forward, hw.attention_efficiency) + copies;
  const double slower_backward =
      attention(backward, hw.flash2_attention_efficiency) - attention(backward, hw.attention_efficiency) + copies;
  CHECK(double(time(flash2).forward - time(cudnn).forward) == Approx(slower_forward * 1e9).margin(2));
  CHECK(double(time(flash2).backward - time(cudnn).backward) == Approx(slower_backward * 1e9).margin(2));
  CHECK(time(flash2).weight == time(cudnn).weight);
  // Batch-first activations (torchtitan, LLM Foundry) go into the kernel as they are.
  const Plan batch_first =
      plan_or_fail(parse_or_fail(kThreeStages, {"precision.attention_kernel=flash2", "training.activation_layout=bsh"}));
  CHECK(double(time(batch_first).forward - time(cudnn).forward) == Approx((slower_forward - copies) * 1e9).margin(2));
  CHECK(double(time(batch_first).backward - time(cudnn).backward) == Approx((slower_backward - copies) * 1e9).margin(2));
  // FlashAttention-2 is about twice FlashAttention-1 (Dao 2023): the attention takes twice as long.
  CHECK(double(time(flash1).forward - time(flash2).forward) ==
        Approx(attention(forward, hw.flash2_attention_efficiency) * 1e9).margin(2));
  CHECK(double(time(flash1).backward - time(flash2).backward) ==
        Approx(attention(backward, hw.flash2_attention_efficiency) * 1e9).margin(2));
  CHECK(time(flash1).weight == time(cudnn).weight);
  // The kernel is flash attention's: without it there is none to name.
  CHECK_THAT(parse_error(kThreeStages, {"precision.flash_attention=false", "precision.attention_kernel=flash2"}),
             Catch::Contains("precision.attention_kernel") && Catch::Contains("flash_attention"));
  CHECK_THAT(parse_error(kThreeStages, {"precision.attention_kernel=flash3"}),
             Catch::Contains("expected \"cudnn\"") && Catch::Contains("flash2"));
}

TEST_CASE("unpadding for FlashAttention's variable-length kernels gathers Q, K, V and scatters the output back, "
          "20 and 22 bytes an input element, 6 and 4 an output element") {
  const std::vector<std::string> batch_first = {"precision.attention_kernel=flash2", "training.activation_layout=bsh"};
  std::vector<std::string> unpadded = batch_first;
  unpadded.push_back("training.attention_unpadding=true");
  const Plan padded_plan = plan_or_fail(parse_or_fail(kThreeStages, batch_first));
  const Plan unpadded_plan = plan_or_fail(parse_or_fail(kThreeStages, unpadded));
  const HardwareConfig& hw = padded_plan.config.hardware;
  const auto time = [](const Plan& plan) { return make_cost_model(plan.config, plan.layout)->stage(1); };
  // 2048 tokens, multi-head (Q, K, V and the output each h = 1024 wide), bf16, int64 row indices:
  // forward, each input's indices written and read (16 bytes) with the element read and written (4),
  // the output's zeros written, then read and written (6); backward the output's gradient gathered (4),
  // each input's gradient scattered into zeros with its indices made again (16 + 6).
  const double T = 2048, h = 1024, rate = hw.hbm_gbps * 1e9 * hw.hbm_efficiency;
  CHECK(double(time(unpadded_plan).forward - time(padded_plan).forward) ==
        Approx((20 * 3 + 6) * T * h / rate * 1e9).margin(2));
  CHECK(double(time(unpadded_plan).backward - time(padded_plan).backward) ==
        Approx((22 * 3 + 4) * T * h / rate * 1e9).margin(2));
  CHECK(time(unpadded_plan).weight == time(padded_plan).weight);
  // cuDNN's kernel takes the padded batch: nothing to unpad for.
  CHECK_THAT(parse_error(kThreeStages, {"training.attention_unpadding=true"}),
             Catch::Contains("training.attention_unpadding") && Catch::Contains("flash2"));
}

TEST_CASE("fused kernels run SwiGLU as one kernel each way: 3f and 5f elements a token, not eager's 5f and 13f") {
  const std::vector<std::string> llama = {"model.mlp=swiglu", "model.ffn_hidden=2816"};
  std::vector<std::string> fused_sets = llama;
  fused_sets.push_back("training.kernels=fused");
  const Plan eager = plan_or_fail(parse_or_fail(kThreeStages, llama));
  const Plan fused = plan_or_fail(parse_or_fail(kThreeStages, fused_sets));
  const HardwareConfig& hw = eager.config.hardware;
  const double T = 2048, f = 2816, bf16 = 2;  // tokens (b = 1), SwiGLU's width
  const auto streaming = [&](double elements) { return elements * bf16 / (hw.hbm_gbps * 1e9 * hw.hbm_efficiency); };
  const auto time = [](const Plan& plan) { return make_cost_model(plan.config, plan.layout)->stage(1); };
  CHECK(double(time(eager).forward - time(fused).forward) == Approx(streaming(T * (5 - 3) * f) * 1e9).margin(2));
  CHECK(double(time(eager).backward - time(fused).backward) == Approx(streaming(T * (13 - 5) * f) * 1e9).margin(2));
  CHECK(time(eager).weight == time(fused).weight);
  // GELU is one kernel either way.
  CHECK(time(plan_or_fail(parse_or_fail(kThreeStages, {"training.kernels=fused"}))).forward ==
        time(plan_or_fail(parse_or_fail(kThreeStages))).forward);
  CHECK_THAT(parse_error(kThreeStages, {"training.kernels=compiled"}), Catch::Contains("expected \"eager\""));
}

TEST_CASE("composite kernels run RMSNorm and the rotary embedding step by step, each step through HBM") {
  // Grouped-query attention: 16 query heads and 4 key/value heads of 64 channels.
  const int t = GENERATE(1, 2);
  const bool sp = GENERATE(false, true);
  const std::vector<std::string> llama = {"model.mlp=swiglu", "model.ffn_hidden=2816", "model.kv_heads=4",
                                          fmt::format("parallel.tp={}", t), fmt::format("parallel.sequence_parallel={}", sp)};
  std::vector<std::string> composite_sets = llama;
  composite_sets.push_back("training.kernels=composite");
  const Plan eager = plan_or_fail(parse_or_fail(kThreeStages, llama));
  const Plan composite = plan_or_fail(parse_or_fail(kThreeStages, composite_sets));
  const HardwareConfig& hw = eager.config.hardware;
  const double T = 2048, h = 1024, q = 1024, k = 256, a = 2;  // tokens (b = 1), widths, bf16
  const double norm_tokens = sp ? T / t : T;
  const auto streaming = [&](double bytes) { return bytes / (hw.hbm_gbps * 1e9 * hw.hbm_efficiency) * 1e9; };
  const auto time = [](const Plan& plan) { return make_cost_model(plan.config, plan.layout)->stage(1); };
  // Per norm and element: forward 28 + 4a bytes against a fused norm's 2a, backward 76 + 8a against
  // 3a; two norms a layer. The rotary embedding: 16 + 2a an element of the queries and keys each way.
  const double rope = T * (q + k) / t * (16 + 2 * a);
  CHECK(double(time(composite).forward - time(eager).forward) ==
        Approx(streaming(2 * norm_tokens * h * (28 + 2 * a) + rope)).margin(2));
  CHECK(double(time(composite).backward - time(eager).backward) ==
        Approx(streaming(2 * norm_tokens * h * (76 + 5 * a) + rope)).margin(2));
  CHECK(time(composite).weight == time(eager).weight);
  // The rotary embedding alone as tensor ops (torchtitan's Llama with a fused norm).
  std::vector<std::string> rope_sets = llama;
  rope_sets.push_back("training.rotary_embedding=tensor_ops");
  const Plan tensor_op_rope = plan_or_fail(parse_or_fail(kThreeStages, rope_sets));
  CHECK(double(time(tensor_op_rope).forward - time(eager).forward) == Approx(streaming(rope)).margin(2));
  CHECK(double(time(tensor_op_rope).backward - time(eager).backward) == Approx(streaming(rope)).margin(2));
  composite_sets.push_back("training.rotary_embedding=fused");
  CHECK_THAT(parse_error(kThreeStages, composite_sets),
             Catch::Contains("training.rotary_embedding") && Catch::Contains("composite"));
}

TEST_CASE("DeepSpeed's accumulation adds every microbatch's bf16 weight gradients into the fp32 ones through HBM") {
  const Plan fused = plan_or_fail(parse_or_fail(kThreeStages));
  const Plan deepspeed = plan_or_fail(parse_or_fail(kThreeStages, {"training.grad_accumulation=deepspeed"}));
  const HardwareConfig& hw = fused.config.hardware;
  const double h = 1024, f = 4096;
  const double linears = 4 * h * h + 2 * h * f, layer = linears + 9 * h + f;  // the middle stage's one layer
  const auto time = [](const Plan& plan) { return make_cost_model(plan.config, plan.layout)->stage(1); };
  // Per weight: the bf16 gradient read (2 bytes), an fp32 copy of it written and read (8), the fp32
  // gradient read and written (8). The weight-gradient GEMMs, compute-bound, take the same time writing
  // a bf16 gradient as adding into an fp32 one.
  CHECK(double(time(deepspeed).weight - time(fused).weight) ==
        Approx(linears * 18 / (hw.hbm_gbps * 1e9 * hw.hbm_efficiency) * 1e9).margin(2));
  CHECK(time(deepspeed).forward == time(fused).forward);
  CHECK(time(deepspeed).backward == time(fused).backward);
  // The bf16 gradients stay from one backward to the next: 2 bytes a parameter more.
  CHECK(double(deepspeed.static_bytes[1] - fused.static_bytes[1]) == Approx(layer * 2).margin(1));
  CHECK_THAT(parse_error(kThreeStages, {"training.grad_accumulation=apex"}),
             Catch::Contains("training.grad_accumulation") && Catch::Contains("expected \"fused\""));
}

TEST_CASE("FSDP's flat parameters concatenate, cast and divide every microbatch's gradients through HBM; FSDP2 copies them once") {
  const Plan fused = plan_or_fail(parse_or_fail(kThreeStages, {"parallel.dp=2"}));
  const Plan fsdp = plan_or_fail(parse_or_fail(kThreeStages, {"parallel.dp=2", "training.grad_accumulation=fsdp"}));
  const HardwareConfig& hw = fused.config.hardware;
  const double h = 1024, f = 4096, linears = 4 * h * h + 2 * h * f;  // the middle stage's one layer
  const auto time = [](const Plan& plan) { return make_cost_model(plan.config, plan.layout)->stage(1); };
  const auto streaming_ns = [&](double bytes) { return bytes / (hw.hbm_gbps * 1e9 * hw.hbm_efficiency) * 1e9; };
  // Per weight: the bf16 views' gradients concatenated into the flat one (read 2, write 2), cast to the
  // fp32 reduce type (read 2, write 4) and divided in place by the pre-divide factor (read 4, write 4).
  CHECK(double(time(fsdp).weight - time(fused).weight) == Approx(streaming_ns(linears * 18)).margin(2));
  CHECK(time(fsdp).forward == time(fused).forward);
  CHECK(time(fsdp).backward == time(fused).backward);
  CHECK(fsdp.static_bytes[1] == fused.static_bytes[1]);  // the flat gradient lives within the backward
  // Reduced in bf16 there is no cast; on one GPU FSDP's pre-divide factor is 1: no division.
  const Plan bf16 = plan_or_fail(parse_or_fail(kThreeStages, {"parallel.dp=2", "training.grad_accumulation=fsdp",
                                                              "precision.grad_bytes=2"}));
  const Plan bf16_fused = plan_or_fail(parse_or_fail(kThreeStages, {"parallel.dp=2", "precision.grad_bytes=2"}));
  CHECK(double(time(bf16).weight - time(bf16_fused).weight) == Approx(streaming_ns(linears * 8)).margin(2));
  const Plan one = plan_or_fail(parse_or_fail(kThreeStages, {"training.grad_accumulation=fsdp"}));
  const Plan one_fused = plan_or_fail(parse_or_fail(kThreeStages));
  CHECK(double(time(one).weight - time(one_fused).weight) == Approx(streaming_ns(linears * 10)).margin(2));
  // FSDP2 copies the gradients into the reduce-scatter's input in the reduce type (read 2, write 4);
  // NCCL averages fp32 and bf16, so nothing divides them.
  const Plan fsdp2 = plan_or_fail(parse_or_fail(kThreeStages, {"parallel.dp=2", "training.grad_accumulation=fsdp2"}));
  CHECK(double(time(fsdp2).weight - time(fused).weight) == Approx(streaming_ns(linears * 6)).margin(2));
  CHECK(fsdp2.static_bytes[1] == fused.static_bytes[1]);
}

TEST_CASE("FSDP2 under ZeRO 3 copies each gathered weight into its parameter before a unit's forward and again before its backward") {
  const auto time = [](const std::vector<std::string>& overrides) {
    const Plan plan = plan_or_fail(parse_or_fail(kThreeStages, overrides));
    return make_cost_model(plan.config, plan.layout)->stage(1);
  };
  const StageTimes sharded = time({"parallel.dp=2", "training.zero_stage=1", "training.grad_accumulation=fsdp2"});
  const StageTimes copied = time({"parallel.dp=2", "training.zero_stage=3", "training.grad_accumulation=fsdp2"});
  const HardwareConfig hw = parse_or_fail(kThreeStages).hardware;
  const double h = 1024, f = 4096, layer = 4 * h * h + 2 * h * f + 9 * h + f;  // the middle stage's one layer
  // Each weight read and written in bf16 (2 + 2 bytes), on the compute stream, each way.
  const double copy_ns = layer * 4 / (hw.hbm_gbps * 1e9 * hw.hbm_efficiency) * 1e9;
  CHECK(double(copied.forward - sharded.forward) == Approx(copy_ns).margin(2));
  CHECK(double(copied.backward - sharded.backward) == Approx(copy_ns).margin(2));
  CHECK(copied.weight == sharded.weight);
  // FSDP1's flat parameter is a view of what it gathers, and one rank gathers nothing.
  const StageTimes fsdp1 = time({"parallel.dp=2", "training.zero_stage=3", "training.grad_accumulation=fsdp"});
  const StageTimes fsdp1_zero1 = time({"parallel.dp=2", "training.zero_stage=1", "training.grad_accumulation=fsdp"});
  CHECK(fsdp1.forward == fsdp1_zero1.forward);
  CHECK(time({"training.zero_stage=3", "training.grad_accumulation=fsdp2"}).forward ==
        time({"training.grad_accumulation=fsdp2"}).forward);
}

TEST_CASE("batch-first sequence parallelism copies the whole tensor after each all-gather and before each reduce-scatter") {
  const auto time = [](const std::vector<std::string>& overrides) {
    std::vector<std::string> all{"parallel.tp=2", "parallel.sequence_parallel=true", "hardware.gpus_per_node=4"};
    all.insert(all.end(), overrides.begin(), overrides.end());
    const Plan plan = plan_or_fail(parse_or_fail(kThreeStages, all));
    return make_cost_model(plan.config, plan.layout)->stage(1);
  };
  const StageTimes sequence_first = time({});
  const StageTimes batch_first = time({"training.activation_layout=bsh"});
  const HardwareConfig hw = parse_or_fail(kThreeStages).hardware;
  // The middle stage's one layer: two all-gather and reduce-scatter pairs each way (attention's and
  // the MLP's), each pair reading and writing the rank's whole b·s·h activations twice.
  const double T = 2048, h = 1024, pair_ns = 4 * T * h * 2 / (hw.hbm_gbps * 1e9 * hw.hbm_efficiency) * 1e9;
  CHECK(double(batch_first.forward - sequence_first.forward) == Approx(2 * pair_ns).margin(2));
  CHECK(double(batch_first.backward - sequence_first.backward) == Approx(2 * pair_ns).margin(2));
  CHECK(batch_first.weight == sequence_first.weight);
  // Async tensor parallelism gathers into place; without sequence parallelism there is nothing to copy.
  CHECK(time({"training.activation_layout=bsh", "training.tp_comm_overlap=true"}).forward ==
        time({"training.tp_comm_overlap=true"}).forward);
  CHECK(time({"training.activation_layout=bsh", "parallel.sequence_parallel=false"}).forward ==
        time({"parallel.sequence_parallel=false"}).forward);
  CHECK_THAT(parse_error(kThreeStages, {"training.activation_layout=bhs"}),
             Catch::Contains("training.activation_layout") && Catch::Contains("\"sbh\""));
}

TEST_CASE("collectives resident beside the layers (vocab-1, vocab-2) hold comm_sms SMs from their GEMMs and attention") {
  const int held = GENERATE(0, 7, 20);
  CAPTURE(held);
  const std::string comm_sms = fmt::format("hardware.comm_sms={}", held);
  const auto time = [&](const std::string& vocab) {
    const Plan plan = plan_or_fail(parse_or_fail(kThreeStages, {"schedule.vocab=" + vocab, comm_sms}));
    return make_cost_model(plan.config, plan.layout)->stage(1);
  };
  // Stage 1's tensor-core seconds (its GEMMs and attention) in F, B and W ...
  const Plan plain = plan_or_fail(parse_or_fail(kThreeStages));
  const HardwareConfig& hw = plain.config.hardware;
  const StageKernels kernels = stage_kernels(plain.config, plain.layout.stages[1]);
  double forward = 0, backward = 0, weight = 0;
  for (const auto& [list, sum] : {std::pair{&kernels.forward, &forward}, std::pair{&kernels.backward, &backward},
                                  std::pair{&kernels.weight, &weight}})
    for (const Kernel& k : *list)
      if (k.flops > 0) *sum += kernel_seconds(k, hw);
  // ... each run on sms - comm_sms of the GPU's SMs.
  const double slower = double(held) / (hw.sms - held) * 1e9;
  for (const std::string vocab : {"vocab-1", "vocab-2"}) {
    CAPTURE(vocab);
    CHECK(double(time(vocab).forward - time("baseline").forward) == Approx(forward * slower).margin(2));
    CHECK(double(time(vocab).backward - time("baseline").backward) == Approx(backward * slower).margin(2));
    CHECK(double(time(vocab).weight - time("baseline").weight) == Approx(weight * slower).margin(2));
  }
  // Interlaced's collectives run between its passes.
  CHECK(time("interlaced").forward == time("baseline").forward);
  CHECK_THAT(parse_error(kThreeStages, {"hardware.comm_sms=132"}), Catch::Contains("hardware.comm_sms"));
}

TEST_CASE("transfers cost latency + bytes / bandwidth of the link they cross, NVLink at what NCCL carries of it") {
  // 2 GPUs per node: devices 0,1 | 2.
  const auto check_sends = [](const Config& c) {
    const Simulated sim = simulate_or_fail(c);
    const double bytes = 1.0 * 2048 * 1024 * 2;
    const HardwareConfig& hw = c.hardware;
    const TimeNs intra = std::llround(hw.intra_node_latency_us * 1e3) + std::llround(bytes / (nvlink_gbps(hw) * 1e9) * 1e9);
    const TimeNs inter = std::llround(hw.inter_node_latency_us * 1e3) + std::llround(bytes / (hw.inter_node_gbps * 1e9) * 1e9);
    int checked = 0;
    for (std::size_t i = 0; i < sim.plan.graph.size(); ++i) {
      const Task& t = sim.plan.graph.task(TaskId(i));
      if (t.kind != OpKind::Send) continue;
      const bool crosses_nodes = (t.device / 2) != (t.peer / 2);
      CHECK(sim.durations[i] == (crosses_nodes ? inter : intra));
      ++checked;
    }
    CHECK(checked == 2 * 2 * 6);  // two boundaries, both directions, six microbatches
  };
  const Config preset = parse_or_fail(kThreeStages);
  CHECK(nvlink_gbps(preset.hardware) == Approx(preset.hardware.intra_node_gbps * preset.hardware.intra_node_efficiency));
  check_sends(preset);
  // Of NVLink's line rate NCCL carries intra_node_efficiency: at half of it, intra-node sends move at
  // half the line rate; the network's sends stay.
  const Config half = parse_or_fail(kThreeStages, {"hardware.intra_node_efficiency=0.5"});
  CHECK(nvlink_gbps(half.hardware) == Approx(half.hardware.intra_node_gbps / 2));
  check_sends(half);
}

TEST_CASE("an all-reduce inside a node runs at the faster of the ring and NVLink SHARP; all-gathers and "
          "reduce-scatters stay rings") {
  // Two tensor-parallel ranks in a node (tp 2, 2 GPUs a node): a forward's all-reduces each move their
  // bytes once, over the ring at what NCCL carries over NVLink, over NVLink SHARP at its bus bandwidth,
  // both after the ring's latencies. So against an infinitely fast switch, the preset's 480 GB/s
  // saves 1 - 360/480 of what the ring spends on bandwidth.
  const auto forward_ns = [](const std::vector<std::string>& sets) {
    std::vector<std::string> all = {"parallel.tp=2", "parallel.sequence_parallel=false"};
    all.insert(all.end(), sets.begin(), sets.end());
    const Plan plan = plan_or_fail(parse_or_fail(kThreeStages, all));
    return double(make_cost_model(plan.config, plan.layout)->stage(1).forward);
  };
  const HardwareConfig h = parse_or_fail(kThreeStages).hardware;
  REQUIRE(h.nvls_allreduce_gbps > nvlink_gbps(h));
  const double ring = forward_ns({"hardware.nvls_allreduce_gbps=0"}), preset = forward_ns({});
  const double instant = forward_ns({"hardware.nvls_allreduce_gbps=1e12"});
  CHECK(ring > preset);
  CHECK((ring - preset) / (ring - instant) == Approx(1 - nvlink_gbps(h) / h.nvls_allreduce_gbps).margin(1e-3));
  // Sequence parallelism's all-gathers and reduce-scatters do not go through the switch.
  const std::string sp = "parallel.sequence_parallel=true";
  CHECK(forward_ns({sp, "hardware.nvls_allreduce_gbps=0"}) == forward_ns({sp}));
  // The A100 has no NVLink SHARP.
  CHECK(parse_or_fail(kThreeStages, {"hardware.preset=a100-80gb"}).hardware.nvls_allreduce_gbps == 0);
}

TEST_CASE("barrier C0 sends its rounds' bytes round the ring once and pays a tree's latency per further round") {
  // Three devices on one node of 4: every collective is intra-node. Algorithm 1's C0 takes 2 rounds
  // (M; S and z), Algorithm 2's 3 (and dX): the bytes are fp32 max, sum-exp and target logit per
  // token, plus Algorithm 2's dX (tokens x h).
  for (const auto& [vocab, rounds] : {std::pair{"vocab-1", 2}, {"vocab-2", 3}}) {
    Config c = parse_or_fail(kThreeStages);
    c.hardware.gpus_per_node = 4;
    c.hardware.nvls_allreduce_gbps = 0;  // rings only (NVLink SHARP: the next test)
    c.schedule.vocab = *vocab_mode_named(vocab);
    const Simulated sim = simulate_or_fail(c);
    const HardwareConfig& hw = c.hardware;
    const double n = 3, tokens = 2048, h = 1024;
    const double bytes = 3 * 4 * tokens + (rounds == 3 ? 4 * tokens * h : 0);
    const TimeNs step = std::llround(hw.intra_node_latency_us * 1e3) + std::llround(bytes / n / (nvlink_gbps(hw) * 1e9) * 1e9);
    const TimeNs latency = std::llround(hw.intra_node_latency_us * 1e3);
    const int depth = 2;  // ceil(log2 3)
    const TimeNs expected = 2 * (3 - 1) * step + (rounds - 1) * 2 * depth * latency;
    int checked = 0;
    for (std::size_t i = 0; i < sim.plan.graph.size(); ++i) {
      const Task& t = sim.plan.graph.task(TaskId(i));
      if (t.group < 0 || sim.plan.graph.group_of(TaskId(i)).data != CollectiveData::SoftmaxStats) continue;
      CHECK(sim.plan.graph.group_of(TaskId(i)).rounds == rounds);
      CHECK(sim.durations[i] == expected);
      ++checked;
    }
    CHECK(checked == 3 * 6);  // a member per device, six microbatches
  }
}

TEST_CASE("FP8: the linear GEMMs at the FP8 peak on one-byte inputs, each input cast (4 bytes an element)") {
  // The GEMM part of the layer's passes above, under precision.fp8: FP8 operands (1 byte), bf16 output
  // (fp32 gradient read and written for W), at peak_fp8_tflops × fp8_efficiency × fill; forward each
  // input X, backward each output gradient dY cast by one kernel reading 2 bytes and writing 1 + 1.
  const Config bf16 = parse_or_fail(kThreeStages), fp8 = parse_or_fail(kThreeStages, {"precision.fp8=\"hybrid\""});
  const auto bf16_model = make_cost_model(bf16, plan_or_fail(bf16).layout);
  const Plan plan = plan_or_fail(fp8);
  const auto model = make_cost_model(plan.config, plan.layout);
  const HardwareConfig& hw = fp8.hardware;
  REQUIRE(hw.peak_fp8_tflops == 1979);
  const double T = 2048, h = 1024, f = 4096;
  const auto fill = [](double rows, double cols) {
    const double tiles = std::ceil(rows / 128) * std::ceil(cols / 128);
    return rows * cols / (128.0 * 128 * std::max(tiles, 132.0));
  };
  const auto seconds = [&](double flops, double bytes, double peak, double efficiency) {
    return std::max(flops / (peak * 1e12 * efficiency * hw.sustained_compute_fraction),
                    bytes / (hw.hbm_gbps * 1e9 * hw.hbm_efficiency));
  };
  const std::pair<double, double> linears[] = {{3 * h, h}, {h, h}, {f, h}, {h, f}};
  double forward_change = 0, backward_change = 0, weight_change = 0;
  for (const auto& [n_out, n_in] : linears) {
    const auto fp8_gemm = [&](double m, double n, double k, double c_bytes) {
      return seconds(2 * m * n * k, m * k + k * n + m * n * c_bytes, hw.peak_fp8_tflops, hw.fp8_efficiency * fill(m, n));
    };
    const auto bf16_gemm = [&](double m, double n, double k, double a, double b, double c_bytes) {
      return seconds(2 * m * n * k, m * k * a + k * n * b + m * n * c_bytes, hw.peak_tflops, hw.compute_efficiency * fill(m, n));
    };
    forward_change += seconds(0, 4 * T * n_in, 1, 1) + fp8_gemm(T, n_out, n_in, 2) - bf16_gemm(T, n_out, n_in, 2, 2, 2);
    backward_change += seconds(0, 4 * T * n_out, 1, 1) + fp8_gemm(T, n_in, n_out, 2) - bf16_gemm(T, n_in, n_out, 2, 2, 2);
    weight_change += fp8_gemm(n_out, n_in, T, 8) - bf16_gemm(n_out, n_in, T, 2, 2, 8);
  }
  CHECK(model->stage(1).forward - bf16_model->stage(1).forward == Approx(forward_change * 1e9).margin(4));
  CHECK(model->stage(1).backward - bf16_model->stage(1).backward == Approx(backward_change * 1e9).margin(4));
  CHECK(model->stage(1).weight - bf16_model->stage(1).weight == Approx(weight_change * 1e9).margin(4));
  // FP8 weights and their transposes: 2 bytes a layer parameter on every device.
  const Plan plain = plan_or_fail(bf16);
  const double layer = 4 * h * h + 2 * h * f + 9 * h + f;
  for (int d = 0; d < 3; ++d) CHECK(plan.static_bytes[std::size_t(d)] - plain.static_bytes[std::size_t(d)] == std::llround(2 * layer));
}

TEST_CASE("FP8 keeps the linear layers' saved inputs in one byte, and a GPU without FP8 refuses it") {
  // Korthikanti's per-token terms at 2 bytes, sequence parallelism off (t = 1 here): the inputs of QKV
  // and the MLP (2 + 2), of the projection (2) and of the MLP's second matrix (2f/h) halve.
  const Config bf16 = parse_or_fail(kThreeStages), fp8 = parse_or_fail(kThreeStages, {"precision.fp8=\"e4m3\""});
  const double T = 2048, h = 1024, f = 4096;
  CHECK(layer_activation_bytes(bf16) - layer_activation_bytes(fp8) == Approx(T * h * (2 + 1 + f / h)));
  CHECK_THAT(parse_error(kThreeStages, {"hardware.preset=\"a100-80gb\"", "precision.fp8=\"hybrid\""}),
             Catch::Contains("precision.fp8 (from --set): the a100-80gb has no FP8 tensor cores"));
  CHECK_THAT(parse_error(kThreeStages, {"precision.fp8=\"e5m2\""}),
             Catch::Contains("precision.fp8 (from --set): expected null (bf16 GEMMs), \"hybrid\""));
}

TEST_CASE("static memory is parameters x 18 bytes, or 6 + 12/d with a distributed optimizer") {
  const int zero = GENERATE(0, 1);
  Config c = parse_or_fail(kThreeStages, {"parallel.dp=4", fmt::format("training.zero_stage={}", zero)});
  const Plan plan = plan_or_fail(c);
  const double h = 1024, f = 4096, V = 32000;
  const double layer = 4 * h * h + 2 * h * f + 9 * h + f;
  const double per_param = zero == 1 ? 6 + 12.0 / 4 : 18;
  CHECK(plan.static_bytes[0] == std::llround((layer + V * h) * per_param));        // layer + embedding
  CHECK(plan.static_bytes[1] == std::llround(layer * per_param));                  // layer only
  CHECK(plan.static_bytes[2] == std::llround((layer + V * h + 2 * h) * per_param));  // layer + head + final norm
}

TEST_CASE("MFU follows the paper: 3(2BSHV + L(8BSH^2 + 4BS^2H + 4BSHF)) / (time x devices x peak)") {
  const int p = GENERATE(2, 4);
  const int m = GENERATE(4, 8);
  const Simulated s = simulate_or_fail(parse_or_fail(explicit_json(p, m, 1, 3, 5)));
  // explicit_json: layers 2p, hidden 64, seq 32, vocab 1000, ffn 4h, micro-batch 1; h100-sxm peak.
  const double B = m, S = 32, H = 64, V = 1000, F = 256, L = 2 * p;
  const double flops = 3 * (2 * B * S * H * V + L * (8 * B * S * H * H + 4 * B * S * S * H + 4 * B * S * H * F));
  const double seconds_taken = (m + p - 1) * 8e-3;
  CHECK(s.metrics.mfu == Approx(flops / (seconds_taken * p * 989e12)));
  CHECK(s.metrics.tokens_per_s == Approx(B * S / seconds_taken));
}

TEST_CASE("MFU counts each layer's GEMMs as the model has them: grouped-query K/V and SwiGLU's three matrices") {
  // The paper's 8BSH² assumes as many K/V heads as query heads, and its 4BSHF two MLP matrices;
  // with g = kv_heads / heads and SwiGLU that is 4BSH²(1 + g) and 6BSHF.
  Config c = parse_or_fail(explicit_json(2, 4, 1, 3, 5));
  c.model.kv_heads = 1, c.model.mlp = MlpKind::SwiGlu, c.model.ffn_hidden = 96;
  const Simulated s = simulate_or_fail(c);
  const double B = 4, S = 32, H = 64, V = 1000, F = 96, L = 4, g = 1.0 / 4;
  const double flops =
      3 * (2 * B * S * H * V + L * (4 * B * S * H * H * (1 + g) + 6 * B * S * H * F + 4 * B * S * S * H));
  const double seconds_taken = (4 + 2 - 1) * 8e-3;
  CHECK(s.metrics.mfu == Approx(flops / (seconds_taken * 2 * 989e12)));
}

TEST_CASE("the work calibration fits is the work the analytic model times, as an op benchmark times it") {
  // Calibration compares ops timed alone: the model at sustained_compute_fraction 1. Stage 1: one
  // layer, no vocabulary layer.
  const Config c = parse_or_fail(kThreeStages, {"hardware.sustained_compute_fraction=1"});
  const Plan plan = plan_or_fail(c);
  const auto model = make_cost_model(plan.config, plan.layout);
  const std::vector<OpWork> work = analytic_op_work(plan.config);
  const auto seconds = [&](std::string_view name) {
    for (const OpWork& w : work)
      if (w.name == name) return analytic_seconds(w, c.hardware);
    FAIL("no op " << name);
    return 0.0;
  };
  CHECK(std::llround(seconds("layer_forward") * 1e9) == Approx(model->stage(1).forward).margin(2));
  CHECK(std::llround(seconds("layer_backward") * 1e9) == Approx(model->stage(1).backward).margin(2));
  CHECK(std::llround(seconds("layer_weight") * 1e9) == Approx(model->stage(1).weight).margin(2));
  // The preset's own fraction leaves the op benchmark's times alone, and slows the run's.
  const Config preset = parse_or_fail(kThreeStages);
  REQUIRE(preset.hardware.sustained_compute_fraction < 1);
  for (const OpWork& w : work) CHECK(analytic_seconds(w, preset.hardware) == analytic_seconds(w, c.hardware));
  const Plan slower = plan_or_fail(preset);
  CHECK(make_cost_model(slower.config, slower.layout)->stage(1).forward > model->stage(1).forward);
}

TEST_CASE("under tensor parallelism calibration's ops are one rank's part, their collectives left out") {
  // measure-ops.py --tensor-parallel times one rank's GEMMs and attention without the all-reduces;
  // the model's W pass has no collective, so the two agree there, and every FLOP is split over tp.
  const Config whole = parse_or_fail(kThreeStages, {"hardware.sustained_compute_fraction=1"});
  const Config split = parse_or_fail(kThreeStages, {"hardware.sustained_compute_fraction=1", "parallel.tp=2"});
  const Plan plan = plan_or_fail(split);
  const std::vector<OpWork> ops = analytic_op_work(split), whole_ops = analytic_op_work(whole);
  for (std::size_t i = 0; i < ops.size(); ++i) {
    INFO(ops[i].name);
    CHECK(2 * total(ops[i].kernels, &Kernel::flops) == Approx(total(whole_ops[i].kernels, &Kernel::flops)));
  }
  const double weight = analytic_seconds(ops[2], split.hardware);
  REQUIRE(ops[2].name == "layer_weight");
  CHECK(std::llround(weight * 1e9) == Approx(make_cost_model(plan.config, plan.layout)->stage(1).weight).margin(2));
}

TEST_CASE("vocabulary passes move, a logit each, what the reference implementation's kernels read and write") {
  // p = 4 devices, 32,000 rows (8,000 each), b·s = 2048 tokens, h = 1024, bf16 activations and
  // parameters, fp32 main gradients.
  const double rows = 8000, tokens = 2048, h = 1024, logits = rows * tokens;
  for (const char* mode : {"vocab-1", "vocab-2"}) {
    const Config c = parse_or_fail(R"json({
      "model": {"layers": 4, "hidden": 1024, "heads": 16, "ffn_hidden": 4096, "seq_len": 2048, "vocab": 32000},
      "parallel": {"pp": 4, "microbatches": 8}, "schedule": {"vocab": "vocab-1"}})json",
                                   {std::string("schedule.vocab=") + mode});
    const Plan plan = plan_or_fail(c);
    REQUIRE(plan.layout.padded_vocab == 32000);
    const VocabWork w = vocab_work(plan.config, plan.layout);
    const bool algorithm2 = std::string(mode) == "vocab-2";
    // S: cast to fp32 (2 + 4), max (4), subtract (4 + 4), exp (4 + 4), sum (4), divide (4 + 4);
    // Algorithm 2 casts the softmax back for softmax·W (4 + 2). Plus the shard's weights, once.
    CHECK(w.s_bytes == Approx(logits * (38 + (algorithm2 ? 6 : 0)) + rows * h * 2));
    // T: rescale (4 + 4), times the loss gradient (4 + 4), cast for the GEMMs (4 + 2).
    CHECK(w.t_bytes == Approx(logits * 22));
    // IB: the tokens' output gradients added into the zeroed shard (read 2, read and write the row,
    // 2 + 2), then the zeroing and the shard added to the main gradient (write 2; read 2, read and
    // write 4 + 4).
    CHECK(w.input_backward_bytes == Approx(tokens * h * 6 + rows * h * 12));
  }
}

TEST_CASE("the embedding's gradient is dense: its zeroing and its sum into the main gradient grow with the vocabulary") {
  const auto first_stage_weight = [](int vocab) {
    const Config c = parse_or_fail(kThreeStages, {"model.vocab=" + std::to_string(vocab)});
    const Plan plan = plan_or_fail(c);
    return double(make_cost_model(plan.config, plan.layout)->stage(0).weight);
  };
  // 32,000 more rows of h = 1024: 12 bytes an element (bf16 zeroing and read, fp32 main gradient
  // read and written) at the H100 preset's HBM rate.
  const HardwareConfig& hw = parse_or_fail(kThreeStages).hardware;
  const double added = 32000.0 * 1024 * 12 / (hw.hbm_gbps * 1e9 * hw.hbm_efficiency) * 1e9;
  CHECK(first_stage_weight(64000) - first_stage_weight(32000) == Approx(added).margin(2));
}
