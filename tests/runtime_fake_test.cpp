// The executor against a backend that computes nothing and records what it is asked to do, as
// ninja's tests drive its builder with a FakeCommandRunner: which layer, head or vocabulary pass
// runs, in which order on which rank, follows from the task graph and the layout alone. Each rank's
// expected calls are derived here op by op from its compute stream, so any schedule, vocabulary mode
// or chunking is checked without any math in the way.
#include <catch2/catch.hpp>
#include <fmt/format.h>

#include <atomic>
#include <cstring>
#include <mutex>
#include <thread>

#include "inprocess_comm.h"
#include "launch.h"
#include "measured.h"
#include "runtime_helpers.h"

using namespace pipesim;
using namespace pipesim::testing::runs;

namespace {

/// The buffers a rank lent to tensor-parallel collectives, and how often one of them went back to the
/// backend while its collective had neither completed nor been ended by an abort: what NCCL would
/// then write into memory the pool has handed to someone else.
struct Lending {
  struct Loan {
    const std::byte* begin;
    std::size_t bytes;
    std::shared_ptr<std::atomic<bool>> settled;  ///< the collective completed
  };
  std::mutex mutex;
  std::vector<Loan> loans;
  runtime::World* world = nullptr;
  std::atomic<int> frees_under_collective = 0;

  std::shared_ptr<std::atomic<bool>> lend(const runtime::Buffer& b) {
    std::lock_guard lock(mutex);
    loans.push_back({static_cast<const std::byte*>(b.data), b.count * runtime::size_of(b.dtype),
                     std::make_shared<std::atomic<bool>>(false)});
    return loans.back().settled;
  }
  void freed(const void* data, std::size_t bytes) {
    const auto* begin = static_cast<const std::byte*>(data);
    std::lock_guard lock(mutex);
    for (const Loan& loan : loans)
      if (!*loan.settled && begin < loan.begin + loan.bytes && loan.begin < begin + bytes && !world->abort_reason())
        ++frees_under_collective;
  }
};

struct FakeActivations final : runtime::Activations {
  Bytes bytes() const override { return 64; }
};

/// What one rank's backend was asked: its compute calls in order (all from the compute thread), and
/// how often the barrier's rounds asked for their terms (from the communication thread).
struct Record {
  std::vector<std::string> calls;
  std::atomic<int> softmax_sums = 0, input_grad_shares = 0, losses = 0;
};

class FakeBackend final : public runtime::Backend {
 public:
  FakeBackend(int tokens, int hidden, Record& record, runtime::TensorParallel* tp = nullptr, Lending* lending = nullptr)
      : n_(std::size_t(tokens)), h_(std::size_t(hidden)), record_(record), tp_(tp), lending_(lending) {}

  std::string_view name() const override { return "fake"; }
  runtime::Tensor allocate(std::size_t count, runtime::DType dtype) override {
    const std::size_t bytes = count * runtime::size_of(dtype);
    void* data = ::operator new(std::max<std::size_t>(bytes, 1));
    std::memset(data, 0, bytes);
    return runtime::Tensor(data, count, dtype, this);
  }
  void free(void* data, std::size_t bytes) noexcept override {
    if (lending_) lending_->freed(data, bytes);
    ::operator delete(data);
  }
  runtime::DType activation_dtype() const override { return runtime::DType::F32; }
  void copy(const runtime::Tensor& src, std::size_t src_at, runtime::Tensor& dst, std::size_t dst_at,
            std::size_t count) override {
    std::memcpy(static_cast<std::byte*>(dst.data()) + dst_at * 4, static_cast<const std::byte*>(src.data()) + src_at * 4,
                count * 4);
  }
  void synchronize() override {}
  void set_batches(std::span<const runtime::Batch>) override {}

