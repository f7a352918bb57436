#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <numeric>
#include <utility>

#include "cpu/hash.h"
#include "measure.h"
#include "model_math.h"
#include "op_interpreter.h"
#include "parallel_shape.h"
#include "partition.h"
#include "walker.h"

namespace pipesim::runtime {
namespace {

Batch make_batch(std::uint64_t seed, int step, int microbatch, int n, int vocab) {
  Batch b;
  for (int i = 0; i < n; ++i) {
    const std::uint64_t key = cpu::splitmix64(seed ^ 0x5eedull) + (std::uint64_t(step) << 40) +
                              (std::uint64_t(microbatch) << 20) + std::uint64_t(i);
    const int token = int(cpu::splitmix64(key) % std::uint64_t(vocab));
    b.tokens.push_back(token);
    b.targets.push_back(int((std::int64_t(token) * 31 + 7) % vocab));
  }
  return b;
}

/// A tensor-parallel group as a layer's math sees it: blocking collectives on the group's first lane, held
/// to the run's timeout. Only the rank's compute thread calls it, in the same order on every rank of
/// the group (they run the same ops). The buffers are the backend's (host memory for the CPU's layers,
/// device memory for the CUDA backend's), as is the lane's memory.
class TensorParallelGroup final : public TensorParallel {
 public:
  TensorParallelGroup(std::unique_ptr<Transport> group, bool sequence_parallel, double timeout_s, int device,
                      std::string label)
      : group_(std::move(group)), sequence_parallel_(sequence_parallel), timeout_s_(timeout_s), device_(device),
        label_(std::move(label)) {}
  int rank() const override { return group_->rank(); }
  int size() const override { return group_->size(); }
  bool sequence_parallel() const override { return sequence_parallel_; }
  void all_reduce(Buffer data) override {
    run(Kind::AllReduce, [&] { return group_->lane(0).all_reduce(data, ReduceOp::Sum); });
  }
  void all_gather(Buffer part, Buffer whole) override {
    run(Kind::AllGather, [&] { return group_->lane(0).all_gather(part, whole); });
  }
  void reduce_scatter(Buffer whole, Buffer part) override {
    run(Kind::ReduceScatter, [&] { return group_->lane(0).reduce_scatter(whole, part, ReduceOp::Sum); });
  }

  /// A step begins at `epoch`: the collectives recorded from now on are its.
  void begin_step(Clock::time_point epoch) { epoch_ = epoch, collectives_.clear(); }
  std::vector<InnerCollective> take_collectives() { return std::exchange(collectives_, {}); }
  /// Under RunOptions::ordered_issue: what a collective waits for before it is issued (its turn in
  /// the rank's issue order, StreamWalker::await_issue_turn); empty otherwise.
  void await_turn_with(std::function<void()> await_turn) { await_turn_ = std::move(await_turn); }

