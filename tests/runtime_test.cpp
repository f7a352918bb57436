// The CPU runtime executes the simulator's task graphs with real math: every schedule with every
// vocabulary mode reproduces the single-device loss and gradients, and a failing or hung rank ends
// the run with an error that names it.
#include <catch2/catch.hpp>
#include <fmt/format.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "chrome_trace.h"
#include "helpers.h"
#include "config_json.h"
#include "cost_model.h"
#include "launch.h"
#include "partition.h"
#include "measured.h"
#include "plan.h"
#include "runtime_helpers.h"

using namespace pipesim;
using namespace pipesim::testing::runs;

namespace {

/// Runs one checked step of `config` under every schedule and vocabulary mode: each must match the
/// single-device reference to fp32 rounding.
void check_every_schedule_and_vocabulary_mode(const Config& config) {
  for (const std::string& schedule : schedule_names())
    for (const std::string& vocab : vocab_mode_names()) {
      const Plan plan = plan_for(config, schedule, vocab);
      runtime::RunOptions o = options();
      o.check = true;
      Result<runtime::RunResult> run = runtime::run_in_process(job_of(plan), o);
      INFO(schedule << " / " << vocab << (run.ok() ? "" : ": " + run.error().message));
      REQUIRE(run.ok());
      const runtime::CheckResult& check = *run.value().check;
      INFO("loss " << check.loss << " reference " << check.reference_loss << ", gradient error "
                   << check.max_grad_rel_err << " in " << check.worst_tensor);
      CHECK(std::abs(check.loss - check.reference_loss) <= 1e-5 * std::abs(check.reference_loss));
      CHECK(check.max_grad_rel_err <= 1e-4);
      CHECK(check.passed());
      // log(V): the model starts near uniform, so a wrong loss cannot pass by being small.
      CHECK(check.reference_loss == Approx(std::log(double(config.model.vocab))).epsilon(0.05));
    }
}

}  // namespace

TEST_CASE("every schedule and vocabulary mode trains like a single device") {
  check_every_schedule_and_vocabulary_mode(tiny_config());
}

TEST_CASE("a Llama-family model (RMSNorm, RoPE, SwiGLU, grouped-query attention) trains like a single device "
          "under every schedule and vocabulary mode") {
  const Config config = testing::shipped_config("llama-tiny.json");
  REQUIRE(config.model.mlp == MlpKind::SwiGlu);
  REQUIRE(config.model.key_value_heads() < config.model.heads);
  check_every_schedule_and_vocabulary_mode(config);
}

TEST_CASE("tied embeddings: one matrix where a device holds both uses, a copy on each of two whose gradients are summed") {
  const auto run = [](const std::string& schedule, const std::string& vocab, bool tied) {
    const Plan plan = plan_for(testing::shipped_config("llama-tiny.json", {fmt::format("model.tied_embeddings={}", tied)}),
                               schedule, vocab);
    runtime::RunOptions o = options();
    o.check = true;
    const Status runnable = runtime::check_runnable(plan.config, o);
    INFO(schedule << " / " << vocab << (runnable.ok() ? "" : ": " + runnable.error().message));
    REQUIRE(runnable.ok());
    Result<runtime::RunResult> result = runtime::run_in_process(job_of(plan), o);
    REQUIRE(result.ok());
    return std::pair{plan.graph, std::move(result).value()};
  };
  // llama-tiny: V = 250 rows of h = 32 over 4 devices; fp32 weights, gradients and Adam's two
  // moments, 16 bytes a parameter.
  const double h = 32, per_parameter = 16;
  for (const auto& [schedule, vocab] : {std::pair{"1f1b", "vocab-1"}, {"zb-v", "vocab-2"}, {"1f1b", "interlaced"},
                                        {"zb-v", "baseline"}, {"v-half", "baseline"}, {"1f1b", "baseline"},
                                        {"interleaved-1f1b", "redistribute"}}) {
    const auto [graph, tied] = run(schedule, vocab, true);
    const runtime::RunResult untied = run(schedule, vocab, false).second;
    INFO(schedule << " / " << vocab << ": loss " << tied.check->loss << " reference " << tied.check->reference_loss
                  << ", gradient error " << tied.check->max_grad_rel_err << " in " << tied.check->worst_tensor);
    CHECK(tied.check->passed());
    CHECK(tied.check->max_grad_rel_err <= 1e-4);
    CHECK(tied.check->reference_loss != Approx(untied.check->reference_loss).epsilon(1e-6));  // another model
    // V placement and the vocabulary-parallel modes put both uses on one device; 1F1B's first and
    // last stage are two, which sum the gradient of their copies: one all-reduce member each.
    const bool apart = vocab == std::string("baseline") || vocab == std::string("redistribute") ? schedule[0] != 'z' && schedule[0] != 'v' : false;
    std::size_t ties = 0;
    for (TaskId id = 0; id < TaskId(graph.size()); ++id)
      ties += graph.task(id).group >= 0 && graph.group_of(id).data == CollectiveData::TiedEmbedding;
    CHECK(ties == (apart ? 2u : 0u));
    // What the tie saves on each device: its vocabulary shard's rows (V' = 252 padded, 63 a device,
    // the last 61), or under V placement the whole head on device 0; nothing where each holds a copy.
    for (int d = 0; d < 4; ++d) {
      const bool on_stages = vocab == std::string("baseline") || vocab == std::string("redistribute");
      const double rows = !on_stages ? (d == 3 ? 61 : 63) : !apart && d == 0 ? 250 : 0;
      CHECK(double(untied.static_bytes[std::size_t(d)] - tied.static_bytes[std::size_t(d)]) == rows * h * per_parameter);
    }
  }
}

