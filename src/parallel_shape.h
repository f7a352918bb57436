#pragma once
/// What the parallel layout makes of one model, in one place: GPU counts and ranks, the global batch
/// and its microbatches, the tokens a rank works on, the bytes of an activation that crosses a stage,
/// ZeRO's sharding, the parameters and static bytes each stage and device holds, the activations a
/// stage keeps and rebuilds, and the memory a device or this machine offers. The cost model, the
/// schedules' order evaluation, the planner, the runtime and the commands all read these, so they
/// cannot disagree
/// (docs/cost-model.md, "Memory").
#include <cstdint>
#include <optional>
#include <vector>

#include "config.h"
#include "layout.h"
#include "units.h"

namespace pipesim {

/// GPUs the config runs on: pp · tp · cp · dp.
int gpu_count(const ParallelConfig& p);

/// Megatron-LM's global batch: the sequences one iteration trains on over every data-parallel replica,
/// microbatches · micro_batch_size · dp.
std::int64_t global_batch_size(const Config& c);

/// The microbatches per pipeline of a global batch of `global_batch` sequences in micro-batches of
/// `micro_batch_size` on each of `dp` replicas: global_batch / (micro_batch_size · dp), or nullopt when
/// that is not a whole number of at least 1 that fits an int. The one place a global batch becomes
/// microbatches: the config reader (training.global_batch_size, after every --set), tune's candidates
/// and so sweep's points all come here.
std::optional<int> microbatches_for(std::int64_t global_batch, int micro_batch_size, int dp);

/// Sets parallel.microbatches from training.global_batch_size where the config gives one. An error on
/// training.global_batch_size when the batch does not split (naming the three numbers and the nearest
/// global batches and micro-batch sizes that do) or splits into more microbatches than pipesim takes.
std::optional<FieldError> derive_microbatches(Config& c);

/// The global rank of pipeline device `device`'s first GPU in Megatron-LM's order: tensor-parallel
/// ranks innermost, then context-parallel, then data-parallel, then pipeline.
int global_rank(const ParallelConfig& p, int device);

/// Tokens of one microbatch on one context-parallel rank: b·s/cp.
double rank_tokens(const Config& c);

/// One activation of the hidden width for one microbatch on one rank: what crosses a stage boundary
/// (forward, and its gradient backward) and what full recomputation keeps of a layer's input.
/// b·s/cp · h · activation_bytes, split over tp under sequence parallelism.
double hidden_activation_bytes(const Config& c);

/// What one rank sends in one expert-parallel all-to-all of one MoE layer (a dispatch or a combine):
/// its routed copies, top-k of each token of its sequence-parallel share b·s/(cp·tp), h wide, as many
/// as the busiest expert's load (moe_load) makes them.
double expert_exchange_bytes(const Config& c);
/// Whether a MoE layer's tokens leave the rank (ep or etp > 1): then F and B each end in an ALLTOALL.
bool exchanges_experts(const Config& c);

/// Members of an expert-parallel group in one node: they lie etp apart in rank order (Megatron-Core's
/// expert grid), so gpus_per_node/etp of them, at most ep.
int expert_ranks_per_node(const Config& c);
/// The nodes, its own among them, that one token's routed copies reach on average: the expected
/// number of distinct nodes among top-k experts drawn evenly, fewer under group-limited routing
/// (docs/cost-model.md, "Mixture of experts").
double expert_nodes_per_token(const Config& c);
/// What one rank's part of one expert-parallel all-to-all (one dispatch or combine of one MoE layer)
/// puts on NVLink and on its network port.
struct ExpertTraffic {
  double intra_node = 0, inter_node = 0;  ///< bytes
};
/// `mxfp8_wire`: the forward dispatch under training.moe_dispatch_fwd_dtype "mxfp8".
ExpertTraffic expert_traffic(const Config& c, bool mxfp8_wire);

/// What ZeRO (Rajbhandari et al. 2020; Megatron-LM's distributed optimizer at stage 1) shards over
/// the dp replicas: stage 1 the optimizer states, stage 2 also the gradients, stage 3 also the
/// weights. Nothing is sharded with one replica.
struct ZeroSharding {
  int stage = 0;
  int dp = 1;
  /// Whether any state is sharded: each replica then owns 1/dp of it (its optimizer updates that part).
  bool any() const { return dp > 1 && stage >= 1; }
  bool optimizer_states() const { return any(); }
  bool gradients() const { return dp > 1 && stage >= 2; }
  bool parameters() const { return dp > 1 && stage >= 3; }
  /// Weights + gradients + optimizer states a device holds per parameter of its stages.
  double bytes_per_param(const PrecisionConfig& p) const;
};
ZeroSharding zero_sharding(const Config& c);

/// The expert data-parallel group (Megatron-Core's expert grid): the tp·cp·dp ranks of a stage
/// that hold the same experts, tp·cp·dp / (ep·etp). check_config holds ep·etp to divide tp·cp·dp.
int expert_data_parallel(const ParallelConfig& p);
/// ZeRO over the expert data-parallel group: what the expert weights' gradients and optimizer
/// states are sharded over.
ZeroSharding expert_zero_sharding(const Config& c);

/// Parameters of `count` layers from `first` on one rank: the tensor-parallel part split over tp, the
/// routed experts over ep·etp, the router whole (layer_param_parts). `experts` is the routed part.
struct RankParams {
  double all = 0, experts = 0;
};
RankParams layers_rank_params(const Config& c, int first, int count);

/// Parameters of one virtual stage on one rank: its layers (layers_rank_params), and the embedding or
/// the LM head (with the final norm) when the stage holds them.
double stage_params(const Config& c, const VirtualStage& stage);
/// The routed experts' share of stage_params: what the expert data-parallel group reduces.
double stage_expert_params(const Config& c, const VirtualStage& stage);
/// Parameters a gradient bucket of Megatron-LM's data-parallel buffer holds (training.bucket_size, or
/// Megatron-Core's default max(40M, 1M·dp)); 0 where the stage's collectives are not bucketed:
/// without overlap_grad_reduce, or under ZeRO 3 (docs/cost-model.md, "The training job").
double gradient_bucket_params(const Config& c);
/// Per device, the routed experts' parameters it holds.
std::vector<double> device_expert_params(const Config& c, const Layout& layout);
/// Parameters of the vocabulary shards each device holds when the vocabulary is split over devices
/// (per tensor-parallel rank; one matrix for both uses when the embeddings are tied); 0 when it is not.
double vocab_shard_params(const Config& c, const Layout& layout);
/// Tied embeddings with the first and the last stage on one device: the one matrix that
/// stage_params counts twice, once for the embedding and once for the LM head.
double tied_copy_params(const Config& c, const Layout& layout, int device);
/// Tied embeddings on two devices: the matrix each of them holds a copy of, whose gradients the
/// graph sums between them; 0 otherwise.
double tied_apart_params(const Config& c, const Layout& layout);
/// Per device, the parameters of its stages and of its vocabulary shards, as its data-parallel
/// collectives move them (a tied matrix that one device holds for both uses counted twice:
/// tied_copy_params).
std::vector<double> device_params(const Config& c, const Layout& layout);
/// Parameters each device's optimizer updates: its own (a tied matrix once), 1/dp of them when ZeRO
/// shards the optimizer states (the routed experts' 1/expert_data_parallel).
double updated_params(const Config& c, const Layout& layout, int device);

/// Transformer-layer parameters a device holds (its stages' layers, on its tensor-parallel rank): what
/// FP8 training keeps a second, FP8 copy of.
double device_layer_params(const Config& c, const Layout& layout, int device);

/// Parameters + gradients + optimizer states held by each device, in bytes (the routed experts' under
/// expert_zero_sharding); under ZeRO 3 also the
/// two whole chunks of weights a device gathers (the one in use and the next, fetched ahead); under
/// FP8 also the layers' FP8 weights, each with its transpose (2 bytes a parameter).
std::vector<Bytes> static_memory_bytes(const Config& c, const Layout& layout);

/// A stage's transformer activations for one microbatch: what F keeps for the backward, what R
/// rebuilds at its largest, and what F would keep without recomputation.
struct ActivationsKept {
  double from_forward = 0, rebuilt = 0, without_recompute = 0;
};
/// For a stage of `layers` layers from layer `first` under the config's recomputation (Korthikanti et al. 2022):
/// uniform full recomputation keeps the input of each group of recompute_num_layers layers and
/// rebuilds one group at a time; block keeps the input of each of its first layers, and the rest
/// whole, rebuilding one layer at a time; selective keeps all but the score matrices and rebuilds one
/// layer's (none under flash attention); selective_op keeps op_checkpoint_bytes a layer and rebuilds
/// the rest of one layer's.
ActivationsKept activations_kept(const Config& c, int first, int layers);

/// The memory a device offers the training job's tensors: hardware.memory_gib less
/// hardware.reserved_gib (the CUDA context, NCCL and the allocator take the rest), never below 0.
Bytes memory_capacity_bytes(const HardwareConfig& h);
/// The physical memory of the machine this process runs on: what a plan or a CPU run may use.
Bytes host_memory_bytes();

}  // namespace pipesim
