#pragma once
/// A mixture-of-experts MLP in fp32 on the CPU: what a Llama-family layer that ModelShape::moe_layer
/// marks runs in place of its dense SwiGLU MLP, on the second norm's output (model.h calls it). In
/// the conventions of kernels.h: row-major, n = batch·seq rows, backward passes accumulate (+=).
///
/// - Router: logits = x·R (R is h × E), in fp32. Each token takes the k experts of the largest
///   logits, best first, ties to the lower expert index; its gate weights are the softmax over
///   those k logits, which is the softmax over all E experts renormalised over the k chosen
///   (Mixtral's routing, Qwen-MoE's norm_topk_prob, Megatron-Core's default top-k then softmax).
/// - Dispatch: the n·k routed copies of the tokens are permuted into expert order (expert by expert,
///   tokens in order within one), so that each expert's rows are one block its GEMMs run on.
/// - Experts: each a SwiGLU MLP of width f, down(silu(gate(x)) · up(x)), with a fused [gate | up]
///   map as the dense layer's. No tokens are dropped (Megatron-Core's dropless MoE).
/// - Combine: y_t = Σ_j gate_tj · expert_{e_tj}(x_t), summed over each token's k copies in its
///   order (best first) whatever the permutation; plus, when given, a shared expert: a dense SwiGLU
///   MLP of width fs on every token, added. (A model's layer runs its shared expert as it runs a
///   dense MLP, split over the tensor-parallel ranks (model.cpp), and gives none here.)
/// - Load balancing (Switch Transformer, Megatron-Core's aux_loss): aux = coeff · E · Σ_i f_i · P_i
///   with f_i the fraction of the n·k routed copies that expert i takes and P_i the mean over tokens
///   of its probability in the softmax over all E logits, both over the microbatch's n tokens. The routing counts f_i are constants of
///   the gradient; P_i carries it into the router. The caller weighs it as it weighs the
///   microbatch's loss (aux_loss_weight); its value is kept, not added to the reported loss, as
///   Megatron-LM logs it apart from the LM loss.
///
/// - Expert parallelism (with an ExpertParallel group of P ranks): the layer's routed experts are
///   split over the group, rank r holding experts [r·E/P, (r + 1)·E/P) (its MoeWeights' expert maps
///   hold those E/P blocks only). Each rank routes its own tokens as above; dispatch sends each
///   routed copy to the rank of its expert (first the counts, expert by expert, then the rows), that
///   rank runs each of its experts on the rows every rank sent it (one block per expert, sources in
///   rank order), and combine sends the outputs back, where the gate-weighted sum happens. The
///   backward mirrors it: the outputs' gradients are dispatched, the inputs' combined back. The
///   weight pass needs no exchange: it reads what the expert's rank kept.
/// - Sequence parallelism (with a TensorParallel group): x holds this rank's share of the
///   microbatch's tokens (Megatron-Core's MoE under tensor parallelism: each expert whole on one
///   rank, or split over the group by expert tensor parallelism, below), which it routes and runs as
///   above. The routing counts f_i are summed over the group, so that the ranks' load-balancing
///   losses (P_i's terms of their own tokens) add up to the microbatch's, and so do their router
///   gradients, which the caller sums over the group.
/// - Expert tensor parallelism (with an expert-tensor-parallel group of T ranks, which hold the same
///   experts): each expert's MLP splits over the group as a dense tensor-parallel one does, rank t
///   holding columns [t·f/T, (t + 1)·f/T) of its gate and of its up projection and those rows of
///   its down projection. After dispatch the group's ranks all-gather the rows they received (by
///   expert, ranks in order within one), run their slice on all of them, and sum the partial outputs
///   back to the rank that received each row (a reduce-scatter) before combine; the backward
///   gathers the output gradients and sums the input gradients likewise. A slice's weight gradient
///   sums over every row the group ran (Megatron-Core's expert tensor parallelism).
///
/// Deterministic: every sum runs in a fixed order, so the same inputs give the same bits however
/// the model is partitioned over devices (under expert parallelism an expert's weight gradient sums
/// the rows of every rank's tokens in one GEMM, which fp32 rounds differently from one per rank;
/// under expert tensor parallelism the outputs add the slices' partial sums).
#include <cstddef>
#include <span>
#include <vector>

#include "model_shape.h"
#include "tensor_parallel.h"

