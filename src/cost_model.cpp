#include "cost_model.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <utility>

#include "kernels.h"
#include "model_math.h"
#include "two_threads.h"

namespace pipesim {
namespace {

/// The analytic model's times for one config: a stage's passes (its kernels at the roofline, with
/// the tensor- and context-parallel communication they leave exposed) and the links' α-β transfers.
/// The cost model asks it of every stage; the auto layer split of single probe stages.
class AnalyticTimes {
 public:
  explicit AnalyticTimes(const Config& config) : c_(config) {}
  const Config& config() const { return c_; }

  StageTimes stage(const VirtualStage& stage) const {
    const StageKernels kernels = stage_kernels(c_, stage);
    // Saturating sums: a speed near zero makes a duration unrepresentable, never a wrapped one.
    const TimeNs recompute = add_ns(pass(kernels.recompute, kernels.tp_allreduces_recompute, 1),
                                    times_ns(kernels.expert_exchanges_recompute, expert_exchange(true)));
    return {pass(kernels.forward, kernels.tp_allreduces_forward, 1),
            add_ns(recompute, pass(kernels.backward, kernels.tp_allreduces_backward, 2)), compute(kernel_seconds_of(kernels.weight)),
            recompute, times_ns(kernels.expert_exchanges, expert_exchange(true)),
            times_ns(kernels.expert_exchanges, expert_exchange(false))};
  }
  /// One MoE layer's token exchange in one pass: a dispatch and a combine all-to-all over the ep ranks
  /// of its expert group (F; B carries their gradients back the other way), each carrying the
  /// rank's routed copies (expert_traffic), and under etp > 1 an all-gather (dispatch) and a
  /// reduce-scatter (combine) of them over the etp ranks. NVLink carries the bytes that stay in the
  /// node and the GPU's own network port the rest, at the same time (docs/cost-model.md, "Mixture of
  /// experts"). Only the forward dispatch may travel in MXFP8 (training.moe_dispatch_fwd_dtype).
  TimeNs expert_exchange(bool forward) const {
    const bool mxfp8 = forward && c_.training.moe_dispatch_mxfp8;
    return add_ns(expert_all_to_all(mxfp8), expert_all_to_all(false));
  }
  TimeNs expert_all_to_all(bool mxfp8_wire) const {
    const ParallelConfig& p = c_.parallel;
    const int etp = p.expert_tp();
    TimeNs all_to_all = 0;
    if (p.ep > 1) {
      const ExpertTraffic t = expert_traffic(c_, mxfp8_wire);
      const bool leaves_node = expert_ranks_per_node(c_) < p.ep;
      const double latency_us = leaves_node ? h().inter_node_latency_us : h().intra_node_latency_us;
      all_to_all = add_ns(ns_from_us(latency_us), ns_from_s(std::max(t.intra_node / (nvlink_gbps(h()) * 1e9),
                                                                      t.inter_node / (h().inter_node_gbps * 1e9))));
    }
    return add_ns(all_to_all, ring(false, expert_exchange_bytes(c_) * etp, etp, etp <= h().gpus_per_node));
  }
  /// One GPU's transfer of `bytes` to another, inside a node or between nodes; between nodes over
  /// `nics` network ports at once (a collective's rings, below): no faster than the node's own links
  /// carry the data to them, and no slower than one port.
  TimeNs link(double bytes, bool intra, int nics = 1) const {
    const double latency_us = intra ? h().intra_node_latency_us : h().inter_node_latency_us;
    const double inter = h().inter_node_gbps;
    const double gbps = intra ? nvlink_gbps(h()) : std::max(inter, std::min(nvlink_gbps(h()), nics * inter));
    return add_ns(ns_from_us(latency_us), ns_from_s(bytes / (gbps * 1e9)));
  }
  /// Ring algorithms: all-reduce 2(n-1) steps of bytes/n; broadcast, reduce, reduce-scatter and
  /// all-gather (n-1) steps. A group with `per_node` members in each node leaves it through as many
  /// network ports: NCCL builds a ring per port and splits the data over them through NVLink
  /// (NVIDIA/nccl#601), so 8 GPUs of a DGX H100 reach 8 × 50 GB/s, capped by the 360 GB/s NCCL carries
  /// over NVLink (two such nodes measure 360 GB/s of bus bandwidth, NVIDIA/nccl#1277). A group with one
  /// member a node (the data-parallel group under tp 8) has one port.
  TimeNs ring(bool all_reduce, double bytes, int n, bool intra, int per_node = 1) const {
    if (n <= 1) return 0;
    return times_ns(all_reduce ? 2 * (n - 1) : n - 1, link(bytes / n, intra, per_node));
  }
  /// An all-reduce: a ring, or inside a node with NVLink SHARP, whichever is faster, as NCCL's tuner
  /// picks. There the switch reduces and the bytes move at its bus bandwidth; its latency is taken as
  /// the ring's (no figure for it here), so small all-reduces cost what the ring does. All-gathers and
  /// reduce-scatters stay rings at what NCCL carries over NVLink (NVIDIA/nccl-tests#212, #326).
  TimeNs all_reduce(double bytes, int n, bool intra, int per_node = 1) const {
    const TimeNs by_ring = ring(true, bytes, n, intra, per_node);
    if (n <= 1 || !intra || h().nvls_allreduce_gbps <= 0) return by_ring;
    const TimeNs nvls = add_ns(times_ns(2 * (n - 1), ns_from_us(h().intra_node_latency_us)),
                               ns_from_s(2.0 * (n - 1) / n * bytes / (h().nvls_allreduce_gbps * 1e9)));
    return std::min(by_ring, nvls);
  }

