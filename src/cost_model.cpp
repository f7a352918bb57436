#include "cost_model.h"

#include <algorithm>
#include <cmath>

#include "model_math.h"
#include "two_threads.h"

namespace pipesim {
namespace {

/// One kernel-sized piece of work; its time is its own roofline, so a memory-bound softmax is not
/// hidden under a compute-bound GEMM of the same op.
struct Piece {
  double flops = 0;
  double bytes = 0;
};

struct StagePieces {
  std::vector<Piece> forward, backward, weight;
  int tp_allreduces_forward = 0, tp_allreduces_backward = 0;  ///< each of b·s·h activations
};

StagePieces stage_pieces(const Config& c, const VirtualStage& stage) {
  const ModelConfig& m = c.model;
  const PrecisionConfig& p = c.precision;
  const double t = c.parallel.tp;
  const double tokens = double(m.micro_batch_size) * m.seq_len;
  const double gemm = layer_gemm_flops(m) / t, attention = layer_attention_flops(m) / t;
  const double weights = layer_params(m) * p.param_bytes / t;
  const double activations = layer_activation_bytes(m, p, c.parallel.tp);
  StagePieces pieces;
  for (int l = 0; l < stage.layers; ++l) {
    pieces.forward.push_back({gemm + attention, weights + activations});
    pieces.backward.push_back({gemm + 2 * attention, weights + activations});
    pieces.weight.push_back({gemm, layer_params(m) * p.grad_bytes / t + activations});
  }
  pieces.tp_allreduces_forward = pieces.tp_allreduces_backward = 2 * stage.layers;
  if (stage.has_head) {
    const double logits = tokens * m.vocab / t;  // fp32 elements
    const double head_weights = vocab_params(m) * p.param_bytes / t;
    const double head_gemm = head_forward_flops(m) / t;
    pieces.forward.push_back({head_gemm, head_weights});
    pieces.forward.push_back({0, 3 * 4 * logits});  // softmax: max, sum-exp, normalise
    pieces.backward.push_back({head_gemm, head_weights});
    pieces.backward.push_back({0, 2 * 4 * logits});  // softmax gradient
    pieces.weight.push_back({head_gemm, vocab_params(m) * p.grad_bytes / t});
  }
  if (stage.has_embedding) {
    const double rows = tokens * m.hidden / t;
    pieces.forward.push_back({0, 2 * rows * p.param_bytes});  // gather: read rows, write output
    pieces.weight.push_back({0, rows * (p.activation_bytes + 2 * p.grad_bytes)});  // scatter-add
    if (c.parallel.tp > 1) ++pieces.tp_allreduces_forward;  // vocab-parallel embedding sum
  }
  return pieces;
}

double total(const std::vector<Piece>& pieces, double Piece::*field) {
  double sum = 0;
  for (const Piece& piece : pieces) sum += piece.*field;
  return sum;
}

/// Parameters of the vocabulary shards each device holds when the vocabulary is split over devices.
double vocab_shard_params(const Config& c, const Layout& layout) {
  if (layout.vocab == VocabPlacement::OnStages) return 0;
  return 2.0 * layout.padded_vocab / layout.devices * c.model.hidden / c.parallel.tp;  // embedding + head rows
}

double stage_params(const Config& c, const VirtualStage& stage) {
  const ModelConfig& m = c.model;
  double params = stage.layers * layer_params(m);
  if (stage.has_embedding) params += vocab_params(m);
  if (stage.has_head) params += vocab_params(m) + 2.0 * m.hidden;
  return params / c.parallel.tp;
}

/// Explicit costs are given for an even share (layers/pp) of the model; a stage scales by its layers.
double share_of_device(const Config& c, const VirtualStage& stage) {
  return double(stage.layers) * c.parallel.pp / c.model.layers;
}

/// Global rank of a pipeline stage's TP-rank 0 under Megatron's order (tp innermost, then dp, then pp).
int global_rank(const Config& c, int device) { return device * c.parallel.tp * c.parallel.dp; }

class AnalyticCostModel final : public CostModel {
 public:
  AnalyticCostModel(const Config& config, const Layout& layout) : c_(config), h_(config.hardware), layout_(layout) {
    for (const VirtualStage& stage : layout.stages) {
      const StagePieces pieces = stage_pieces(config, stage);
      const TimeNs allreduce = tp_allreduce();
      // Saturating sums: a speed near zero makes a duration unrepresentable, never a wrapped one.
      stages_.push_back({add_ns(run(pieces.forward), times_ns(pieces.tp_allreduces_forward, allreduce)),
                         add_ns(run(pieces.backward), times_ns(pieces.tp_allreduces_backward, allreduce)),
                         run(pieces.weight)});
    }
  }
  std::string_view source() const override { return "analytic"; }

