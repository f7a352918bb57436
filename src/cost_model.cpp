#include "cost_model.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <utility>

#include "model_math.h"
#include "two_threads.h"

namespace pipesim {
namespace {

/// The kernels of one virtual stage's F, B and W for one microbatch, per tensor-parallel rank.
struct StageKernels {
  std::vector<Kernel> forward, backward, weight, recompute;
  /// Tensor-parallel collectives, each an all-reduce of b·s·h activations or, under sequence
  /// parallelism, an all-gather and a reduce-scatter of them (the same ring time).
  int tp_allreduces_forward = 0, tp_allreduces_backward = 0, tp_allreduces_recompute = 0;
};

/// A GEMM of an M×K by a K×N operand: its FLOPs, and each operand read and the result written once.
Kernel gemm(double m, double n, double k, double a_bytes, double b_bytes, double c_bytes) {
  return {2 * m * n * k, m * k * a_bytes + k * n * b_bytes + m * n * c_bytes, false, m, n};
}
/// A memory-bound kernel (norms, activation functions, casts, gathers): bytes moved, no GEMM FLOPs.
Kernel streaming(double bytes) { return {0, bytes, false, 0, 0}; }
/// A GEMM batched over heads and sequences: enough tiles to fill the SMs, so its fill is taken as 1.
Kernel batched_gemm(double flops, double bytes) { return {flops, bytes, false, 0, 0}; }
/// Fused (flash) causal attention: its matrix FLOPs, run at attention_efficiency.
Kernel fused_attention(double flops, double bytes) { return {flops, bytes, true, 0, 0}; }

/// Tokens of one microbatch on one context-parallel rank.
double rank_tokens(const Config& c) { return double(c.model.micro_batch_size) * c.model.seq_len / c.parallel.cp; }

void append(std::vector<Kernel>& to, const std::vector<Kernel>& kernels) { to.insert(to.end(), kernels.begin(), kernels.end()); }

/// Core attention's shape on one tensor- and context-parallel rank: its queries' tokens against
/// every key of the sequence, over heads/t heads.
struct AttentionShape {
  double tokens, keys, width, kv_width, heads, act;  // width: hidden/t; act: bytes an element
  double products() const { return 2 * tokens * keys * width; }  // FLOPs of QKᵀ (or of P·V), unmasked
  double scores() const { return tokens * keys * heads; }        // elements of the score matrix
  double score_bytes() const { return scores() * act; }
  double qkvo_bytes() const { return tokens * (2 * width + 2 * kv_width) * act; }  // Q, K, V and O once each
  /// One unfused product over the score matrix (QKᵀ, P·V or a gradient's): two of the four
  /// Q/K/V/O-sized operands and the matrix itself.
  Kernel score_product() const { return batched_gemm(products(), qkvo_bytes() / 2 + score_bytes()); }
};

AttentionShape attention_shape(const Config& c) {
  const ModelConfig& m = c.model;
  const double t = c.parallel.tp, g = double(m.key_value_heads()) / m.heads;
  return {rank_tokens(c), double(m.seq_len), m.hidden / t, g * m.hidden / t, m.heads / t, c.precision.activation_bytes};
}

/// Flash attention: one fused causal kernel, half of the unmasked products forward and 2.5× that
/// backward (five matrix products to two); Q, K, V, O (and dO, dQ, dK, dV) read or written once.
/// Without it, as Megatron-LM ran GPT before flash attention: QKᵀ and P·V as batched GEMMs over the
/// whole score matrix (masked, not skipped), and the fused scale-mask-softmax and the attention
/// dropout (a 1-byte mask) each reading and writing that matrix through HBM.
std::vector<Kernel> core_attention_forward(const Config& c) {
  const AttentionShape a = attention_shape(c);
  if (c.precision.flash_attention) return {fused_attention(a.products(), a.qkvo_bytes())};
  return {a.score_product(),                                  // S = QKᵀ
          streaming(2 * a.score_bytes()),                     // P = softmax(mask(S))
          streaming(2 * a.score_bytes() + a.scores()),        // dropout(P) and its mask
          a.score_product()};                                 // O = P·V
}

std::vector<Kernel> core_attention_backward(const Config& c) {
  const AttentionShape a = attention_shape(c);
  if (c.precision.flash_attention) return {fused_attention(2.5 * a.products(), 2 * a.qkvo_bytes())};
  const Kernel product = a.score_product();
  return {product, product,                                   // dP = dO·Vᵀ, dV = Pᵀ·dO
          streaming(2 * a.score_bytes() + a.scores()),        // dropout's backward, through its mask
          streaming(3 * a.score_bytes()),                     // softmax's backward: P, dP in, dS out
          product, product};                                  // dQ = dS·K, dK = dSᵀ·Q
}

/// One decoder layer as a framework runs it (docs/cost-model.md): four GEMMs (QKV, projection, MLP up
/// — gate and up together for SwiGLU — and down) in each of F (Y = XWᵀ), B (dX = dY·W) and W
/// (dW = dYᵀX, accumulated into the fp32 main gradient); fused causal attention; and the
/// memory-bound norms, activation function and residual adds. A context-parallel rank runs s/cp of
/// the tokens, its queries against every key.
void add_layer(const Config& c, StageKernels& out) {
  const ModelConfig& m = c.model;
  const PrecisionConfig& p = c.precision;
  const double t = c.parallel.tp, tokens = rank_tokens(c), h = m.hidden, f = m.ffn_hidden;
  const double g = double(m.key_value_heads()) / m.heads, act = p.activation_bytes;
  const bool swiglu = m.mlp == MlpKind::SwiGlu;
  struct Linear {
    double out, in;  // per tensor-parallel rank: column-parallel split out, row-parallel split in
  };
  const Linear linears[] = {{h * (1 + 2 * g) / t, h}, {h, h / t}, {(swiglu ? 2 : 1) * f / t, h}, {h, f / t}};
  for (const Linear& l : linears) {
    out.forward.push_back(gemm(tokens, l.out, l.in, act, p.param_bytes, act));
    out.backward.push_back(gemm(tokens, l.in, l.out, act, p.param_bytes, act));
    out.weight.push_back(gemm(l.out, l.in, tokens, act, act, 2 * p.grad_bytes));  // read-modify-write
  }
  append(out.forward, core_attention_forward(c));
  append(out.backward, core_attention_backward(c));
  // Memory-bound, in elements per token: F: two norms (read, write) and the activation function
  // (GELU one fused kernel, 2f; SwiGLU as PyTorch runs it unfused, SiLU 2f and the product 3f). B: the
  // norms' backward (read input and gradient, write gradient), the residual gradients' sums,
  // attention's layout copies, and the activation's backward (GELU 3f; SwiGLU 13f: two products,
  // SiLU's backward, the gate and up gradients copied into one). The norms and residuals work on
  // every token of every tensor-parallel rank unless sequence parallelism splits them.
  const double norms = c.parallel.sequence_parallel ? t : 1;
  out.forward.push_back(streaming(tokens * (4 * h / norms + (swiglu ? 5 : 2) * f / t) * act));
  out.backward.push_back(streaming(tokens * (16 * h / norms + (swiglu ? 13 : 3) * f / t) * act));
  if (!swiglu)  // GPT's biases: their gradients read each linear's output gradient
    out.weight.push_back(streaming(tokens * (h * (1 + 2 * g) + 2 * h + f) / t * act));
}

/// The LM head with a PyTorch-style cross-entropy: logits in bf16, cast to fp32, log-softmax (read
/// twice, written once) — 18 bytes a logit forward; backward writes the one-hot gradient, runs the
/// log-softmax backward and casts back — 22 bytes a logit.
void add_head(const Config& c, StageKernels& out) {
  const ModelConfig& m = c.model;
  const PrecisionConfig& p = c.precision;
  const double tokens = rank_tokens(c), h = m.hidden, rows = double(m.vocab) / c.parallel.tp;
  const double act = p.activation_bytes;
  out.forward.push_back(gemm(tokens, rows, h, act, p.param_bytes, act));
  out.forward.push_back(streaming(18 * tokens * rows));
  out.backward.push_back(streaming(22 * tokens * rows));
  out.backward.push_back(gemm(tokens, h, rows, act, p.param_bytes, act));
  out.weight.push_back(gemm(rows, h, tokens, act, act, 2 * p.grad_bytes));
}

/// The input embedding: a gather of b·s rows (read, write); its gradient cast to fp32 (read, write)
/// and scatter-added into the main gradient: read it, then an atomic read-modify-write of each row,
/// counted twice (atomics reach about half the bandwidth of plain stores on the H100 measured).
void add_embedding(const Config& c, StageKernels& out) {
  const ModelConfig& m = c.model;
  const PrecisionConfig& p = c.precision;
  const double elements = rank_tokens(c) * m.hidden / c.parallel.tp;
  out.forward.push_back(streaming(2 * elements * p.param_bytes));
  out.weight.push_back(streaming(elements * (p.activation_bytes + p.grad_bytes)));
  out.weight.push_back(streaming(elements * (p.grad_bytes + 4 * p.grad_bytes)));
  if (c.parallel.tp > 1) ++out.tp_allreduces_forward;  // vocab-parallel embedding sum
}

/// A stage's transformer activations for one microbatch: what F keeps for the backward, what R
/// takes at its largest, and what F would keep without recomputation.
struct ActivationsKept {
  double from_forward = 0, rebuilt = 0, without_recompute = 0;
};

/// Uniform full recomputation keeps the input of each group of recompute_num_layers layers and
/// rebuilds one group at a time; block keeps the input of each of its first layers, and the rest whole,
/// rebuilding one layer at a time; selective keeps all but the score matrices and rebuilds one
/// layer's (none under flash attention).
ActivationsKept activations_kept(const Config& c, int layers) {
  const double layer = layer_activation_bytes(c), input = layer_input_bytes(c);
  ActivationsKept kept{layers * layer, 0, layers * layer};
  const TrainingConfig& t = c.training;
  if (t.recompute_granularity == Recompute::Selective) {
    Config all = c;
    all.training.recompute_granularity = Recompute::None;
    kept.without_recompute = layers * layer_activation_bytes(all);
    kept.rebuilt = layers > 0 ? layer_score_bytes(c) : 0;
  } else if (const int recomputed = recomputed_layers(t, layers); recomputed > 0) {
    if (t.recompute_method == RecomputeMethod::Uniform) {
      const int group = std::min(t.recompute_num_layers, layers);
      kept.from_forward = double((layers + group - 1) / group) * input;
      kept.rebuilt = group * layer;
    } else {
      kept.from_forward = recomputed * input + (layers - recomputed) * layer;
      kept.rebuilt = layer;
    }
  }
  return kept;
}

StageKernels stage_kernels(const Config& c, const VirtualStage& stage) {
  StageKernels kernels;
  for (int l = 0; l < stage.layers; ++l) add_layer(c, kernels);
  kernels.tp_allreduces_forward = kernels.tp_allreduces_backward = 2 * stage.layers;
  // R: full recomputation runs the recomputed layers' forward again, collectives included; selective
  // recomputation only the score part of attention, which flash attention's backward already redoes.
  const int recomputed = recomputed_layers(c.training, stage.layers);
  if (recomputed > 0) {
    StageKernels layer;
    add_layer(c, layer);
    for (int l = 0; l < recomputed; ++l) append(kernels.recompute, layer.forward);
    kernels.tp_allreduces_recompute = 2 * recomputed;
  } else if (c.training.recompute_granularity == Recompute::Selective && !c.precision.flash_attention) {
    for (int l = 0; l < stage.layers; ++l) append(kernels.recompute, core_attention_forward(c));
  }
  if (stage.has_head) add_head(c, kernels);
  if (stage.has_embedding) add_embedding(c, kernels);
  return kernels;
}

double total(const std::vector<Kernel>& kernels, double Kernel::*field) {
  double sum = 0;
  for (const Kernel& kernel : kernels) sum += kernel.*field;
  return sum;
}

double seconds(const std::vector<Kernel>& kernels, const HardwareConfig& h) {
  double s = 0;
  for (const Kernel& kernel : kernels) s += kernel_seconds(kernel, h);
  return s;
}

double stage_params(const Config& c, const VirtualStage& stage) {
  const ModelConfig& m = c.model;
  double params = stage.layers * layer_params(m);
  if (stage.has_embedding) params += vocab_params(m);
  if (stage.has_head) params += vocab_params(m) + 2.0 * m.hidden;
  return params / c.parallel.tp;
}

/// Tied embeddings with the first and the last stage on one device: the one matrix that
/// stage_params counts twice, once for the embedding and once for the LM head.
double tied_copy_params(const Config& c, const Layout& layout, int device) {
  const bool both = layout.stages.front().has_embedding && layout.stages.back().has_head &&
                    layout.stages.front().device == device && layout.stages.back().device == device;
  return c.model.tied_embeddings && both ? vocab_params(c.model) / c.parallel.tp : 0;
}

/// Per device, the parameters of its stages and of its vocabulary shards, as its data-parallel
/// collectives move them (a tied matrix that one device holds for both uses counted twice:
/// tied_copy_params).
std::vector<double> device_params(const Config& c, const Layout& layout) {
  std::vector<double> params(std::size_t(layout.devices), vocab_shard_params(c, layout));
  for (const VirtualStage& stage : layout.stages) params[std::size_t(stage.device)] += stage_params(c, stage);
  return params;
}

/// Explicit costs are given for an even share (layers/pp) of the model; a stage scales by its layers.
double share_of_device(const Config& c, const VirtualStage& stage) {
  return double(stage.layers) * c.parallel.pp / c.model.layers;
}

/// Global rank of a pipeline stage's TP-rank 0 under Megatron's order (tp innermost, then dp, then pp).
int global_rank(const Config& c, int device) { return device * c.parallel.tp * c.parallel.dp; }

class AnalyticCostModel final : public CostModel {
 public:
  AnalyticCostModel(const Config& config, const Layout& layout)
      : c_(config), h_(config.hardware), layout_(layout), device_params_(device_params(config, layout)) {
    for (const VirtualStage& stage : layout.stages) {
      const StageKernels kernels = stage_kernels(config, stage);
      // Saturating sums: a speed near zero makes a duration unrepresentable, never a wrapped one.
      const TimeNs recompute = pass(kernels.recompute, kernels.tp_allreduces_recompute, 1);
      stages_.push_back({pass(kernels.forward, kernels.tp_allreduces_forward, 1),
                         add_ns(recompute, pass(kernels.backward, kernels.tp_allreduces_backward, 2)),
                         run(kernels.weight), recompute});
    }
  }
  std::string_view source() const override { return "analytic"; }