 private:
  const HardwareConfig& h() const { return c_.hardware; }
  /// A tensor-parallel all-reduce of the rank's activations; under sequence parallelism an
  /// all-gather and a reduce-scatter, each half of it, which stay rings (all_reduce, above).
  TimeNs tp_allreduce() const {
    return c_.parallel.sequence_parallel ? ring(true, tp_activation_bytes(), c_.parallel.tp, true)
                                         : all_reduce(tp_activation_bytes(), c_.parallel.tp, true);
  }
  double tp_activation_bytes() const { return rank_tokens(c_) * c_.model.hidden * c_.precision.activation_bytes; }
  /// Transformer Engine's "pipeline" comm-GEMM overlap (its forward reduce-scatters) splits the GEMM
  /// in 4 (num_splits, the default every NeMo recipe keeps): each split's reduce-scatter runs beside
  /// the next split's GEMM, on SMs the GEMM leaves free (Kernel::overlap_sms), and the last one
  /// after the GEMM ends. The GEMM's time on the SMs it keeps, less its time on all of them, plus
  /// that last reduce-scatter.
  double overlap_cost_seconds(const Kernel& gemm) const {
    constexpr double kSplits = 4;
    return held_sms_seconds(kernel_seconds(gemm, h()), gemm.overlap_sms) +
           double(ring(false, tp_activation_bytes(), c_.parallel.tp, true)) * 1e-9 / kSplits;
  }
  /// What `seconds` of tensor-core work on all the SMs costs more on all but `held` of them.
  double held_sms_seconds(double seconds, int held) const {
    const int sms = h().sms;
    return held > 0 && sms > held ? seconds * held / (sms - held) : 0;
  }
  /// vocab-1 and vocab-2 run their all-reduces and broadcasts on a stream of their own, posted ahead
  /// of the compute that waits for them, so an NCCL kernel is resident beside the layers' kernels and
  /// holds hardware.comm_sms SMs from their GEMMs and attention. The interlaced mode's collectives
  /// run in step with its passes, between them.
  int sms_held_by_collectives() const {
    const VocabMode v = c_.schedule.vocab;
    return v == VocabMode::Vocab1 || v == VocabMode::Vocab2 ? h().comm_sms : 0;
  }
  /// One pass over a list of kernels: their roofline seconds, all of them and by kind.
  struct KernelSeconds {
    double all = 0, tensor_cores = 0, gemm = 0, attention = 0, overlap_cost = 0;
    int attention_kernels = 0;
  };
  KernelSeconds kernel_seconds_of(const std::vector<Kernel>& kernels) const {
    KernelSeconds s;
    for (const Kernel& k : kernels) {
      const double seconds = kernel_seconds(k, h());
      s.all += seconds;
      if (k.flops > 0) s.tensor_cores += seconds;
      if (k.attention) s.attention += seconds, ++s.attention_kernels;
      else if (k.flops > 0) s.gemm += seconds;
      if (k.overlap_sms > 0) s.overlap_cost += overlap_cost_seconds(k);
    }
    return s;
  }
  /// Kernels in order; their GEMMs and attention on the SMs resident collectives leave them.
  TimeNs compute(const KernelSeconds& s) const {
    return add_ns(ns_from_s(s.all), ns_from_s(held_sms_seconds(s.tensor_cores, sms_held_by_collectives())));
  }
  /// One round of context parallelism's ring: each rank passes on a block of K and V (s/cp tokens).
  double cp_ring_seconds() const {
    const ModelConfig& m = c_.model;
    if (c_.parallel.cp <= 1) return 0;
    const AttentionWidths w = attention_widths(m);
    const double block = rank_tokens(c_) * (w.key + w.value) / c_.parallel.tp * c_.precision.activation_bytes;
    const bool intra = c_.parallel.tp * c_.parallel.cp <= h().gpus_per_node;
    return (c_.parallel.cp - 1) * double(link(block, intra)) * 1e-9;
  }
  /// A pass's kernels, then the communication they leave exposed: its `tp_collectives` (all of them,
  /// or under tp_comm_overlap what the pass's GEMMs cannot cover, and what the overlap costs the
  /// GEMMs a reduce-scatter shares its SMs with: overlap_cost_seconds) and, per attention kernel,
  /// `ring_rounds` of context parallelism's K/V ring (K and V forward; with dK and dV backward),
  /// overlapped with that attention.
  TimeNs pass(const std::vector<Kernel>& kernels, int tp_collectives, int ring_rounds) const {
    const KernelSeconds s = kernel_seconds_of(kernels);
    TimeNs time = compute(s);
    const TimeNs tp_comm = times_ns(tp_collectives, tp_allreduce());
    time = add_ns(time, c_.training.tp_comm_overlap
                            ? ns_from_s(std::max(0.0, double(tp_comm) * 1e-9 - s.gemm) + s.overlap_cost)
                            : tp_comm);
    const double ring = s.attention_kernels * ring_rounds * cp_ring_seconds();
    return ring > 0 ? add_ns(time, ns_from_s(std::max(0.0, ring - s.attention))) : time;
  }

