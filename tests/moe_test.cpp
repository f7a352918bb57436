// Mixture of experts: the config's rules, the expert parameters and their memory, the all-to-all's
// bytes and time, and where the graph puts it (blocking, or hidden by DualPipeV's pairs). Every
// expected figure is derived here from the formulas in docs/cost-model.md.
#include <algorithm>
#include <cmath>

#include "helpers.h"
#include "model_math.h"
#include "parallel_shape.h"

using namespace pipesim;
using namespace pipesim::testing;

namespace {

/// A small MoE model: 8 layers, h 256, 16 experts of width 512, top 4; SwiGLU; 4 GPUs a node.
std::string moe_json(const std::string& parallel, const std::string& extra_model = "",
                     const std::string& schedule = "1f1b", const std::string& training = "{}") {
  return fmt::format(R"json({{
    "model": {{"layers": 8, "hidden": 256, "heads": 4, "ffn_hidden": 1024, "seq_len": 128, "vocab": 1024,
              "mlp": "swiglu", "num_experts": 16, "moe_router_topk": 4, "moe_ffn_hidden_size": 512{}}},
    "parallel": {},
    "schedule": {{"name": "{}"}},
    "hardware": {{"preset": "h100-sxm", "gpus_per_node": 4}},
    "training": {}
  }})json",
                     extra_model, parallel, schedule, training);
}

std::string error_of(const std::string& json, const std::vector<std::string>& overrides = {}) {
  Result<Config> config = parse_config(json, "c.json", overrides);
  return config.ok() ? "" : config.error().message;
}

/// Time an op of `graph` runs with the compute stream of its device busy.
TimeNs hidden_time(const TaskGraph& graph, const Timeline& timeline, TaskId op) {
  TimeNs hidden = 0;
  for (const TaskId c : graph.stream_order(graph.task(op).device, Stream::Compute)) {
    const TimeNs from = std::max(timeline.start[std::size_t(c)], timeline.start[std::size_t(op)]);
    const TimeNs to = std::min(timeline.end[std::size_t(c)], timeline.end[std::size_t(op)]);
    if (to > from) hidden += to - from;
  }
  return hidden;
}

}  // namespace

TEST_CASE("a MoE config names the rule a layout breaks, as Megatron-Core states it") {
  const std::string ok = R"({"pp": 2, "dp": 4, "ep": 4, "microbatches": 4})";
  CHECK(error_of(moe_json(ok)).empty());
  CHECK(error_of(moe_json(ok), {"parallel.ep=3"}).find("parallel.ep (from --set): ep 3 does not divide the 16 experts") !=
        std::string::npos);
  // ep·etp must divide tp·cp·dp: the expert groups are carved out of a stage's ranks.
  CHECK(error_of(moe_json(ok), {"parallel.ep=8"}).find("ep 8 x etp 1 = 8 does not divide tp 1 x cp 1 x dp 4 = 4") !=
        std::string::npos);
  CHECK(error_of(moe_json(ok), {"parallel.tp=2", "parallel.sequence_parallel=false"})
            .starts_with("c.json: parallel.sequence_parallel (from --set): Megatron-Core runs MoE layers"));
  CHECK(error_of(moe_json(ok), {"training.overlap_moe_expert_parallel_comm=true"})
            .find("with pp > 1 it needs parallel.chunks >= 2") != std::string::npos);
  CHECK(error_of(moe_json(ok), {"model.moe_router_topk=17"}).find("model.moe_router_topk (from --set): must be at most 16") !=
        std::string::npos);
  // A MoE key on a dense model, or expert parallelism without experts, is a mistake, not ignored.
  const std::string dense = R"({"model": {"layers": 4, "hidden": 64, "heads": 4, "seq_len": 32, "vocab": 100},
                                "parallel": {"pp": 2, "dp": 2, "microbatches": 2}})";
  CHECK(error_of(dense, {"model.moe_router_topk=2"}).starts_with("c.json: model.moe_router_topk (from --set): applies to a "
                                                                 "mixture-of-experts model only"));
  CHECK(error_of(dense, {"parallel.ep=2"}).starts_with("c.json: parallel.ep (from --set): expert parallelism needs experts"));
  CHECK(error_of(moe_json(ok, R"(, "moe_layer_freq": [0, 1])")).find("lists 2 layers but model.layers is 8") !=
        std::string::npos);
}

