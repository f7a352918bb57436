#include "frameworks.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>

namespace pipesim {
namespace {

constexpr std::array<std::pair<Framework, std::string_view>, 4> kNames = {
    {{Framework::Any, "any"}, {Framework::Megatron, "megatron"}, {Framework::Torchtitan, "torchtitan"},
     {Framework::Pytorch, "pytorch"}}};

bool one_of(const std::string& name, std::initializer_list<std::string_view> names) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

/// Whether the transformer layers split evenly over the stages between the first and the last, which
/// may hold fewer (Megatron's --decoder-first/last-pipeline-num-layers, torchtitan's
/// pipeline_parallel_first/last_stage_less_layers): the uneven splits these frameworks can say.
bool even_between_ends(const std::vector<int>& split, bool ends_fewer_only) {
  if (split.size() < 3) return split.size() < 2 || !ends_fewer_only || split.front() == split.back();
  const int middle = split[1];
  for (std::size_t i = 1; i + 1 < split.size(); ++i)
    if (split[i] != middle) return false;
  return !ends_fewer_only || (split.front() <= middle && split.back() <= middle);
}

}  // namespace

bool accounts_for_vocabulary(const std::vector<int>& split) {
  if (split.size() < 2) return false;
  const int k = split.front() + 1;
  for (std::size_t i = 1; i + 1 < split.size(); ++i)
    if (split[i] != k) return false;
  return split.back() == k - 1;
}

namespace {

std::string recompute_form(const TrainingConfig& t) {
  if (t.recompute_granularity != Recompute::Full) return std::string(recompute_name(t.recompute_granularity));
  return fmt::format("full/{}/{}", t.recompute_method == RecomputeMethod::Block ? "block" : "uniform",
                     t.recompute_num_layers);
}

/// DeepSpeed's BF16_Optimizer and PyTorch FSDP's flat parameters (training.grad_accumulation
/// "deepspeed", "fsdp") run in none of the frameworks exported to, FSDP2's ("fsdp2") where the
/// export runs FSDP2 (`runs_fsdp2`: torchtitan, PyTorch at ZeRO 2 and 3): elsewhere `name`
/// accumulates the weight gradients its own way, taken as "fused".
void foreign_accumulation(const Config& c, std::string_view name, std::vector<Unsupported>& out,
                          bool runs_fsdp2 = false) {
  std::string_view accumulation;
  switch (c.training.grad_accumulation) {
    case GradAccumulation::Fused: return;
    case GradAccumulation::DeepSpeed: accumulation = "DeepSpeed's BF16_Optimizer"; break;
    case GradAccumulation::Fsdp: accumulation = "FSDP's flat parameters"; break;
    case GradAccumulation::Fsdp2:
      if (runs_fsdp2) return;
      accumulation = "FSDP2";
      break;
  }
  out.push_back({"training.grad_accumulation", fmt::format("{} does not run {}", name, accumulation), "fused"});
}

/// LLM Foundry's unpadding for FlashAttention's variable-length kernels (training.attention_unpadding):
/// `name` calls attention on the padded batch.
void unpadded_attention(const Config& c, std::string_view name, std::vector<Unsupported>& out) {
  if (c.training.attention_unpadding)
    out.push_back({"training.attention_unpadding", fmt::format("{} calls attention on the padded batch", name), "false"});
}

void megatron(const Config& c, const std::vector<int>& split, std::vector<Unsupported>& out) {
  const std::string& s = c.schedule.name;
  // megatron/core/pipeline_parallel/schedules.py: no pipelining at pp 1, 1F1B, and the interleaved
  // 1F1B when a virtual pipeline size is given (pp > 1).
  if (c.parallel.pp == 1 ? s != "1f1b" : !one_of(s, {"1f1b", "interleaved-1f1b"}))
    out.push_back({"schedule.name",
                   c.parallel.pp == 1 ? "Megatron-LM runs no pipeline schedule at pp 1 (forward_backward_no_pipelining)"
                                      : "Megatron-LM runs 1f1b and interleaved-1f1b",
                   "1f1b"});
  const VocabMode v = c.schedule.vocab;
  if (v == VocabMode::Vocab1 || v == VocabMode::Vocab2 || v == VocabMode::Interlaced)
    out.push_back({"schedule.vocab", "Megatron-LM keeps the embedding on the first stage and the LM head on the last",
                   "baseline"});
  else if (v == VocabMode::Redistribute && !accounts_for_vocabulary(split) &&
           (s == "interleaved-1f1b" || !even_between_ends(split, false)))
    out.push_back({"schedule.vocab",
                   "Megatron-LM splits layers unevenly only at the first and last stage "
                   "(--decoder-first/last-pipeline-num-layers, not with a virtual pipeline), or one layer fewer "
                   "there for the embedding and the loss (--account-for-embedding/loss-in-pipeline-split)",
                   "baseline"});
  if (c.training.recompute_granularity == Recompute::SelectiveOp)
    out.push_back({"training.recompute_granularity",
                   "Megatron-LM recomputes core attention (selective) or whole layers, not by torchtitan's op policy",
                   "selective"});
  if (c.training.optimizer_post_validation)
    out.push_back({"training.optimizer_post_validation", "mainline Megatron-LM synchronises stages at the step", "false"});
  if (c.training.kernels == KernelProfile::Composite)
    out.push_back({"training.kernels", "Megatron-LM runs fused norms and rotary embeddings", "fused"});
  else if (c.training.rotary_embedding == RotaryEmbedding::TensorOps)
    out.push_back({"training.rotary_embedding", "Megatron-LM runs a fused rotary embedding", "fused"});
  foreign_accumulation(c, "Megatron-LM", out);
  unpadded_attention(c, "Megatron-LM", out);
  if (c.parallel.tp > 1 && c.training.activation_layout != ActivationLayout::SequenceFirst)
    out.push_back({"training.activation_layout", "Megatron-LM holds activations sequence first", "sbh"});
  // megatron/training/arguments.py turns overlap_p2p_comm off without a virtual pipeline.
  if (c.parallel.pp > 1 && c.training.overlap_p2p_comm && s != "interleaved-1f1b")
    out.push_back({"training.overlap_p2p_comm", "Megatron-LM overlaps pipeline transfers only in the interleaved schedule",
                   "false"});
}

/// torch.distributed.pipelining posts a stage's receives before its compute and waits for its sends
/// later: the transfers overlap, as overlap_p2p_comm models them.
void pytorch_transfers(const Config& c, std::vector<Unsupported>& out) {
  if (c.parallel.pp > 1 && !c.training.overlap_p2p_comm)
    out.push_back({"training.overlap_p2p_comm", "PyTorch's pipelining overlaps its transfers with compute", "true"});
}

void torchtitan(const Config& c, const std::vector<int>& split, std::vector<Unsupported>& out) {
  const std::string& s = c.schedule.name;
  // torch.distributed.pipelining's schedules by the names torchtitan's pipeline_parallel_schedule takes.
  if (c.parallel.pp > 1 && !one_of(s, {"gpipe", "1f1b", "interleaved-1f1b", "zb-v", "dualpipe-v"})) {
    const bool v_shaped = one_of(s, {"v-half", "v-min"});
    out.push_back({"schedule.name", "torchtitan runs GPipe, 1F1B, Interleaved1F1B, ZBVZeroBubble and DualPipeV",
                   v_shaped ? "zb-v" : "1f1b"});
  }
  // At pipeline_parallel_degree 1 torchtitan builds no pipeline stages: the model is one piece.
  if (c.parallel.pp == 1 && c.parallel.chunks > 1)
    out.push_back({"schedule.name", "torchtitan runs no pipeline schedule at pp 1: the model is one stage", "1f1b"});
  const VocabMode v = c.schedule.vocab;
  const bool single_chunk = one_of(s, {"gpipe", "1f1b"}) || c.parallel.pp == 1;
  if (v == VocabMode::Vocab1 || v == VocabMode::Vocab2 || v == VocabMode::Interlaced)
    out.push_back({"schedule.vocab", "torchtitan keeps the embedding on the first stage and the LM head on the last",
                   "baseline"});
  else if (v == VocabMode::Redistribute && (!single_chunk || !even_between_ends(split, true)))
    out.push_back({"schedule.vocab",
                   "torchtitan takes layers only off the first and last stage (pipeline_parallel_first/"
                   "last_stage_less_layers) of a one-stage-per-rank schedule",
                   "baseline"});
  // FSDP2 (fully_shard) shards parameters, gradients and optimizer states together; replicate is DDP.
  if (c.parallel.dp > 1 && c.training.zero_stage == 1)
    out.push_back({"training.zero_stage", "torchtitan has DDP (0) and FSDP2: 2 (no resharding after forward) or 3",
                   "2"});
  // torchtitan/distributed/activation_checkpoint.py: full AC per block, or selective AC by op policy
  // (selective_op) or every n blocks -- not pipesim's selective (core attention alone).
  const std::string recompute = recompute_form(c.training);
  if (recompute != "none" && recompute != "full/uniform/1" && recompute != "selective_op")
    out.push_back({"training.recompute_granularity",
                   fmt::format("torchtitan's activation checkpointing is per block (full) or by op policy, not {}",
                               recompute),
                   // under flash attention pipesim's selective recomputes nothing: none is its nearest
                   c.training.recompute_granularity == Recompute::Selective ? "none" : "full/uniform/1"});
  if (c.parallel.tp > 1 && !c.parallel.sequence_parallel)
    out.push_back({"parallel.sequence_parallel", "torchtitan's tensor parallelism always shards the sequence", "true"});
  if (c.parallel.tp > 1 && c.training.activation_layout != ActivationLayout::BatchFirst)
    out.push_back({"training.activation_layout", "torchtitan's DTensor layers hold activations batch first", "bsh"});
  if (c.parallel.tp > 1 && c.training.tp_comm_overlap && c.training.kernels != KernelProfile::Fused)
    out.push_back({"training.kernels", "torchtitan's async tensor parallelism runs under torch.compile", "fused"});
  else if (c.training.kernels != KernelProfile::Fused && c.training.rotary_embedding != RotaryEmbedding::TensorOps)
    out.push_back({"training.rotary_embedding",
                   "torchtitan's Llama applies the rotary embedding as tensor ops unless torch.compile fuses them",
                   "tensor_ops"});
  if (c.training.optimizer_post_validation)
    out.push_back({"training.optimizer_post_validation", "torchtitan synchronises stages at the step", "false"});
  foreign_accumulation(c, "torchtitan", out, /*runs_fsdp2=*/true);
  unpadded_attention(c, "torchtitan", out);
  pytorch_transfers(c, out);
}

void pytorch(const Config& c, const std::vector<int>& split, std::vector<Unsupported>& out) {
  // torch.distributed.pipelining runs any order as a compute-only CSV (`pipesim export --format
  // pytorch-csv`); the stages are the user's modules.
  (void)split;
  const VocabMode v = c.schedule.vocab;
  if (v == VocabMode::Vocab1 || v == VocabMode::Vocab2 || v == VocabMode::Interlaced)
    out.push_back({"schedule.vocab", "PyTorch's pipelining has no vocabulary-parallel passes", "baseline"});
  if (c.parallel.dp > 1 && c.training.zero_stage == 1)
    out.push_back({"training.zero_stage", "PyTorch has DDP (0) and FSDP2: 2 (no resharding after forward) or 3", "2"});
  if (c.training.optimizer_post_validation)
    out.push_back({"training.optimizer_post_validation", "PyTorch's optimizers step after a synchronised step", "false"});
  foreign_accumulation(c, "PyTorch", out, /*runs_fsdp2=*/c.training.zero_stage >= 2);
  pytorch_transfers(c, out);
}

}  // namespace

std::string_view framework_name(Framework framework) {
  for (const auto& [f, name] : kNames)
    if (f == framework) return name;
  return "?";
}

std::optional<Framework> framework_named(std::string_view name) {
  for (const auto& [f, n] : kNames)
    if (n == name) return f;
  return std::nullopt;
}

std::vector<std::string> framework_names() {
  std::vector<std::string> names;
  for (const auto& entry : kNames) names.emplace_back(entry.second);
  return names;
}

std::vector<Unsupported> unsupported(Framework framework, const Config& config, const std::vector<int>& layers_per_stage) {
  std::vector<Unsupported> out;
  switch (framework) {
    case Framework::Any: break;
    case Framework::Megatron: megatron(config, layers_per_stage, out); break;
    case Framework::Torchtitan: torchtitan(config, layers_per_stage, out); break;
    case Framework::Pytorch: pytorch(config, layers_per_stage, out); break;
  }
  return out;
}

Config nearest_runnable(Framework framework, Config config, const std::vector<int>& layers_per_stage,
                        std::vector<std::string>& changes) {
  for (const Unsupported& u : unsupported(framework, config, layers_per_stage)) {
    changes.push_back(fmt::format("{} → {} ({})", u.field, u.nearest, u.reason));
    if (u.field == "schedule.name") config.schedule.name = u.nearest;
    if (u.field == "schedule.vocab") config.schedule.vocab = VocabMode::Baseline, config.schedule.layers_per_stage.clear();
    if (u.field == "training.zero_stage") config.training.zero_stage = std::stoi(u.nearest);
    if (u.field == "training.recompute_granularity") {
      config.training.recompute_granularity = u.nearest == "none"        ? Recompute::None
                                              : u.nearest == "selective" ? Recompute::Selective
                                                                         : Recompute::Full;
      config.training.recompute_method = RecomputeMethod::Uniform, config.training.recompute_num_layers = 1;
    }
    if (u.field == "parallel.sequence_parallel") config.parallel.sequence_parallel = true;
    if (u.field == "training.kernels")
      config.training.kernels = KernelProfile::Fused, config.training.rotary_embedding = RotaryEmbedding::Fused;
    if (u.field == "training.rotary_embedding")
      config.training.rotary_embedding = u.nearest == "tensor_ops" ? RotaryEmbedding::TensorOps : RotaryEmbedding::Fused;
    if (u.field == "training.grad_accumulation") config.training.grad_accumulation = GradAccumulation::Fused;
    if (u.field == "training.attention_unpadding") config.training.attention_unpadding = false;
    if (u.field == "training.optimizer_post_validation") config.training.optimizer_post_validation = false;
    if (u.field == "training.overlap_p2p_comm") config.training.overlap_p2p_comm = u.nearest == "true";
    if (u.field == "training.activation_layout")
      config.training.activation_layout = u.nearest == "bsh" ? ActivationLayout::BatchFirst : ActivationLayout::SequenceFirst;
  }
  return config;
}

Config as_run_by(Framework framework, Config config) {
  const bool pytorch = framework == Framework::Torchtitan || framework == Framework::Pytorch;
  if (pytorch) {
    config.training.overlap_p2p_comm = true;
    // Its async tensor parallelism has no Transformer Engine SM margin to price.
    config.training.tp_comm_overlap_proj_sms = config.training.tp_comm_overlap_fc2_sms = 0;
  }
  if (framework == Framework::Torchtitan) {
    config.training.activation_layout = ActivationLayout::BatchFirst;
    // Its Llama applies the rotary embedding as tensor ops unless torch.compile fuses them.
    if (config.training.kernels != KernelProfile::Fused) config.training.rotary_embedding = RotaryEmbedding::TensorOps;
  }
  if (framework == Framework::Megatron) {
    if (config.schedule.name != "interleaved-1f1b") config.training.overlap_p2p_comm = false;
    config.training.kernels = KernelProfile::Fused;  // Megatron-Core fuses SwiGLU unless told not to
    config.training.rotary_embedding = RotaryEmbedding::Fused;
    config.training.activation_layout = ActivationLayout::SequenceFirst;
  }
  return config;
}

}  // namespace pipesim
