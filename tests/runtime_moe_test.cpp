// Mixture-of-experts layers in the CPU runtime (runtime/cpu/moe.h): configs/moe-tiny.json -- a dense
// first layer, then routed and shared SwiGLU experts -- trains like a single device under every
// schedule and vocabulary mode, with data parallelism, ZeRO and recomputation, with expert
// parallelism over the replicas, and under tensor parallelism with sequence parallelism (each
// expert whole on one rank or split over the tensor-parallel ranks, expert groups carved out of the
// tensor- and data-parallel ranks); what the runtime does not run is refused by the field that asks
// for it.
#include <catch2/catch.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "helpers.h"
#include "launch.h"
#include "measured.h"
#include "partition.h"
#include "runtime_helpers.h"
#include "schedule.h"

using namespace pipesim;
using namespace pipesim::testing::runs;

namespace {

Config moe_tiny(const std::vector<std::string>& overrides = {}) {
  return testing::shipped_config("moe-tiny.json", overrides);
}

/// One checked step of `plan`: the loss and every gradient within fp32's bounds of the reference.
void check_matches_reference(const Plan& plan, const std::string& what) {
  runtime::RunOptions o = options();
  o.check = true;
  const Status runnable = runtime::check_runnable(plan.config, o);
  INFO(what << (runnable.ok() ? "" : ": " + runnable.error().message));
  REQUIRE(runnable.ok());
  Result<runtime::RunResult> run = runtime::run_in_process(job_of(plan), o);
  INFO((run.ok() ? "" : run.error().message));
  REQUIRE(run.ok());
  const runtime::CheckResult& check = *run.value().check;
  INFO("loss " << check.loss << " reference " << check.reference_loss << ", gradient error " << check.max_grad_rel_err
               << " in " << check.worst_tensor);
  CHECK(std::abs(check.loss - check.reference_loss) <= 1e-5 * std::abs(check.reference_loss));
  CHECK(check.max_grad_rel_err <= 1e-4);
  CHECK(check.passed());
  // log(V): the model starts near uniform, so a wrong loss cannot pass by being small.
  CHECK(check.reference_loss == Approx(std::log(double(plan.config.model.vocab))).epsilon(0.05));
}

}  // namespace

TEST_CASE("moe-tiny.json: a dense first layer, then MoE layers of routed and shared SwiGLU experts") {
  const Config config = moe_tiny();
  const runtime::ModelShape s = runtime::model_shape(config);
  CHECK(s.family == runtime::LayerFamily::Llama);
  CHECK(s.experts == 4);
  CHECK(s.router_topk == 2);
  CHECK(s.expert_ffn == 32);
  CHECK(s.shared_expert_ffn == 32);
  CHECK(s.moe_layers == std::vector<bool>{false, true, true, true});
  CHECK(config.parallel.ep == 1);
  // Every layer of a device's stages built as its kind: the dense one with its MLP, the others with
  // a router and experts instead.
  const Plan plan = plan_for(config, "1f1b", "baseline");
  for (int device = 0; device < plan.layout.devices; ++device) {
    const runtime::RankModel m = runtime::make_rank_model(s, plan.layout, {.device = device, .tp_rank = 0, .tp = 1, .owned = {}}, 3);
    for (const auto& [index, layer] : m.params.layers) {
      CAPTURE(device, index);
      CHECK(layer.moe() == s.moe_layer(index));
      CHECK(layer.fc1_weight.empty() == s.moe_layer(index));
    }
  }
}

TEST_CASE("a mixture-of-experts model trains like a single device under every schedule and vocabulary mode") {
  const Config config = moe_tiny();
  for (const std::string& schedule : schedule_names())
    for (const std::string& vocab : vocab_mode_names())
      check_matches_reference(plan_for(config, schedule, vocab), schedule + " / " + vocab);
}