TEST_CASE("a MoE layer's parameters, FLOPs and the experts' share each rank holds, in closed form") {
  const Config c = parse_or_fail(moe_json(R"({"pp": 2, "tp": 2, "dp": 8, "ep": 4, "microbatches": 4})",
                                          R"(, "moe_shared_expert_intermediate_size": 256, "moe_layer_freq": 2)"));
  const double h = 256, f = 512, shared = 256, experts = 16, k = 4, tokens = 128;
  const double attention = 2 * h * h * 2 + 2 * h;  // MHA (g = 1): 4h², two RMSNorm gains
  CHECK(layer_params(c.model, LayerKind::Moe) == Approx(attention + 3 * h * shared + experts * 3 * h * f + h * experts));
  CHECK(layer_params(c.model) == Approx(attention + 3 * h * 1024));
  CHECK(layer_gemm_flops(c.model, LayerKind::Moe) ==
        Approx(tokens * (8 * h * h + 2 * h * experts + k * 6 * h * f + 6 * h * shared)));
  // moe_layer_freq 2: layers 0, 2, 4, 6 are MoE; stage 0 holds layers 0-3.
  CHECK(moe_layer_count(c.model, 0, 4) == 2);
  const RankParams rank = layers_rank_params(c, 0, 4);
  const double ep_etp = 4 * 2;  // etp follows tp
  CHECK(rank.experts == Approx(2 * experts * 3 * h * f / ep_etp));
  CHECK(rank.all == Approx((2 * (attention + 3 * h * 1024) + 2 * (attention + 3 * h * shared)) / 2 + 2 * h * experts +
                           rank.experts));
  // The expert data-parallel group: tp·cp·dp / (ep·etp) = 16 / 8.
  CHECK(expert_data_parallel(c.parallel) == 2);
}

TEST_CASE("ZeRO shards the experts' optimizer states over the expert data-parallel group, the rest over dp") {
  const Config c = parse_or_fail(moe_json(R"({"pp": 1, "dp": 8, "ep": 4, "microbatches": 4})", "", "1f1b",
                                          R"({"zero_stage": 1})"));
  const Plan plan = plan_or_fail(c);
  const double experts = device_expert_params(c, plan.layout)[0];
  const double all = device_params(c, plan.layout)[0];
  const double edp = 8.0 / 4;  // dp 8 over ep 4
  CHECK(experts == Approx(8 * 16 * 3 * 256 * 512 / 4.0));
  // bf16 weights 2, fp32 gradients 4, optimizer states 12 sharded.
  const double expected = (all - experts) * (2 + 4 + 12.0 / 8) + experts * (2 + 4 + 12 / edp);
  CHECK(double(plan.static_bytes[0]) == Approx(expected).epsilon(1e-9));
}

TEST_CASE("the all-to-all carries each rank's routed copies, and is priced by NVLink and the network port") {
  // tp 1, ep 8 over nodes of 4: half the peers are off the node.
  const Config c = parse_or_fail(moe_json(R"({"pp": 2, "dp": 8, "ep": 8, "microbatches": 4})",
                                          R"(, "moe_imbalance": 1.5, "moe_capacity_factor": 1.25)"));
  const double load = 1.25;  // the capacity factor caps the imbalance
  const double bytes = 128.0 * 4 * load * 256 * 2;  // tokens · top-k · load · h · bf16
  CHECK(expert_exchange_bytes(c) == Approx(bytes));
  const Plan plan = plan_or_fail(c);
  const std::vector<TimeNs> durations = op_durations(*make_cost_model(plan.config, plan.layout), plan.graph);
  const HardwareConfig& hw = c.hardware;
  const double intra = bytes * 3 / 8 / (nvlink_gbps(hw) * 1e9), inter = bytes * 4 / 8 / (hw.inter_node_gbps * 1e9);
  const double one = hw.inter_node_latency_us * 1e-6 + std::max(intra, inter);  // one all-to-all
  int exchanges = 0;
  for (TaskId id = 0; id < TaskId(plan.graph.size()); ++id) {
    const Task& t = plan.graph.task(id);
    if (t.kind != OpKind::AllToAll) continue;
    ++exchanges;
    // Stage of 4 layers, every one MoE: a dispatch and a combine each.
    CHECK(plan.graph.work(id).bytes == Approx(2 * 4 * bytes));
    CHECK(double(durations[std::size_t(id)]) == Approx(4 * 2 * one * 1e9).margin(8));  // ns rounding: 8 all-to-alls
  }
  CHECK(exchanges == 2 * 2 * 4);  // F and B of 2 stages and 4 microbatches
}