  std::size_t layer_activation_count() const override { return n_ * h_; }
  runtime::Tensor embed(int mb) override { return call(fmt::format("embed m{}", mb)); }
  void embed_backward(int mb, const runtime::Tensor&) override { log(fmt::format("embed_backward m{}", mb)); }
  std::unique_ptr<runtime::Activations> layer_forward(int layer, runtime::Tensor&) override {
    log(fmt::format("F L{}", layer));
    if (tp_) {  // as a row-split map sums its partial output: a scratch tensor, back to the pool after
      runtime::Tensor partial = activation();
      tp_->all_reduce(partial.view());
    }
    return std::make_unique<FakeActivations>();
  }
  void layer_backward(int layer, runtime::Activations&, runtime::Tensor&, bool defer) override {
    log(fmt::format("B L{}{}", layer, defer ? " deferred" : ""));
  }
  void layer_weight(int layer, runtime::Activations&) override { log(fmt::format("W L{}", layer)); }
  std::unique_ptr<runtime::Activations> final_norm(runtime::Tensor) override {
    log("final_norm");
    return std::make_unique<FakeActivations>();
  }
  runtime::Tensor final_output(const runtime::Activations&) override { return activation(); }
  runtime::Tensor final_norm_backward(runtime::Activations&, const runtime::Tensor&) override {
    return call("final_norm_backward");
  }
  double head_forward(runtime::Activations&, int mb, float) override {
    log(fmt::format("head m{}", mb));
    return 0;
  }
  runtime::Tensor head_backward(runtime::Activations&) override { return call("head_backward"); }

  runtime::OutputShard output_forward(int mb, const runtime::Tensor&, bool algorithm2) override {
    log(fmt::format("S m{}", mb));
    return {.logits = allocate(n_, runtime::DType::F32), .local = allocate(3 * n_, runtime::DType::F32),
            .terms = algorithm2 ? allocate(2 * n_ * h_, runtime::DType::F32) : runtime::Tensor()};
  }
  runtime::Tensor softmax_sums(const runtime::Tensor&, const runtime::Tensor&) override {
    ++record_.softmax_sums;
    return allocate(2 * n_, runtime::DType::F32);
  }
  double loss_sum(const runtime::Tensor&, const runtime::Tensor&) override {
    ++record_.losses;
    return 0;
  }
  runtime::Tensor input_grad_share(const runtime::Tensor&, const runtime::Tensor&, const runtime::Tensor&,
                                   const runtime::Tensor&, float) override {
    ++record_.input_grad_shares;
    return activation();
  }
  runtime::Tensor output_backward(int mb, const runtime::Tensor&, const runtime::Tensor&, const runtime::Tensor&, float,
                                  bool input_grad) override {
    log(fmt::format("T m{}", mb));
    return input_grad ? activation() : runtime::Tensor();
  }
  std::vector<runtime::Buffer> parameter_buffers(bool) override { return {}; }
  void optimizer_step(const runtime::OptimizerSettings&, int) override { log("optimizer"); }
  std::vector<runtime::HostGradient> gradients() override { return {}; }
  Bytes static_bytes() const override { return 0; }

 private:
  void log(std::string what) { record_.calls.push_back(std::move(what)); }
  runtime::Tensor activation() { return allocate(n_ * h_, runtime::DType::F32); }
  runtime::Tensor call(std::string what) {
    log(std::move(what));
    return activation();
  }

  std::size_t n_, h_;
  Record& record_;
  runtime::TensorParallel* tp_;
  Lending* lending_;
};

/// A request that completes when `inner` does, or (`inner` null) never: a peer that stopped
/// answering. After an abort it throws CommError, as every transport's requests do.
class TrackedRequest final : public runtime::Request {
 public:
  TrackedRequest(std::unique_ptr<runtime::Request> inner, runtime::Transport& transport,
                 std::shared_ptr<std::atomic<bool>> settled)
      : inner_(std::move(inner)), transport_(transport), settled_(std::move(settled)) {}
  bool done() override {
    if (!inner_) {
      if (transport_.aborted()) throw runtime::CommError("the run was aborted");
      return false;
    }
    const bool done = inner_->done();
    if (done) *settled_ = true;
    return done;
  }

