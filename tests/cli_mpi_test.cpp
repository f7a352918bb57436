// `mpirun -np 4 pipesim run`: one process per rank, the check against the reference, and a failing,
// hung or killed process ending the job. $PIPESIM_MPIRUN names mpirun (tests/meson.build); it is empty when
// pipesim was built without MPI or no mpirun was found, and then this test exits 77 before any test
// runs, which Meson reports as SKIP.
#define CATCH_CONFIG_RUNNER
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>

#include "cli_helpers.h"

using json = nlohmann::json;
using namespace pipesim::testing::cli;

namespace {

/// A checked run's JSON report from `processes` MPI processes, within the fp32 bounds of the reference.
void check_report(const Output& out, int processes) {
  INFO(out.text);
  REQUIRE(out.exit_code == 0);
  const json r = json::parse(out.text);
  CHECK(r["runtime"] == "mpi, " + std::to_string(processes) + " processes");
  CHECK(std::abs(r["loss"].get<double>() - r["reference_loss"].get<double>()) <= 1e-5 * r["reference_loss"].get<double>());
  CHECK(r["max_grad_rel_err"].get<double>() <= 1e-4);
}

}  // namespace

TEST_CASE("mpirun -np 4 runs the same check across processes") {
  const char* mpirun = std::getenv("PIPESIM_MPIRUN");
  REQUIRE(mpirun);
  const Output out = run_command(std::string(mpirun) + " -np 4 " + std::getenv("PIPESIM") + " run " + config("tiny.json") +
                                 " --schedule v-half --vocab vocab-1 --check --format json");
  check_report(out, 4);
  // A failing process ends the job: mpirun exits non-zero and the failing rank says where.
  const Output fault = run_command(std::string(mpirun) + " -np 4 " + std::getenv("PIPESIM") + " run " + config("tiny.json") +
                                   " --inject-fault 3:B:1 --timeout 5", true);
  CHECK(fault.exit_code != 0);
  CHECK_THAT(fault.text, Catch::Contains("pipesim: error: rank 3 failed at B(d3,s3,m1): injected fault"));
  // A hung process is found by the others' timeout, which ends the job.
  const Output hang = run_command(std::string(mpirun) + " -np 4 " + std::getenv("PIPESIM") + " run " + config("tiny.json") +
                                  " --inject-fault 1:F:2:hang --timeout 2", true);
  CHECK(hang.exit_code != 0);
  CHECK_THAT(hang.text, Catch::Contains(": no progress for 2 s; waiting on "));
  // A process that dies without a word (SIGKILL) ends the job too, and mpirun names it.
  const Output killed = run_command(std::string(mpirun) + " -np 4 " + std::getenv("PIPESIM") + " run " +
                                    config("tiny.json") + " --inject-fault 2:F:1:kill --timeout 5", true);
  CHECK(killed.exit_code != 0);
  CHECK_THAT(killed.text, Catch::Contains("rank 2"));
  // A rank that hangs before it connects (before NCCL's communicators on a GPU) is found by the others.
  const Output setup = run_command(std::string(mpirun) + " -np 4 " + std::getenv("PIPESIM") + " run " +
                                   config("tiny.json") + " --inject-fault 1:setup:hang --timeout 2", true);
  CHECK(setup.exit_code != 0);
  CHECK_THAT(setup.text, Catch::Contains(": no progress for 2 s waiting for the start-of-step barrier"));
}

TEST_CASE("mpirun -np 8 runs tensor- and data-parallel ranks inside a 2-stage pipeline, one process each") {
  const char* mpirun = std::getenv("PIPESIM_MPIRUN");
  REQUIRE(mpirun);
  const std::string layout = " --set parallel.tp=2 --set parallel.dp=2 --set parallel.pp=2 --set parallel.microbatches=4";
  const Output out = run_command(std::string(mpirun) + " -np 8 " + std::getenv("PIPESIM") + " run " + config("tiny.json") +
                                 layout + " --schedule zb-v --vocab vocab-2 --set training.zero_stage=1 --check --format json");
  check_report(out, 8);
  // A process count that is not the layout's tp × cp × dp × pp is refused with the count to give.
  const Output wrong = run_command(std::string(mpirun) + " -np 6 " + std::getenv("PIPESIM") + " run " +
                                   config("tiny.json") + layout, true);
  CHECK(wrong.exit_code != 0);
  CHECK_THAT(wrong.text, Catch::Contains("this MPI job has 6 processes but the layout has 8 ranks (tp 2 × cp 1 × dp 2 "
                                         "× pp 2); give mpirun -np 8 (or a multiple of tp × cp × dp = 4"));
}