TEST_CASE("group-limited routing and the flex dispatcher cut what leaves the node; MXFP8 halves the dispatch") {
  // ep 16 over nodes of 4: 4 nodes, 4 experts a rank. Top 4 of 16 experts.
  const std::string layout = R"({"pp": 1, "dp": 16, "ep": 16, "microbatches": 2})";
  const std::string flex = R"({"moe_token_dispatcher_type": "flex"})";
  const double nodes = 4, k = 4;
  // Unlimited: the distinct nodes among k even draws over 4 nodes.
  const Config free = parse_or_fail(moe_json(layout, "", "1f1b", flex));
  const double unlimited = nodes * (1 - std::pow(1 - 1 / nodes, k));
  CHECK(expert_nodes_per_token(free) == Approx(unlimited));
  // ep 6 over nodes of 4 ends half-way into its second node: 1.5 nodes' worth of bins.
  const Config ragged = parse_or_fail(moe_json(R"({"pp": 1, "dp": 12, "ep": 6, "microbatches": 2})", "", "1f1b", flex),
                                      {"model.num_experts=24"});
  CHECK(expert_nodes_per_token(ragged) == Approx(1.5 * (1 - std::pow(1 - 1 / 1.5, k))));
  // Node-limited (DeepSeek-V3's): 4 groups, one a node, 2 a token: exactly 2 nodes.
  const std::string node_limited = R"(, "moe_router_num_groups": 4, "moe_router_group_topk": 2)";
  CHECK(expert_nodes_per_token(parse_or_fail(moe_json(layout, node_limited, "1f1b", flex))) == Approx(2));
  // Device-limited: 8 groups (two a node), 2 a token: a node is missed when both come from the
  // other 6 groups, C(6,2)/C(8,2) = 15/28.
  const std::string device_limited = R"(, "moe_router_num_groups": 8, "moe_router_group_topk": 2)";
  CHECK(expert_nodes_per_token(parse_or_fail(moe_json(layout, device_limited, "1f1b", flex))) ==
        Approx(nodes * (1 - 15.0 / 28)));
  // 2 groups of 2 nodes, 1 a token: the k copies fall on 2 nodes.
  const std::string wide_groups = R"(, "moe_router_num_groups": 2, "moe_router_group_topk": 1)";
  CHECK(expert_nodes_per_token(parse_or_fail(moe_json(layout, wide_groups, "1f1b", flex))) ==
        Approx(2 * (1 - std::pow(0.5, k))));

  // The bytes: each of the rank's copies (tokens · k, h wide, bf16) to its expert's rank, or under
  // flex a network crossing per other node the token reaches and NVLink for the copies not landed.
  const Config limited = parse_or_fail(moe_json(layout, node_limited, "1f1b", flex));
  const double tokens = 128, copy = 256 * 2.0, copies = tokens * k;
  const Config plain = parse_or_fail(moe_json(layout, node_limited));
  CHECK(expert_traffic(plain, false).inter_node == Approx(copies * 12 / 16 * copy));
  CHECK(expert_traffic(plain, false).intra_node == Approx(copies * 3 / 16 * copy));
  CHECK(expert_traffic(limited, false).inter_node == Approx(tokens * 2 * (nodes - 1) / nodes * copy));
  CHECK(expert_traffic(limited, false).intra_node == Approx(copies * 3 / 4 * copy));
  // MXFP8 on the wire: a byte a value and a byte per 32 for the scale, against bf16's two.
  CHECK(expert_traffic(limited, true).inter_node == Approx(expert_traffic(limited, false).inter_node * (33.0 / 32) / 2));

  // Only the forward's dispatch travels in MXFP8: F's exchange is shorter than B's.
  const Config mx = parse_or_fail(moe_json(layout, node_limited, "1f1b",
                                           R"({"moe_token_dispatcher_type": "flex", "moe_dispatch_fwd_dtype": "mxfp8"})"));
  const StageTimes times = make_cost_model(mx, plan_or_fail(mx).layout)->stage(0);
  const HardwareConfig& hw = mx.hardware;
  const auto all_to_all = [&](bool mxfp8) {
    const ExpertTraffic t = expert_traffic(mx, mxfp8);
    return hw.inter_node_latency_us * 1e-6 +
           std::max(t.intra_node / (nvlink_gbps(hw) * 1e9), t.inter_node / (hw.inter_node_gbps * 1e9));
  };
  const double layers = 8;  // one stage, every layer MoE
  CHECK(double(times.exchange_forward) == Approx(layers * (all_to_all(true) + all_to_all(false)) * 1e9).margin(16));
  CHECK(double(times.exchange_backward) == Approx(layers * 2 * all_to_all(false) * 1e9).margin(16));
  CHECK(times.exchange_forward < times.exchange_backward);
}