 private:
  std::unique_ptr<runtime::Request> inner_;
  runtime::Transport& transport_;
  std::shared_ptr<std::atomic<bool>> settled_;
};

/// A collective lane whose calls lend their buffers to `lending`; with `hang`, they never complete.
class FaultyLane final : public runtime::Communicator {
 public:
  FaultyLane(runtime::Communicator& inner, runtime::Transport& transport, Lending& lending, bool hang)
      : inner_(inner), transport_(transport), lending_(lending), hang_(hang) {}
  std::unique_ptr<runtime::Request> send(runtime::Buffer b, int peer) override { return inner_.send(b, peer); }
  std::unique_ptr<runtime::Request> recv(runtime::Buffer b, int peer) override { return inner_.recv(b, peer); }
  std::unique_ptr<runtime::Request> all_reduce(runtime::Buffer b, runtime::ReduceOp op) override {
    return track(b, [&] { return inner_.all_reduce(b, op); });
  }
  std::unique_ptr<runtime::Request> broadcast(runtime::Buffer b, int root) override {
    return track(b, [&] { return inner_.broadcast(b, root); });
  }
  std::unique_ptr<runtime::Request> reduce(runtime::Buffer b, runtime::ReduceOp op, int root) override {
    return track(b, [&] { return inner_.reduce(b, op, root); });
  }
  std::unique_ptr<runtime::Request> all_gather(runtime::Buffer in, runtime::Buffer out) override {
    lending_.lend(in);
    return track(out, [&] { return inner_.all_gather(in, out); });
  }
  std::unique_ptr<runtime::Request> reduce_scatter(runtime::Buffer in, runtime::Buffer out, runtime::ReduceOp op) override {
    lending_.lend(in);
    return track(out, [&] { return inner_.reduce_scatter(in, out, op); });
  }
  std::unique_ptr<runtime::Request> all_to_all(runtime::Buffer in, std::span<const std::size_t> send_counts,
                                               runtime::Buffer out, std::span<const std::size_t> recv_counts) override {
    lending_.lend(in);
    return track(out, [&] { return inner_.all_to_all(in, send_counts, out, recv_counts); });
  }

 private:
  template <class Issue>
  std::unique_ptr<runtime::Request> track(const runtime::Buffer& b, Issue&& issue) {
    return std::make_unique<TrackedRequest>(hang_ ? nullptr : issue(), transport_, lending_.lend(b));
  }
  runtime::Communicator& inner_;
  runtime::Transport& transport_;
  Lending& lending_;
  bool hang_;
};

/// A rank's in-process transport whose collective groups (tensor parallelism's) go through
/// FaultyLanes: the fault-injecting fake communicator.
class FaultyTransport final : public testing::ForwardingTransport {
 public:
  FaultyTransport(runtime::Transport& inner, Lending& lending, bool hang, bool faulty_lanes = false,
                  std::unique_ptr<runtime::Transport> owned = nullptr)
      : ForwardingTransport(inner, std::move(owned)), lending_(lending), hang_(hang), faulty_lanes_(faulty_lanes) {}
  runtime::Communicator& lane(int lane) override {
    if (!faulty_lanes_ || lane == runtime::kControlLane) return inner().lane(lane);
    auto& slot = lanes_[lane];
    if (!slot) slot = std::make_unique<FaultyLane>(inner().lane(lane), *this, lending_, hang_);
    return *slot;
  }
  std::unique_ptr<runtime::Transport> subgroup(const std::vector<int>& members, runtime::GroupUse use) override {
    std::unique_ptr<runtime::Transport> group = inner().subgroup(members, use);
    runtime::Transport& wrapped = *group;
    return std::make_unique<FaultyTransport>(wrapped, lending_, hang_, use == runtime::GroupUse::Collectives, std::move(group));
  }