TEST_CASE("full recomputation: F keeps only the inputs, R rebuilds the activations, the gradients stay exact") {
  const std::vector<std::string> none{"training.recompute_granularity=none"};
  const auto peak = [](const runtime::RunResult& r) {
    return *std::max_element(r.peak_activation_bytes.begin(), r.peak_activation_bytes.end());
  };
  const Plan baseline_plan = plan_for(tiny_config(none), "1f1b", "vocab-1");
  Result<runtime::RunResult> without = runtime::run_in_process(job_of(baseline_plan), options());
  REQUIRE(without.ok());
  for (const std::vector<std::string>& set :
       {std::vector<std::string>{"training.recompute_granularity=full", "training.recompute_num_layers=1"},
        {"training.recompute_granularity=full", "training.recompute_num_layers=2"},
        {"training.recompute_granularity=full", "training.recompute_method=block", "training.recompute_num_layers=1"}})
    for (const std::string& schedule : schedule_names())
      for (const std::string& vocab : vocab_mode_names()) {
        const Plan plan = plan_for(tiny_config(set), schedule, vocab);
        REQUIRE(plan.graph.has(OpKind::R));
        runtime::RunOptions o = options();
        o.check = true;
        Result<runtime::RunResult> run = runtime::run_in_process(job_of(plan), o);
        INFO(fmt::format("{} / {} / {}", fmt::join(set, " "), schedule, vocab) << (run.ok() ? "" : ": " + run.error().message));
        REQUIRE(run.ok());
        const runtime::CheckResult& check = *run.value().check;
        CHECK(std::abs(check.loss - check.reference_loss) <= 1e-5 * std::abs(check.reference_loss));
        CHECK(check.max_grad_rel_err <= 1e-4);
        // Fewer activations held: only layer inputs wait between F and R.
        if (schedule == "1f1b" && vocab == "vocab-1") CHECK(peak(run.value()) < peak(without.value()));
      }
}

TEST_CASE("a check passes only within its bounds, and never on NaN") {
  runtime::CheckResult c{.loss = 2.0, .reference_loss = 2.0, .max_grad_rel_err = 0, .worst_tensor = "head",
                         .loss_tolerance = 1e-5, .grad_tolerance = 1e-4};
  CHECK(c.passed());
  c.loss = 2.0 * (1 + 2e-5);  // twice the loss bound off
  CHECK_FALSE(c.passed());
  c.loss = 2.0, c.max_grad_rel_err = 2e-4;
  CHECK_FALSE(c.passed());
  c.max_grad_rel_err = std::nan("");
  CHECK_FALSE(c.passed());
  c.grad_tolerance = 0;  // bf16: the loss alone is held to its bound
  CHECK(c.passed());
  c.loss = std::nan("");
  CHECK_FALSE(c.passed());
}