TEST_CASE("a mixture-of-experts model with data parallelism, ZeRO 1 and full recomputation") {
  for (const std::vector<std::string>& set :
       {std::vector<std::string>{"parallel.dp=2"}, {"parallel.dp=2", "training.zero_stage=1"},
        {"training.recompute_granularity=full", "training.recompute_num_layers=1"}})
    for (const auto& [schedule, vocab] : {std::pair{"1f1b", "vocab-1"}, {"zb-v", "baseline"}})
      check_matches_reference(plan_for(moe_tiny(set), schedule, vocab),
                              fmt::format("{} / {} / {}", fmt::join(set, " "), schedule, vocab));
}

TEST_CASE("expert parallelism over the replicas trains like a single device under every schedule and vocabulary mode") {
  // ep = dp = 2: each replica holds 2 of the 4 experts, and their gradients are its alone.
  const Config config = moe_tiny({"parallel.dp=2", "parallel.ep=2"});
  for (const std::string& schedule : schedule_names())
    for (const std::string& vocab : vocab_mode_names())
      check_matches_reference(plan_for(config, schedule, vocab), "ep 2 / " + schedule + " / " + vocab);
}

TEST_CASE("expert parallelism with an expert data-parallel group, one expert a rank, ZeRO and recomputation") {
  for (const std::vector<std::string>& set :
       {std::vector<std::string>{"parallel.dp=4", "parallel.ep=2"},  // replicas 0 and 2 (1 and 3) sum their experts'
        {"parallel.dp=4", "parallel.ep=4"},
        // ZeRO shards the experts' maps over the expert data-parallel group (of 2; of 1 at ep = dp)
        {"parallel.dp=4", "parallel.ep=2", "training.zero_stage=1"},
        {"parallel.dp=4", "parallel.ep=2", "training.zero_stage=3"},
        {"parallel.dp=2", "parallel.ep=2", "training.zero_stage=3"},
        {"parallel.dp=2", "parallel.ep=2", "training.recompute_granularity=full", "training.recompute_num_layers=1"}})
    for (const auto& [schedule, vocab] : {std::pair{"1f1b", "vocab-1"}, {"zb-v", "baseline"}})
      check_matches_reference(plan_for(moe_tiny(set), schedule, vocab),
                              fmt::format("{} / {} / {}", fmt::join(set, " "), schedule, vocab));
}

TEST_CASE("ZeRO over the expert data-parallel group trains as the unsharded run does, step after step") {
  // The check compares the first step's gradients; the optimizer's sharded update shows in the next
  // steps' losses.
  const auto losses = [](const std::vector<std::string>& set) {
    const runtime::RunOptions o = options(3);
    Result<runtime::RunResult> run = runtime::run_in_process(job_of(plan_for(moe_tiny(set), "1f1b", "vocab-1")), o);
    INFO((run.ok() ? "" : run.error().message));
    REQUIRE(run.ok());
    return run.value().losses;
  };
  const std::vector<double> whole = losses({"parallel.dp=4", "parallel.ep=2"});
  for (const std::string zero : {"1", "2", "3"}) {
    const std::vector<double> sharded = losses({"parallel.dp=4", "parallel.ep=2", "training.zero_stage=" + zero});
    REQUIRE(sharded.size() == whole.size());
    for (std::size_t step = 0; step < whole.size(); ++step) {
      CAPTURE(zero, step);
      CHECK(sharded[step] == Approx(whole[step]).epsilon(1e-6));
    }
  }
}

TEST_CASE("an expert-parallel rank holds its share of each MoE layer's routed experts, the rest whole") {
  const Config config = moe_tiny({"parallel.dp=2", "parallel.ep=2"});
  const runtime::ModelShape s = runtime::model_shape(config);
  const Plan plan = plan_for(config, "1f1b", "baseline");
  const runtime::RankModel whole = runtime::make_rank_model(s, plan.layout, {.device = 1, .tp_rank = 0, .tp = 1, .owned = {}}, 3);
  for (int ep_rank = 0; ep_rank < 2; ++ep_rank) {
    const runtime::RankModel part = runtime::make_rank_model(s, plan.layout, {.device = 1, .tp_rank = 0, .tp = 1, .owned = {}, .ep_rank = ep_rank, .ep = 2},
                                                                3);
    for (const auto& [index, layer] : part.params.layers) {
      CAPTURE(ep_rank, index);
      const cpu::Layer& all = whole.params.layers.at(index);
      CHECK(layer.router_weight == all.router_weight);
      CHECK(layer.shared_fc1_weight == all.shared_fc1_weight);
      const std::size_t block = all.expert_fc1_weight.size() / 2;
      REQUIRE(layer.expert_fc1_weight.size() == block);
      CHECK(std::equal(layer.expert_fc1_weight.begin(), layer.expert_fc1_weight.end(),
                       all.expert_fc1_weight.begin() + std::ptrdiff_t(std::size_t(ep_rank) * block)));
      CHECK(layer.expert_fc2_weight.size() == all.expert_fc2_weight.size() / 2);
    }
  }
}