 private:
  using Kind = InnerCollective::Kind;
  /// Issues a collective, waits for it, and records when it ran (the trace shows it). A collective
  /// that fails or times out may still be queued, reading and writing the caller's buffers, which go
  /// back to the backend's pool as the exception unwinds the layer: so the run is aborted first
  /// (NCCL: ncclCommAbort, which stops the rank's kernels; in-process: no peer reads a buffer after
  /// the abort), and only then does the exception leave. Under ordered issue it first waits for its
  /// turn, before any of its calls is made.
  template <class Issue>
  void run(Kind kind, Issue&& issue) {
    if (await_turn_) await_turn_();  // before the try: no call of this collective is in flight yet
    const TimeNs start = since_epoch();
    std::unique_ptr<Request> request;
    try {
      request = issue();
      wait_for(*group_, *request, timeout_s_, fmt::format("a tensor-parallel {}", inner_collective_name(kind)));
    } catch (const CommError&) {
      throw;  // another rank aborted the run: no transfer touches the buffers any more
    } catch (const std::exception& e) {
      group_->abort(fmt::format("{} failed: {}", label_, e.what()));
      throw;
    }
    collectives_.push_back({.device = device_, .start = start, .end = since_epoch(), .kind = kind});
  }
  TimeNs since_epoch() const {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - epoch_).count();
  }
  std::unique_ptr<Transport> group_;
  bool sequence_parallel_;
  double timeout_s_;
  int device_;
  std::string label_;  ///< how errors name this rank
  Clock::time_point epoch_ = Clock::now();
  std::vector<InnerCollective> collectives_;  ///< this step's, in the order they ran
  std::function<void()> await_turn_;
};

// An expert-parallel group's exchanges take the graph's ALLTOALL lane (kExpertLane, ir.md), which no
// op the runtime issues otherwise uses. Not lane 0: at ep = dp the expert group has the data-parallel
// group's members, and a transport may give a group of the same members the same lanes (the
// in-process one does), where the DP_ALLREDUCE ops, issued from the communication thread, take
// lane 0 -- two threads' collectives on one lane would match across ranks in whatever order they came.

/// An expert-parallel group as a mixture-of-experts layer sees it (tensor_parallel.h): its variable
/// all-to-all as two of the transport's on kExpertLane, one count per peer and then the rows, so
/// that each rank receives only the blocks addressed to it. The counts go first because a rank
/// knows what it sends each peer but not what each peer sends it, and the rows' exchange needs both.
/// Blocking and held to the run's timeout; a failure aborts the run first, as TensorParallelGroup's
/// do, so that no transfer touches a buffer the unwinding frees.
class ExpertParallelGroup final : public ExpertParallel {
 public:
  ExpertParallelGroup(std::unique_ptr<Transport> group, double timeout_s, std::string label)
      : group_(std::move(group)), timeout_s_(timeout_s), label_(std::move(label)) {}
  int rank() const override { return group_->rank(); }
  int size() const override { return group_->size(); }
  std::vector<float> all_to_all(std::span<const float> send, std::span<const std::size_t> counts,
                                std::vector<std::size_t>& received) override {
    const auto ranks = std::size_t(size());
    if (counts.size() != ranks) throw std::invalid_argument("an all-to-all needs one count per rank of its group");
    if (send.size() != std::accumulate(counts.begin(), counts.end(), std::size_t{0}))
      throw std::invalid_argument("an all-to-all's buffer is not as long as its counts add up to");
    const std::vector<std::size_t> one(ranks, 1);
    std::vector<double> mine(counts.begin(), counts.end()), theirs(ranks);  // exact up to 2^53
    exchange(host_buffer(std::span(mine)), one, host_buffer(std::span(theirs)), one,
             "an expert-parallel all-to-all's counts");
    received.clear();
    for (const double c : theirs) received.push_back(std::size_t(c));
    std::vector<float> out(std::accumulate(received.begin(), received.end(), std::size_t{0}));
    exchange(host_buffer(send), counts, host_buffer(std::span(out)), received, "an expert-parallel all-to-all");
    return out;
  }