namespace pipesim::cpu {

using runtime::ExpertParallel;
using runtime::TensorParallel;

/// The weights of one MoE MLP, as linear maps x·W: the router h × E; the experts' fused gate and up
/// projections, E blocks of h × 2f one after the other (each row [gate | up]); their down
/// projections, E blocks of f × h; the shared expert's h × 2fs and fs × h (empty without one).
struct MoeWeights {
  std::span<const float> router, expert_fc1, expert_fc2, shared_fc1, shared_fc2;
};
/// Gradient accumulators of the same shapes.
struct MoeGradients {
  std::span<float> router, expert_fc1, expert_fc2, shared_fc1, shared_fc2;
};

/// What the forward keeps for the backward and the weight pass (besides x, which the layer keeps as
/// its second norm's output).
struct MoeCache {
  std::vector<float> probs;  ///< n × E: the softmax over every expert, the load-balancing loss's P
  std::vector<int> chosen;   ///< n × k: each token's experts, best first
  std::vector<float> gates;  ///< n × k: their weights, the softmax over the chosen logits
  /// n·k: the routed copies in expert order, each as t·k + j (token t's j-th choice).
  std::vector<int> rows;
  std::vector<int> first_row;  ///< E + 1: where each expert's block of `rows` starts
  /// The rows this rank's experts ran, by source rank then expert (P × E/P): what each rank of the
  /// expert-parallel group sent it (without one, each expert's count of this rank's copies).
  std::vector<int> received;
  /// E/P + 1: where each of this rank's experts' block of `permuted`, `fc1` and `act` starts.
  std::vector<int> expert_first_row;
  /// T × E/P: each rank of the expert-tensor-parallel group's rows of each of these experts (T = 1
  /// without one: this rank's own).
  std::vector<int> etp_rows;
  /// Per row this rank's experts ran, expert by expert (sources in rank order within one): its input
  /// (h), the fused [gate | up] (2f), silu(gate)·up (f). Without expert parallelism: the routed copies
  /// in expert order.
  std::vector<float> permuted, fc1, act;
  /// n·k × h: the expert's output of each of this rank's routed copies, in expert order (combined back).
  std::vector<float> out;
  std::vector<float> shared_fc1, shared_act;  ///< n × 2fs, n × fs; empty without a shared expert
  /// E: each expert's routed copies of the whole microbatch (every rank of a sequence-parallel group),
  /// and the microbatch's tokens: the load-balancing loss's f_i.
  std::vector<int> microbatch_routed;
  int microbatch_tokens = 0;
  double aux_loss = 0;  ///< coeff · E · Σ f_i·P_i of this microbatch (this rank's tokens' part of it)
  std::size_t bytes() const;
};

/// The output gradient of each linear map, kept by a backward whose weight gradients a separate
/// pass adds (a W op split off B): the router's logits, the experts' two maps (expert order) and the
/// shared expert's.
struct MoeDeferred {
  std::vector<float> router_dy, expert_fc1_dy, expert_fc2_dy, shared_fc1_dy, shared_fc2_dy;
  std::size_t bytes() const;
};

/// y (n × h) = the MoE MLP of x (n × h), overwritten; n is x's rows. With `ep`, w holds this rank's
/// experts only and the group's other ranks run the same layer at the same time (their own tokens).
/// With `tp`, x is this rank's share of the microbatch's tokens, the group's other ranks' the rest.
/// With `etp`, w holds this rank's slice of each of its experts (cpu::expert_part) and the group's
/// other ranks the other slices of the same experts.
void moe_forward(const runtime::ModelShape& shape, const MoeWeights& w, std::span<const float> x, std::span<float> y,
                 MoeCache& cache, ExpertParallel* ep = nullptr, TensorParallel* tp = nullptr,
                 TensorParallel* etp = nullptr);
/// dx += the gradient of x given dy, the gradient of y, and of aux_loss_weight · cache.aux_loss;
/// adds the weight gradients into `grad`, or with `deferred` keeps what moe_weight_backward needs.
void moe_backward(const runtime::ModelShape& shape, const MoeWeights& w, std::span<const float> x,
                  const MoeCache& cache, std::span<const float> dy, std::span<float> dx, const MoeGradients& grad,
                  MoeDeferred* deferred, float aux_loss_weight, ExpertParallel* ep = nullptr,
                  TensorParallel* etp = nullptr);
/// The weight gradients moe_backward deferred: the same sums, so the same bits (of this rank's
/// experts, from the rows it kept: no exchange).
void moe_weight_backward(const runtime::ModelShape& shape, std::span<const float> x, const MoeCache& cache,
                         const MoeDeferred& deferred, const MoeGradients& grad);

}  // namespace pipesim::cpu
