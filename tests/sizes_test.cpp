// Size limits: one place refuses what would overflow or outgrow the machine, and its task estimate
// really bounds what the graph builder makes.
#include <climits>

#include "helpers.h"
#include "sizes.h"

using namespace pipesim;
using namespace pipesim::testing;

namespace {

const std::string kTiny = R"json({
  "model": {"layers": 16, "hidden": 32, "heads": 4, "ffn_hidden": 128, "seq_len": 16, "vocab": 250},
  "parallel": {"pp": 4, "microbatches": 8, "chunks": 2}
})json";

std::string error_of(const std::vector<std::string>& overrides) {
  Result<Config> config = parse_config(kTiny, "c.json", overrides);
  return config.ok() ? "(no error)" : config.error().message;
}

}  // namespace

TEST_CASE("the task estimate bounds every schedule and vocabulary mode") {
  const int pp = GENERATE(2, 4);
  const int m = GENERATE(4, 8);
  for (const std::string& schedule : schedule_names())
    for (const std::string& vocab : vocab_mode_names()) {
      Config config = parse_or_fail(kTiny, {fmt::format("parallel.pp={}", pp), fmt::format("parallel.microbatches={}", m)});
      config.schedule.name = schedule;
      config.schedule.vocab = *vocab_mode_named(vocab);
      Result<Plan> plan = make_plan(config);
      if (!plan.ok()) continue;  // this schedule does not take this shape
      CAPTURE(schedule, vocab, pp, m, plan.value().graph.size());
      CHECK(std::int64_t(plan.value().graph.size()) <= *estimated_tasks(config));
    }
}

TEST_CASE("sizes past a limit, or whose products overflow, are refused with the field and the fix") {
  const std::string limit = " (pipesim's limit; docs/config.md says why)";
  // 8 microbatches x (16 layers x b·s·h·(34 + 5·a·s/h) + the head's b·s·(4V + 8h)), b = 1.
  const double s = 4194304, h = 4096, a = 32, V = 250;
  const double kScoresBytes = 8 * (16 * s * h * (34 + 5 * a * s / h) + s * (4 * V + 8 * h));
  using Case = std::pair<std::vector<std::string>, std::string>;
  const Case c = GENERATE_COPY(values<Case>({
      // pp × chunks once wrapped a 32-bit int to 0 (a division by zero); the chunk cap now comes first.
      {{"parallel.chunks=1073741824"},
       "c.json: parallel.chunks (from --set): must be at most 127, got 1073741824" + limit},
      {{"parallel.chunks=100", "schedule.name=interleaved-1f1b"},
       "c.json: model.layers: 16 layers cannot fill 400 virtual stages: interleaved-1f1b runs parallel.chunks = 100 "
       "chunks per device, so pp 4 needs 400; use parallel.chunks of at most 4 or at least 400 layers"},
      {{"parallel.chunks=100"}, "(no error)"},  // 1f1b runs one stage per device, whatever parallel.chunks says
      {{"parallel.pp=2000"}, "c.json: parallel.pp (from --set): must be at most 1024, got 2000" + limit},
      {{"parallel.chunks=128"}, "c.json: parallel.chunks (from --set): must be at most 127, got 128" + limit},
      {{"model.layers=2147483647"}, "c.json: model.layers (from --set): must be at most 4096, got 2147483647" + limit},
      {{"model.hidden=2147483647"}, "c.json: model.hidden (from --set): must be at most 131072, got 2147483647" + limit},
      {{"model.vocab=2147483647"}, "c.json: model.vocab (from --set): must be at most 16777216, got 2147483647" + limit},
      {{"model.seq_len=8388608"}, "c.json: model.seq_len (from --set): must be at most 4194304, got 8388608" + limit},
      {{"model.micro_batch_size=4096", "model.seq_len=4096"},
       "c.json: model.micro_batch_size (from --set): 4096 x seq_len 4096 is 16777216 tokens per microbatch, over "
       "pipesim's limit of 4194304; use a smaller micro_batch_size or seq_len"},
      {{"parallel.microbatches=1000000000"},
       "c.json: parallel.microbatches (from --set): must be at most 1048576, got 1000000000" + limit},
      {{"parallel.tp=2147483647"}, "c.json: parallel.dp: pp 4 x tp 2147483647 x dp 1 x cp 1 is over pipesim's limit "
                                   "of 16777216 GPUs; use a smaller dp, tp or cp"},
      {{"parallel.dp=2147483647", "parallel.tp=2147483647"},
       "c.json: parallel.dp (from --set): pp 4 x tp 2147483647 x dp 2147483647 x cp 1 is over pipesim's limit of "
       "16777216 GPUs; use a smaller dp, tp or cp"},
      {{"parallel.pp=1024", "model.layers=4096", "parallel.microbatches=1048576"},
       // 7 tasks per virtual stage and microbatch, 16 per device for the iteration (baseline vocabulary); 1f1b
       // runs one chunk per device.
       fmt::format("c.json: parallel.microbatches (from --set): pp 1024 x chunks 1 x microbatches 1048576 would build "
                   "about {} tasks, over pipesim's limit of 268435456; use fewer microbatches or pipeline stages",
                   1024 * 1 * 7 * std::int64_t(1048576) + 16 * 1024)},
      // Without flash attention the b·a·s² scores dominate: past 2^56 bytes the sums would overflow.
      {{"model.seq_len=4194304", "model.hidden=4096", "model.heads=32", "precision.flash_attention=false"},
       fmt::format("c.json: parallel.microbatches: the activations of all microbatches would take {:.3g} bytes, over "
                   "pipesim's limit of 7.21e+16; use fewer microbatches or a smaller model",
                   kScoresBytes)},
      {{"schedule.layers_per_stage=[2147483647,2147483647,5,5,0,0,0,0]"},
       "c.json: schedule.layers_per_stage[0] (from --set): must be at most 4096, got 2147483647" + limit},
      {{"model.ffn_hidden=64"}, "(no error)"},
  }));
  CAPTURE(c.first);
  CHECK(error_of(c.first) == c.second);
}

TEST_CASE("a plan that would outgrow the machine's memory is refused before it is built") {
  const Config config = parse_or_fail(kTiny);
  CHECK_FALSE(check_plan_fits(config, Bytes(1) << 30).has_value());
  const std::optional<FieldError> e = check_plan_fits(config, 1000);
  REQUIRE(e.has_value());
  CHECK(e->path == "parallel.microbatches");
  CHECK(e->message ==
        "pp 4 x chunks 2 x microbatches 8 would need about 0.0 GiB to build and simulate, more than this machine's "
        "0.0 GiB; use fewer microbatches or pipeline stages");
}