 private:
  void exchange(Buffer in, std::span<const std::size_t> send_counts, Buffer out,
                std::span<const std::size_t> recv_counts, const char* what) {
    std::unique_ptr<Request> request;
    try {
      request = group_->lane(kExpertLane).all_to_all(in, send_counts, out, recv_counts);
      wait_for(*group_, *request, timeout_s_, what);
    } catch (const CommError&) {
      throw;  // another rank aborted the run: no transfer touches the buffers any more
    } catch (const std::exception& e) {
      group_->abort(fmt::format("{} failed: {}", label_, e.what()));
      throw;
    }
  }
  std::unique_ptr<Transport> group_;
  double timeout_s_;
  std::string label_;
};

/// How errors name a rank: its number, and where it sits when there is more than a pipeline.
std::string rank_label(const Job& job, int rank) {
  if (job.ranks() == job.layout.devices) return fmt::format("rank {}", rank);
  const RankPlace p = job.place(rank);
  return fmt::format("rank {} (device {}, replica {}, tp rank {})", rank, p.device, p.replica, p.tp_rank);
}

/// The transports of one rank: the world; its pipeline (the ranks of its replica and tensor-parallel
/// rank, by device), which the graph's ops use; its data- and tensor-parallel groups when it has them;
/// the pair of its pipeline's devices that sum a tied embedding's gradient, when it is one of them;
/// under expert parallelism its expert-parallel group and, when more replicas hold its experts, its
/// expert data-parallel group.
struct RankGroups {
  Transport& world;
  std::unique_ptr<Transport> own_pipeline, data, tied, expert_data;
  std::unique_ptr<TensorParallelGroup> tensor;
  std::unique_ptr<ExpertParallelGroup> expert;
  Transport& pipeline() { return own_pipeline ? *own_pipeline : world; }
};

/// Every rank makes its groups in the same order (pipeline, data, tensor, expert, expert data,
/// tied), each waiting only for its members, so that no two ranks wait on each other's next group.
RankGroups make_groups(Transport& world, const Job& job, double timeout_s) {
  RankGroups groups{.world = world, .own_pipeline = nullptr, .data = nullptr, .tied = nullptr, .expert_data = nullptr,
                    .tensor = nullptr, .expert = nullptr};
  const int rank = world.rank();
  if (job.ranks() != job.layout.devices) {  // otherwise the pipeline is the world
    groups.own_pipeline = world.subgroup(job.group_of(rank, &RankPlace::device), GroupUse::Pipeline);
    if (job.dp > 1) groups.data = world.subgroup(job.group_of(rank, &RankPlace::replica), GroupUse::Collectives);
    if (job.tp > 1)
      groups.tensor = std::make_unique<TensorParallelGroup>(
          world.subgroup(job.group_of(rank, &RankPlace::tp_rank), GroupUse::Collectives), job.sequence_parallel,
          timeout_s, job.place(rank).device, rank_label(job, rank));
    if (job.ep > 1)
      groups.expert = std::make_unique<ExpertParallelGroup>(
          world.subgroup(job.expert_group_of(rank, Job::ExpertGroup::Parallel), GroupUse::Collectives), timeout_s,
          rank_label(job, rank));
    // Within a replica its tensor-parallel ranks of one expert rank sum their gradients themselves
    // (cpu::sum_partial_gradients); across replicas, when an expert group spans several, the
    // replicas that hold the same experts do, in this group, and the data-parallel group otherwise.
    if (job.expert_replicas() > 1 && job.dp > job.expert_replicas())
      groups.expert_data =
          world.subgroup(job.expert_group_of(rank, Job::ExpertGroup::DataParallel), GroupUse::Collectives);
  }
  const auto& groups_of_graph = job.graph.groups();
  const bool tie = std::any_of(groups_of_graph.begin(), groups_of_graph.end(),
                               [](const CollectiveGroup& g) { return g.data == CollectiveData::TiedEmbedding; });
  const int first = job.layout.stages.front().device, last = job.layout.stages.back().device, device = job.place(rank).device;
  if (tie && (device == first || device == last)) groups.tied = groups.pipeline().subgroup({first, last}, GroupUse::Collectives);
  return groups;
}

StreamWalker::Names walker_names(const Job& job, int rank) {
  return {.self = rank_label(job, rank), .peer = job.ranks() == job.layout.devices ? "rank" : "device"};
}

/// One rank's run: each step's batches, the walk over its ops, the loss and step time agreed by every
/// rank; then the check and the measurements (rank 0 of each pipeline gathers its pipeline's).
Result<RunResult> run_steps(RankGroups& groups, Backend& backend, const Job& job, const RunOptions& options) {
  Transport& comm = groups.pipeline();
  const int rank = comm.rank();
  const RankPlace place = job.place(groups.world.rank());
  OpInterpreter interpreter(job, place, comm, groups.data.get(), groups.tied.get(), groups.tensor.get(), backend,
                            options.optimizer, groups.expert_data.get());
  StepRecorder recorder(job.graph.size(), interpreter.buffers());
  const auto all_reduce = [&](std::span<float> values, ReduceOp op, const std::string& what) {
    wait_for(groups.world, groups.world.control().all_reduce(host_buffer(values), op), options.timeout_s, what);
  };
  // Every replica holds the same summed gradients, but under ZeRO each only its own part of them;
  // under expert parallelism the first ep ranks of a stage each hold their share of the routed
  // experts (host_gradients leaves out those of a tensor-parallel rank past them).
  const bool checks_gradients = place.replica == 0 || job.sharded();
  const bool checks_experts = place.replica < job.expert_replicas();
  RunResult result;
  try {
    StreamWalker walker(job.graph, rank, walker_names(job, groups.world.rank()), comm, backend, options,
                        groups.tensor != nullptr);
    // Under ordered issue a tensor-parallel collective waits for its compute op's turn, for as long
    // as the walker lives.
    struct Hook {
      TensorParallelGroup* tensor;
      ~Hook() {
        if (tensor) tensor->await_turn_with({});
      }
    } hook{options.ordered_issue ? groups.tensor.get() : nullptr};
    if (hook.tensor) hook.tensor->await_turn_with([&walker] { walker.await_issue_turn(); });
    backend.warm_up();  // a library loading mid-step could wait for the GPU's queue, NCCL's waiting kernels in it
    backend.release_thread();
    for (int step = 0; step < options.steps; ++step) {
      // Replica r takes microbatches r·m .. r·m + m − 1 of the step's global batch.
      std::vector<Batch> batches, global;
      for (int mb = 0; mb < job.microbatches * job.dp; ++mb)
        global.push_back(make_batch(options.seed, step, mb, job.shape.tokens(), job.shape.vocab));
      batches.assign(global.begin() + place.replica * job.microbatches,
                     global.begin() + (place.replica + 1) * job.microbatches);
      const bool checking = options.check && step == 0;
      std::optional<GradientCheck> check;
      if (checking) check.emplace(job.shape, options.seed, global);
      interpreter.begin_step(batches, checking);
      recorder.clear(job.graph.size());
      std::vector<float> token{1.0f};
      all_reduce(token, ReduceOp::Sum, "the start-of-step barrier");
      const Clock::time_point epoch = Clock::now();
      if (groups.tensor) groups.tensor->begin_step(epoch);
      walker.run_step(step, epoch, interpreter, recorder);
      const auto elapsed = std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - epoch).count();
      // Every tensor-parallel rank computes the same loss: one of them counts it.
      std::vector<float> loss{place.tp_rank == 0 ? float(interpreter.loss_part()) : 0.0f}, time{float(elapsed)};
      all_reduce(loss, ReduceOp::Sum, "the loss all-reduce");
      all_reduce(time, ReduceOp::Max, "the step-time all-reduce");
      result.losses.push_back(loss[0]);
      result.step_ns.push_back(TimeNs(time[0]));
      if (checking) {
        std::vector<HostGradient> gradients = interpreter.take_gradients();
        if (!checks_gradients)
          std::erase_if(gradients,
                        [&](const HostGradient& g) { return !checks_experts || !routed_expert_model_tensor(g.tensor); });
        std::vector<float> terms = check->error_terms(gradients);
        all_reduce(terms, ReduceOp::Sum, "the gradient-check all-reduce");
        result.check = check->result(terms, loss[0], options);
      }
      if (groups.world.rank() == 0 && options.on_step) options.on_step(step, loss[0], TimeNs(time[0]));
    }
    recorder.move_into(result);
    if (groups.tensor) result.tensor_parallel = groups.tensor->take_collectives();
    gather_measurements(comm, job.graph, options.timeout_s, interpreter.buffers().peak(), interpreter.buffers().peak_op(),
                        backend.static_bytes(), result);
    return result;
  } catch (const CommError& e) {
    return Error{e.what()};
  } catch (const RankFailure& e) {
    groups.world.abort(e.what());
    return Error{e.what()};
  } catch (const std::exception& e) {  // e.g. out of memory: still end every rank, never hang them
    const std::string why = fmt::format("{} failed: {}", rank_label(job, groups.world.rank()), e.what());
    groups.world.abort(why);
    return Error{why};
  }
}

}  // namespace

