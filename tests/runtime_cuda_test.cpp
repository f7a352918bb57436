// The CUDA backend executes the same task graphs as the CPU backend and matches the single-device
// CPU reference: every schedule × vocabulary mode in fp32 (TF32 off) to the CPU's bounds, and in
// bf16 within 1e-2 on the loss; the Llama family (RMSNorm, RoPE, SwiGLU, grouped-query attention)
// likewise; data-parallel replicas on one GPU (in-process, device memory), their gradients
// all-reduced or under ZeRO reduce-scattered; and tensor-parallel ranks, with and without sequence
// parallelism. Needs a GPU: without one it exits 77, which Meson reports as SKIP.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>
#include <fmt/format.h>

#include <cmath>

#include "cuda/cuda_backend.h"
#include "helpers.h"
#include "launch.h"
#include "measured.h"
#include "plan.h"

using namespace pipesim;

namespace {

Plan shipped_plan(const std::string& file, const std::string& schedule, const std::string& vocab) {
  Config config = testing::shipped_config(file);
  config.schedule.name = schedule, config.schedule.vocab = *vocab_mode_named(vocab);
  return testing::plan_or_fail(config);
}

Plan tiny_plan(const std::string& schedule, const std::string& vocab) {
  return shipped_plan("tiny.json", schedule, vocab);
}

runtime::CheckResult checked_run(const std::string& schedule, const std::string& vocab, runtime::DType dtype,
                                 const std::string& file = "tiny.json") {
  runtime::RunOptions o;
  o.backend = runtime::BackendKind::Cuda, o.dtype = dtype, o.check = true, o.timeout_s = 60;
  const Plan plan = shipped_plan(file, schedule, vocab);
  Result<runtime::RunResult> run = runtime::run_in_process(job_of(plan), o);
  INFO(file << ": " << schedule << " / " << vocab << (run.ok() ? "" : ": " + run.error().message));
  REQUIRE(run.ok());
  return *run.value().check;
}

/// The CPU tests' bounds (tests/runtime_test.cpp): the loss within 1e-5 relative, every gradient
/// within 1e-4, and a loss near log(V), so a wrong loss cannot pass by being small.
void check_fp32_bounds(const runtime::CheckResult& check, int vocab) {
  INFO("loss " << check.loss << " reference " << check.reference_loss << ", gradient error " << check.max_grad_rel_err
               << " in " << check.worst_tensor);
  CHECK(std::abs(check.loss - check.reference_loss) <= 1e-5 * std::abs(check.reference_loss));
  CHECK(check.max_grad_rel_err <= 1e-4);
  CHECK(check.passed());
  CHECK(check.reference_loss == Approx(std::log(double(vocab))).epsilon(0.05));
}

}  // namespace

TEST_CASE("fp32 on the GPU matches the CPU reference for every schedule and vocabulary mode") {
  for (const std::string& schedule : schedule_names())
    for (const std::string& vocab : vocab_mode_names()) {
      const runtime::CheckResult check = checked_run(schedule, vocab, runtime::DType::F32);
      INFO(schedule << " / " << vocab << ": loss " << check.loss << " reference " << check.reference_loss
                    << ", gradient error " << check.max_grad_rel_err << " in " << check.worst_tensor);
      CHECK(check.passed());
    }
}

TEST_CASE("bf16 on the GPU keeps the loss within 1e-2 of the fp32 reference") {
  for (const std::string vocab : {"baseline", "vocab-1", "vocab-2"}) {
    const runtime::CheckResult check = checked_run("1f1b", vocab, runtime::DType::BF16);
    INFO(vocab << ": loss " << check.loss << " reference " << check.reference_loss);
    CHECK(check.passed());
  }
}

TEST_CASE("a Llama-family model (RMSNorm, RoPE, SwiGLU, grouped-query attention) in fp32 on the GPU matches the "
          "CPU reference") {
  const Config config = testing::shipped_config("llama-tiny.json");
  REQUIRE(config.model.mlp == MlpKind::SwiGlu);
  REQUIRE(config.model.key_value_heads() < config.model.heads);
  // One schedule per kind of walk: plain 1F1B, chunks on a loop, B and W split, V placement with W split.
  for (const std::string schedule : {"1f1b", "interleaved-1f1b", "zb-h1", "zb-v"})
    for (const std::string& vocab : vocab_mode_names()) {
      INFO(schedule << " / " << vocab);
      check_fp32_bounds(checked_run(schedule, vocab, runtime::DType::F32, "llama-tiny.json"), config.model.vocab);
    }
}