 protected:
  TimeNs p2p(const Task& task, const TaskWork& work) const override {
    const bool same_node = global_rank(c_, task.device) / h_.gpus_per_node == global_rank(c_, task.peer) / h_.gpus_per_node;
    return link(work.bytes, same_node);
  }
  TimeNs collective(const Task& task, const TaskWork& work, int ranks) const override {
    // Pipeline-group collectives span nodes when the pipeline does; DP groups stride by tp.
    const bool intra = task.kind == OpKind::DpAllReduce
                           ? c_.parallel.tp * c_.parallel.dp <= h_.gpus_per_node
                           : global_rank(c_, c_.parallel.pp - 1) < h_.gpus_per_node;
    return ring(task.kind, work.bytes, ranks, intra);
  }
  TimeNs vocab_pass(const Task&, const TaskWork& work) const override {
    // GEMM, then memory-bound softmax or gather kernels: their times add.
    return add_ns(ns_from_s(work.flops / (h_.peak_tflops * 1e12 * h_.compute_efficiency) +
                            work.bytes / (h_.hbm_gbps * 1e9 * h_.hbm_efficiency)),
                  launch());
  }
  TimeNs optimizer(int device) const override {
    double params = vocab_shard_params(c_, layout_);
    for (const VirtualStage& stage : layout_.stages)
      if (stage.device == device) params += stage_params(c_, stage);
    const PrecisionConfig& p = c_.precision;
    // Read gradients, read and write weights and optimizer states.
    const double states = p.optimizer_bytes / (p.distributed_optimizer ? c_.parallel.dp : 1);
    return add_ns(memory_time(params * (p.grad_bytes + 2 * (p.param_bytes + states))), launch());
  }

 private:
  TimeNs launch() const { return ns_from_us(h_.kernel_launch_us); }
  TimeNs memory_time(double bytes) const { return ns_from_s(bytes / (h_.hbm_gbps * 1e9 * h_.hbm_efficiency)); }
  TimeNs run(const std::vector<Piece>& pieces) const {
    if (pieces.empty()) return 0;
    double s = 0;
    for (const Piece& piece : pieces)
      s += std::max(piece.flops / (h_.peak_tflops * 1e12 * h_.compute_efficiency),
                    piece.bytes / (h_.hbm_gbps * 1e9 * h_.hbm_efficiency));
    return add_ns(ns_from_s(s), launch());
  }
  TimeNs link(double bytes, bool intra) const {
    const double latency_us = intra ? h_.intra_node_latency_us : h_.inter_node_latency_us;
    const double gbps = intra ? h_.intra_node_gbps : h_.inter_node_gbps;
    return add_ns(ns_from_us(latency_us), ns_from_s(bytes / (gbps * 1e9)));
  }
  /// Ring algorithms: all-reduce 2(n-1) steps of bytes/n; broadcast and reduce (n-1) steps.
  TimeNs ring(OpKind kind, double bytes, int n, bool intra) const {
    if (n <= 1) return 0;
    const int steps = (kind == OpKind::AllReduce || kind == OpKind::DpAllReduce) ? 2 * (n - 1) : n - 1;
    return times_ns(steps, link(bytes / n, intra));
  }
  TimeNs tp_allreduce() const {
    const ModelConfig& m = c_.model;
    const double bytes = double(m.micro_batch_size) * m.seq_len * m.hidden * c_.precision.activation_bytes;
    return ring(OpKind::AllReduce, bytes, c_.parallel.tp, true);
  }