  const Config c_;  ///< a copy: a plan keeps its cost model while the plan itself moves
};

class AnalyticCostModel final : public CostModel {
 public:
  AnalyticCostModel(const Config& config, const Layout& layout) : times_(config) {
    for (const VirtualStage& stage : layout.stages) stages_.push_back(times_.stage(stage));
    // Read gradients, read and write weights and optimizer states: one fused kernel (multi-tensor Adam).
    const PrecisionConfig& p = config.precision;
    for (int d = 0; d < layout.devices; ++d) {
      double bytes = updated_params(config, layout, d) * (p.grad_bytes + 2 * (p.param_bytes + p.optimizer_bytes));
      // FP8: the layers' weights cast to FP8 and transposed once an iteration (read 2 bytes, write 1 + 1).
      if (p.fp8 != Fp8Format::None) bytes += 4 * device_layer_params(config, layout, d);
      optimizer_ns_.push_back(ns_from_s(kernel_seconds({0, bytes, false}, config.hardware)));
    }
  }
  std::string_view source() const override { return "analytic"; }

 protected:
  TimeNs p2p(const Task& task, const TaskWork& work) const override {
    const ParallelConfig& p = times_.config().parallel;
    const int node = times_.config().hardware.gpus_per_node;
    return times_.link(work.bytes, global_rank(p, task.device) / node == global_rank(p, task.peer) / node);
  }
  TimeNs collective(const Task& task, const TaskWork& work, const CollectiveGroup& group) const override {
    const ParallelConfig& p = times_.config().parallel;
    const HardwareConfig& h = times_.config().hardware;
    // Pipeline-group collectives span nodes when the pipeline does; DP groups stride by tp·cp.
    const bool data_parallel = task.kind == OpKind::DpAllReduce;
    const bool intra = data_parallel ? p.tp * p.cp * p.dp <= h.gpus_per_node : global_rank(p, p.pp - 1) < h.gpus_per_node;
    // Members per node: DP groups stride by tp·cp, pipeline groups by tp·cp·dp (Megatron rank order).
    const int stride = data_parallel ? p.tp * p.cp : p.tp * p.cp * p.dp;
    const int per_node = std::max(1, h.gpus_per_node / stride);
    const bool all_reduce = task.kind == OpKind::AllReduce ||
                            (task.kind == OpKind::DpAllReduce && group.data == CollectiveData::Gradients);
    // The rounds' bytes go round the ring once; each further round (a few values per token, which
    // NCCL reduces over a tree) waits for the last and adds a tree's latency: up and down its depth.
    const int depth = int(std::ceil(std::log2(std::max(group.ranks, 1))));
    const double latency_us = intra ? h.intra_node_latency_us : h.inter_node_latency_us;
    const auto over = [&](double bytes, int ranks, bool in_node, int members_per_node) {
      return all_reduce ? times_.all_reduce(bytes, ranks, in_node, members_per_node)
                        : times_.ring(false, bytes, ranks, in_node, members_per_node);
    };
    TimeNs experts = 0;
    if (data_parallel && work.expert_bytes > 0) {
      // The routed experts' tensors go round the expert data-parallel group, whose members lie ep·etp
      // apart in rank order (Megatron-Core's expert grid): after the rest, on the same stream.
      const int expert_stride = p.ep * p.expert_tp(), ranks = expert_data_parallel(p);
      experts = over(work.expert_bytes, ranks, expert_stride * ranks <= h.gpus_per_node,
                     std::max(1, h.gpus_per_node / expert_stride));
    }
    return add_ns(add_ns(over(work.bytes - work.expert_bytes, group.ranks, intra, per_node),
                         times_ns((group.rounds - 1) * 2 * depth, ns_from_us(latency_us))),
                  experts);
  }
  TimeNs vocab_pass(const Task&, const TaskWork& work) const override {
    // GEMM, then memory-bound softmax or gather kernels: their times add. (No vector: this runs for
    // every vocabulary op of the graph.)
    const HardwareConfig& h = times_.config().hardware;
    double s = 0;
    if (work.flops > 0) s += kernel_seconds({work.flops, 0, false}, h);
    if (work.bytes > 0) s += kernel_seconds({0, work.bytes, false}, h);
    return ns_from_s(s);
  }
  TimeNs optimizer(int device) const override { return optimizer_ns_[std::size_t(device)]; }

