// Data parallelism in the runtime: replicas of the pipeline, each on its own microbatches, whose
// gradients the graph's DP_ALLREDUCE sums (or, under ZeRO, reduce-scatters, each replica updating
// its part and all-gathering the weights) -- a step must match one device on the whole global batch.
#include <catch2/catch.hpp>

#include <algorithm>

#include "cpu/model.h"
#include "launch.h"
#include "measured.h"
#include "partition.h"
#include "runtime_helpers.h"

using namespace pipesim;
using namespace pipesim::testing::runs;

namespace {

runtime::RunResult checked_run(const Plan& plan, int steps = 1) {
  runtime::RunOptions o = options(steps);
  o.check = true;
  Result<runtime::RunResult> run = runtime::run_in_process(job_of(plan), o);
  INFO((run.ok() ? "" : run.error().message));
  REQUIRE(run.ok());
  return std::move(run).value();
}

}  // namespace

TEST_CASE("data-parallel replicas, their gradients all-reduced or under ZeRO reduce-scattered, train like one device") {
  for (const std::string zero : {"0", "1", "2"})
    for (const std::string schedule : {"1f1b", "zb-h1", "interleaved-1f1b", "zb-v"})
      for (const std::string vocab : {"baseline", "vocab-1", "vocab-2"}) {
        const Plan plan = plan_for(tiny_config({"parallel.dp=2", "parallel.pp=2", "parallel.microbatches=4",
                                                "training.zero_stage=" + zero}),
                                   schedule, vocab);
        REQUIRE(plan.graph.has(OpKind::DpAllReduce));
        const runtime::RunResult run = checked_run(plan);
        const runtime::CheckResult& check = *run.check;
        INFO("ZeRO " << zero << ", " << schedule << " / " << vocab << ": loss " << check.loss << " reference "
                     << check.reference_loss << ", gradient error " << check.max_grad_rel_err << " in "
                     << check.worst_tensor);
        CHECK(check.passed());
        CHECK(check.max_grad_rel_err <= 1e-4);
        // The data-parallel collectives are ops of the measured step, with a duration.
        for (TaskId id = 0; id < TaskId(plan.graph.size()); ++id)
          if (plan.graph.task(id).kind == OpKind::DpAllReduce)
            CHECK(run.timeline.end[std::size_t(id)] > run.timeline.start[std::size_t(id)]);
      }
}

TEST_CASE("ZeRO 3 and the overlapped reductions and gathers run per stage, and train like one device over steps") {
  // Between the collectives that gather them, a replica holds only its part of each weight (the rest
  // is zeroed), so a missing or late gather fails the check, and later steps' losses show it.
  const auto losses_of = [](const std::string& schedule, const std::string& vocab, std::vector<std::string> settings) {
    settings.insert(settings.end(), {"parallel.dp=2", "parallel.pp=2", "parallel.microbatches=4"});
    const Plan plan = plan_for(tiny_config(settings), schedule, vocab);
    const runtime::RunResult run = checked_run(plan, 3);
    INFO(schedule << " / " << vocab << ": gradient error " << run.check->max_grad_rel_err << " in "
                  << run.check->worst_tensor);
    CHECK(run.check->passed());
    return std::pair{plan.graph, run.losses};
  };
  for (const std::string schedule : {"1f1b", "interleaved-1f1b", "zb-v"})
    for (const std::string vocab : {"baseline", "vocab-1"}) {
      const std::vector<double> reference = losses_of(schedule, vocab, {}).second;
      for (const std::vector<std::string>& settings :
           {std::vector<std::string>{"training.zero_stage=3"},
            {"training.zero_stage=1", "training.overlap_param_gather=true", "training.overlap_grad_reduce=true"},
            {"training.zero_stage=2", "training.overlap_grad_reduce=true"},
            {"training.zero_stage=0", "training.overlap_grad_reduce=true"}}) {
        INFO(schedule << " / " << vocab << " with " << settings.front() << ", " << settings.size() - 1 << " more");
        const auto [graph, losses] = losses_of(schedule, vocab, settings);
        // The graph's per-stage collectives, and in the vocabulary-parallel mode the shards' own.
        int per_stage = 0, per_device = 0;
        for (const Task& t : graph.tasks())
          if (t.kind == OpKind::DpAllReduce) ++(t.stage >= 0 ? per_stage : per_device);
        CHECK(per_stage > 0);
        if (vocab == "vocab-1") CHECK(per_device > 0);
        for (std::size_t step = 0; step < losses.size(); ++step)
          CHECK(losses[step] == Approx(reference[step]).epsilon(1e-5));
      }
    }
}