namespace {
/// Tensor parallelism as Megatron-Core runs MoE layers under it: sequence parallel, experts whole.
std::vector<std::string> with_tp(std::vector<std::string> set) {
  set.insert(set.begin(), {"parallel.tp=2", "parallel.sequence_parallel=true", "parallel.etp=1"});
  return set;
}
/// The same with expert tensor parallelism: each expert split over the two tensor-parallel ranks.
std::vector<std::string> with_etp(std::vector<std::string> set) {
  set.insert(set.begin(), {"parallel.tp=2", "parallel.sequence_parallel=true", "parallel.etp=2"});
  return set;
}
}  // namespace

TEST_CASE("expert-parallel groups are carved out of a stage's tensor- and data-parallel ranks, tensor-parallel innermost") {
  const auto groups = [](const std::vector<std::string>& set, int rank) {
    const Plan plan = plan_for(moe_tiny(with_tp(set)), "1f1b", "baseline");
    const runtime::Job job = job_of(plan);
    const runtime::RankPlace p = job.place(rank);
    return std::tuple{job.expert_group_of(rank, runtime::Job::ExpertGroup::Parallel),
                      job.expert_group_of(rank, runtime::Job::ExpertGroup::DataParallel), job.expert_rank(p),
                      job.expert_replicas()};
  };
  using Groups = std::tuple<std::vector<int>, std::vector<int>, int, int>;
  // Rank = (device·dp + replica)·tp + tp_rank. At tp 2 × dp 1, ep 2: the two tensor-parallel ranks.
  CHECK(groups({"parallel.ep=2"}, 3) == Groups{{2, 3}, {3}, 1, 1});
  // ep 1: every rank its own group; the expert data-parallel group all of a stage's ranks.
  CHECK(groups({"parallel.dp=2"}, 5) == Groups{{5}, {4, 5, 6, 7}, 0, 1});
  // tp 2 × dp 2, ep 2: a replica's tensor-parallel ranks; the replicas sum the same experts.
  CHECK(groups({"parallel.dp=2", "parallel.ep=2"}, 2) == Groups{{2, 3}, {0, 2}, 0, 1});
  // ep 4: both replicas' ranks of a device, every rank its own experts.
  CHECK(groups({"parallel.dp=2", "parallel.ep=4"}, 6) == Groups{{4, 5, 6, 7}, {6}, 2, 2});
}

TEST_CASE("expert-tensor-parallel groups are a stage's consecutive ranks, innermost in the expert grid") {
  // etp = tp = 2: (expert-parallel, expert-tensor-parallel, expert data-parallel group), expert rank,
  // slice, replicas of distinct slices.
  const auto groups = [](const std::vector<std::string>& set, int rank) {
    const runtime::Job job = job_of(plan_for(moe_tiny(with_etp(set)), "1f1b", "baseline"));
    const runtime::RankPlace p = job.place(rank);
    using G = runtime::Job::ExpertGroup;
    return std::tuple{job.expert_group_of(rank, G::Parallel), job.expert_group_of(rank, G::TensorParallel),
                      job.expert_group_of(rank, G::DataParallel), job.expert_rank(p), job.expert_tp_rank(p),
                      job.expert_replicas()};
  };
  using Groups = std::tuple<std::vector<int>, std::vector<int>, std::vector<int>, int, int, int>;
  // Rank = (device·dp + replica)·tp + tp_rank. ep 1: a replica's two ranks split every expert; the
  // replicas sum each slice.
  CHECK(groups({"parallel.dp=2"}, 3) == Groups{{3}, {2, 3}, {1, 3}, 0, 1, 1});
  // ep 2 at dp 2: a tensor-parallel rank's two replicas split the experts, each slice's alone.
  CHECK(groups({"parallel.dp=2", "parallel.ep=2"}, 2) == Groups{{0, 2}, {2, 3}, {2}, 1, 0, 2});
  // dp 4, ep 2: replicas 0 and 2 (1 and 3) hold the same experts and sum each slice.
  CHECK(groups({"parallel.dp=4", "parallel.ep=2"}, 11) == Groups{{9, 11}, {10, 11}, {11, 15}, 1, 1, 2});
}

