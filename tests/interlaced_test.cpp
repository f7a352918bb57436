// Interlaced as its reference implementation runs it (sail-sg/VocabularyParallelism): on 1F1B every
// device steps through the output layer in lockstep, one forward, one backward and one output-layer
// step per iteration, with floor(1.5p) - i forwards before device i's first backward. Checked on
// the paper's 1F1B setups against its reported range, and on explicit costs for the structure.
#include "config_files.h"
#include "helpers.h"

using namespace pipesim;
using namespace pipesim::testing;

namespace {

Simulated simulate_paper(const std::string& setup, int vocab_size, const std::string& vocab) {
  const char* root = std::getenv("PIPESIM_SOURCE");
  Result<Config> c = load_config(std::string(root ? root : ".") + "/configs/paper/" + setup + ".json",
                                 {fmt::format("model.vocab={}", vocab_size), "schedule.vocab=" + vocab});
  if (!c.ok()) FAIL(c.error().message);
  return simulate_or_fail(c.value());
}

}  // namespace

TEST_CASE("interlaced on the paper's 1F1B setups: within 8% below and 6% above vocab-1's throughput") {
  const std::string setup = GENERATE("1f1b-8gpu-seq2048", "1f1b-8gpu-seq4096", "1f1b-16gpu-seq2048",
                                     "1f1b-16gpu-seq4096", "1f1b-32gpu-seq2048", "1f1b-32gpu-seq4096");
  const int vocab_size = GENERATE(32000, 64000, 128000, 256000);
  CAPTURE(setup, vocab_size);
  const Simulated interlaced = simulate_paper(setup, vocab_size, "interlaced");
  const Simulated vocab1 = simulate_paper(setup, vocab_size, "vocab-1");
  // Throughput ratio = inverse ratio of iteration times (same tokens per iteration).
  const double ratio = double(vocab1.metrics.iteration_ns) / double(interlaced.metrics.iteration_ns);
  // The paper measures 0.92 to 1.02. vocab-1's collectives stay resident beside its layers and hold
  // hardware.comm_sms SMs from them; interlaced's run between its passes. In the authors' pass times
  // interlaced's layers still run up to 3% (F) and 2-6% (B) slower than the baseline's, which
  // pipesim does not charge (docs/vocabulary-parallelism.md), so it puts interlaced 3-6% above
  // vocab-1 where the paper has it 2% above to 8% below.
  CHECK(ratio >= 0.92);
  CHECK(ratio <= 1.06);
}

TEST_CASE("interlaced on 1F1B: one F, one B and one S+T per iteration, odd devices backward first") {
  const int p = GENERATE(2, 3, 4, 8);
  const int m = 3 * p;
  CAPTURE(p);
  Config c = parse_or_fail(explicit_json(p, m, 1, 1, 2));
  c.schedule.vocab = VocabMode::Interlaced;
  const Plan plan = plan_or_fail(c);
  for (int d = 0; d < p; ++d) {
    std::vector<OpKind> kinds;  // the device's compute ops and passes, in program order
    for (TaskId id : plan.graph.stream_order(d, Stream::Compute))
      if (const OpKind k = plan.graph.task(id).kind; k == OpKind::F || k == OpKind::B || k == OpKind::S) kinds.push_back(k);
    // Between two output-layer steps in the steady state, exactly one forward and one backward.
    int forwards = 0, backwards = 0, steps = 0;
    bool steady = false;
    for (std::size_t i = 0; i < kinds.size(); ++i) {
      if (kinds[i] != OpKind::S) {
        (kinds[i] == OpKind::F ? forwards : backwards)++;
        continue;
      }
      if (steady && forwards > 0 && backwards > 0) {
        CHECK(forwards == 1);
        CHECK(backwards == 1);
        CHECK(kinds[i - 2] == (d % 2 == 1 ? OpKind::B : OpKind::F));  // parity order
        ++steps;
      }
      steady |= backwards > 0;
      forwards = backwards = 0;
    }
    CHECK(steps > 0);
  }
}