  const Config& c_;
  const HardwareConfig& h_;
  const Layout& layout_;
};

class ExplicitCostModel final : public CostModel {
 public:
  ExplicitCostModel(const Config& config, const Layout& layout) : costs_(*config.costs) {
    const auto at = [](const std::vector<double>& values, int device) {
      return values.size() == 1 ? values[0] : values[static_cast<std::size_t>(device)];
    };
    for (const VirtualStage& stage : layout.stages) {
      const double share = share_of_device(config, stage);
      const double forward = (stage.has_head ? costs_.output_forward_ms : 0) + (stage.has_embedding ? costs_.input_forward_ms : 0);
      const double backward = (stage.has_head ? costs_.output_backward_ms : 0) + (stage.has_embedding ? costs_.input_backward_ms : 0);
      stages_.push_back({ns_from_ms(at(costs_.forward_ms, stage.device) * share + forward),
                         ns_from_ms(at(costs_.backward_ms, stage.device) * share + backward),
                         ns_from_ms(at(costs_.weight_ms, stage.device) * share)});
    }
    shards_ = layout.devices;
  }
  std::string_view source() const override { return "explicit"; }

 protected:
  TimeNs p2p(const Task&, const TaskWork&) const override { return ns_from_ms(costs_.p2p_ms); }
  TimeNs collective(const Task& task, const TaskWork&, int) const override {
    return ns_from_ms(task.kind == OpKind::DpAllReduce ? costs_.dp_allreduce_ms : costs_.allreduce_ms);
  }
  TimeNs optimizer(int) const override { return ns_from_ms(costs_.optimizer_ms); }
  /// Each device runs 1/p of the vocabulary layers.
  TimeNs vocab_pass(const Task& task, const TaskWork&) const override {
    switch (task.kind) {
      case OpKind::S: return ns_from_ms(costs_.output_forward_ms / shards_);
      case OpKind::T: return ns_from_ms(costs_.output_backward_ms / shards_);
      case OpKind::IF: return ns_from_ms(costs_.input_forward_ms / shards_);
      default: return ns_from_ms(costs_.input_backward_ms / shards_);
    }
  }

