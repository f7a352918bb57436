#pragma once
/// The configuration model: what a user describes in JSON, as plain values. Parsing lives in
/// tools/ (this layer includes no JSON library); semantic checks that need no file live here.
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace pipesim {

/// The MLP of a transformer layer: GPT's two matrices around a GELU, or the gated SwiGLU of Llama,
/// Qwen and Mistral (gate and up projections, SiLU, down projection: three matrices).
enum class MlpKind { Gelu, SwiGlu };

struct ModelConfig {
  int layers = 0;
  int hidden = 0;
  int heads = 0;
  int kv_heads = 0;       ///< key/value heads (grouped-query attention); 0 in a fresh struct means `heads`
  int ffn_hidden = 0;
  int seq_len = 0;
  int vocab = 0;
  int micro_batch_size = 1;
  MlpKind mlp = MlpKind::Gelu;
  /// The LM head reuses the embedding. Each pipeline stage that needs it still holds a copy (as
  /// Megatron does), so per-device memory and time do not change; reported for the record.
  bool tied_embeddings = false;
  // Mixture of experts, named as Megatron-LM's arguments (docs/config.md, "Mixture of experts").
  int num_experts = 0;                          ///< routed experts a MoE layer holds; 0: every layer dense
  int moe_router_topk = 2;                      ///< experts each token is routed to
  int moe_ffn_hidden_size = 0;                  ///< one expert's MLP width; 0 in a fresh struct means ffn_hidden
  int moe_shared_expert_intermediate_size = 0;  ///< the shared experts' MLP width, beside the routed ones; 0: none
  /// Which layers are MoE: with an empty pattern every moe_layer_freq-th from the first (layer i when
  /// i % freq == 0), else pattern[i] (DeepSeek-V3's first three layers dense: 0, 0, 0, 1, 1, ...).
  int moe_layer_freq = 1;
  std::vector<int> moe_layer_pattern{};
  /// Tokens an expert takes at most, as a multiple of its even share (the rest are dropped); absent:
  /// dropless, every token routed.
  std::optional<double> moe_capacity_factor{};
  /// Tokens of the busiest expert over the mean (>= 1): its GEMMs and the all-to-all it receives wait
  /// for that many; capped by the capacity factor.
  double moe_imbalance = 1;
  /// Group-limited routing (DeepSeek-V3's node-limited routing): the experts fall into
  /// moe_router_num_groups equal groups in order, and each token's experts come from
  /// moe_router_group_topk of them. 0: unlimited.
  int moe_router_num_groups = 0, moe_router_group_topk = 0;
  /// Channels of one attention head (Megatron-LM's --kv-channels, Hugging Face's head_dim); 0 in a
  /// fresh struct means hidden / heads.
  int head_dim = 0;
  /// Multi-head latent attention (DeepSeek-V2/V3), as Megatron-LM names it: queries through a rank
  /// q_lora_rank bottleneck (0: a full projection), keys and values through one of kv_lora_rank (0: no
  /// MLA); each head's query and key have qk_nope_head_dim + qk_rope_head_dim channels, its value
  /// v_head_dim.
  int q_lora_rank = 0, kv_lora_rank = 0, qk_nope_head_dim = 0, qk_rope_head_dim = 0, v_head_dim = 0;
  int key_value_heads() const { return kv_heads > 0 ? kv_heads : heads; }
  int head_channels() const { return head_dim > 0 ? head_dim : hidden / heads; }
  bool latent_attention() const { return kv_lora_rank > 0; }
  bool has_experts() const { return num_experts > 0; }
  int expert_ffn_hidden() const { return moe_ffn_hidden_size > 0 ? moe_ffn_hidden_size : ffn_hidden; }
};

struct ParallelConfig {
  int pp = 1;            ///< pipeline-parallel devices (one simulated pipeline)
  int tp = 1;            ///< tensor-parallel degree inside each stage
  int dp = 1;            ///< data-parallel replicas of the whole pipeline
  int cp = 1;            ///< context parallelism: each rank of a cp group holds seq_len / cp tokens
  int microbatches = 1;  ///< microbatches per iteration per pipeline (m)
  int chunks = 1;        ///< model chunks per device (v); interleaved schedules need v >= 2
  /// Megatron's sequence parallelism: the norms and dropouts work on seq_len / tp tokens and keep
  /// 1/tp of their activations; tensor-parallel all-reduces become all-gathers and reduce-scatters.
  bool sequence_parallel = true;
  /// Expert parallelism (MoE layers only, Megatron-Core's folding): ep ranks each hold num_experts/ep
  /// experts, each expert split over etp ranks (0 in a fresh struct means tp). The expert groups are
  /// carved out of the tp·cp·dp ranks of a stage; the rest of them are the expert data-parallel group
  /// (expert_data_parallel in parallel_shape.h).
  int ep = 1;
  int etp = 0;
  int expert_tp() const { return etp > 0 ? etp : tp; }
};

/// Where the vocabulary layers (embedding, LM head and loss) run: on the first and the last stage
/// (baseline; redistribute also moves transformer layers off those stages), or split over every
/// device (Vocabulary Parallelism's Algorithms 1 and 2, or interlaced). The modes' table, with what
/// each does and how it lays out, is plan.h's vocab_modes().
enum class VocabMode { Baseline, Redistribute, Vocab1, Vocab2, Interlaced };
/// "baseline", "redistribute", "vocab-1", "vocab-2" or "interlaced", as configs spell it.
std::string_view vocab_mode_name(VocabMode mode);
/// The mode a config names, or nullopt for a name that is none of them.
std::optional<VocabMode> vocab_mode_named(std::string_view name);
/// Every mode's name, in the order of the enum (and of `pipesim list`).
std::vector<std::string> vocab_mode_names();

/// The activation memory per device that the automatic zero-bubble scheduler (zb-auto) may fill:
/// as the zero-bubble paper states its limits, a multiple of 1F1B's peak activation memory (1 for
/// ZB-1p, 2 for ZB-2p), or bytes, or all that fits beside the device's static memory.
struct ActivationLimit {
  enum class Unit { Fit, Times1F1B, Bytes };
  Unit unit = Unit::Fit;
  double value = 0;  ///< the multiple, or bytes; unused for Fit
  bool operator==(const ActivationLimit&) const = default;
};
/// "fit", "2x" or "40 GiB", as configs spell it (config.cpp).
std::string activation_limit_text(const ActivationLimit& limit);

struct ScheduleConfig {
  std::string name = "1f1b";
  VocabMode vocab = VocabMode::Baseline;
  /// Transformer layers for the `redistribute` vocabulary mode, one count per device or one per
  /// virtual stage (split_per_stage in layout.h); empty means "auto" (the split that minimises the
  /// slowest stage under the cost model).
  std::vector<int> layers_per_stage;
  ActivationLimit memory_limit;  ///< read by zb-auto only
};

/// Every field is a number the user can override; presets only fill defaults.
struct HardwareConfig {
  std::string preset;
  double peak_tflops = 0;          ///< dense bf16/fp16 peak per GPU, TFLOP/s
  double compute_efficiency = 0;   ///< achieved fraction of peak for GEMMs
  double attention_efficiency = 0; ///< achieved fraction of peak for fused causal attention (cuDNN's)
  /// The same for FlashAttention-2's kernels (precision.attention_kernel "flash2"): on Hopper about
  /// 0.62 of cuDNN's (docs/cost-model.md, "Attention kernels"); on the A100 the same kernel.
  double flash2_attention_efficiency = 0;
  /// Fused causal attention over L keys runs at the efficiencies above × L / (L + this): a cost per
  /// query row that does not shrink with L (the diagonal tiles, loading each query tile, rescaling its
  /// output), fitted to the kernels' published rates from 0.5K to 16K tokens (docs/cost-model.md,
  /// "Attention kernels"). The efficiencies above are then the long-sequence ones. 0: no such cost.
  double attention_overhead_tokens = 0;
  double hbm_gbps = 0;             ///< HBM bandwidth, GB/s
  double hbm_efficiency = 0;       ///< achieved fraction of HBM bandwidth
  double intra_node_gbps = 0;      ///< GPU-to-GPU link inside a node, per direction, GB/s
  /// The share of intra_node_gbps NCCL's transfers carry: NVLink's line rate less its protocol's
  /// overhead, about 20% (NVIDIA/nccl-tests#212: "NCCL can get an effective NVLink bandwidth of
  /// 370GB/s" of the H100's 450; docs/cost-model.md, "Analytic"). nvlink_gbps() applies it.
  double intra_node_efficiency = 1;
  double intra_node_latency_us = 0;
  /// Bus bandwidth of an all-reduce inside one node through NVLink SHARP, the NVSwitch reducing the
  /// data (NCCL's NVLS algorithm, its default there): about 480 GB/s on 8 H100s (NVIDIA/nccl-tests#212).
  /// Such an all-reduce runs at the faster of it and the ring. 0: no NVLink SHARP (the A100).
  double nvls_allreduce_gbps = 0;
  double inter_node_gbps = 0;      ///< network bandwidth per GPU between nodes, GB/s
  double inter_node_latency_us = 0;
  int gpus_per_node = 8;
  double memory_gib = 0;           ///< device memory capacity, GiB
  /// Memory the training job cannot use for its tensors: CUDA context, NCCL buffers, allocator
  /// fragmentation. Taken off memory_gib before a config is said to fit.
  double reserved_gib = 0;
  double kernel_launch_us = 0;     ///< fixed overhead added to every kernel of a compute op
  /// Streaming multiprocessors: a GEMM with fewer 128×128 output tiles than this, or ragged edges,
  /// runs below compute_efficiency (tile_fill in cost_model.h). 0: GEMM efficiency ignores shape.
  int sms = 0;
  /// SMs a resident NCCL kernel holds from the compute beside it: one CTA a channel, on an SM no
  /// compute kernel shares (NVIDIA/nccl#689). Charged where collectives stay resident beside the
  /// layers' compute: the vocabulary modes whose all-reduces run on their own stream (vocab-1,
  /// vocab-2; docs/cost-model.md, "Collectives beside compute"). 0: none held.
  int comm_sms = 0;
  /// Dense FP8 tensor-core peak, TFLOP/s; 0 for a GPU without FP8 (precision.fp8 is refused there).
  double peak_fp8_tflops = 0;
  double fp8_efficiency = 0;  ///< achieved fraction of peak_fp8_tflops for FP8 GEMMs (× tile fill, as bf16's)
  /// The share of the efficiencies above (measured on ops timed alone) that a GPU's tensor-core
  /// kernels keep through a training run: GEMMs, attention and FP8 GEMMs run at peak × efficiency ×
  /// this. 1 for hardware described by hand; the presets' are fitted to half of the published runs
  /// (tools/published-runs.py --fit, docs/cost-model.md "Sustained throughput"). Op-level
  /// calibration compares with it at 1.
  double sustained_compute_fraction = 1;
};

/// GB/s a collective or a transfer moves over NVLink, per direction: the line rate × intra_node_efficiency.
double nvlink_gbps(const HardwareConfig& h);

/// Activation recomputation, as Megatron-LM's --recompute-granularity names it, and torchtitan's
/// per-op policy.
enum class Recompute {
  None,
  Selective,  ///< core attention only (the score matrices); nothing to save under flash attention
  /// torchtitan's selective activation checkpointing by op policy (selective_ac_option "op"): each
  /// layer keeps its input, attention's output and every other matrix product's output in forward
  /// order (q, v, the MLP's first), and its backward reruns the rest of its forward (model_math.h,
  /// op_checkpoint_products). Dense layers with multi-head or grouped-query attention.
  SelectiveOp,
  Full,  ///< whole layers, from their saved input, before the backward that needs them
};
/// "none", "selective", "selective_op" or "full", as configs spell it.
std::string_view recompute_name(Recompute recompute);

/// Which layers full recomputation covers (Megatron-LM's --recompute-method).
enum class RecomputeMethod {
  Uniform,  ///< every layer; the input of each group of recompute_num_layers layers is kept
  Block,    ///< the first recompute_num_layers layers of each virtual stage; the rest keep everything
};

/// How a MoE layer's routed tokens reach their experts (Megatron-Core's --moe-token-dispatcher-type).
enum class MoeDispatcher {
  AllToAll,  ///< "alltoall": every routed copy of a token travels to its expert's rank on its own
  Flex,      ///< "flex" (DeepEP): a token crosses the network once per node it goes to, then NVLink fans it out
};
/// "alltoall" or "flex", as configs spell it.
std::string_view moe_dispatcher_name(MoeDispatcher dispatcher);

/// The elementwise kernels a framework runs: "eager" (PyTorch, one kernel an op), "composite" (eager,
/// with RMSNorm and the rotary embedding written as tensor ops, as torchtitan's Llama of 2024) or "fused".
enum class KernelProfile { Eager, Composite, Fused };
std::string_view kernel_profile_name(KernelProfile profile);

/// How the layers apply the rotary embedding: "fused", one kernel (Transformer Engine's, Apex's,
/// torch.compile's) whose read and write of the queries and keys are not charged, or "tensor_ops",
/// torchtitan's eager complex multiply, each op a kernel through HBM (docs/cost-model.md, "Kernel
/// profiles"). The composite profile runs it as tensor ops.
enum class RotaryEmbedding { Fused, TensorOps };
std::string_view rotary_embedding_name(RotaryEmbedding rotary);

/// How the layers lay out their activations, which decides what sequence parallelism's collectives
/// cost on the compute stream: "sbh", sequence first (Megatron-LM), whose all-gathers and
/// reduce-scatters work on the outer dimension in place; or "bsh", batch first (PyTorch's DTensor, as
/// torchtitan shards the sequence, dimension 1), where each all-gather is followed and each
/// reduce-scatter preceded by a copy of the whole tensor (docs/cost-model.md, "The training job").
enum class ActivationLayout { SequenceFirst, BatchFirst };
std::string_view activation_layout_name(ActivationLayout layout);

/// How a microbatch's weight gradients reach the fp32 main gradients: "fused", the weight-gradient GEMM
/// adds into them (Megatron-LM's gradient-accumulation fusion); "deepspeed", as DeepSpeed's
/// BF16_Optimizer does after every backward: fresh gradients in the parameters' type, then cast to
/// fp32 and added in; "fsdp", as PyTorch FSDP's flat parameters take them to each microbatch's
/// reduce-scatter: fresh gradients concatenated into the flat gradient, cast to the reduce type and
/// divided before it; or "fsdp2", as FSDP2 (fully_shard) does: fresh gradients copied into the
/// reduce-scatter's input in the reduce type (docs/cost-model.md, "Gradient accumulation").
enum class GradAccumulation { Fused, DeepSpeed, Fsdp, Fsdp2 };
std::string_view grad_accumulation_name(GradAccumulation accumulation);

/// How the training job runs what the schedule leaves out: recomputation, optimizer-state sharding
/// and the overlap of data- and tensor-parallel communication with compute.
struct TrainingConfig {
  /// Megatron-LM's --global-batch-size: sequences per iteration over all data-parallel replicas. When
  /// given, parallel.microbatches follows from it (microbatches_for in parallel_shape.h), so a change
  /// of dp or micro_batch_size keeps the batch; when not, the batch is what the microbatches make.
  std::optional<int> global_batch_size;
  Recompute recompute_granularity = Recompute::None;
  RecomputeMethod recompute_method = RecomputeMethod::Uniform;
  int recompute_num_layers = 1;
  /// ZeRO: 1 shards optimizer states over dp (Megatron's distributed optimizer), 2 also gradients,
  /// 3 also parameters (FSDP).
  int zero_stage = 0;
  bool overlap_grad_reduce = false;   ///< gradient reduce-scatter/all-reduce hidden behind the backward
  bool overlap_param_gather = false;  ///< parameter all-gather hidden behind the next step's forwards
  /// Parameters a gradient bucket holds under overlap_grad_reduce (Megatron-LM's --ddp-bucket-size);
  /// 0: Megatron-Core's default, max(40M, 1M·dp) (gradient_bucket_params).
  int bucket_size = 0;
  bool tp_comm_overlap = false;       ///< tensor-parallel collectives overlapped with their GEMMs
  /// Under tp_comm_overlap, the streaming multiprocessors Transformer Engine's forward reduce-scatters
  /// keep from their GEMMs: the attention output projection's (its userbuffers layer proj_fprop) and
  /// the MLP down projection's (fc2_fprop), each a "pipeline" overlap with an SM margin (TE's default
  /// 16 each; NeMo's recipes set their own). 0: the GEMM keeps every SM (PyTorch's async tensor
  /// parallelism). docs/cost-model.md, "The training job".
  static constexpr int kTeOverlapSms = 16;  ///< Transformer Engine's initialize_ub default num_sm
  int tp_comm_overlap_proj_sms = kTeOverlapSms;
  int tp_comm_overlap_fc2_sms = kTeOverlapSms;
  /// Megatron-Core's --overlap-p2p-comm: pipeline sends and receives run beside compute. Off (its
  /// default), each rank waits for every exchange, which puts the transfer on both ends' critical path.
  bool overlap_p2p_comm = false;
  /// Megatron-Core's --overlap-moe-expert-parallel-comm: the expert-parallel all-to-alls of one
  /// microbatch run beside the compute of another (a forward beside a backward) instead of holding up
  /// the compute stream. DualPipeV does this by construction (docs/cost-model.md, "Mixture of experts").
  bool overlap_moe_expert_parallel_comm = false;
  /// Megatron-Core's --moe-token-dispatcher-type: how routed tokens reach their experts' ranks
  /// (docs/cost-model.md, "Mixture of experts").
  MoeDispatcher moe_token_dispatcher_type = MoeDispatcher::AllToAll;
  /// Megatron-Core's --moe-dispatch-fwd-dtype: the forward dispatch's wire format (flex only).
  bool moe_dispatch_mxfp8 = false;
  /// The zero-bubble paper's optimizer post-validation (its Megatron fork's
  /// --enable-optimizer-post-validation): no all-reduce across stages before the optimizer step, so
  /// each device starts its next iteration once its own step is done, and the iteration time is the
  /// steady-state period, the longest device span (docs/cost-model.md). Without it every stage waits
  /// for the slowest at the step, and the iteration time is the makespan from a common start.
  bool optimizer_post_validation = false;
  /// Whose elementwise kernels the layers run (docs/cost-model.md, "Kernel profiles"): PyTorch eager's,
  /// one kernel an op, as the presets' op measurements ran them, or fused ones (Megatron-Core's and
  /// Transformer Engine's, torch.compile's). They differ in SwiGLU, one kernel instead of several;
  /// "composite" also runs each step of RMSNorm and of the rotary embedding as a kernel of its own.
  KernelProfile kernels = KernelProfile::Eager;
  RotaryEmbedding rotary_embedding = RotaryEmbedding::Fused;  ///< "tensor_ops" under the composite profile
  GradAccumulation grad_accumulation = GradAccumulation::Fused;
  ActivationLayout activation_layout = ActivationLayout::SequenceFirst;
  /// The attention calls FlashAttention's variable-length kernels on unpadded rows: flash-attn's
  /// bert_padding gathers the queries, keys and values into them and scatters the output back, every
  /// layer (LLM Foundry's MPT flash path; docs/cost-model.md, "Attention kernels").
  bool attention_unpadding = false;
};

/// The first layers of a stage of `layers` that full recomputation runs again before their backward
/// (all of them under `uniform`): the simulator's R costs them, the runtime's R rebuilds them.
int recomputed_layers(const TrainingConfig& t, int layers);

/// FP8 training as Transformer Engine runs it, named as Megatron-LM's --fp8-format: the layers'
/// linear GEMMs take FP8 inputs, E4M3 throughout or (hybrid) E4M3 forward and E5M2 gradients. Both
/// run at the FP8 tensor-core rate and hold one byte an element, so they cost the same here.
enum class Fp8Format { None, Hybrid, E4M3 };
/// "hybrid" or "e4m3", as configs and Megatron-LM spell them; "none" for None.
std::string_view fp8_format_name(Fp8Format format);

/// Which fused attention kernel the framework runs: cuDNN's (Transformer Engine; PyTorch's SDPA on
/// Hopper once it made cuDNN its default), FlashAttention-2 (flash-attn 2, PyTorch's SDPA flash
/// backend) or FlashAttention-1 (flash-attn 1.x, as 2023's stacks pinned it). FlashAttention-3 runs
/// at cuDNN's rate on the H100 (docs/cost-model.md).
enum class AttentionKernel { Cudnn, Flash2, Flash1 };
/// "cudnn", "flash2" or "flash1", as configs spell them.
std::string_view attention_kernel_name(AttentionKernel kernel);

struct PrecisionConfig {
  double param_bytes = 2;          ///< bf16/fp16 working weights
  double grad_bytes = 4;           ///< fp32 gradient accumulation
  double optimizer_bytes = 12;     ///< fp32 master weights + Adam m and v
  double activation_bytes = 2;     ///< bytes per activation element (bf16/fp16)
  bool flash_attention = true;     ///< drops the 5·a·s/h attention-score activation term
  AttentionKernel attention_kernel = AttentionKernel::Cudnn;  ///< under flash_attention: whose kernel
  Fp8Format fp8 = Fp8Format::None; ///< FP8 linear layers (docs/cost-model.md, "FP8")
};

/// Explicit per-op costs, each for one microbatch on one device's whole share of the model
/// (an even share of the layers; a chunk of v gets 1/v, an uneven stage scales by its layers).
/// Per-device arrays (length pp) are accepted for forward/backward/weight.
struct ExplicitCosts {
  std::vector<double> forward_ms;   ///< size pp after parsing
  std::vector<double> backward_ms;  ///< input-gradient backward (full backward without a W split)
  std::vector<double> weight_ms;    ///< weight-gradient pass; added to B when a schedule has no W
  double p2p_ms = 0;
  std::optional<double> activation_bytes;  ///< unset: the analytic activation model
  double optimizer_ms = 0;
  double dp_allreduce_ms = 0;
  // Vocabulary layers, each for one microbatch over the whole vocabulary (one device holds it all in
  // `baseline`; vocabulary-parallel modes split it evenly over the pp devices).
  double output_forward_ms = 0;   ///< LM head + softmax cross-entropy forward
  double output_backward_ms = 0;  ///< its backward
  double input_forward_ms = 0;    ///< embedding lookup
  double input_backward_ms = 0;   ///< embedding gradient
  double allreduce_ms = 0;        ///< each collective of the vocabulary passes
  double output_activation_bytes = 0;  ///< what the output layer keeps from forward to backward
};

struct Config {
  std::string source;  ///< where it came from (a file name), used in messages
  ModelConfig model;
  ParallelConfig parallel;
  ScheduleConfig schedule;
  HardwareConfig hardware;
  PrecisionConfig precision;
  TrainingConfig training;
  std::optional<ExplicitCosts> costs;
};

/// A problem with one field of a config: `path` is the JSON path (`parallel.pp`), `message`
/// says what is wrong and what to change.
struct FieldError {
  std::string path;
  std::string message;
};

/// Checks relations between fields (the parser already checked types and ranges of single
/// fields). Schedule-specific limits are checked by the schedule generators.
std::optional<FieldError> check_config(const Config& config);

/// The hardware preset names, in table order.
std::vector<std::string> hardware_preset_names();
/// The preset's values, or nullopt for an unknown name.
std::optional<HardwareConfig> hardware_preset(const std::string& name);

}  // namespace pipesim
