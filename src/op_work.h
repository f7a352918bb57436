#pragma once
/// The work and memory each op of the graph carries, per microbatch and tensor-parallel rank:
/// FLOPs and HBM bytes (summed over its kernels, kernels.h) and the activation bytes it takes and
/// returns (parallel_shape.h's activations_kept, and the vocabulary passes' logits).
#include <algorithm>
#include <vector>

#include "config.h"
#include "layout.h"
#include "units.h"

namespace pipesim {

/// Work and memory of one virtual stage for one microbatch, per tensor-parallel rank.
struct StageWork {
  double forward_flops = 0, backward_flops = 0, weight_flops = 0;  ///< backward: input-gradient part
  double forward_bytes = 0, backward_bytes = 0, weight_bytes = 0;  ///< HBM traffic
  double recompute_flops = 0, recompute_bytes = 0;  ///< R, the recomputation before B; 0: no R
  Bytes activation_bytes = 0;   ///< taken at F, kept until the backward has used it
  Bytes recomputed_bytes = 0;   ///< taken at R (what it rebuilds, at its largest), returned by B
  Bytes weight_held_bytes = 0;  ///< kept past B until W when W is split off
  double params = 0;            ///< parameters of this stage on one rank (stage_params)
  double expert_params = 0;     ///< the routed experts' share of them (stage_expert_params)
  double embedding_params = 0;  ///< the input embedding's share of them (a stage that holds it)
  double head_params = 0;       ///< the LM head's and the final norm's (a stage that holds them)
  /// MoE layers whose tokens leave the rank (exchanges_experts): F and B each end in an ALLTOALL
  /// carrying `exchange_bytes` per layer and all-to-all.
  int expert_exchanges = 0;
  double exchange_bytes = 0;
  int exchange_ranks = 1;  ///< ep: the ranks each all-to-all spans
  bool recomputes() const { return recompute_flops > 0 || recompute_bytes > 0; }
  /// What R takes: under a W split, at least what W will need beyond what F kept.
  Bytes recompute_alloc(bool split_weight) const {
    if (!recomputes()) return 0;
    return split_weight ? std::max(recomputed_bytes, weight_held_bytes - activation_bytes) : recomputed_bytes;
  }
  /// What B returns: everything F and R took except what W still needs.
  Bytes backward_free(bool split_weight) const {
    return activation_bytes + recompute_alloc(split_weight) - (split_weight ? weight_held_bytes : 0);
  }
};

/// Per-stage work under the analytic model; `costs.activation_bytes` overrides the memory.
std::vector<StageWork> stage_work(const Config& config, const Layout& layout);

/// Work of the vocabulary-parallel passes on one device for one microbatch (docs/vocabulary-parallelism.md), with
/// the vocabulary split into layout.padded_vocab / p rows per device. GEMM FLOPs and memory-bound
/// bytes are kept apart: the passes run them as separate kernels, one after the other.
struct VocabWork {
  double s_flops = 0, s_bytes = 0;    ///< S: logits (+ softmax·W for Algorithm 2), local softmax stats
  double t_flops = 0, t_bytes = 0;    ///< T: dW (+ dX for Algorithm 1), softmax gradient
  double input_forward_bytes = 0;     ///< IF: gather of the rows in this shard
  double input_backward_bytes = 0;    ///< IB: scatter-add into this shard's gradient
  Bytes s_activation_bytes = 0;       ///< kept from S to T: fp32 logits shard and the input X
  double output_broadcast_bytes = 0;  ///< the last transformer output X, to every device
  double barrier0_bytes = 0;          ///< C0: max, sum-exp, target logit (+ dX for Algorithm 2)
  double barrier1_bytes = 0;          ///< C1 (Algorithm 1): dX
  double input_reduce_bytes = 0;      ///< the summed embedding output, to the first stage
  double grad_broadcast_bytes = 0;    ///< the embedding output's gradient, from the first stage
};
VocabWork vocab_work(const Config& config, const Layout& layout);

/// Explicit costs are given for an even share (layers/pp) of the model: the share `stage` is of it.
double explicit_share(const Config& c, const VirtualStage& stage);

}  // namespace pipesim