 private:
  const AnalyticTimes times_;
  std::vector<TimeNs> optimizer_ns_;  ///< per device: its ZeRO share of the update (updated_params)
};

class ExplicitCostModel final : public CostModel {
 public:
  ExplicitCostModel(const Config& config, const Layout& layout) {
    const ExplicitCosts& costs = *config.costs;
    const auto at = [](const std::vector<double>& values, int device) {
      return values.size() == 1 ? values[0] : values[static_cast<std::size_t>(device)];
    };
    for (const VirtualStage& stage : layout.stages) {
      const double share = explicit_share(config, stage);
      const double forward = (stage.has_head ? costs.output_forward_ms : 0) + (stage.has_embedding ? costs.input_forward_ms : 0);
      const double backward = (stage.has_head ? costs.output_backward_ms : 0) + (stage.has_embedding ? costs.input_backward_ms : 0);
      stages_.push_back({ns_from_ms(at(costs.forward_ms, stage.device) * share + forward),
                         ns_from_ms(at(costs.backward_ms, stage.device) * share + backward),
                         ns_from_ms(at(costs.weight_ms, stage.device) * share)});
    }
    device_params_ = device_params(config, layout);
    grad_bytes_ = config.precision.grad_bytes, param_bytes_ = config.precision.param_bytes;
    // Asked of every op of a graph, millions of them: the conversions are made once, here.
    p2p_ns_ = ns_from_ms(costs.p2p_ms);
    allreduce_ns_ = ns_from_ms(costs.allreduce_ms);
    dp_allreduce_ns_ = ns_from_ms(costs.dp_allreduce_ms);
    optimizer_ns_ = ns_from_ms(costs.optimizer_ms);
    // Each device runs 1/p of the vocabulary layers.
    const int shards = layout.devices;
    vocab_ns_ = {ns_from_ms(costs.output_forward_ms / shards), ns_from_ms(costs.output_backward_ms / shards),
                 ns_from_ms(costs.input_forward_ms / shards), ns_from_ms(costs.input_backward_ms / shards)};
  }
  std::string_view source() const override { return "explicit"; }