TEST_CASE("the reference of a data-parallel check is the whole global batch, not one replica's") {
  // Two replicas of 4 microbatches and one pipeline of 8 see the same 8 microbatches: the same loss.
  const runtime::RunResult two = checked_run(plan_for(
      tiny_config({"parallel.dp=2", "parallel.pp=2", "parallel.microbatches=4"}), "1f1b", "baseline"));
  const runtime::RunResult one =
      checked_run(plan_for(tiny_config({"parallel.pp=2", "parallel.microbatches=8"}), "1f1b", "baseline"));
  CHECK(two.check->reference_loss == Approx(one.check->reference_loss).epsilon(1e-6));
  CHECK(two.losses[0] == Approx(one.losses[0]).epsilon(1e-5));
}

TEST_CASE("ZeRO-1 keeps Adam's moments of 1/dp of every tensor, and replicas stay identical over steps") {
  const auto run = [](const std::string& zero) {
    return checked_run(plan_for(tiny_config({"parallel.dp=2", "parallel.pp=2", "parallel.microbatches=4",
                                             "training.zero_stage=" + zero}),
                                "1f1b", "vocab-1"),
                       3);
  };
  const runtime::RunResult whole = run("0"), sharded = run("1");
  // fp32 weights and gradients (8 bytes a parameter) plus two moments (8 more), of which ZeRO-1
  // keeps half at dp = 2: every tensor of tiny.json has an even number of elements, so exactly half.
  for (std::size_t d = 0; d < whole.static_bytes.size(); ++d) CHECK(sharded.static_bytes[d] * 4 == whole.static_bytes[d] * 3);
  // The same updates, whoever applies them: the losses of later steps agree to rounding.
  for (std::size_t step = 0; step < 3; ++step) CHECK(sharded.losses[step] == Approx(whole.losses[step]).epsilon(1e-5));
  CHECK(sharded.losses[2] < sharded.losses[0]);
}

TEST_CASE("tensor-parallel ranks, each its heads and FFN slice, with data-parallel replicas train like one device") {
  // tp = 2, dp = 2, pp = 2: eight ranks; with and without sequence parallelism.
  for (const std::string sequence_parallel : {"false", "true"})
    for (const std::string zero : {"0", "1"})
      for (const std::string schedule : {"1f1b", "zb-h1", "interleaved-1f1b", "zb-v"})
        for (const std::string vocab : {"baseline", "vocab-1", "vocab-2"}) {
          const Plan plan = plan_for(tiny_config({"parallel.tp=2", "parallel.dp=2", "parallel.pp=2",
                                                  "parallel.microbatches=4",
                                                  "parallel.sequence_parallel=" + sequence_parallel,
                                                  "training.zero_stage=" + zero}),
                                     schedule, vocab);
          REQUIRE(job_of(plan).ranks() == 8);
          const runtime::CheckResult check = *checked_run(plan).check;
          INFO("sequence parallel " << sequence_parallel << ", ZeRO " << zero << ", " << schedule << " / " << vocab
                                    << ": loss " << check.loss << " reference " << check.reference_loss
                                    << ", gradient error " << check.max_grad_rel_err << " in " << check.worst_tensor);
          CHECK(check.passed());
          CHECK(check.max_grad_rel_err <= 1e-4);
        }
}

TEST_CASE("under sequence parallelism a rank passes on its own rows: 1/tp of the activations between stages") {
  const auto peak_of = [](const std::string& sequence_parallel) {
    const Plan plan = plan_for(tiny_config({"parallel.tp=2", "parallel.pp=2", "parallel.microbatches=4",
                                            "parallel.sequence_parallel=" + sequence_parallel}),
                               "1f1b", "vocab-1");
    const runtime::RunResult run = checked_run(plan);
    REQUIRE(run.check->passed());
    return run;
  };
  const runtime::RunResult whole = peak_of("false"), split = peak_of("true");
  // A layer keeps fewer rows of its input and norms, so every rank's activation peak drops.
  for (std::size_t d = 0; d < whole.peak_activation_bytes.size(); ++d)
    CHECK(split.peak_activation_bytes[d] < whole.peak_activation_bytes[d]);
}

TEST_CASE("a Llama-family layer splits its query and key/value heads and its gate and up projections") {
  for (const std::string schedule : {"1f1b", "zb-v"}) {
    const Plan plan = plan_for(testing::shipped_config("llama-tiny.json", {"parallel.tp=2", "parallel.pp=2"}),
                               schedule, "vocab-1");
    const runtime::CheckResult check = *checked_run(plan).check;
    INFO(schedule << ": gradient error " << check.max_grad_rel_err << " in " << check.worst_tensor);
    CHECK(check.passed());
  }
}