 private:
  const ExplicitCosts& costs_;
  int shards_ = 1;
};

}  // namespace

std::vector<StageWork> stage_work(const Config& config, const Layout& layout) {
  const ModelConfig& m = config.model;
  // W needs the inputs of the four GEMMs of each layer: b·s·(3h + f) elements.
  const double weight_held_fraction =
      double(m.micro_batch_size) * m.seq_len * (3.0 * m.hidden + m.ffn_hidden) * config.precision.activation_bytes /
      config.parallel.tp / std::max(1.0, layer_activation_bytes(m, config.precision, config.parallel.tp));
  std::vector<StageWork> work;
  for (const VirtualStage& stage : layout.stages) {
    const StagePieces pieces = stage_pieces(config, stage);
    StageWork w;
    w.forward_flops = total(pieces.forward, &Piece::flops);
    w.backward_flops = total(pieces.backward, &Piece::flops);
    w.weight_flops = total(pieces.weight, &Piece::flops);
    w.forward_bytes = total(pieces.forward, &Piece::bytes);
    w.backward_bytes = total(pieces.backward, &Piece::bytes);
    w.weight_bytes = total(pieces.weight, &Piece::bytes);
    double layer_bytes = stage.layers * layer_activation_bytes(m, config.precision, config.parallel.tp);
    if (config.costs && config.costs->activation_bytes)
      layer_bytes = *config.costs->activation_bytes * share_of_device(config, stage);
    double head_bytes = 0;
    if (stage.has_head)  // fp32 logits kept for the softmax gradient, plus its input
      head_bytes = config.costs ? config.costs->output_activation_bytes
                                : double(m.micro_batch_size) * m.seq_len *
                                      (4.0 * m.vocab + config.precision.activation_bytes * m.hidden) / config.parallel.tp;
    w.activation_bytes = static_cast<Bytes>(std::llround(layer_bytes + head_bytes));
    w.weight_held_bytes = static_cast<Bytes>(std::llround(layer_bytes * std::min(1.0, weight_held_fraction)));
    w.params = stage_params(config, stage);
    work.push_back(w);
  }
  return work;
}

StageWeights stage_weights(const Config& config) {
  if (config.costs) return {1, 0, 0};  // explicit mode: vocabulary layers cost nothing
  Config probe = config;
  probe.parallel.pp = 1;
  probe.parallel.chunks = 1;
  const auto time_of = [&](const VirtualStage& stage) {
    Layout layout{1, 1, Placement::Loop, {stage}};
    AnalyticCostModel model(probe, layout);
    const StageTimes& t = model.stage(0);
    return double(t.forward + t.backward + t.weight);
  };
  const double empty = time_of({0, 0, 0, 0, false, false});
  const double layer = time_of({0, 0, 0, 1, false, false}) - empty;
  return {layer, time_of({0, 0, 0, 0, true, false}) - empty, time_of({0, 0, 0, 0, false, true}) - empty};
}

VocabWork vocab_work(const Config& config, const Layout& layout) {
  const ModelConfig& m = config.model;
  const PrecisionConfig& p = config.precision;
  const double tokens = double(m.micro_batch_size) * m.seq_len, h = m.hidden, t = config.parallel.tp;
  const double rows = double(layout.padded_vocab) / layout.devices / t;  // vocabulary rows per device
  const bool two_barriers = layout.vocab != VocabPlacement::Vocab2;
  VocabWork w;
  const double gemm = 2 * tokens * h * rows, logits = 4 * tokens * rows;  // FLOPs; fp32 bytes
  w.s_flops = gemm * (two_barriers ? 1 : 2);  // Algorithm 2 also forms softmax_local·W_i
  w.s_bytes = 2 * logits + rows * h * p.param_bytes;
  w.t_flops = gemm * (two_barriers ? 2 : 1);  // dW, and dX for Algorithm 1
  w.t_bytes = 2 * logits;
  w.input_forward_bytes = 2 * tokens * h / t * p.param_bytes;
  w.input_backward_bytes = tokens * h / t * (p.activation_bytes + 2 * p.grad_bytes);
  w.s_activation_bytes = config.costs ? Bytes(config.costs->output_activation_bytes / layout.devices)
                                      : Bytes(logits + tokens * h * p.activation_bytes / t);
  w.output_broadcast_bytes = tokens * h * p.activation_bytes / t;
  w.barrier0_bytes = 3 * 4 * tokens + (two_barriers ? 0 : 4 * tokens * h / t);
  w.barrier1_bytes = two_barriers ? 4 * tokens * h / t : 0;
  w.input_reduce_bytes = tokens * h * p.activation_bytes / t;
  w.grad_broadcast_bytes = tokens * h * p.activation_bytes / t;
  return w;
}

std::vector<Bytes> static_memory_bytes(const Config& config, const Layout& layout) {
  std::vector<double> params(static_cast<std::size_t>(layout.devices), vocab_shard_params(config, layout));
  for (const VirtualStage& stage : layout.stages) params[static_cast<std::size_t>(stage.device)] += stage_params(config, stage);
  std::vector<Bytes> bytes;
  for (double p : params)
    bytes.push_back(static_cast<Bytes>(std::llround(p * bytes_per_param(config.precision, config.parallel.dp))));
  return bytes;
}

TimeNs CostModel::duration(const TaskGraph& graph, TaskId id, bool split_weight) const {
  const Task& task = graph.task(id);
  switch (task.kind) {
    case OpKind::F: return stage(task.stage).forward;
    case OpKind::B: return add_ns(stage(task.stage).backward, split_weight ? 0 : stage(task.stage).weight);
    case OpKind::W: return stage(task.stage).weight;
    case OpKind::S:
    case OpKind::T:
    case OpKind::IF:
    case OpKind::IB: return vocab_pass(task, graph.work_of(task));
    case OpKind::Send:
    case OpKind::Recv: return p2p(task, graph.work_of(task));
    case OpKind::AllReduce:
    case OpKind::Broadcast:
    case OpKind::Reduce:
    case OpKind::DpAllReduce:
      return collective(task, graph.work_of(task), graph.groups()[static_cast<std::size_t>(task.group)].ranks);
    case OpKind::Optimizer: return optimizer(task.device);
  }
  return 0;
}

std::unique_ptr<CostModel> make_cost_model(const Config& config, const Layout& layout) {
  if (config.costs) return std::make_unique<ExplicitCostModel>(config, layout);
  return std::make_unique<AnalyticCostModel>(config, layout);
}

std::vector<TimeNs> op_durations(const CostModel& model, const TaskGraph& graph) {
  const bool split_weight =
      std::any_of(graph.tasks().begin(), graph.tasks().end(), [](const Task& task) { return task.kind == OpKind::W; });
  std::vector<TimeNs> durations(graph.size());
  // Each op's duration is its own (cost models are immutable): on a large graph, in two halves.
  in_two_halves(durations.size(), durations.size() >= kOpsWorthAThread, [&](std::size_t begin, std::size_t end) {
    for (std::size_t i = begin; i < end; ++i)
      durations[i] = model.duration(graph, static_cast<TaskId>(i), split_weight);
  });
  return durations;
}

std::vector<OpWork> analytic_op_work(const Config& config) {
  Config one = config;
  one.parallel.tp = 1;
  const auto as_work = [](std::string name, std::initializer_list<const std::vector<Piece>*> lists) {
    OpWork work{std::move(name), {}};
    for (const std::vector<Piece>* list : lists)
      for (const Piece& piece : *list) work.pieces.emplace_back(piece.flops, piece.bytes);
    return work;
  };
  const StagePieces layer = stage_pieces(one, {.device = 0, .chunk = 0, .first_layer = 0, .layers = 1,
                                               .has_embedding = false, .has_head = false});
  const StagePieces head = stage_pieces(one, {.device = 0, .chunk = 0, .first_layer = 0, .layers = 0,
                                              .has_embedding = false, .has_head = true});
  const StagePieces embedding = stage_pieces(one, {.device = 0, .chunk = 0, .first_layer = 0, .layers = 0,
                                                   .has_embedding = true, .has_head = false});
  return {as_work("layer_forward", {&layer.forward}), as_work("layer_backward", {&layer.backward}),
          as_work("layer_weight", {&layer.weight}), as_work("output_forward", {&head.forward}),
          as_work("output_backward", {&head.backward, &head.weight}), as_work("input_forward", {&embedding.forward}),
          as_work("input_backward", {&embedding.weight})};
}

double analytic_seconds(const OpWork& work, const HardwareConfig& h) {
  double s = 0;
  for (const auto& [flops, bytes] : work.pieces)
    s += std::max(flops / (h.peak_tflops * 1e12 * h.compute_efficiency), bytes / (h.hbm_gbps * 1e9 * h.hbm_efficiency));
  return s + h.kernel_launch_us * 1e-6;
}

}  // namespace pipesim