 private:
  Lending& lending_;
  bool hang_, faulty_lanes_;
  std::map<int, std::unique_ptr<FaultyLane>> lanes_;
};

/// The backend calls rank `rank`'s compute stream implies, op by op. Under full recomputation, R
/// runs the forward of the layers it recomputes: all of a stage's (uniform), or its first
/// recompute_num_layers (block).
std::vector<std::string> expected_calls(const TaskGraph& graph, const Layout& layout, const TrainingConfig& training,
                                        int rank) {
  std::vector<std::string> calls;
  const int last = layout.stage_count() - 1;
  const bool split_weight = graph.has(OpKind::W);
  for (TaskId id : graph.stream(graph.first_stream(rank))) {
    const Task& t = graph.task(id);
    const int mb = t.microbatch;
    const VirtualStage* stage = t.stage >= 0 ? &layout.stages[std::size_t(t.stage)] : nullptr;
    switch (t.kind) {
      case OpKind::F:
        if (stage->has_embedding) calls.push_back(fmt::format("embed m{}", mb));
        for (int l = stage->first_layer; l < stage->first_layer + stage->layers; ++l) calls.push_back(fmt::format("F L{}", l));
        if (t.stage == last) calls.push_back("final_norm");
        if (stage->has_head) calls.push_back(fmt::format("head m{}", mb));
        break;
      case OpKind::B:
        if (stage->has_head) calls.push_back("head_backward");
        if (t.stage == last) calls.push_back("final_norm_backward");
        for (int l = stage->first_layer + stage->layers - 1; l >= stage->first_layer; --l)
          calls.push_back(fmt::format("B L{}{}", l, split_weight ? " deferred" : ""));
        if (stage->has_embedding) calls.push_back(fmt::format("embed_backward m{}", mb));
        break;
      case OpKind::W:
        for (int l = stage->first_layer; l < stage->first_layer + stage->layers; ++l) calls.push_back(fmt::format("W L{}", l));
        break;
      case OpKind::R: {
        const int recomputed = training.recompute_method == RecomputeMethod::Block
                                   ? std::min(training.recompute_num_layers, stage->layers)
                                   : stage->layers;
        for (int l = stage->first_layer; l < stage->first_layer + recomputed; ++l) calls.push_back(fmt::format("F L{}", l));
        break;
      }
      case OpKind::S: calls.push_back(fmt::format("S m{}", mb)); break;
      case OpKind::T: calls.push_back(fmt::format("T m{}", mb)); break;
      case OpKind::IF: calls.push_back(fmt::format("embed m{}", mb)); break;
      case OpKind::IB: calls.push_back(fmt::format("embed_backward m{}", mb)); break;
      case OpKind::Optimizer: calls.push_back("optimizer"); break;
      default: FAIL("not a compute op: " << graph.describe(id));
    }
  }
  return calls;
}

}  // namespace

TEST_CASE("the executor asks the backend for each op's layers, in the graph's order, on the op's rank") {
  const Config config = tiny_config(GENERATE(std::vector<std::string>{},
                                             std::vector<std::string>{"training.recompute_granularity=full"},
                                             std::vector<std::string>{"training.recompute_granularity=full",
                                                                      "training.recompute_method=block"}));
  for (const char* schedule : {"1f1b", "zb-h1", "interleaved-1f1b", "zb-v"})
    for (const std::string& vocab : vocab_mode_names()) {
      const Plan plan = plan_for(config, schedule, vocab);
      const runtime::Job job = job_of(plan);
      std::vector<Record> records(std::size_t(plan.layout.devices));
      const auto fake = [&](int rank, runtime::TensorParallel*) {
        return std::make_unique<FakeBackend>(job.shape.tokens(), job.shape.hidden, records[std::size_t(rank)]);
      };
      Result<runtime::RunResult> run = runtime::run_in_process(job, options(), fake);
      INFO(schedule << " / " << vocab << (run.ok() ? "" : ": " + run.error().message));
      REQUIRE(run.ok());
      const bool vocab_parallel = plan.layout.vocab != VocabPlacement::OnStages;
      for (int rank = 0; rank < plan.layout.devices; ++rank) {
        const Record& r = records[std::size_t(rank)];
        INFO("rank " << rank);
        CHECK(r.calls == expected_calls(plan.graph, plan.layout, plan.config.training, rank));
        // Barrier C0's rounds on every rank, once per microbatch: the sum round's terms, then with
        // Algorithm 2 its dX share; the loss on the last stage's rank.
        const int mbs = job.microbatches;
        CHECK(r.softmax_sums == (vocab_parallel ? mbs : 0));
        CHECK(r.input_grad_shares == (plan.layout.vocab == VocabPlacement::Vocab2 ? mbs : 0));
        CHECK(r.losses == (vocab_parallel && rank == plan.layout.stages.back().device ? mbs : 0));
      }
    }
}