TEST_CASE("training steps lower the loss") {
  const Plan plan = plan_for(tiny_config(), "1f1b", "vocab-2");
  runtime::RunOptions o = options(3);
  o.optimizer = {.kind = runtime::OptimizerKind::Sgd, .learning_rate = 0.5f};
  Result<runtime::RunResult> run = runtime::run_in_process(job_of(plan), o);
  REQUIRE(run.ok());
  const std::vector<double>& losses = run.value().losses;
  REQUIRE(losses.size() == 3);
  CHECK(losses[2] < losses[0]);  // SGD on a learnable token map lowers the loss
}

TEST_CASE("Adam, the default optimizer, lowers the loss and keeps two moments per parameter") {
  const Plan plan = plan_for(tiny_config(), "1f1b", "vocab-1");
  Result<runtime::RunResult> adam = runtime::run_in_process(job_of(plan), options(3));
  REQUIRE(adam.ok());
  CHECK(adam.value().losses[2] < adam.value().losses[0]);
  runtime::RunOptions o = options(1);
  o.optimizer.kind = runtime::OptimizerKind::Sgd;
  Result<runtime::RunResult> sgd = runtime::run_in_process(job_of(plan), o);
  REQUIRE(sgd.ok());
  // fp32 weights and gradients (8 bytes a parameter), plus Adam's two moments (8 more).
  for (int rank = 0; rank < plan.layout.devices; ++rank)
    CHECK(adam.value().static_bytes[std::size_t(rank)] == 2 * sgd.value().static_bytes[std::size_t(rank)]);
}

TEST_CASE("an Adam step is the published update, bias-corrected, step by step") {
  const Plan plan = plan_for(tiny_config(), "1f1b", "baseline");
  runtime::RankModel model = runtime::make_rank_model(runtime::model_shape(plan.config), plan.layout,
                                                      {.device = 0, .tp_rank = 0, .tp = 1, .owned = {}}, 7);
  const runtime::OptimizerSettings adam{.kind = runtime::OptimizerKind::Adam, .learning_rate = 0.01f};
  std::vector<float>& w = model.params.embedding;
  std::vector<float>& g = model.grads.embedding;
  REQUIRE(w.size() > 3);
  const double w0 = w[3], g1 = 0.5, g2 = -0.25;
  g[3] = float(g1);
  model.optimizer_step(adam, 1);
  // Step 1: m = (1 − β1)·g, v = (1 − β2)·g², so m̂ = g and v̂ = g²: the step is lr·g/(|g| + ε).
  const double w1 = w0 - 0.01 * g1 / (std::abs(g1) + 1e-8);
  CHECK(w[3] == Approx(w1).epsilon(1e-6));
  CHECK(g[3] == 0.0f);
  g[3] = float(g2);
  model.optimizer_step(adam, 2);
  const double m = 0.9 * 0.1 * g1 + 0.1 * g2, v = 0.999 * 0.001 * g1 * g1 + 0.001 * g2 * g2;
  const double m_hat = m / (1 - 0.9 * 0.9), v_hat = v / (1 - 0.999 * 0.999);
  CHECK(w[3] == Approx(w1 - 0.01 * m_hat / (std::sqrt(v_hat) + 1e-8)).epsilon(1e-6));
  // Elements whose gradient stayed 0 do not move.
  const float untouched = w[4];
  model.optimizer_step(adam, 3);
  CHECK(w[4] == untouched);
}