TEST_CASE("mpirun with fewer processes than the config's pipeline refuses, never runs a shorter pipeline") {
  const char* mpirun = std::getenv("PIPESIM_MPIRUN");
  REQUIRE(mpirun);
  const Output out = run_command(std::string(mpirun) + " -np 3 " + std::getenv("PIPESIM") + " run " + config("tiny.json"), true);
  CHECK(out.exit_code != 0);
  CHECK_THAT(out.text, Catch::Contains("tiny.json: this MPI job has 3 processes but the layout has 4 ranks (tp 1 × cp 1 × "
                                       "dp 1 × pp 4); give mpirun -np 4, or --set parallel.pp=3 to run 3 pipeline stages"));
  // --ranks names the pipeline instead of parallel.pp, and must agree too.
  const Output ranks = run_command(std::string(mpirun) + " -np 3 " + std::getenv("PIPESIM") + " run " +
                                   config("tiny.json") + " --ranks 2", true);
  CHECK(ranks.exit_code != 0);
  CHECK_THAT(ranks.text, Catch::Contains("give mpirun -np 2, or --ranks 3 to run 3 pipeline stages"));
}

TEST_CASE("mpirun: a tied embedding on the first and last stage's processes, ZeRO 3 per stage, matches the reference") {
  // Each pipeline's first and last process sum their copies' gradients over a group of the two;
  // the replicas gather and reduce-scatter each stage's weights.
  const char* mpirun = std::getenv("PIPESIM_MPIRUN");
  REQUIRE(mpirun);
  const Output out = run_command(std::string(mpirun) + " -np 8 " + std::getenv("PIPESIM") + " run " +
                                 config("llama-tiny.json") + " --vocab baseline --set model.tied_embeddings=true" +
                                 " --set parallel.dp=2 --set parallel.microbatches=4 --set training.zero_stage=3" +
                                 " --check --format json");
  check_report(out, 8);
}

TEST_CASE("mpirun -np 4: expert parallelism over the replicas of a 2-stage pipeline matches the reference") {
  // pp 2 × dp 2, ep 2: each process holds 2 of a MoE layer's 4 routed experts and exchanges its
  // tokens with the other replica of its stage inside F, B and R. Over MPI what matters is the
  // transport's exchange, so two orders do (one stage a device, and the V placement with a
  // vocabulary-parallel mode); tests/runtime_moe_test.cpp runs every schedule and mode in-process.
  const char* mpirun = std::getenv("PIPESIM_MPIRUN");
  REQUIRE(mpirun);
  for (const auto& [schedule, vocab] : {std::pair{"1f1b", "baseline"}, std::pair{"dualpipe-v", "vocab-1"}}) {
    CAPTURE(schedule, vocab);
    const Output out = run_command(std::string(mpirun) + " -np 4 " + std::getenv("PIPESIM") + " run " +
                                   config("moe-tiny.json") + " --set parallel.dp=2 --set parallel.ep=2 --schedule " +
                                   schedule + " --vocab " + vocab + " --check --format json");
    check_report(out, 4);
  }
  // dp 4 × ep 2 over 8 processes: replicas 0 and 2 (1 and 3) hold the same experts and sum, and
  // under ZeRO 3 shard, their gradients over a group of their own.
  const Output zero = run_command(std::string(mpirun) + " -np 8 " + std::getenv("PIPESIM") + " run " +
                                  config("moe-tiny.json") + " --set parallel.dp=4 --set parallel.ep=2" +
                                  " --set training.zero_stage=3 --schedule zb-v --vocab vocab-2 --check --format json");
  check_report(zero, 8);
  // tp 2 × ep 2: a stage's two tensor-parallel ranks are its expert group, each routing its own
  // sequence-parallel share of the tokens.
  const Output tensor = run_command(std::string(mpirun) + " -np 4 " + std::getenv("PIPESIM") + " run " +
                                    config("moe-tiny.json") + " --set parallel.tp=2 --set parallel.etp=1" +
                                    " --set parallel.ep=2 --schedule 1f1b --vocab vocab-1 --check --format json");
  check_report(tensor, 4);
  // etp = tp = 2: each expert split over the two tensor-parallel ranks, which gather the rows they
  // received and sum their slices' outputs back.
  const Output sliced = run_command(std::string(mpirun) + " -np 4 " + std::getenv("PIPESIM") + " run " +
                                    config("moe-tiny.json") + " --set parallel.tp=2 --set parallel.etp=2" +
                                    " --schedule zb-v --vocab baseline --check --format json");
  check_report(sliced, 4);
}

int main(int argc, char** argv) {
  const char* mpirun = std::getenv("PIPESIM_MPIRUN");
  if (!mpirun || !*mpirun) {
    std::printf("skipped: pipesim was built without MPI, or no mpirun was found (PIPESIM_MPIRUN is empty)\n");
    return 77;
  }
  return Catch::Session().run(argc, argv);
}