TEST_CASE("a Llama-family model in bf16 (cuDNN's grouped-query attention) keeps the loss within 1e-2") {
  for (const std::string vocab : {"baseline", "vocab-1"}) {
    const runtime::CheckResult check = checked_run("1f1b", vocab, runtime::DType::BF16, "llama-tiny.json");
    INFO(vocab << ": loss " << check.loss << " reference " << check.reference_loss);
    CHECK(check.passed());
  }
}

TEST_CASE("data-parallel replicas on the GPU, gradients all-reduced or under ZeRO reduce-scattered, train like one "
          "device") {
  // dp = 2 × pp = 2: four ranks sharing the GPU, each replica on half of the global batch.
  for (const std::string zero : {"0", "1"})
    for (const std::string schedule : {"1f1b", "zb-h1"})
      for (const std::string vocab : {"baseline", "vocab-1"}) {
        Config config = testing::shipped_config("tiny.json", {"parallel.dp=2", "parallel.pp=2", "parallel.microbatches=4",
                                                              "training.zero_stage=" + zero});
        config.schedule.name = schedule, config.schedule.vocab = *vocab_mode_named(vocab);
        const Plan plan = testing::plan_or_fail(config);
        REQUIRE(plan.graph.has(OpKind::DpAllReduce));
        runtime::RunOptions o;
        o.backend = runtime::BackendKind::Cuda, o.check = true, o.timeout_s = 60;
        Result<runtime::RunResult> run = runtime::run_in_process(job_of(plan), o);
        INFO("ZeRO " << zero << ", " << schedule << " / " << vocab << (run.ok() ? "" : ": " + run.error().message));
        REQUIRE(run.ok());
        check_fp32_bounds(*run.value().check, config.model.vocab);
      }
}

TEST_CASE("ZeRO-1 on the GPU keeps Adam's moments of half of every tensor at dp = 2, and its replicas train as "
          "ZeRO-0's do") {
  const auto run = [](const std::string& zero, runtime::DType dtype,
                      runtime::BackendKind backend = runtime::BackendKind::Cuda) {
    Config config = testing::shipped_config("tiny.json", {"parallel.dp=2", "parallel.pp=2", "parallel.microbatches=4",
                                                          "training.zero_stage=" + zero});
    const Plan plan = testing::plan_or_fail(config);
    runtime::RunOptions o;
    o.backend = backend, o.dtype = dtype, o.steps = 3, o.timeout_s = 60;
    Result<runtime::RunResult> result = runtime::run_in_process(job_of(plan), o);
    INFO("ZeRO " << zero << (result.ok() ? "" : ": " + result.error().message));
    REQUIRE(result.ok());
    return std::move(result).value();
  };
  const runtime::RunResult whole = run("0", runtime::DType::F32), sharded = run("1", runtime::DType::F32);
  // fp32 weights and gradients (8 bytes a parameter) plus two moments (8 more), of which ZeRO-1
  // keeps half at dp = 2 (tiny.json's tensors have even sizes): 3/4 of ZeRO-0's bytes on the CPU
  // backend, whose static bytes are that state alone. The GPU's also hold the libraries' workspaces,
  // the same under either stage: it frees what the CPU backend frees.
  const runtime::RunResult whole_cpu = run("0", runtime::DType::F32, runtime::BackendKind::Cpu),
                           sharded_cpu = run("1", runtime::DType::F32, runtime::BackendKind::Cpu);
  for (std::size_t d = 0; d < whole.static_bytes.size(); ++d) {
    CHECK(sharded_cpu.static_bytes[d] * 4 == whole_cpu.static_bytes[d] * 3);
    CHECK(whole.static_bytes[d] - sharded.static_bytes[d] == whole_cpu.static_bytes[d] - sharded_cpu.static_bytes[d]);
  }
  for (std::size_t step = 0; step < 3; ++step) CHECK(sharded.losses[step] == Approx(whole.losses[step]).epsilon(1e-5));
  CHECK(sharded.losses[2] < sharded.losses[0]);
  // bf16: the gathered weights' bf16 copies are refreshed (weights_written), so the replicas'
  // later steps still follow ZeRO-0's.
  const runtime::RunResult whole16 = run("0", runtime::DType::BF16), sharded16 = run("1", runtime::DType::BF16);
  for (std::size_t step = 0; step < 3; ++step) CHECK(sharded16.losses[step] == Approx(whole16.losses[step]).epsilon(1e-2));
  CHECK(sharded16.losses[2] < sharded16.losses[0]);
}