TEST_CASE("a step's op times and memory come back from every rank") {
  const Plan plan = plan_for(tiny_config(), "1f1b", "vocab-1");
  const runtime::Job job = job_of(plan);
  std::vector<Record> records(std::size_t(plan.layout.devices));
  const auto fake = [&](int rank, runtime::TensorParallel*) {
    return std::make_unique<FakeBackend>(job.shape.tokens(), job.shape.hidden, records[std::size_t(rank)]);
  };
  Result<runtime::RunResult> run = runtime::run_in_process(job, options(2), fake);
  REQUIRE(run.ok());
  const runtime::RunResult& result = run.value();
  CHECK(result.losses.size() == 2);
  REQUIRE(result.timeline.end.size() == plan.graph.size());
  for (TaskId id = 0; id < TaskId(plan.graph.size()); ++id) {
    INFO(plan.graph.describe(id));
    CHECK(result.timeline.end[std::size_t(id)] >= result.timeline.start[std::size_t(id)]);
    CHECK(result.timeline.end[std::size_t(id)] > 0);
  }
  // Every rank holds a stage's cache (its layers' 64 bytes each) at some point.
  for (int rank = 0; rank < plan.layout.devices; ++rank) CHECK(result.peak_activation_bytes[std::size_t(rank)] >= 64);
}

TEST_CASE("a tensor-parallel collective that times out is ended before its buffers go back to the backend") {
  // Rank 1's tensor-parallel collectives never complete (a peer that stopped answering); rank 0's
  // wait on rank 1's. Both time out inside a layer, whose scratch tensor then goes back to the
  // backend: only after the run was aborted, which ends every transfer that could touch it.
  // No pipeline peer to time out first; no sequence parallelism, whose split the fake backend does not make.
  const Plan plan =
      plan_for(tiny_config({"parallel.tp=2", "parallel.pp=1", "parallel.sequence_parallel=false"}), "1f1b", "baseline");
  const runtime::Job job = job_of(plan);
  REQUIRE(job.ranks() == 2 * plan.layout.devices);
  Lending lending;
  runtime::World world(job.ranks());
  lending.world = &world;
  std::vector<Record> records(std::size_t(job.ranks()));
  std::vector<std::optional<Result<runtime::RunResult>>> results(std::size_t(job.ranks()));
  {
    std::vector<std::jthread> threads;
    for (int r = 0; r < job.ranks(); ++r)
      threads.emplace_back([&, r] {
        FaultyTransport transport(world.rank(r), lending, /*hang=*/job.place(r).tp_rank == 1);
        const auto fake = [&](int rank, runtime::TensorParallel* tp) {
          return std::make_unique<FakeBackend>(job.shape.tokens(), job.shape.hidden, records[std::size_t(rank)], tp,
                                               &lending);
        };
        results[std::size_t(r)] = runtime::run_rank(transport, job, options(1, 0.3), fake);
      });
  }
  for (const auto& result : results) CHECK_FALSE(result->ok());
  const std::optional<std::string> why = world.abort_reason();
  REQUIRE(why);
  CHECK_THAT(*why, Catch::Matchers::Contains("no progress for 0.3 s waiting for a tensor-parallel"));
  CHECK(lending.loans.size() >= 2);
  CHECK(lending.frees_under_collective == 0);
}
