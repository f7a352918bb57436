#include "config.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <numeric>

#include "parallel_shape.h"
#include "sizes.h"

namespace pipesim {
namespace {

// Vendor datasheet peaks and links (NVLink per direction, one 200/400 Gb/s NIC per GPU); of NVLink's
// line rate NCCL carries about 80% (intra_node_efficiency: NVIDIA/nccl-tests#212, 370 GB/s of the
// H100's 450 "with the protocol overhead (~20%)"; #326, all-gather saturating at 360 GB/s on 8 H100s,
// "exactly what we'd expect"; the A100's NVLink runs the same protocols); an all-reduce inside a Hopper
// node runs through NVLink SHARP at about 480 GB/s of bus bandwidth (#212; the H200 has the same
// NVLink and NVSwitch). h100-sxm's
// efficiencies are fitted (`pipesim calibrate`) to PyTorch op times measured on an H100
// (docs/data/h100-torch-ops-2.json, docs/cost-model.md), h200's to the same measurement on an H200
// (docs/data/h200-torch-ops.json); both fits put the launch overhead at zero (the GPU runs a stream's
// kernels back to back while the CPU runs ahead). a100-80gb's GEMM fraction carries the H100 fit
// over by the published best-GEMM measurements of both GPUs (86.9% and 80.3% of peak, docs/
// cost-model.md), its attention is FlashAttention-2's own A100 measurement (Dao 2023, Figure 4d:
// causal, head dim 128, 0.5K to 16K tokens), its HBM fraction is the H100's.
// flash2_attention_efficiency: FlashAttention-2 on Hopper runs at 0.62 of cuDNN's fused attention,
// forward (causal) and backward, head dim 128, sequences of 2K to 8K tokens (Shah et al. 2024,
// FlashAttention-3, Figures 5 and 6), applied to the measured attention_efficiency; the A100 preset's
// attention is FlashAttention-2's already. attention_overhead_tokens: the same figures' rates against
// the sequence (cuDNN's on the H100: 308 tokens; FlashAttention-2's on the A100: 487), each paper's
// grid 2,048 blocks (16K tokens of 16 heads), whose N / (N + sms) the efficiencies are divided by
// (docs/cost-model.md, attention kernels); the Hopper presets' attention efficiencies are their
// measured ones over the mean of (1 + 308 / L)(1 + sms / N) over the measured layers (L 2K and 4K
// tokens, N 384 to 6,144 blocks), so the measured attention times stay where they were. All of it is overridable per config. sms: the GPUs' SM
// counts, for GEMMs' tile fill. comm_sms: fitted to the vocabulary paper authors' A100 pass times
// (tools/vocab-passes.py --fit-comm-sms, docs/cost-model.md); the H100 and H200 take the A100's
// count. reserved_gib: the CUDA context and cuBLAS workspaces (about 0.6 GiB),
// NCCL's buffers for the tensor-, pipeline- and data-parallel communicators (about 1 GiB), and the
// caching allocator's fragmentation (about 5% of what a training step allocates, taken as 1.4 GiB
// of an 80 GB card and 1.9 GiB of a 141 GB one): what Megatron-LM runs lose on these GPUs.
// peak_fp8_tflops: NVIDIA's dense FP8 Tensor Core figure (1,979 TFLOP/s on the H100, "based on non-sparse
// specifications" in its DGX Cloud benchmarks; the H200's datasheet gives the same 3,958 "with
// sparsity"); the A100 has no FP8 tensor cores. fp8_efficiency is fitted to NVIDIA's published FP8
// against BF16 step times of the same recipes, on half of them (tools/fit-fp8.py, docs/cost-model.md);
// the H200 takes the H100's. sustained_compute_fraction: fitted per GPU to the even-numbered published
// runs of that GPU and tested on the odd-numbered ones (tools/published-runs.py --fit, docs/
// cost-model.md); the H200, with no published runs, takes the H100's (the same chip at the same 700 W).
// h100-96gb-500w is the H100 of Meta's Grand Teton hosts that torchtitan's benchmarks ran on, as
// their December 2024 file describes it (docs/data/published-runs.json gives its address): 96 GB of
// HBM2e at 2.4 TB/s, a 500 W power limit, a 400 Gb/s RDMA port per GPU. The chip and its op-level
// efficiencies are the H100's; the lower clocks the power limit holds it to are in its own fitted
// fraction, as the other presets' (from torchtitan's runs alone, the only published ones on it).
const HardwareConfig kA100{
    .preset = "a100-80gb", .peak_tflops = 312, .compute_efficiency = 0.76, .attention_efficiency = 0.65,
    .flash2_attention_efficiency = 0.65, .attention_overhead_tokens = 487, .hbm_gbps = 2039, .hbm_efficiency = 0.8, .intra_node_gbps = 300,
    .intra_node_efficiency = 0.8, .intra_node_latency_us = 8,
    .inter_node_gbps = 25, .inter_node_latency_us = 12, .gpus_per_node = 8, .memory_gib = 80.0, .reserved_gib = 3.0,
    .kernel_launch_us = 0, .sms = 108, .comm_sms = 7, .sustained_compute_fraction = 0.97};
const HardwareConfig kH100Sxm{
    .preset = "h100-sxm", .peak_tflops = 989, .compute_efficiency = 0.70, .attention_efficiency = 0.74,
    .flash2_attention_efficiency = 0.46, .attention_overhead_tokens = 308, .hbm_gbps = 3350, .hbm_efficiency = 0.80, .intra_node_gbps = 450,
    .intra_node_efficiency = 0.8, .intra_node_latency_us = 6, .nvls_allreduce_gbps = 480,
    .inter_node_gbps = 50, .inter_node_latency_us = 10, .gpus_per_node = 8, .memory_gib = 79.6, .reserved_gib = 3.0,
    .kernel_launch_us = 0, .sms = 132, .comm_sms = kA100.comm_sms, .peak_fp8_tflops = 1979, .fp8_efficiency = 0.57,
    .sustained_compute_fraction = 0.82};
/// The H100 chip with its own memory and its own fitted fraction (above).
HardwareConfig grand_teton_h100() {
  HardwareConfig h = kH100Sxm;
  h.preset = "h100-96gb-500w";
  h.hbm_gbps = 2400;
  h.memory_gib = 89.4;
  h.sustained_compute_fraction = 0.73;
  return h;
}
const HardwareConfig kH200{
    .preset = "h200", .peak_tflops = 989, .compute_efficiency = 0.71, .attention_efficiency = 0.63,
    .flash2_attention_efficiency = 0.39, .attention_overhead_tokens = kH100Sxm.attention_overhead_tokens, .hbm_gbps = 4800, .hbm_efficiency = 0.66, .intra_node_gbps = 450,
    .intra_node_efficiency = 0.8, .intra_node_latency_us = 6, .nvls_allreduce_gbps = 480,
    .inter_node_gbps = 50, .inter_node_latency_us = 10, .gpus_per_node = 8, .memory_gib = 140.4, .reserved_gib = 3.5,
    .kernel_launch_us = 0, .sms = 132, .comm_sms = kA100.comm_sms, .peak_fp8_tflops = 1979,
    .fp8_efficiency = kH100Sxm.fp8_efficiency,
    .sustained_compute_fraction = kH100Sxm.sustained_compute_fraction};
const std::array<HardwareConfig, 4> kPresets = {kA100, kH100Sxm, grand_teton_h100(), kH200};

}  // namespace

int recomputed_layers(const TrainingConfig& t, int layers) {
  if (t.recompute_granularity != Recompute::Full) return 0;
  return t.recompute_method == RecomputeMethod::Block ? std::min(t.recompute_num_layers, layers) : layers;
}

std::string_view fp8_format_name(Fp8Format format) {
  switch (format) {
    case Fp8Format::None: return "none";
    case Fp8Format::Hybrid: return "hybrid";
    case Fp8Format::E4M3: return "e4m3";
  }
  return "?";
}

std::string_view grad_accumulation_name(GradAccumulation accumulation) {
  switch (accumulation) {
    case GradAccumulation::Fused: return "fused";
    case GradAccumulation::DeepSpeed: return "deepspeed";
    case GradAccumulation::Fsdp: return "fsdp";
    case GradAccumulation::Fsdp2: return "fsdp2";
  }
  return "?";
}

std::string_view activation_layout_name(ActivationLayout layout) {
  return layout == ActivationLayout::BatchFirst ? "bsh" : "sbh";
}

std::string_view rotary_embedding_name(RotaryEmbedding rotary) {
  return rotary == RotaryEmbedding::TensorOps ? "tensor_ops" : "fused";
}

std::string_view kernel_profile_name(KernelProfile profile) {
  switch (profile) {
    case KernelProfile::Eager: return "eager";
    case KernelProfile::Composite: return "composite";
    case KernelProfile::Fused: return "fused";
  }
  return "?";
}

std::string_view attention_kernel_name(AttentionKernel kernel) {
  switch (kernel) {
    case AttentionKernel::Cudnn: return "cudnn";
    case AttentionKernel::Flash2: return "flash2";
    case AttentionKernel::Flash1: return "flash1";
  }
  return "?";
}

std::string_view moe_dispatcher_name(MoeDispatcher dispatcher) {
  return dispatcher == MoeDispatcher::Flex ? "flex" : "alltoall";
}

std::string_view recompute_name(Recompute recompute) {
  switch (recompute) {
    case Recompute::None: return "none";
    case Recompute::Selective: return "selective";
    case Recompute::SelectiveOp: return "selective_op";
    case Recompute::Full: return "full";
  }
  return "?";
}

namespace {
constexpr std::array kVocabModes = {VocabMode::Baseline, VocabMode::Redistribute, VocabMode::Vocab1, VocabMode::Vocab2,
                                    VocabMode::Interlaced};
}  // namespace

std::string activation_limit_text(const ActivationLimit& limit) {
  switch (limit.unit) {
    case ActivationLimit::Unit::Fit: return "fit";
    case ActivationLimit::Unit::Times1F1B: return fmt::format("{:g}x", limit.value);
    case ActivationLimit::Unit::Bytes: return fmt::format("{:g} GiB", limit.value / double(Bytes(1) << 30));
  }
  return "?";
}

std::string_view vocab_mode_name(VocabMode mode) {
  switch (mode) {
    case VocabMode::Baseline: return "baseline";
    case VocabMode::Redistribute: return "redistribute";
    case VocabMode::Vocab1: return "vocab-1";
    case VocabMode::Vocab2: return "vocab-2";
    case VocabMode::Interlaced: return "interlaced";
  }
  return "?";
}

std::optional<VocabMode> vocab_mode_named(std::string_view name) {
  for (const VocabMode mode : kVocabModes)
    if (vocab_mode_name(mode) == name) return mode;
  return std::nullopt;
}

std::vector<std::string> vocab_mode_names() {
  std::vector<std::string> names;
  for (const VocabMode mode : kVocabModes) names.emplace_back(vocab_mode_name(mode));
  return names;
}

std::vector<std::string> hardware_preset_names() {
  std::vector<std::string> names;
  for (const HardwareConfig& preset : kPresets) names.push_back(preset.preset);
  return names;
}

double nvlink_gbps(const HardwareConfig& h) { return h.intra_node_gbps * h.intra_node_efficiency; }

std::optional<HardwareConfig> hardware_preset(const std::string& name) {
  for (const HardwareConfig& preset : kPresets)
    if (preset.preset == name) return preset;
  return std::nullopt;
}

namespace {

/// Megatron-Core's rules for a mixture-of-experts layout (megatron/core/parallel_state.py and
/// transformer_config.py), each named where a config breaks it.
std::optional<FieldError> check_experts(const Config& config) {
  const ModelConfig& m = config.model;
  const ParallelConfig& p = config.parallel;
  const TrainingConfig& t = config.training;
  if (!m.has_experts()) {
    if (p.ep > 1) return FieldError{"parallel.ep", "expert parallelism needs experts; give model.num_experts or set ep to 1"};
    if (p.etp > 0 && p.etp != p.tp)
      return FieldError{"parallel.etp", "expert tensor parallelism needs experts; give model.num_experts or remove etp"};
    if (t.overlap_moe_expert_parallel_comm)
      return FieldError{"training.overlap_moe_expert_parallel_comm", "overlaps expert-parallel all-to-alls, and this "
                                                                     "model has no experts; set it to false"};
    if (t.moe_token_dispatcher_type != MoeDispatcher::AllToAll || t.moe_dispatch_mxfp8)
      return FieldError{t.moe_dispatch_mxfp8 ? "training.moe_dispatch_fwd_dtype" : "training.moe_token_dispatcher_type",
                        "dispatches tokens to experts, and this model has none; remove it"};
    return std::nullopt;
  }
  if (m.num_experts % p.ep != 0)
    return FieldError{"parallel.ep", fmt::format("ep {} does not divide the {} experts (model.num_experts): each expert-"
                                                 "parallel rank holds num_experts / ep of them; choose a divisor of {}",
                                                 p.ep, m.num_experts, m.num_experts)};
  const int ranks = p.tp * p.cp * p.dp, expert_ranks = p.ep * p.expert_tp();
  if (ranks % expert_ranks != 0)
    return FieldError{"parallel.ep", fmt::format("ep {} x etp {} = {} does not divide tp {} x cp {} x dp {} = {}: "
                                                 "Megatron-Core carves the expert groups (ep x etp ranks each) out of "
                                                 "the ranks of a pipeline stage; choose ep and etp whose product "
                                                 "divides {}",
                                                 p.ep, p.expert_tp(), expert_ranks, p.tp, p.cp, p.dp, ranks, ranks)};
  if (m.moe_router_topk > m.num_experts)
    return FieldError{"model.moe_router_topk", fmt::format("routes each token to {} of {} experts; choose at most {}",
                                                           m.moe_router_topk, m.num_experts, m.num_experts)};
  if (p.tp > 1 && !p.sequence_parallel)
    return FieldError{"parallel.sequence_parallel", "Megatron-Core runs MoE layers under tensor parallelism only with "
                                                    "sequence parallelism; set it to true or tp to 1"};
  if (m.moe_router_group_topk > 0 || m.moe_router_num_groups > 0) {
    if (m.moe_router_num_groups == 0 || m.moe_router_group_topk == 0)
      return FieldError{m.moe_router_num_groups == 0 ? "model.moe_router_num_groups" : "model.moe_router_group_topk",
                        "group-limited routing needs both moe_router_num_groups (the groups the experts fall into) and "
                        "moe_router_group_topk (the groups a token may use); give both or neither"};
    if (m.num_experts % m.moe_router_num_groups != 0)
      return FieldError{"model.moe_router_num_groups",
                        fmt::format("{} groups do not divide the {} experts; choose a divisor of {} (the nodes of the "
                                    "expert-parallel group for node-limited routing, ep for device-limited)",
                                    m.moe_router_num_groups, m.num_experts, m.num_experts)};
    if (m.moe_router_group_topk > m.moe_router_num_groups)
      return FieldError{"model.moe_router_group_topk", fmt::format("selects {} of {} groups; choose at most {}",
                                                                   m.moe_router_group_topk, m.moe_router_num_groups,
                                                                   m.moe_router_num_groups)};
  }
  if (t.moe_dispatch_mxfp8 && t.moe_token_dispatcher_type != MoeDispatcher::Flex)
    return FieldError{"training.moe_dispatch_fwd_dtype", "Megatron-Core sends the dispatch in MXFP8 only through the "
                                                         "flex dispatcher; set training.moe_token_dispatcher_type to "
                                                         "\"flex\" or this to \"bf16\""};
  if (m.expert_ffn_hidden() % p.expert_tp() != 0)
    return FieldError{"parallel.etp", fmt::format("etp {} does not divide moe_ffn_hidden_size {}; choose a divisor",
                                                  p.expert_tp(), m.expert_ffn_hidden())};
  if (t.overlap_moe_expert_parallel_comm) {
    const std::string_view field = "training.overlap_moe_expert_parallel_comm";
    if (p.ep <= 1)
      return FieldError{std::string(field), "overlaps the expert-parallel all-to-alls, so it needs parallel.ep > 1; "
                                            "set it to false or raise ep"};
    if (t.recompute_granularity == Recompute::Full)
      return FieldError{std::string(field), "Megatron-Core refuses it with full recomputation; set "
                                            "training.recompute_granularity to \"selective\" or \"none\", or this to false"};
    if (p.pp > 1 && p.chunks < 2)
      return FieldError{std::string(field), "Megatron-Core overlaps a forward with a backward of another model chunk, so "
                                            "with pp > 1 it needs parallel.chunks >= 2 (a virtual pipeline); raise "
                                            "chunks or set it to false"};
  }
  return std::nullopt;
}

}  // namespace

std::optional<FieldError> check_config(const Config& config) {
  if (std::optional<FieldError> e = check_sizes(config)) return e;
  const ModelConfig& model = config.model;
  const ParallelConfig& parallel = config.parallel;
  if (model.head_dim == 0 && !model.latent_attention() && model.hidden % model.heads != 0)
    return FieldError{"model.heads", fmt::format("{} heads do not divide hidden size {}; choose a divisor of {}",
                                                 model.heads, model.hidden, model.hidden)};
  if (model.key_value_heads() > model.heads || model.heads % model.key_value_heads() != 0)
    return FieldError{"model.kv_heads", fmt::format("{} key/value heads do not divide {} heads; choose a divisor of {}",
                                                    model.key_value_heads(), model.heads, model.heads)};
  if (model.heads % parallel.tp != 0)
    return FieldError{"parallel.tp", fmt::format("tp {} does not divide {} heads; choose a divisor of {}",
                                                 parallel.tp, model.heads, model.heads)};
  if (parallel.cp > 1 && model.seq_len % (2 * parallel.cp) != 0)
    return FieldError{"parallel.cp", fmt::format("cp {} needs seq_len ({}) divisible by 2 x cp = {}: each rank takes "
                                                 "two chunks of the sequence, one early and one late, to balance "
                                                 "causal attention; choose a cp that divides {}",
                                                 parallel.cp, model.seq_len, 2 * parallel.cp, model.seq_len / 2)};
  if (config.precision.fp8 != Fp8Format::None && config.hardware.peak_fp8_tflops <= 0)
    return FieldError{"precision.fp8",
                      fmt::format("{} has no FP8 tensor cores (hardware.peak_fp8_tflops is 0); remove precision.fp8, "
                                  "or run on a GPU that has them (h100-sxm, h200) or give hardware.peak_fp8_tflops",
                                  config.hardware.preset.empty() ? "this GPU" : "the " + config.hardware.preset)};
  if (std::optional<FieldError> e = check_experts(config)) return e;
  const TrainingConfig& training = config.training;
  if (training.recompute_granularity == Recompute::SelectiveOp &&
      (model.has_experts() || model.latent_attention() || !config.precision.flash_attention))
    return FieldError{"training.recompute_granularity",
                      fmt::format("\"selective_op\" is torchtitan's per-op policy as it runs dense layers with flash "
                                  "attention and {} attention; this model {}: use \"selective\" or \"full\"",
                                  "multi-head or grouped-query",
                                  model.has_experts()        ? "has experts"
                                  : model.latent_attention() ? "has latent attention"
                                                             : "runs without flash attention")};
  // Both given (derive_microbatches fills microbatches only when the config leaves it out): they must agree.
  if (training.global_batch_size && global_batch_size(config) != *training.global_batch_size) {
    const std::optional<int> derived =
        microbatches_for(*training.global_batch_size, model.micro_batch_size, parallel.dp);
    return FieldError{"parallel.microbatches",
                      fmt::format("{} microbatches x micro_batch_size {} x dp {} make a global batch of {} sequences, "
                                  "but training.global_batch_size is {}; give one of the two{}",
                                  parallel.microbatches, model.micro_batch_size, parallel.dp, global_batch_size(config),
                                  *training.global_batch_size,
                                  derived ? fmt::format(" (the global batch alone makes {} microbatches)", *derived) : "")};
  }
  if (training.tp_comm_overlap && !(parallel.sequence_parallel && parallel.tp > 1))
    return FieldError{"training.tp_comm_overlap", "overlaps the all-gathers and reduce-scatters of sequence "
                                                  "parallelism, so it needs parallel.tp > 1 and "
                                                  "parallel.sequence_parallel true; set it to false"};
  for (const auto& [field, sms] : {std::pair{"training.tp_comm_overlap_proj_sms", training.tp_comm_overlap_proj_sms},
                                    std::pair{"training.tp_comm_overlap_fc2_sms", training.tp_comm_overlap_fc2_sms}})
    if (training.tp_comm_overlap && config.hardware.sms > 0 && sms >= config.hardware.sms)
      return FieldError{field, fmt::format("a reduce-scatter cannot take all {} of the GPU's SMs (hardware.sms) from "
                                           "its GEMM; give fewer (Transformer Engine's default is {})",
                                           config.hardware.sms, TrainingConfig::kTeOverlapSms)};
  if (config.hardware.sms > 0 && config.hardware.comm_sms >= config.hardware.sms)
    return FieldError{"hardware.comm_sms", fmt::format("a collective cannot hold all {} of the GPU's SMs (hardware.sms); "
                                                       "give fewer",
                                                       config.hardware.sms)};
  if (training.kernels == KernelProfile::Composite && training.rotary_embedding != RotaryEmbedding::TensorOps)
    return FieldError{"training.rotary_embedding", "is \"fused\", but the composite kernel profile runs the rotary "
                                                   "embedding as tensor ops; remove it, or set training.kernels to "
                                                   "\"eager\" (RMSNorm as one kernel)"};
  if (training.attention_unpadding &&
      (!config.precision.flash_attention || config.precision.attention_kernel == AttentionKernel::Cudnn))
    return FieldError{"training.attention_unpadding", "unpads the rows for FlashAttention's variable-length kernels, "
                                                      "and this config runs none; set precision.attention_kernel to "
                                                      "\"flash2\" or \"flash1\", or set this to false"};
  if (training.bucket_size > 0 && !training.overlap_grad_reduce)
    return FieldError{"training.bucket_size", "sizes the gradient buckets that training.overlap_grad_reduce reduces "
                                              "during the backward, and it is off; set it to true or remove bucket_size"};
  if (training.overlap_param_gather && training.zero_stage == 0)
    return FieldError{"training.overlap_param_gather", "gathers parameters that a sharded optimizer updated, so it "
                                                       "needs training.zero_stage >= 1; set it to false or shard"};
  // Its length depends on the chunks the schedule runs, so the planner checks it (plan_layout): any
  // length's counts must sum to the layers.
  const std::vector<int>& split = config.schedule.layers_per_stage;
  if (!split.empty()) {
    // 64-bit: each count is only bounded by INT_MAX, and a wrapped sum could match model.layers.
    const std::int64_t total = std::accumulate(split.begin(), split.end(), std::int64_t(0));
    if (total != model.layers)
      return FieldError{"schedule.layers_per_stage",
                        fmt::format("counts sum to {} but model.layers is {}; make them sum to {}", total,
                                    model.layers, model.layers)};
  }
  if (config.costs && exchanges_experts(config))
    return FieldError{"parallel.ep", "a costs block gives each pass's time as measured, which leaves the experts' "
                                     "all-to-alls no time of their own; remove the costs block (the analytic model "
                                     "prices them) or set ep and etp to 1"};
  if (config.costs && training.recompute_granularity != Recompute::None)
    return FieldError{"training.recompute_granularity",
                      "a costs block gives each pass's time and memory as measured, recomputation included or not; "
                      "set it to \"none\" and give the times measured with recomputation on"};
  if (config.costs) {
    for (const auto& [name, values] : {std::pair{"forward_ms", &config.costs->forward_ms},
                                       std::pair{"backward_ms", &config.costs->backward_ms},
                                       std::pair{"weight_ms", &config.costs->weight_ms}})
    {
      if (values->size() != 1 && static_cast<int>(values->size()) != parallel.pp)
        return FieldError{fmt::format("costs.{}", name),
                          fmt::format("has {} entries; give one number or one per device (pp = {})",
                                      values->size(), parallel.pp)};
      // An iteration of no time has infinite throughput and MFU; weight_ms alone may be 0 (no W split).
      const bool all_zero = std::all_of(values->begin(), values->end(), [](double ms) { return ms == 0; });
      if (all_zero && values != &config.costs->weight_ms)
        return FieldError{fmt::format("costs.{}", name), "is 0 on every device; give the milliseconds it takes (> 0)"};
    }
  }
  return std::nullopt;
}

}  // namespace pipesim