TEST_CASE("tensor-parallel ranks on the GPU, each its heads and FFN slice, with and without sequence parallelism, "
          "train like one device") {
  // tp = 2 × pp = 2 (and × dp = 2 under ZeRO 1): the ranks share the GPU.
  const std::vector<std::pair<std::string, std::vector<std::string>>> runs = {
      {"tiny.json", {"parallel.tp=2", "parallel.pp=2", "parallel.sequence_parallel=false"}},
      {"tiny.json", {"parallel.tp=2", "parallel.pp=2", "parallel.sequence_parallel=true"}},
      {"llama-tiny.json", {"parallel.tp=2", "parallel.pp=2", "parallel.sequence_parallel=false"}},
      {"llama-tiny.json", {"parallel.tp=2", "parallel.pp=2", "parallel.sequence_parallel=true"}},
      {"tiny.json", {"parallel.tp=2", "parallel.dp=2", "parallel.pp=2", "parallel.microbatches=4",
                     "training.zero_stage=1", "parallel.sequence_parallel=true"}}};
  for (const auto& [file, set] : runs)
    for (const std::string schedule : {"1f1b", "zb-h1"})
      for (const std::string vocab : {"baseline", "vocab-1"}) {
        Config config = testing::shipped_config(file, set);
        config.schedule.name = schedule, config.schedule.vocab = *vocab_mode_named(vocab);
        const Plan plan = testing::plan_or_fail(config);
        runtime::RunOptions o;
        o.backend = runtime::BackendKind::Cuda, o.check = true, o.timeout_s = 60;
        Result<runtime::RunResult> run = runtime::run_in_process(job_of(plan), o);
        INFO(file << " " << fmt::format("{}", fmt::join(set, " ")) << ", " << schedule << " / " << vocab
                  << (run.ok() ? "" : ": " + run.error().message));
        REQUIRE(run.ok());
        check_fp32_bounds(*run.value().check, config.model.vocab);
        CHECK_FALSE(run.value().tensor_parallel.empty());  // the layers' all-reduces ran, and were recorded
      }
}

TEST_CASE("op times are the GPU's: each rank's compute ops follow each other within the step") {
  runtime::RunOptions o;
  o.backend = runtime::BackendKind::Cuda, o.dtype = runtime::DType::BF16, o.steps = 2, o.timeout_s = 60;
  const Plan plan = tiny_plan("1f1b", "vocab-1");
  Result<runtime::RunResult> run = runtime::run_in_process(job_of(plan), o);
  REQUIRE(run.ok());
  const runtime::RunResult& r = run.value();
  for (int rank = 0; rank < plan.graph.devices(); ++rank) {
    TimeNs previous_end = 0;
    for (const TaskId id : plan.graph.stream(plan.graph.first_stream(rank))) {  // the compute stream
      const TimeNs start = r.timeline.start[std::size_t(id)], end = r.timeline.end[std::size_t(id)];
      INFO("rank " << rank << ", " << plan.graph.describe(id) << ": " << start << " to " << end << " ns");
      CHECK(previous_end <= start);
      CHECK(start < end);
      CHECK(end <= r.step_ns.back());
      previous_end = end;
    }
  }
}

int main(int argc, char** argv) {
  if (runtime::cuda::device_count() == 0) {
    fmt::print("skipped: {}\n", runtime::cuda::unavailable_reason());
    return 77;
  }
  return Catch::Session().run(argc, argv);
}