TEST_CASE("expert tensor parallelism: each expert split over the tensor-parallel ranks, which run it on all tokens") {
  // etp = tp = 2 at ep 1 (the replicas sum each slice at dp 2) and with ep 2 over the replicas, under ZeRO.
  for (const std::vector<std::string>& set :
       {std::vector<std::string>{}, {"parallel.dp=2"}, {"parallel.dp=2", "parallel.ep=2"},
        {"parallel.dp=4", "parallel.ep=2", "training.zero_stage=1"}})
    for (const auto& [schedule, vocab] : {std::pair{"1f1b", "vocab-1"}, {"zb-v", "baseline"}})
      check_matches_reference(plan_for(moe_tiny(with_etp(set)), schedule, vocab),
                              fmt::format("tp 2 etp 2 {} / {} / {}", fmt::join(set, " "), schedule, vocab));
}

TEST_CASE("an expert-tensor-parallel rank holds its slice of each of its experts' maps") {
  const Config config = moe_tiny(with_etp({}));
  const runtime::ModelShape s = runtime::model_shape(config);
  const cpu::Layer whole = cpu::make_layer(s, 3, 1);
  const std::size_t h = std::size_t(s.hidden), f = std::size_t(s.expert_ffn), half = f / 2;
  for (int slice = 0; slice < 2; ++slice) {
    const cpu::Layer part = cpu::expert_part(s, whole, 1, 2, slice, 2);  // experts 2 and 3
    REQUIRE(part.expert_fc1_weight.size() == 2 * h * f);
    REQUIRE(part.expert_fc2_weight.size() == 2 * half * h);
    for (std::size_t e = 0; e < 2; ++e) {
      CAPTURE(slice, e);
      const std::size_t expert = 2 + e;
      // Row 1 of the fused map: the slice's gate columns, then its up columns.
      const std::size_t row = 1, at = e * h * f + row * f;
      const std::size_t whole_row = expert * h * 2 * f + row * 2 * f;
      CHECK(part.expert_fc1_weight[at] == whole.expert_fc1_weight[whole_row + std::size_t(slice) * half]);
      CHECK(part.expert_fc1_weight[at + half] == whole.expert_fc1_weight[whole_row + f + std::size_t(slice) * half]);
      // The down projection's rows of the slice.
      CHECK(part.expert_fc2_weight[e * half * h] ==
            whole.expert_fc2_weight[expert * f * h + std::size_t(slice) * half * h]);
    }
  }
}