TEST_CASE("group-limited routing and the dispatcher are refused where Megatron-Core refuses them") {
  const std::string ok = R"({"pp": 2, "dp": 4, "ep": 4, "microbatches": 4})";
  CHECK(error_of(moe_json(ok), {"model.moe_router_group_topk=2"}).find("model.moe_router_num_groups: group-"
                                                                       "limited routing needs both") != std::string::npos);
  CHECK(error_of(moe_json(ok), {"model.moe_router_num_groups=3", "model.moe_router_group_topk=1"})
            .find("3 groups do not divide the 16 experts") != std::string::npos);
  CHECK(error_of(moe_json(ok), {"model.moe_router_num_groups=4", "model.moe_router_group_topk=5"})
            .find("selects 5 of 4 groups") != std::string::npos);
  CHECK(error_of(moe_json(ok), {"training.moe_dispatch_fwd_dtype=mxfp8"})
            .find("only through the flex dispatcher") != std::string::npos);
  CHECK(error_of(moe_json(ok), {"training.moe_token_dispatcher_type=allgather"})
            .find("all-gather dispatcher is not modelled") != std::string::npos);
  const std::string dense = R"({"model": {"layers": 4, "hidden": 64, "heads": 4, "seq_len": 32, "vocab": 100},
                                "parallel": {"pp": 2, "dp": 2, "microbatches": 2}})";
  CHECK(error_of(dense, {"training.moe_token_dispatcher_type=flex"}).find("this model has none") != std::string::npos);
  CHECK(error_of(dense, {"model.moe_router_num_groups=2"}).find("applies to a mixture-of-experts model only") !=
        std::string::npos);
}