TEST_CASE("measurements cover every op of the last step") {
  const Plan plan = plan_for(tiny_config(), "zb-h1", "vocab-1");
  Result<runtime::RunResult> run = runtime::run_in_process(job_of(plan), options(2));
  REQUIRE(run.ok());
  const runtime::RunResult& r = run.value();
  for (TaskId id = 0; id < TaskId(plan.graph.size()); ++id) {
    INFO(plan.graph.describe(id));
    CHECK(r.timeline.end[std::size_t(id)] >= r.timeline.start[std::size_t(id)]);
    for (TaskId dep : plan.graph.deps(id)) CHECK(r.timeline.start[std::size_t(id)] >= r.timeline.end[std::size_t(dep)]);
  }
  for (int d = 0; d < plan.layout.devices; ++d) {
    CHECK(r.peak_activation_bytes[std::size_t(d)] > 0);
    CHECK(r.static_bytes[std::size_t(d)] > 0);
  }
  // The measured trace's memory counter peaks where the run says its memory peaked.
  const nlohmann::json trace = nlohmann::json::parse(chrome_trace(plan.graph, r.timeline, r.static_bytes, "t", r.live_after));
  std::vector<Bytes> highest(std::size_t(plan.layout.devices), 0);
  for (const auto& e : trace["traceEvents"])
    if (e["ph"] == "C") highest[e["pid"].get<std::size_t>()] = std::max(highest[e["pid"].get<std::size_t>()], e["args"]["bytes"].get<Bytes>());
  for (int d = 0; d < plan.layout.devices; ++d)
    CHECK(highest[std::size_t(d)] == r.static_bytes[std::size_t(d)] + r.peak_activation_bytes[std::size_t(d)]);
}

TEST_CASE("the embedding and LM-head parts of an op are the last step's, as its time is") {
  // The profile subtracts them from the op's time and gives them to the vocabulary layers: parts
  // summed over every step would make the head's cost the steps' sum and the layers' cost less.
  const Plan plan = plan_for(tiny_config(), "zb-h1", "baseline");
  Result<runtime::RunResult> run = runtime::run_in_process(job_of(plan), options(3));
  REQUIRE(run.ok());
  const runtime::RunResult& r = run.value();
  int with_parts = 0;
  for (TaskId id = 0; id < TaskId(plan.graph.size()); ++id) {
    INFO(plan.graph.describe(id));
    CHECK(r.vocab_layer_ns[std::size_t(id)] <= r.timeline.end[std::size_t(id)] - r.timeline.start[std::size_t(id)]);
    with_parts += r.vocab_layer_ns[std::size_t(id)] > 0;
  }
  CHECK(with_parts == 4 * plan.config.parallel.microbatches);  // F and B of the first and the last stage
}

TEST_CASE("a profile of ZB-V's 2p half stages gives ZB-H1's p stages their measured costs") {
  // Made-up op times of known parts: per layer and device, plus baseline's embedding and LM head,
  // which ZB-V holds both on device 0 and ZB-H1 on devices 0 and p - 1. The profile of the ZB-V run
  // must give every ZB-H1 stage exactly its layers' time on its device plus its vocabulary parts.
  const Config config = tiny_config();  // 8 layers on p = 4: ZB-V's stages hold 1, ZB-H1's 2
  const Plan v = plan_for(config, "zb-v", "baseline");
  const Plan h1 = plan_for(config, "zb-h1", "baseline");
  REQUIRE(v.layout.stages.size() == 2 * h1.layout.stages.size());
  const auto layer_ms = [](OpKind kind, int device) {
    return (kind == OpKind::F ? 1.0 : kind == OpKind::B ? 2.0 : 0.75) * (1 + 0.25 * device);
  };
  const double head_f = 3, head_b = 4, embed_f = 0.2, embed_b = 0.3;
  const auto vocab_ms = [&](OpKind kind, const VirtualStage& stage) {
    if (kind == OpKind::W) return 0.0;  // the head's weight gradient is taken in its B
    return (stage.has_head ? (kind == OpKind::F ? head_f : head_b) : 0) +
           (stage.has_embedding ? (kind == OpKind::F ? embed_f : embed_b) : 0);
  };
  runtime::RunResult r;
  r.timeline.start.assign(v.graph.size(), 0), r.timeline.end.assign(v.graph.size(), 1000);
  r.vocab_layer_ns.assign(v.graph.size(), 0);
  for (TaskId id = 0; id < TaskId(v.graph.size()); ++id) {
    const Task& t = v.graph.task(id);
    if (t.kind != OpKind::F && t.kind != OpKind::B && t.kind != OpKind::W) continue;
    const VirtualStage& stage = v.layout.stages[std::size_t(t.stage)];
    r.vocab_layer_ns[std::size_t(id)] = ns_from_ms(vocab_ms(t.kind, stage));
    r.timeline.end[std::size_t(id)] = ns_from_ms(stage.layers * layer_ms(t.kind, t.device) + vocab_ms(t.kind, stage));
  }
  const nlohmann::ordered_json profile = measured_profile(v, r);
  Result<Config> profiled = apply_profile(h1.config, profile.dump(), "zb-v.json");
  REQUIRE(profiled.ok());
  const std::unique_ptr<CostModel> costs = make_cost_model(profiled.value(), h1.layout);
  for (std::size_t s = 0; s < h1.layout.stages.size(); ++s) {
    const VirtualStage& stage = h1.layout.stages[s];
    const StageTimes& got = costs->stage(int(s));
    INFO("ZB-H1 stage " << s);
    // Within rounding: op times are whole nanoseconds, doubled from ZB-V's half stages, rounded again.
    const std::pair<OpKind, TimeNs> times[] = {{OpKind::F, got.forward}, {OpKind::B, got.backward}, {OpKind::W, got.weight}};
    for (const auto& [kind, time] : times) {
      INFO(op_kind_name(kind));
      CHECK(std::abs(double(time) - 1e6 * (stage.layers * layer_ms(kind, stage.device) + vocab_ms(kind, stage))) <= 2);
    }
  }
}