TEST_CASE("a split layer is the whole layer: its parts' elements tile every split tensor exactly once") {
  const cpu::ModelShape shape = runtime::model_shape(testing::shipped_config("llama-tiny.json"));
  const cpu::Layer whole = cpu::make_layer(shape, 3, 0);
  for (const int ranks : {2, shape.key_value_heads()}) {
    const auto tensors = whole.tensors();
    std::vector<std::vector<int>> covered(tensors.size());
    for (std::size_t t = 0; t < tensors.size(); ++t) covered[t].assign(tensors[t]->size(), 0);
    for (int rank = 0; rank < ranks; ++rank) {
      const cpu::Layer part = cpu::split_layer(shape, whole, rank, ranks);
      const auto elements = cpu::split_elements(shape, rank, ranks);
      for (std::size_t t = 0; t < tensors.size(); ++t) {
        if (elements[t].empty()) {  // whole on every rank
          CHECK(*part.tensors()[t] == *tensors[t]);
          continue;
        }
        REQUIRE(part.tensors()[t]->size() == elements[t].size());
        for (std::size_t i = 0; i < elements[t].size(); ++i) {
          CHECK((*part.tensors()[t])[i] == (*tensors[t])[elements[t][i]]);
          ++covered[t][elements[t][i]];
        }
      }
    }
    for (std::size_t t : {2u, 4u, 8u, 10u})  // qkv, proj, fc1, fc2 weights
      CHECK(std::all_of(covered[t].begin(), covered[t].end(), [](int c) { return c == 1; }));
  }
}

TEST_CASE("a measured step records every tensor-parallel collective its layers run, for the trace") {
  // tiny.json's 8 GPT layers over pp = 2, m = 4 microbatches, tp = 2.
  const int layers = 8, m = 4;
  const auto collectives = [&](const std::string& sequence_parallel) {
    const Plan plan = plan_for(tiny_config({"parallel.tp=2", "parallel.pp=2", "parallel.microbatches=4",
                                            "parallel.sequence_parallel=" + sequence_parallel}),
                               "1f1b", "baseline");
    return checked_run(plan).tensor_parallel;
  };
  // Without sequence parallelism a layer all-reduces twice forward (attention and MLP outputs) and
  // twice backward (their input gradients).
  const std::vector<runtime::InnerCollective> whole = collectives("false");
  CHECK(whole.size() == std::size_t(4 * layers * m));
  CHECK(std::all_of(whole.begin(), whole.end(), [](const auto& c) { return c.kind == runtime::InnerCollective::Kind::AllReduce; }));
  // With it, each of those becomes an all-gather and a reduce-scatter (8 a layer and microbatch);
  // the last stage gathers its output for the head and the first its input gradient for the
  // embedding (once a microbatch each); and each layer's four norm-parameter gradients are summed
  // once a step.
  const std::vector<runtime::InnerCollective> split = collectives("true");
  CHECK(split.size() == std::size_t(8 * layers * m + 2 * m + 4 * layers));
  for (const runtime::InnerCollective& c : split) CHECK(c.end >= c.start);
}

TEST_CASE("with replicas and tensor-parallel ranks, an error names the rank and where it sits") {
  const Plan plan = plan_for(tiny_config({"parallel.dp=2", "parallel.pp=2", "parallel.microbatches=4"}), "1f1b", "baseline");
  runtime::RunOptions o = options(1, 10);
  o.fault = runtime::InjectedFault{.rank = 1, .kind = OpKind::B, .microbatch = 1};  // device 1, in both replicas
  const Result<runtime::RunResult> run = runtime::run_in_process(job_of(plan), o);
  REQUIRE(!run.ok());
  CHECK_THAT(run.error().message, Catch::Contains("(device 1, replica "));
  CHECK_THAT(run.error().message, Catch::Contains(", tp rank 0) failed at B(d1,s1,m1): injected fault"));
}

TEST_CASE("the CUDA backend takes Llama layers, data- and tensor-parallel ranks, as the CPU backend does") {
  runtime::RunOptions cuda = options();
  cuda.backend = runtime::BackendKind::Cuda;
  for (const Config& runnable :
       {testing::shipped_config("llama-tiny.json"),
        tiny_config({"parallel.dp=2", "parallel.pp=2", "parallel.microbatches=4", "training.zero_stage=1"}),
        tiny_config({"parallel.tp=2", "parallel.pp=2"}),
        tiny_config({"parallel.tp=2", "parallel.pp=2", "parallel.sequence_parallel=false"})}) {
    const Status status = runtime::check_runnable(runnable, cuda);
    INFO((status.ok() ? "" : status.error().message));
    CHECK(status.ok());
  }
}