TEST_CASE("a blocking all-to-all holds up the compute stream; DualPipeV's pairs hide it behind compute") {
  // Long sequences of a wider model on 8-GPU nodes: an F's expert compute outlasts its exchange, as
  // DeepSeek-V3's shape was chosen to make it.
  const std::string parallel = R"({"pp": 2, "dp": 8, "ep": 8, "microbatches": 8, "chunks": 2})";
  const std::vector<std::string> shape = {"model.hidden=1024", "model.heads=8", "model.seq_len=4096",
                                          "hardware.gpus_per_node=8"};
  // Transfers overlapped too: a synchronous SEND after an F would wait for its combine anyway.
  const auto run = [&](const std::string& schedule, const std::string& training = R"({"overlap_p2p_comm": true})") {
    return simulate_or_fail(parse_or_fail(moe_json(parallel, "", schedule, training), shape));
  };
  const Simulated dualpipe = run("dualpipe-v"), interleaved = run("interleaved-1f1b");
  const Simulated overlapped = run("interleaved-1f1b", R"({"overlap_p2p_comm": true, "overlap_moe_expert_parallel_comm": true})");
  const auto share_hidden = [](const Simulated& s) {
    TimeNs hidden = 0, all = 0;
    for (TaskId id = 0; id < TaskId(s.plan.graph.size()); ++id)
      if (s.plan.graph.task(id).kind == OpKind::AllToAll) {
        hidden += hidden_time(s.plan.graph, s.timeline, id);
        all += s.timeline.end[std::size_t(id)] - s.timeline.start[std::size_t(id)];
      }
    REQUIRE(all > 0);
    return double(hidden) / double(all);
  };
  CHECK(share_hidden(interleaved) == 0);  // the next compute op waits for each
  // Overlapped, only the exchanges of the warm-up and cool-down forwards, which the next forward of
  // the device waits for (its input), stay exposed: 0.44 of DualPipeV's and 0.66 here when measured.
  CHECK(share_hidden(dualpipe) > 0.4);
  CHECK(share_hidden(overlapped) > 0.6);
  CHECK(overlapped.metrics.iteration_ns < interleaved.metrics.iteration_ns);
  CHECK(dualpipe.metrics.iteration_ns < run("1f1b").metrics.iteration_ns);
  // What reads a stage's output waits for its combine: no F of the next stage starts before it.
  for (TaskId id = 0; id < TaskId(dualpipe.plan.graph.size()); ++id)
    if (dualpipe.plan.graph.task(id).kind == OpKind::AllToAll)
      for (const TaskId next : dualpipe.plan.graph.successors(id))
        CHECK(dualpipe.timeline.start[std::size_t(next)] >= dualpipe.timeline.end[std::size_t(id)]);
}

namespace {
/// Parameters in billions, all and active (a MoE layer's routed experts at top-k of num_experts).
std::pair<double, double> billions(const ModelConfig& m) {
  double active = 2 * vocab_params(m);
  for (int l = 0; l < m.layers; ++l) {
    const LayerParams p = layer_param_parts(m, layer_kind(m, l));
    active += p.tensor_parallel + p.replicated + (p.experts > 0 ? p.experts * m.moe_router_topk / m.num_experts : 0);
  }
  return {(model_layer_params(m) + 2 * vocab_params(m)) / 1e9, active / 1e9};
}
}  // namespace

// Each figure to within one unit of its last stated digit (the makers round or truncate).
TEST_CASE("the shipped MoE models have the parameters their makers state, all and active") {
  // Mixtral-8x7B: 46.7B, 12.9B active (Mistral AI); from its config.json, every layer MoE.
  const Config mixtral = source_config("mixtral-8x7b.json");
  CHECK(mixtral.model.num_experts == 8);
  CHECK(mixtral.model.moe_router_topk == 2);
  CHECK(mixtral.model.expert_ffn_hidden() == 14336);
  CHECK(billions(mixtral.model).first == Approx(46.7).margin(0.1));
  CHECK(billions(mixtral.model).second == Approx(12.9).margin(0.1));
  // Qwen3-30B-A3B: 30.5B, 3.3B active (its model card); heads of 128 channels on a hidden of 2048.
  const Config qwen = source_config("qwen3-30b-a3b.json");
  CHECK(qwen.model.head_channels() == 128);
  CHECK(billions(qwen.model).first == Approx(30.5).margin(0.1));
  CHECK(billions(qwen.model).second == Approx(3.3).margin(0.1));
  // DeepSeek-V3: 671B, 37B active (its report, which leaves the 14B prediction module out); MLA.
  const Config deepseek = source_config("deepseek-v3.json");
  CHECK(moe_layer_count(deepseek.model, 0, 61) == 58);
  CHECK(deepseek.model.moe_router_num_groups == 8);  // n_group, topk_group: node-limited routing
  CHECK(deepseek.model.moe_router_group_topk == 4);
  CHECK(billions(deepseek.model).first == Approx(671).margin(1));
  CHECK(billions(deepseek.model).second == Approx(37).margin(1));
}
