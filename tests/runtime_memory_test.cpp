// The CPU runtime sets glibc's allocator to keep the memory it frees (keep_freed_host_memory), so that
// measured op times hold no page faults. Only glibc's allocator has that setting: where the C library
// is another, or a sanitizer brings its own allocator (AddressSanitizer, ThreadSanitizer,
// MemorySanitizer), this test exits 77 before any test runs, which Meson reports as SKIP.
#define CATCH_CONFIG_RUNNER
#include <sys/resource.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <vector>

#include "launch.h"
#include "measured.h"
#include "runtime_helpers.h"

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define PIPESIM_SANITIZER_ALLOCATOR 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer) || __has_feature(memory_sanitizer)
#define PIPESIM_SANITIZER_ALLOCATOR 1
#endif
#endif

using namespace pipesim;
using namespace pipesim::testing::runs;

TEST_CASE("a CPU run keeps the memory it frees: steps after the first take (almost) no page faults") {
  // Width 64 and 64 tokens: tensors over glibc's default mmap threshold (128 KiB), which it would hand
  // back to the kernel on every free, with the rest trimmed off the heap's top. The next op to allocate
  // that memory then takes a page fault per 4 KiB page in its measured time, and how many depends on
  // the schedule's order of allocations and frees: ZB-V's B ops took about twice ZB-H1's faults per
  // layer and a fifth more time, which a ZB-V profile then carried into its prediction of ZB-H1.
  const Config config = tiny_config({"model.hidden=64", "model.ffn_hidden=256", "model.seq_len=64"});
  const Plan plan = plan_for(config, "zb-v", "vocab-1");
  std::vector<long> faults;  // the process's minor faults as each step ends (rank 0 reports it)
  runtime::RunOptions o = options(4);
  o.on_step = [&](int, double, TimeNs) {
    rusage usage{};
    getrusage(RUSAGE_SELF, &usage);
    faults.push_back(usage.ru_minflt);
  };
  Result<runtime::RunResult> run = runtime::run_in_process(job_of(plan), o);
  REQUIRE(run.ok());
  REQUIRE(faults.size() == 4);
  // Each step allocates and frees at least every device's activation peak again; the first step's
  // faults bring that memory in once. Steps 3 and 4 may fault only a small part of it again (each
  // step's compute threads are new, and their stacks fault in afresh).
  Bytes activations = 0;
  for (Bytes b : run.value().peak_activation_bytes) activations += b;
  const double pages = double(activations) / 4096;
  const double per_step = double(faults[3] - faults[1]) / 2;
  INFO(per_step << " page faults per step; the activation peaks span " << pages << " pages");
  CHECK(per_step < 0.1 * pages);
}

int main([[maybe_unused]] int argc, [[maybe_unused]] char** argv) {
#if defined(PIPESIM_SANITIZER_ALLOCATOR)
  std::printf("skipped: a sanitizer build, whose allocator is the sanitizer's, not glibc's\n");
  return 77;
#elif !defined(__GLIBC__)
  std::printf("skipped: the C library is not glibc, whose allocator setting this test checks\n");
  return 77;
#else
  return Catch::Session().run(argc, argv);
#endif
}