 protected:
  TimeNs p2p(const Task& task, const TaskWork& work) const override {
    const bool same_node = global_rank(c_, task.device) / h_.gpus_per_node == global_rank(c_, task.peer) / h_.gpus_per_node;
    return link(work.bytes, same_node);
  }
  TimeNs collective(const Task& task, const TaskWork& work, const CollectiveGroup& group) const override {
    // Pipeline-group collectives span nodes when the pipeline does; DP groups stride by tp·cp.
    const bool intra = task.kind == OpKind::DpAllReduce
                           ? c_.parallel.tp * c_.parallel.cp * c_.parallel.dp <= h_.gpus_per_node
                           : global_rank(c_, c_.parallel.pp - 1) < h_.gpus_per_node;
    const bool all_reduce = task.kind == OpKind::AllReduce ||
                            (task.kind == OpKind::DpAllReduce && group.data == CollectiveData::Gradients);
    // The rounds' bytes go round the ring once; each further round (a few values per token, which
    // NCCL reduces over a tree) waits for the last and adds a tree's latency: up and down its depth.
    const int depth = int(std::ceil(std::log2(std::max(group.ranks, 1))));
    const double latency_us = intra ? h_.intra_node_latency_us : h_.inter_node_latency_us;
    return add_ns(ring(all_reduce, work.bytes, group.ranks, intra),
                  times_ns((group.rounds - 1) * 2 * depth, ns_from_us(latency_us)));
  }
  TimeNs vocab_pass(const Task&, const TaskWork& work) const override {
    // GEMM, then memory-bound softmax or gather kernels: their times add. (No vector: this runs for
    // every vocabulary op of the graph.)
    double s = 0;
    if (work.flops > 0) s += kernel_seconds({work.flops, 0, false}, h_);
    if (work.bytes > 0) s += kernel_seconds({0, work.bytes, false}, h_);
    return ns_from_s(s);
  }
  TimeNs optimizer(int device) const override {
    const double params = device_params_[std::size_t(device)] - tied_copy_params(c_, layout_, device);
    const PrecisionConfig& p = c_.precision;
    // ZeRO shards the update with the optimizer states: each replica updates 1/dp of the parameters.
    const double updated = c_.training.zero_stage >= 1 ? params / c_.parallel.dp : params;
    // Read gradients, read and write weights and optimizer states: one fused kernel (multi-tensor Adam).
    return ns_from_s(kernel_seconds({0, updated * (p.grad_bytes + 2 * (p.param_bytes + p.optimizer_bytes)), false}, h_));
  }