TEST_CASE("a failing rank ends every rank with an error naming it") {
  const Plan plan = plan_for(tiny_config(), "1f1b", "vocab-1");
  const runtime::InjectedFault fault{.rank = 1, .kind = OpKind::B, .microbatch = 2, .hang = false};
  runtime::RunOptions o = options(1, 10);
  o.fault = fault;
  Result<runtime::RunResult> run = runtime::run_in_process(job_of(plan), o);
  REQUIRE_FALSE(run.ok());
  INFO(run.error().message);
  CHECK(run.error().message.starts_with("rank 1 failed at B(d1,s1,m2): injected fault\n"));
  for (int rank : {0, 2, 3}) CHECK_THAT(run.error().message, Catch::Contains(fmt::format("rank {} stopped waiting on ", rank)));
}

TEST_CASE("a hung rank ends the run after the timeout, naming what the others wait for") {
  const Plan plan = plan_for(tiny_config(), "1f1b", "baseline");
  const runtime::InjectedFault fault{.rank = 2, .kind = OpKind::F, .microbatch = 1, .hang = true};
  const auto start = std::chrono::steady_clock::now();
  runtime::RunOptions o = options(1, 0.5);
  o.fault = fault;
  Result<runtime::RunResult> run = runtime::run_in_process(job_of(plan), o);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  REQUIRE_FALSE(run.ok());
  INFO(run.error().message);
  CHECK(seconds < 5);
  CHECK_THAT(run.error().message, Catch::StartsWith("rank ") && Catch::Contains(": no progress for 0.5 s; waiting on "));
  // Whichever rank's watchdog fires first ends the run; the hung rank is named either way: by its own
  // watchdog (its compute stream stuck) or, once the run is ended around it, as hung at the op.
  CHECK_THAT(run.error().message, Catch::Contains("its own F(d2,s2,m1) (started, not finished)") ||
                                      Catch::Contains("rank 2 hung at F(d2,s2,m1) (injected fault)"));
  CHECK_THAT(run.error().message, Catch::Contains("(rank 2)"));
}

TEST_CASE("measured in-flight activations on 1F1B's first device: p, p + 2 (vocab-1), p + 1 (vocab-2) microbatches") {
  // Baseline holds p microbatches' stage caches on device 0 (1F1B's warm-up); the paper's Algorithms 1
  // and 2 hold p + 2 and p + 1. Measured in units of baseline's peak / p; the vocabulary buffers (X,
  // a logits shard, softmax statistics) add less than one microbatch's caches at this size.
  const Config config = tiny_config();
  const int p = config.parallel.pp;
  const auto peak = [&](const std::string& vocab) {
    const Plan plan = plan_for(config, "1f1b", vocab);
    Result<runtime::RunResult> run = runtime::run_in_process(job_of(plan), options());
    REQUIRE(run.ok());
    return double(run.value().peak_activation_bytes[0]);
  };
  const double microbatch = peak("baseline") / p;
  CHECK(int(peak("vocab-1") / microbatch) == p + 2);
  CHECK(int(peak("vocab-2") / microbatch) == p + 1);
}