 protected:
  TimeNs p2p(const Task&, const TaskWork&) const override { return p2p_ns_; }
  TimeNs collective(const Task& task, const TaskWork& work, const CollectiveGroup& group) const override {
    if (task.kind != OpKind::DpAllReduce) return allreduce_ns_;
    // An all-reduce is a reduce-scatter and an all-gather: ZeRO's halves take half of it each.
    const TimeNs whole = group.data == CollectiveData::Gradients ? dp_allreduce_ns_ : dp_allreduce_ns_ / 2;
    // dp_allreduce_ms is a device's whole reduction; a collective of one stage's tensors (or of the
    // vocabulary shards) takes its share of the bytes.
    const double all = device_params_[std::size_t(task.device)] *
                       (group.data == CollectiveData::Parameters ? param_bytes_ : grad_bytes_);
    return work.bytes > 0 && work.bytes < all ? TimeNs(std::llround(double(whole) * work.bytes / all)) : whole;
  }
  TimeNs optimizer(int) const override { return optimizer_ns_; }
  TimeNs vocab_pass(const Task& task, const TaskWork&) const override {
    switch (task.kind) {
      case OpKind::S: return vocab_ns_[0];
      case OpKind::T: return vocab_ns_[1];
      case OpKind::IF: return vocab_ns_[2];
      default: return vocab_ns_[3];
    }
  }