 private:
  TimeNs run(const std::vector<Kernel>& kernels) const { return ns_from_s(seconds(kernels, h_)); }
  TimeNs link(double bytes, bool intra) const {
    const double latency_us = intra ? h_.intra_node_latency_us : h_.inter_node_latency_us;
    const double gbps = intra ? h_.intra_node_gbps : h_.inter_node_gbps;
    return add_ns(ns_from_us(latency_us), ns_from_s(bytes / (gbps * 1e9)));
  }
  /// Ring algorithms: all-reduce 2(n-1) steps of bytes/n; broadcast, reduce, reduce-scatter and
  /// all-gather (n-1) steps.
  TimeNs ring(bool all_reduce, double bytes, int n, bool intra) const {
    if (n <= 1) return 0;
    return times_ns(all_reduce ? 2 * (n - 1) : n - 1, link(bytes / n, intra));
  }
  TimeNs tp_allreduce() const {
    const double bytes = rank_tokens(c_) * c_.model.hidden * c_.precision.activation_bytes;
    return ring(true, bytes, c_.parallel.tp, true);
  }
  /// One round of context parallelism's ring: each rank passes on a block of K and V (s/cp tokens).
  double cp_ring_seconds() const {
    const ModelConfig& m = c_.model;
    if (c_.parallel.cp <= 1) return 0;
    const double block = rank_tokens(c_) * 2.0 * m.key_value_heads() / m.heads * m.hidden / c_.parallel.tp *
                         c_.precision.activation_bytes;
    const bool intra = c_.parallel.tp * c_.parallel.cp <= h_.gpus_per_node;
    return (c_.parallel.cp - 1) * double(link(block, intra)) * 1e-9;
  }
  /// A pass's kernels, then the communication they leave exposed: its `tp_collectives` (all of them,
  /// or under tp_comm_overlap what the pass's GEMMs cannot cover) and, per attention kernel,
  /// `ring_rounds` of context parallelism's K/V ring (K and V forward; with dK and dV backward),
  /// overlapped with that attention.
  TimeNs pass(const std::vector<Kernel>& kernels, int tp_collectives, int ring_rounds) const {
    double gemm = 0, attention = 0, attention_kernels = 0;
    for (const Kernel& k : kernels) {
      if (k.attention) attention += kernel_seconds(k, h_), ++attention_kernels;
      else if (k.flops > 0) gemm += kernel_seconds(k, h_);
    }
    TimeNs time = run(kernels);
    const TimeNs tp_comm = times_ns(tp_collectives, tp_allreduce());
    time = add_ns(time, c_.training.tp_comm_overlap ? ns_from_s(std::max(0.0, double(tp_comm) * 1e-9 - gemm)) : tp_comm);
    const double ring = attention_kernels * ring_rounds * cp_ring_seconds();
    return ring > 0 ? add_ns(time, ns_from_s(std::max(0.0, ring - attention))) : time;
  }