std::string_view inner_collective_name(InnerCollective::Kind kind) {
  switch (kind) {
    case InnerCollective::Kind::AllReduce: return "all-reduce";
    case InnerCollective::Kind::AllGather: return "all-gather";
    case InnerCollective::Kind::ReduceScatter: return "reduce-scatter";
  }
  return "?";
}

bool CheckResult::passed() const {
  const bool loss_ok = std::abs(loss - reference_loss) <= loss_tolerance * std::abs(reference_loss);
  return loss_ok && (grad_tolerance == 0 || max_grad_rel_err <= grad_tolerance);
}

Config memory_as_run(const Config& config, const RunOptions& options) {
  Config c = config;
  const bool bf16 = options.dtype == DType::BF16;
  c.precision = {.param_bytes = bf16 ? 6.0 : 4.0,
                 .grad_bytes = 4,
                 .optimizer_bytes = options.optimizer.kind == OptimizerKind::Sgd ? 0.0 : 8.0,
                 .activation_bytes = bf16 ? 2.0 : 4.0,
                 .flash_attention = options.backend == BackendKind::Cuda};
  c.training.zero_stage = std::min(c.training.zero_stage, 1);
  return c;
}

namespace {

/// Mixture-of-experts layers run on the CPU backend (cpu/moe.h), their routed experts whole on one
/// rank or split over ep ranks of a stage (expert parallelism, whose all-to-alls run inside F, B and
/// R), under tensor parallelism with sequence parallelism (each tensor-parallel rank routes its own
/// tokens; the config asks for it, check_experts), each expert whole (etp 1) or split over the
/// tensor-parallel group (etp = tp, whose collectives the expert-tensor-parallel ones then are),
/// dropless, SwiGLU experts. Each refusal names the field.
Status check_experts_runnable(const Config& c, const RunOptions& options) {
  if (!c.model.has_experts()) return Status::Ok();
  const int tp = c.parallel.tp, ep = c.parallel.ep, etp = c.parallel.expert_tp();
  if (etp != 1 && etp != tp)
    return Error{fmt::format("{}: parallel.etp: the runtime splits each expert over the tensor-parallel group or not "
                             "at all, but parallel.etp is {} at parallel.tp {}; set parallel.etp to 1 or to {} "
                             "(simulate models it)",
                             c.source, etp, tp, tp)};
  if (etp == 1 && ep % tp != 0 && tp % ep != 0)
    return Error{fmt::format("{}: parallel.ep: the runtime's expert-parallel groups are tensor-parallel ranks of one "
                             "replica or whole replicas' ranks, but ep {} and tp {} do not divide one another; choose "
                             "an ep that divides or is a multiple of parallel.tp (simulate models it)",
                             c.source, ep, tp)};
  if (c.model.moe_shared_expert_intermediate_size % tp != 0)
    return Error{fmt::format("{}: model.moe_shared_expert_intermediate_size: {} does not split over parallel.tp = {} "
                             "ranks; make it a multiple of {}",
                             c.source, c.model.moe_shared_expert_intermediate_size, tp, tp)};
  if (options.backend == BackendKind::Cuda)
    return Error{fmt::format("{}: model.num_experts: the CUDA backend runs dense layers only; run mixture-of-experts "
                             "layers with --backend cpu, or remove model.num_experts (and the moe_ keys)",
                             c.source)};
  if (c.model.mlp != MlpKind::SwiGlu)
    return Error{fmt::format("{}: model.mlp: the runtime's experts are SwiGLU MLPs (the Llama family); set model.mlp "
                             "to \"swiglu\" to run mixture-of-experts layers",
                             c.source)};
  if (c.model.moe_capacity_factor)
    return Error{fmt::format("{}: model.moe_capacity_factor: the runtime's experts take every token routed to them "
                             "(dropless) and drop none; remove model.moe_capacity_factor to run it (simulate models "
                             "token dropping)",
                             c.source)};
  return Status::Ok();
}

}  // namespace

