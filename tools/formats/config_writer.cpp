#include "config_writer.h"

namespace pipesim {
namespace {

using json = nlohmann::ordered_json;

/// The mixture-of-experts keys, only for a MoE model (a dense config reads them as mistakes).
void add_experts(json& out, const ModelConfig& m) {
  if (!m.has_experts()) return;
  out.update(json{{"num_experts", m.num_experts},
                  {"moe_router_topk", m.moe_router_topk},
                  {"moe_ffn_hidden_size", m.expert_ffn_hidden()},
                  {"moe_shared_expert_intermediate_size", m.moe_shared_expert_intermediate_size},
                  {"moe_layer_freq", m.moe_layer_pattern.empty() ? json(m.moe_layer_freq) : json(m.moe_layer_pattern)},
                  {"moe_capacity_factor", m.moe_capacity_factor ? json(*m.moe_capacity_factor) : json(nullptr)},
                  {"moe_imbalance", m.moe_imbalance}});
  if (m.moe_router_num_groups > 0)
    out.update(json{{"moe_router_num_groups", m.moe_router_num_groups}, {"moe_router_group_topk", m.moe_router_group_topk}});
}

json model_json(const ModelConfig& m) {
  json out{{"layers", m.layers},
          {"hidden", m.hidden},
          {"heads", m.heads},
          {"kv_heads", m.key_value_heads()},
          {"ffn_hidden", m.ffn_hidden},
          {"seq_len", m.seq_len},
          {"vocab", m.vocab},
          {"micro_batch_size", m.micro_batch_size},
          {"mlp", m.mlp == MlpKind::SwiGlu ? "swiglu" : "gelu"},
          {"tied_embeddings", m.tied_embeddings}};
  if (m.head_dim > 0) out["head_dim"] = m.head_dim;
  if (m.latent_attention())
    out.update(json{{"q_lora_rank", m.q_lora_rank}, {"kv_lora_rank", m.kv_lora_rank}, {"qk_nope_head_dim", m.qk_nope_head_dim},
                    {"qk_rope_head_dim", m.qk_rope_head_dim}, {"v_head_dim", m.v_head_dim}});
  add_experts(out, m);
  return out;
}

/// With a global batch, microbatches are left to follow from it, as in the config written from: a
/// `--set parallel.dp=...` on the written file then keeps the batch, as it would on the original.
json parallel_json(const ParallelConfig& p, bool global_batch) {
  json out{{"pp", p.pp}, {"tp", p.tp}, {"dp", p.dp}, {"cp", p.cp}};
  if (!global_batch) out["microbatches"] = p.microbatches;
  out.update(json{{"chunks", p.chunks}, {"sequence_parallel", p.sequence_parallel}});
  if (p.ep > 1) out["ep"] = p.ep;
  if (p.etp > 0) out["etp"] = p.etp;  // absent, it follows tp
  return out;
}

json schedule_json(const ScheduleConfig& s) {
  return {{"name", s.name},
          {"vocab", std::string(vocab_mode_name(s.vocab))},
          {"layers_per_stage", s.layers_per_stage.empty() ? json("auto") : json(s.layers_per_stage)},
          {"memory_limit", s.memory_limit.unit == ActivationLimit::Unit::Times1F1B ? json(s.memory_limit.value)
                                                                                   : json(activation_limit_text(s.memory_limit))}};
}

/// Every number, not only those that differ from the preset: the preset names where they came from.
json hardware_json(const HardwareConfig& h) {
  json out;
  if (hardware_preset(h.preset)) out["preset"] = h.preset;
  out.update(json{{"peak_tflops", h.peak_tflops},
                  {"compute_efficiency", h.compute_efficiency},
                  {"attention_efficiency", h.attention_efficiency},
                  {"flash2_attention_efficiency", h.flash2_attention_efficiency},
                  {"attention_overhead_tokens", h.attention_overhead_tokens},
                  {"hbm_gbps", h.hbm_gbps},
                  {"hbm_efficiency", h.hbm_efficiency},
                  {"intra_node_gbps", h.intra_node_gbps},
                  {"intra_node_efficiency", h.intra_node_efficiency},
                  {"intra_node_latency_us", h.intra_node_latency_us},
                  {"nvls_allreduce_gbps", h.nvls_allreduce_gbps},
                  {"inter_node_gbps", h.inter_node_gbps},
                  {"inter_node_latency_us", h.inter_node_latency_us},
                  {"gpus_per_node", h.gpus_per_node},
                  {"memory_gib", h.memory_gib},
                  {"reserved_gib", h.reserved_gib},
                  {"kernel_launch_us", h.kernel_launch_us},
                  {"sms", h.sms},
                  {"comm_sms", h.comm_sms},
                  {"peak_fp8_tflops", h.peak_fp8_tflops},
                  {"fp8_efficiency", h.fp8_efficiency},
                  {"sustained_compute_fraction", h.sustained_compute_fraction}});
  return out;
}

}  // namespace

json fp8_json(Fp8Format format) {
  return format == Fp8Format::None ? json(nullptr) : json(std::string(fp8_format_name(format)));
}

namespace {

json precision_json(const PrecisionConfig& p) {
  return {{"param_bytes", p.param_bytes},
          {"grad_bytes", p.grad_bytes},
          {"optimizer_bytes", p.optimizer_bytes},
          {"activation_bytes", p.activation_bytes},
          {"flash_attention", p.flash_attention},
          {"attention_kernel", attention_kernel_name(p.attention_kernel)},
          {"fp8", fp8_json(p.fp8)}};
}

json training_json(const TrainingConfig& t) {
  json out;
  if (t.global_batch_size) out["global_batch_size"] = *t.global_batch_size;
  out.update(json{{"recompute_granularity", recompute_name(t.recompute_granularity)},
          {"recompute_method", t.recompute_method == RecomputeMethod::Block ? "block" : "uniform"},
          {"recompute_num_layers", t.recompute_num_layers},
          {"zero_stage", t.zero_stage},
          {"overlap_grad_reduce", t.overlap_grad_reduce},
          {"overlap_param_gather", t.overlap_param_gather},
          {"tp_comm_overlap", t.tp_comm_overlap},
          {"overlap_p2p_comm", t.overlap_p2p_comm},
          {"overlap_moe_expert_parallel_comm", t.overlap_moe_expert_parallel_comm},
          {"optimizer_post_validation", t.optimizer_post_validation},
          {"kernels", kernel_profile_name(t.kernels)}});
  // The default is left out, so a file that never set it stays without it.
  if (t.grad_accumulation != GradAccumulation::Fused) out["grad_accumulation"] = grad_accumulation_name(t.grad_accumulation);
  if (t.activation_layout != ActivationLayout::SequenceFirst)
    out["activation_layout"] = activation_layout_name(t.activation_layout);
  if (t.attention_unpadding) out["attention_unpadding"] = true;
  // The composite profile's own (its default) is left out, as fused is elsewhere.
  if (t.rotary_embedding == RotaryEmbedding::TensorOps && t.kernels != KernelProfile::Composite)
    out["rotary_embedding"] = rotary_embedding_name(t.rotary_embedding);
  // Only a MoE model may set them (check_experts): a dense config's file stays without them.
  if (t.moe_token_dispatcher_type != MoeDispatcher::AllToAll)
    out["moe_token_dispatcher_type"] = std::string(moe_dispatcher_name(t.moe_token_dispatcher_type));
  if (t.moe_dispatch_mxfp8) out["moe_dispatch_fwd_dtype"] = "mxfp8";
  // Transformer Engine's defaults are left out, so a file that never set them stays without them.
  if (t.tp_comm_overlap_proj_sms != TrainingConfig::kTeOverlapSms) out["tp_comm_overlap_proj_sms"] = t.tp_comm_overlap_proj_sms;
  if (t.tp_comm_overlap_fc2_sms != TrainingConfig::kTeOverlapSms) out["tp_comm_overlap_fc2_sms"] = t.tp_comm_overlap_fc2_sms;
  if (t.bucket_size > 0) out["bucket_size"] = t.bucket_size;
  return out;
}

json costs_json(const ExplicitCosts& c) {
  json out{{"forward_ms", c.forward_ms}, {"backward_ms", c.backward_ms}, {"weight_ms", c.weight_ms},
           {"p2p_ms", c.p2p_ms}};
  if (c.activation_bytes) out["activation_bytes"] = *c.activation_bytes;  // absent: the analytic model
  out.update(json{{"optimizer_ms", c.optimizer_ms},
                  {"dp_allreduce_ms", c.dp_allreduce_ms},
                  {"output_forward_ms", c.output_forward_ms},
                  {"output_backward_ms", c.output_backward_ms},
                  {"input_forward_ms", c.input_forward_ms},
                  {"input_backward_ms", c.input_backward_ms},
                  {"allreduce_ms", c.allreduce_ms},
                  {"output_activation_bytes", c.output_activation_bytes}});
  return out;
}

}  // namespace

json config_json(const Config& config, const std::string& description) {
  json out{{"description", description},
           {"model", model_json(config.model)},
           {"parallel", parallel_json(config.parallel, config.training.global_batch_size.has_value())},
           {"schedule", schedule_json(config.schedule)},
           {"hardware", hardware_json(config.hardware)},
           {"precision", precision_json(config.precision)},
           {"training", training_json(config.training)}};
  if (config.costs) out["costs"] = costs_json(*config.costs);
  return out;
}

}  // namespace pipesim