TEST_CASE("the gradient check takes every element of the routed experts' maps once, from the rank of its slice") {
  // ep 2 × etp 2: four ranks of distinct slices, each reporting its gradient (here its weights) as
  // elements of the whole tensor.
  const Config config = moe_tiny(with_etp({"parallel.dp=2", "parallel.ep=2"}));
  const runtime::ModelShape s = runtime::model_shape(config);
  const Plan plan = plan_for(config, "1f1b", "baseline");
  const cpu::Model whole = cpu::make_model(s, 3);
  std::map<std::size_t, std::vector<int>> seen;
  for (int ep_rank = 0; ep_rank < 2; ++ep_rank)
    for (int slice = 0; slice < 2; ++slice) {
      runtime::RankModel m = runtime::make_rank_model(
          s, plan.layout,
          {.device = 1, .tp_rank = slice, .tp = 2, .owned = {}, .ep_rank = ep_rank, .ep = 2, .etp_rank = slice, .etp = 2},
          3);
      m.grads = m.params;
      for (const runtime::HostGradient& g : runtime::host_gradients(m)) {
        if (!runtime::routed_expert_model_tensor(g.tensor)) continue;
        const std::span<const float> all = runtime::model_tensor(whole, g.tensor);
        std::vector<int>& count = seen.try_emplace(g.tensor, all.size(), 0).first->second;
        REQUIRE(g.elements.size() == g.values.size());
        for (std::size_t i = 0; i < g.values.size(); ++i) {
          const std::size_t at = g.offset + g.elements[i];
          REQUIRE(at < all.size());
          CHECK(g.values[i] == all[at]);
          ++count[at];
        }
      }
    }
  std::size_t moe_layers = 0;  // of device 1, each with two routed experts' maps
  const runtime::RankModel device1 = runtime::make_rank_model(s, plan.layout, {.device = 1, .owned = {}}, 3);
  for (const auto& [index, layer] : device1.params.layers)
    moe_layers += layer.moe() ? 1 : 0;
  CHECK(moe_layers > 0);
  CHECK(seen.size() == 2 * moe_layers);
  for (const auto& [tensor, count] : seen) {
    CAPTURE(tensor);
    CHECK(std::all_of(count.begin(), count.end(), [](int c) { return c == 1; }));
  }
}

TEST_CASE("tensor parallelism with sequence parallelism: each rank routes its own tokens, its experts whole") {
  // ep 1: every tensor-parallel rank holds every expert and sums their gradients with the others;
  // ep 2 at dp 1: the two tensor-parallel ranks are the expert group; at dp 2 the replicas sum each
  // share; ep 4: a group spans both replicas.
  for (const std::vector<std::string>& set :
       {std::vector<std::string>{}, {"parallel.ep=2"}, {"parallel.dp=2"}, {"parallel.dp=2", "parallel.ep=2"},
        {"parallel.dp=2", "parallel.ep=4", "training.zero_stage=1"}})
    for (const auto& [schedule, vocab] : {std::pair{"1f1b", "vocab-1"}, {"zb-v", "baseline"}})
      check_matches_reference(plan_for(moe_tiny(with_tp(set)), schedule, vocab),
                              fmt::format("tp 2 {} / {} / {}", fmt::join(set, " "), schedule, vocab));
}

TEST_CASE("mixture-of-experts runs refuse, by the field, what the runtime does not run") {
  const auto refusal = [](const std::vector<std::string>& set, runtime::BackendKind backend = runtime::BackendKind::Cpu) {
    runtime::RunOptions o = options();
    o.backend = backend;
    const Status s = runtime::check_runnable(moe_tiny(set), o);
    REQUIRE_FALSE(s.ok());
    return s.error().message;
  };
  using Catch::Matchers::Contains;
  CHECK_THAT(refusal(with_tp({"parallel.dp=2", "parallel.etp=4"})),
             Contains("parallel.etp:") && Contains("set parallel.etp to 1 or to 2"));
  CHECK_THAT(refusal(with_tp({"model.num_experts=6", "parallel.dp=3", "parallel.ep=3"})), Contains("parallel.ep:") && Contains("divide"));
  CHECK_THAT(refusal(with_tp({"model.moe_shared_expert_intermediate_size=31"})),
             Contains("model.moe_shared_expert_intermediate_size:") && Contains("multiple of 2"));
  CHECK_THAT(refusal({}, runtime::BackendKind::Cuda),
             Contains("model.num_experts:") && Contains("the CUDA backend runs dense layers only"));
  CHECK_THAT(refusal({"model.mlp=gelu"}), Contains("model.mlp:") && Contains("swiglu"));
  CHECK_THAT(refusal({"model.moe_capacity_factor=1.25"}), Contains("model.moe_capacity_factor:") && Contains("dropless"));
  // The refusals of dense models still apply.
  CHECK_THAT(refusal({"parallel.cp=2"}), Contains("parallel.cp:"));
}