Status check_runnable(const Config& c, const RunOptions& options) {
  if (c.parallel.tp > 1 && c.parallel.sequence_parallel && (c.model.micro_batch_size * c.model.seq_len) % c.parallel.tp)
    return Error{fmt::format("{}: parallel.sequence_parallel: a microbatch's {} tokens do not split over parallel.tp = {} "
                             "ranks; make model.micro_batch_size × model.seq_len a multiple of {}, or set "
                             "parallel.sequence_parallel to false",
                             c.source, c.model.micro_batch_size * c.model.seq_len, c.parallel.tp, c.parallel.tp)};
  // The config already holds heads to a multiple of tp; a rank takes whole key/value heads too.
  for (const auto& [field, size] : {std::pair{"model.kv_heads", c.model.key_value_heads()}, {"model.ffn_hidden", c.model.ffn_hidden}})
    if (size % c.parallel.tp != 0)
      return Error{fmt::format("{}: {}: {} does not split over parallel.tp = {} ranks; make it a multiple of {}",
                               c.source, field, size, c.parallel.tp, c.parallel.tp)};
  if (c.model.latent_attention() || c.model.head_channels() * c.model.heads != c.model.hidden)
    return Error{fmt::format("{}: {}: the runtime's attention has hidden / heads channels a head; remove it to run (simulate "
                             "models it)",
                             c.source, c.model.latent_attention() ? "model.kv_lora_rank" : "model.head_dim")};
  if (c.parallel.cp != 1)
    return Error{fmt::format("{}: parallel.cp: the runtime runs each stage on one device; set parallel.cp to 1", c.source)};
  if (Status s = check_experts_runnable(c, options); !s.ok()) return s;
  if (c.precision.fp8 != Fp8Format::None)
    return Error{fmt::format("{}: precision.fp8: the runtime computes in fp32 or bf16 (--dtype); remove precision.fp8 "
                             "to run it (simulate models FP8)",
                             c.source)};
  // Selective recomputation rebuilds attention scores, which fused attention never keeps (the graph
  // then has no R) and the runtime's unfused CPU attention always keeps.
  if (c.training.recompute_granularity == Recompute::Selective && !c.precision.flash_attention)
    return Error{fmt::format("{}: training.recompute_granularity: selective recomputation without flash attention "
                             "recomputes attention scores, which the runtime keeps; use \"full\" or \"none\", or set "
                             "precision.flash_attention to true (then selective recomputation has no R op)",
                             c.source)};
  if (c.training.recompute_granularity == Recompute::SelectiveOp)
    return Error{fmt::format("{}: training.recompute_granularity: the runtime recomputes whole layers (\"full\") or "
                             "nothing; use one of them, or \"selective\" (simulate models \"selective_op\")",
                             c.source)};
  if (c.model.tied_embeddings && options.backend == BackendKind::Cuda)
    return Error{fmt::format("{}: model.tied_embeddings: the CUDA backend runs an untied embedding and LM head; run "
                             "tied embeddings with --backend cpu, or set model.tied_embeddings to false",
                             c.source)};
  const bool llama = c.model.mlp == MlpKind::SwiGlu;
  if (llama && (c.model.hidden / c.model.heads) % 2 != 0)
    return Error{fmt::format("{}: model.hidden: rotary embeddings turn pairs of a head's {} dimensions; make "
                             "model.hidden / model.heads even",
                             c.source, c.model.hidden / c.model.heads)};
  // Weights and gradients of every rank plus the activations of every microbatch in flight, fp32.
  const ModelShape s = model_shape(c);
  const double n = double(s.tokens()), h = s.hidden;
  const double qkv = s.qkv_width(), fc1 = s.fc1_width();
  const double params = 2.0 * vocab_params(c.model) + model_layer_params(c.model);  // untied, whole
  // A mixture-of-experts layer keeps, instead of the dense MLP's, the router's probabilities, k
  // routed copies of each token (input, [gate | up], activation, output) and the shared expert's.
  const int moe_layers = moe_layer_count(c.model, 0, s.layers);
  const double dense_mlp = n * (fc1 + s.ffn),
               moe_mlp = n * (double(s.experts) + s.router_topk * (2.0 * h + 3.0 * s.expert_ffn) + 3.0 * s.shared_expert_ffn);
  const double activations = double(c.parallel.microbatches) *
                             (s.layers * (n * (8.0 * h + qkv) + double(s.batch) * s.heads * s.seq * s.seq) +
                              (s.layers - moe_layers) * dense_mlp + moe_layers * moe_mlp);
  const bool cpu_math = options.backend == BackendKind::Cpu || options.check;
  // On a GPU the host holds each rank's fp32 weights and gradients only (to upload, and to check).
  // Every data-parallel replica holds a copy of the pipeline's model (and, for now, every
  // tensor-parallel rank the whole of its activations).
  const double needed = c.parallel.dp * c.parallel.tp * (cpu_math ? 4.0 * (2.0 * params + activations + 2.0 * n * s.vocab * c.parallel.microbatches)
                                                  : 4.0 * 2.0 * params);
  const double available = double(host_memory_bytes());
  if (needed > 0.5 * available && !cpu_math)
    return Error{fmt::format("{}: model: the host would need about {:.1f} GiB for this model's fp32 weights and "
                             "gradients, more than half of this machine's {:.1f} GiB; shrink model.*",
                             c.source, needed / double(1ull << 30), available / double(1ull << 30))};
  if (needed > 0.5 * available)
    return Error{fmt::format("{}: model: the CPU runtime would need about {:.1f} GiB for this model (fp32 weights, "
                             "gradients and activations), more than half of this machine's {:.1f} GiB; shrink model.* "
                             "(configs/tiny.json is sized for it) or parallel.microbatches{}",
                             c.source, needed / double(1ull << 30), available / double(1ull << 30),
                             options.backend == BackendKind::Cuda ? "; or drop --check, whose reference runs on the CPU" : "")};
  return Status::Ok();
}