 private:
  TimeNs p2p_ns_ = 0, allreduce_ns_ = 0, dp_allreduce_ns_ = 0, optimizer_ns_ = 0;
  std::vector<double> device_params_;  ///< device_params: what a device's data-parallel collectives move
  double grad_bytes_ = 0, param_bytes_ = 0;
  std::array<TimeNs, 4> vocab_ns_{};  ///< S, T, IF, IB
};

}  // namespace

StageWeights stage_weights(const Config& config) {
  if (config.costs) return {1, 0, 0};  // explicit mode: vocabulary layers cost nothing
  Config probe = config;
  probe.parallel.pp = 1;
  probe.parallel.chunks = 1;
  const AnalyticTimes times(probe);
  const auto time_of = [&](const VirtualStage& stage) {
    const StageTimes t = times.stage(stage);
    return double(t.forward + t.backward + t.weight);
  };
  const double empty = time_of({0, 0, 0, 0, false, false});
  const double layer = time_of({0, 0, 0, 1, false, false}) - empty;
  return {layer, time_of({0, 0, 0, 0, true, false}) - empty, time_of({0, 0, 0, 0, false, true}) - empty};
}

TimeNs CostModel::duration(const TaskGraph& graph, TaskId id, bool split_weight) const {
  const Task& task = graph.task(id);
  switch (task.kind) {
    case OpKind::F: return stage(task.stage).forward;
    case OpKind::B: {
      const StageTimes& t = stage(task.stage);
      return add_ns(t.backward - t.recompute, split_weight ? 0 : t.weight);
    }
    case OpKind::W: return stage(task.stage).weight;
    case OpKind::R: return stage(task.stage).recompute;
    case OpKind::S:
    case OpKind::T:
    case OpKind::IF:
    case OpKind::IB: return vocab_pass(task, graph.work_of(task));
    case OpKind::Send:
    case OpKind::Recv: return p2p(task, graph.work_of(task));
    case OpKind::AllReduce:
    case OpKind::Broadcast:
    case OpKind::Reduce:
      return collective(task, graph.work_of(task), graph.groups()[static_cast<std::size_t>(task.group)]);
    case OpKind::DpAllReduce: {
      const TaskWork& work = graph.work_of(task);
      const CollectiveGroup& group = graph.groups()[static_cast<std::size_t>(task.group)];
      if (work.buckets <= 1) return collective(task, work, group);
      // Gradients fill their buckets through the stage's last backward (B, or W where split off);
      // weights are gathered bucket by bucket ahead of its first forward. Each bucket is a collective
      // of its own (its latency too); the embedding's runs after (before) the pass.
      const StageTimes& t = stage(task.stage);
      const double n = work.buckets;
      const TaskWork bucket{.bytes = (work.bytes - work.embedding_bytes) / n, .expert_bytes = work.expert_bytes / n};
      const TimeNs embedding = work.embedding_bytes > 0 ? collective(task, {.bytes = work.embedding_bytes}, group) : 0;
      TimeNs each = collective(task, bucket, group);
      // ZeRO 3's gather for the backward: the root unit and the first layer ahead of it; FSDP gathers
      // the other layers during the backward, each beside a layer's reduce-scatter, charged there.
      if (task.payload == Payload::Gradient) return add_ns(embedding, each);
      if (work.gathered_beside_bytes > 0) {
        const CollectiveGroup gather{.members = {}, .ranks = group.ranks, .data = CollectiveData::Parameters};
        const double share = work.gathered_beside_bytes / (work.bytes - work.embedding_bytes);
        each = add_ns(each, collective(task, {.bytes = bucket.bytes * share, .expert_bytes = bucket.expert_bytes * share}, gather));
        // Recomputation runs inside each unit's backward, so the whole of it covers the collectives.
        return add_ns(embedding, bucketed_tail(each, work.buckets, add_ns(t.backward, t.weight)));
      }
      const TimeNs pass = group.data == CollectiveData::Parameters ? t.forward
                          : split_weight                          ? t.weight
                                                                  : add_ns(t.backward - t.recompute, t.weight);
      return add_ns(embedding, bucketed_tail(each, work.buckets, pass));
    }
    case OpKind::AllToAll: {
      const StageTimes& t = stage(task.stage);
      return task.payload == Payload::Gradient ? t.exchange_backward : t.exchange_forward;
    }
    case OpKind::Optimizer: return optimizer(task.device);
  }
  return 0;
}

TimeNs bucketed_tail(TimeNs bucket, int buckets, TimeNs pass) {
  // Bucket k is ready k/n of the way through the pass and its collective starts then or when the one
  // before ends: the last ends max(T + c, T/n + n·c), so max(c, n·c − T(1 − 1/n)) after the pass.
  const double n = buckets, c = double(bucket);
  return TimeNs(std::llround(std::max(c, n * c - double(pass) * (1 - 1 / n))));
}

std::unique_ptr<CostModel> make_cost_model(const Config& config, const Layout& layout) {
  if (config.costs) return std::make_unique<ExplicitCostModel>(config, layout);
  return std::make_unique<AnalyticCostModel>(config, layout);
}

TimeNs shortest_transfer(const CostModel& model, const Layout& layout, Bytes boundary_bytes) {
  TimeNs shortest = std::numeric_limits<TimeNs>::max();
  const TaskWork boundary{.bytes = double(boundary_bytes)};
  for (std::size_t s = 0; s + 1 < layout.stages.size(); ++s) {
    const int a = layout.stages[s].device, b = layout.stages[s + 1].device;
    if (a == b) continue;
    for (const auto& [from, to] : {std::pair{a, b}, std::pair{b, a}})
      shortest = std::min(shortest, model.transfer({.kind = OpKind::Send, .device = from, .peer = to}, boundary));
  }
  return shortest;
}

std::vector<TimeNs> op_durations(const CostModel& model, const TaskGraph& graph) {
  const bool split_weight = graph.has(OpKind::W);
  std::vector<TimeNs> durations(graph.size());
  // Each op's duration is its own (cost models are immutable): on a large graph, in two halves.
  in_two_halves(durations.size(), durations.size() >= kOpsWorthAThread, [&](std::size_t begin, std::size_t end) {
    for (std::size_t i = begin; i < end; ++i)
      durations[i] = model.duration(graph, static_cast<TaskId>(i), split_weight);
  });
  return durations;
}

}  // namespace pipesim