  const Config& c_;
  const HardwareConfig& h_;
  const Layout& layout_;
  const std::vector<double> device_params_;  ///< device_params
};

class ExplicitCostModel final : public CostModel {
 public:
  ExplicitCostModel(const Config& config, const Layout& layout) {
    const ExplicitCosts& costs = *config.costs;
    const auto at = [](const std::vector<double>& values, int device) {
      return values.size() == 1 ? values[0] : values[static_cast<std::size_t>(device)];
    };
    for (const VirtualStage& stage : layout.stages) {
      const double share = share_of_device(config, stage);
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

std::vector<StageWork> stage_work(const Config& config, const Layout& layout) {
  const ModelConfig& m = config.model;
  // W needs the inputs of the four GEMMs of each layer: b·s·(3h + f) elements.
  const double weight_held_fraction = rank_tokens(config) * (3.0 * m.hidden + m.ffn_hidden) *
                                      config.precision.activation_bytes / config.parallel.tp /
                                      std::max(1.0, layer_activation_bytes(config));
  std::vector<StageWork> work;
  for (const VirtualStage& stage : layout.stages) {
    const StageKernels kernels = stage_kernels(config, stage);
    StageWork w;
    w.forward_flops = total(kernels.forward, &Kernel::flops);
    w.backward_flops = total(kernels.backward, &Kernel::flops);
    w.weight_flops = total(kernels.weight, &Kernel::flops);
    w.forward_bytes = total(kernels.forward, &Kernel::bytes);
    w.backward_bytes = total(kernels.backward, &Kernel::bytes);
    w.weight_bytes = total(kernels.weight, &Kernel::bytes);
    w.recompute_flops = total(kernels.recompute, &Kernel::flops);
    w.recompute_bytes = total(kernels.recompute, &Kernel::bytes);
    const ActivationsKept kept = activations_kept(config, stage.layers);
    double layer_bytes = kept.from_forward;
    w.recomputed_bytes = static_cast<Bytes>(std::llround(kept.rebuilt));
    if (config.costs && config.costs->activation_bytes)
      layer_bytes = *config.costs->activation_bytes * share_of_device(config, stage);
    double head_bytes = 0;
    if (stage.has_head)  // fp32 logits kept for the softmax gradient, plus its input
      head_bytes = config.costs ? config.costs->output_activation_bytes
                                : rank_tokens(config) * (4.0 * m.vocab + config.precision.activation_bytes * m.hidden) /
                                      config.parallel.tp;
    w.activation_bytes = static_cast<Bytes>(std::llround(layer_bytes + head_bytes));
    // W needs what the backward had, recomputed or not.
    const double full_layers = config.costs && config.costs->activation_bytes ? layer_bytes : kept.without_recompute;
    w.weight_held_bytes = static_cast<Bytes>(std::llround(full_layers * std::min(1.0, weight_held_fraction)));
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
  const double tokens = rank_tokens(config), h = m.hidden, t = config.parallel.tp;
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

double vocab_shard_params(const Config& c, const Layout& layout) {
  if (layout.vocab == VocabPlacement::OnStages) return 0;
  // Rows of the embedding and of the LM head; tied, one matrix serves both.
  return (c.model.tied_embeddings ? 1.0 : 2.0) * layout.padded_vocab / layout.devices * c.model.hidden / c.parallel.tp;
}

std::vector<Bytes> static_memory_bytes(const Config& config, const Layout& layout) {
  const auto devices = static_cast<std::size_t>(layout.devices);
  std::vector<double> params = device_params(config, layout), largest_stage(devices, 0.0);
  for (const VirtualStage& stage : layout.stages) {
    const auto d = static_cast<std::size_t>(stage.device);
    largest_stage[d] = std::max(largest_stage[d], stage_params(config, stage));
  }
  const int zero = config.training.zero_stage, dp = config.parallel.dp;
  std::vector<Bytes> bytes;
  for (std::size_t d = 0; d < devices; ++d) {
    params[d] -= tied_copy_params(config, layout, int(d));
    double held = params[d] * bytes_per_param(config.precision, zero, dp);
    // ZeRO-3 gathers a chunk's weights before its F and B and frees them after: the chunk in use and
    // the next one, fetched ahead, are whole.
    if (zero == 3 && dp > 1) held += 2 * largest_stage[d] * config.precision.param_bytes;
    bytes.push_back(static_cast<Bytes>(std::llround(held)));
  }
  return bytes;
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
    case OpKind::DpAllReduce:
      return collective(task, graph.work_of(task), graph.groups()[static_cast<std::size_t>(task.group)]);
    case OpKind::Optimizer: return optimizer(task.device);
  }
  return 0;
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

std::vector<OpWork> analytic_op_work(const Config& config) {
  Config one = config;
  one.parallel.tp = 1;
  const auto kernels_of = [&](int layers, bool head, bool embedding) {
    return stage_kernels(one, {.device = 0, .chunk = 0, .first_layer = 0, .layers = layers,
                               .has_embedding = embedding, .has_head = head});
  };
  const StageKernels layer = kernels_of(1, false, false), head = kernels_of(0, true, false),
                     embedding = kernels_of(0, false, true);
  return {{"layer_forward", layer.forward},   {"layer_backward", layer.backward},
          {"layer_weight", layer.weight},     {"output_forward", head.forward},
          {"output_backward", head.backward}, {"output_weight", head.weight},
          {"input_forward", embedding.forward}, {"input_backward", embedding.weight}};
}

// cuBLAS runs a GEMM as output tiles, one per SM at a time; 128×128 is its common bf16 tile on A100
// and H100. Past one wave the tail is balanced (stream-K, split-K), which the H100 measurements in
// docs/data show: over their shapes (all at least one wave) a per-wave model explains nothing.
// Split-K below one wave is not modelled, so the fill there is a lower bound (docs/cost-model.md).
double tile_fill(const Kernel& kernel, int sms) {
  if (kernel.rows <= 0 || kernel.cols <= 0 || sms <= 0) return 1;
  constexpr double kTile = 128;
  const double tiles = std::ceil(kernel.rows / kTile) * std::ceil(kernel.cols / kTile);
  return kernel.rows * kernel.cols / (kTile * kTile * std::max(tiles, double(sms)));
}

double kernel_seconds(const Kernel& kernel, const HardwareConfig& h) {
  const double efficiency =
      kernel.attention ? h.attention_efficiency : h.compute_efficiency * tile_fill(kernel, h.sms);
  return std::max(kernel.flops / (h.peak_tflops * 1e12 * efficiency), kernel.bytes / (h.hbm_gbps * 1e9 * h.hbm_efficiency)) +
         h.kernel_launch_us * 1e-6;
}

double analytic_seconds(const OpWork& work, const HardwareConfig& h) { return seconds(work.kernels, h); }

}  // namespace pipesim