Result<RunResult> run_rank(Transport& comm, const Job& job, const RunOptions& options, const BackendFactory& backend_for) {
  if (comm.size() != job.ranks())
    return Error{fmt::format("{} ranks cannot run {} pipeline devices × {} tensor-parallel × {} data-parallel ranks",
                             comm.size(), job.layout.devices, job.tp, job.dp)};
  std::optional<RankGroups> groups;
  try {
    groups.emplace(make_groups(comm, job, options.timeout_s));
  } catch (const std::exception& e) {  // an MPI call failed: end every rank
    const std::string why = fmt::format("rank {} could not join its groups: {}", comm.rank(), e.what());
    comm.abort(why);
    return Error{why};
  }
  std::unique_ptr<Backend> backend;
  try {
    backend = backend_for ? backend_for(comm.rank(), groups->tensor.get())
                          : make_backend(options, job, comm.rank(), groups->tensor.get(), groups->expert.get());
  } catch (const std::exception& e) {  // e.g. out of device memory: end every rank, never hang them
    const std::string why = fmt::format("rank {} could not set up its {} backend: {}", comm.rank(),
                                        options.backend == BackendKind::Cuda ? "CUDA" : "CPU", e.what());
    comm.abort(why);
    return Error{why};
  }
  return run_steps(*groups, *backend, job, options);
}

}  // namespace pipesim::runtime
