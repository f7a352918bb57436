#include "config_json.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <array>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <nlohmann/json.hpp>

#include "config_includes.h"
#include "files.h"
#include "parallel_shape.h"
#include "plan.h"
#include "sizes.h"
#include "spellcheck.h"

namespace pipesim {
namespace {

using json = nlohmann::json;

/// Thrown inside the reader only, caught at its boundary and returned as an Error.
struct ConfigError {
  std::string path;
  std::string message;
  /// The failure is a key's, not a value's: a field the config does not have, or an override's path
  /// through something that is not an object.
  bool about_key = false;
};

/// How deep a config goes, for the message that refuses a deeper one.
constexpr std::string_view kConfigNesting = "pipesim configs nest at most 3 levels (costs.forward_ms: [...])";

/// did_you_mean for a message that lists the choices already: nothing when none is close.
std::string suggestion(const std::string& word, const std::vector<std::string>& choices) {
  return closest_matches(word, choices).empty() ? "" : did_you_mean(word, choices);
}

std::string describe(const json& value) { return (value.is_string() ? "string " : "") + describe_json(value); }

/// Walks one JSON object, checking each key it is asked for and rejecting any it is not.
class ObjectReader {
 public:
  ObjectReader(const json& object, std::string path) : object_(object), path_(std::move(path)) {
    if (!object_.is_object()) throw ConfigError{path_, "expected an object, got " + describe(object_)};
  }

  bool has(const std::string& key) {
    if (std::find(known_.begin(), known_.end(), key) == known_.end()) known_.push_back(key);
    return object_.contains(key);
  }
  std::string at(const std::string& key) const { return path_.empty() ? key : path_ + "." + key; }
  const json& value(const std::string& key) const { return object_.at(key); }

  int integer(const std::string& key, int fallback, int min, bool required = false, int max = std::numeric_limits<int>::max()) {
    if (!has(key)) {
      if (required) throw ConfigError{at(key), fmt::format("required; give an integer >= {}", min)};
      return fallback;
    }
    const json& v = object_.at(key);
    if (!v.is_number_integer() && !(v.is_number_float() && v.get<double>() == std::floor(v.get<double>())))
      throw ConfigError{at(key), "expected an integer, got " + describe(v)};
    const double d = v.get<double>();
    if (d < min) throw ConfigError{at(key), fmt::format("must be at least {}, got {}", min, v.dump())};
    if (d > max) throw ConfigError{at(key), fmt::format("must be at most {}, got {}", max, v.dump())};
    return static_cast<int>(d);
  }

  double number(const std::string& key, double fallback, double min, double max = 1e300, bool min_open = false) {
    if (!has(key)) return fallback;
    return number_value(object_.at(key), at(key), min, max, min_open);
  }

  static double number_value(const json& v, const std::string& path, double min, double max, bool min_open) {
    if (!v.is_number()) throw ConfigError{path, "expected a number, got " + describe(v)};
    const double d = v.get<double>();
    if (min_open ? d <= min : d < min)
      throw ConfigError{path, fmt::format("must be {} {}, got {}", min_open ? "greater than" : "at least", min, v.dump())};
    if (d > max) throw ConfigError{path, fmt::format("must be at most {}, got {}", max, v.dump())};
    return d;
  }

  bool boolean(const std::string& key, bool fallback) {
    if (!has(key)) return fallback;
    if (!object_.at(key).is_boolean()) throw ConfigError{at(key), "expected true or false, got " + describe(object_.at(key))};
    return object_.at(key).get<bool>();
  }

  std::string string(const std::string& key, const std::string& fallback) {
    if (!has(key)) return fallback;
    if (!object_.at(key).is_string()) throw ConfigError{at(key), "expected a string, got " + describe(object_.at(key))};
    return object_.at(key).get<std::string>();
  }

  /// One value a config names (a string among `choices`), `fallback` when absent; anything else is
  /// refused with each choice and what it means (an empty meaning is left out).
  struct Choice {
    std::string name, meaning;
  };
  std::string choice(const std::string& key, const std::string& fallback, const std::vector<Choice>& choices) {
    const std::string given = string(key, fallback);
    std::vector<std::string> names;
    for (const Choice& c : choices) names.push_back(c.name);
    if (std::find(names.begin(), names.end(), given) != names.end()) return given;
    std::string listed;
    for (std::size_t i = 0; i < choices.size(); ++i) {
      listed += i == 0 ? "" : i + 1 == choices.size() ? " or " : ", ";
      listed += fmt::format("\"{}\"", choices[i].name);
      if (!choices[i].meaning.empty()) listed += fmt::format(" ({})", choices[i].meaning);
    }
    throw ConfigError{at(key), fmt::format("expected {}, got \"{}\"{}", listed, visible(abbreviate(given)),
                                           suggestion(given, names))};
  }

  /// Call last: every key not asked for is a mistake (usually a typo).
  void reject_unknown() const {
    for (const auto& [key, _] : object_.items())
      if (std::find(known_.begin(), known_.end(), key) == known_.end()) {
        std::string known;
        for (const std::string& k : known_) known += (known.empty() ? "" : ", ") + k;
        throw ConfigError{at(visible(abbreviate(key))),
                          fmt::format("unknown key{} Known keys here: {}", did_you_mean(key, known_), known), true};
      }
  }

 private:
  const json& object_;
  std::string path_;
  std::vector<std::string> known_;
};

/// head_dim, and multi-head latent attention's widths (all or none of them; q_lora_rank optional).
void read_attention(ObjectReader& r, ModelConfig& m) {
  m.head_dim = r.integer("head_dim", 0, 1, false, limits::kHidden);
  m.kv_lora_rank = r.integer("kv_lora_rank", 0, 1, false, limits::kHidden);
  const bool latent = m.kv_lora_rank > 0;
  m.q_lora_rank = r.integer("q_lora_rank", 0, 1, false, limits::kHidden);
  for (const auto& [key, field] : {std::pair{"qk_nope_head_dim", &m.qk_nope_head_dim},
                                   std::pair{"qk_rope_head_dim", &m.qk_rope_head_dim}, std::pair{"v_head_dim", &m.v_head_dim}}) {
    if (latent != r.has(key))
      throw ConfigError{r.at(latent ? key : "kv_lora_rank"),
                        latent ? "required with kv_lora_rank (multi-head latent attention); give each head's width"
                               : fmt::format("required with {} (multi-head latent attention): give kv_lora_rank, or "
                                             "remove {}", key, key)};
    *field = r.integer(key, 0, 1, false, limits::kHidden);
  }
  if (m.q_lora_rank > 0 && !latent)
    throw ConfigError{r.at("q_lora_rank"), "applies to multi-head latent attention only; give kv_lora_rank "
                                           "(and each head's widths) or remove q_lora_rank"};
  if (latent && m.head_dim > 0)
    throw ConfigError{r.at("head_dim"), "multi-head latent attention gives each head's widths "
                                        "(qk_nope_head_dim, qk_rope_head_dim, v_head_dim); remove head_dim"};
}

/// The mixture-of-experts keys (Megatron-LM's names); without num_experts the others are refused, so a
/// MoE setting never goes silently unused.
void read_experts(ObjectReader& r, ModelConfig& m) {
  m.num_experts = r.integer("num_experts", 0, 0, false, 1 << 16);
  const bool moe = m.num_experts > 0;
  for (const char* key : {"moe_router_topk", "moe_ffn_hidden_size", "moe_shared_expert_intermediate_size",
                          "moe_layer_freq", "moe_capacity_factor", "moe_imbalance", "moe_router_num_groups",
                          "moe_router_group_topk"})
    if (!moe && r.has(key))
      throw ConfigError{r.at(key), "applies to a mixture-of-experts model only; give model.num_experts (the routed "
                                   "experts of a MoE layer) or remove it"};
  m.moe_router_topk = r.integer("moe_router_topk", 2, 1, false, std::max(1, m.num_experts));
  m.moe_ffn_hidden_size = r.integer("moe_ffn_hidden_size", m.ffn_hidden, 1, false, limits::kFfnHidden);
  m.moe_shared_expert_intermediate_size = r.integer("moe_shared_expert_intermediate_size", 0, 0, false, limits::kFfnHidden);
  if (r.has("moe_layer_freq")) {
    const json& v = r.value("moe_layer_freq");
    const std::string path = r.at("moe_layer_freq");
    if (v.is_array()) {
      if (v.size() != std::size_t(m.layers))
        throw ConfigError{path, fmt::format("lists {} layers but model.layers is {}; give one 0 (dense) or 1 (MoE) per "
                                            "layer, or an integer N for every N-th layer", v.size(), m.layers)};
      for (std::size_t i = 0; i < v.size(); ++i) {
        if (!v[i].is_number_integer() || (v[i].get<long>() != 0 && v[i].get<long>() != 1))
          throw ConfigError{fmt::format("{}[{}]", path, i), "expected 0 (a dense layer) or 1 (a MoE layer), got " + describe(v[i])};
        m.moe_layer_pattern.push_back(v[i].get<int>());
      }
    } else {
      m.moe_layer_freq = r.integer("moe_layer_freq", 1, 1, false, std::max(1, m.layers));
    }
  }
  if (r.has("moe_capacity_factor") && !r.value("moe_capacity_factor").is_null())
    m.moe_capacity_factor = r.number("moe_capacity_factor", 1, 0, 1e6, true);
  m.moe_imbalance = r.number("moe_imbalance", 1, 1, 1e6);
  m.moe_router_num_groups = r.integer("moe_router_num_groups", 0, 0, false, std::max(1, m.num_experts));
  m.moe_router_group_topk = r.integer("moe_router_group_topk", 0, 0, false, std::max(1, m.num_experts));
}

ModelConfig read_model(ObjectReader r) {
  ModelConfig m;
  m.layers = r.integer("layers", 0, 1, true);
  m.hidden = r.integer("hidden", 0, 1, true);
  m.heads = r.integer("heads", 0, 1, true);
  m.kv_heads = r.integer("kv_heads", m.heads, 1);
  // The default in 64 bits: a huge hidden is refused by check_sizes, not wrapped here.
  m.ffn_hidden = r.integer("ffn_hidden", int(std::min<std::int64_t>(4 * std::int64_t(m.hidden), INT_MAX)), 1);
  m.seq_len = r.integer("seq_len", 0, 1, true);
  m.vocab = r.integer("vocab", 0, 1, true);
  m.micro_batch_size = r.integer("micro_batch_size", 1, 1);
  const std::string mlp =
      r.choice("mlp", "gelu", {{"gelu", "GPT: two matrices"}, {"swiglu", "Llama, Qwen: gate, up and down matrices"}});
  m.mlp = mlp == "swiglu" ? MlpKind::SwiGlu : MlpKind::Gelu;
  m.tied_embeddings = r.boolean("tied_embeddings", false);
  read_attention(r, m);
  read_experts(r, m);
  r.has("hf_config");  // expand_hf_config has turned it into the fields above
  r.reject_unknown();
  return m;
}

/// `global_batch`: the config gives training.global_batch_size, which makes microbatches optional.
ParallelConfig read_parallel(ObjectReader r, bool global_batch) {
  ParallelConfig p;
  p.pp = r.integer("pp", 1, 1);  // check_sizes holds the upper limits
  p.tp = r.integer("tp", 1, 1);
  p.dp = r.integer("dp", 1, 1);
  p.cp = r.integer("cp", 1, 1);
  if (!global_batch && !r.has("microbatches"))
    throw ConfigError{r.at("microbatches"), "required; give an integer >= 1, or training.global_batch_size (sequences "
                                            "per iteration) to derive it from"};
  p.microbatches = r.integer("microbatches", 1, 1);  // with a global batch: derive_microbatches, unless given
  p.chunks = r.integer("chunks", 1, 1);
  p.sequence_parallel = r.boolean("sequence_parallel", p.sequence_parallel);
  p.ep = r.integer("ep", 1, 1);
  p.etp = r.integer("etp", 0, 1);  // absent: tp (ParallelConfig::expert_tp), also after a change of tp
  r.reject_unknown();
  return p;
}

/// A number is a multiple of 1F1B's peak activation memory; a string is "fit" or GiB ("40 GiB").
ActivationLimit read_activation_limit(const json& v, const std::string& path) {
  constexpr std::string_view kForms = "a multiple of 1F1B's peak activation memory (2 for ZB-2p), \"40 GiB\" or \"fit\"";
  if (v.is_number()) {
    const double times = v.get<double>();
    if (!(times > 0) || times > 1e6) throw ConfigError{path, fmt::format("expected {}, got {}", kForms, v.dump())};
    return {ActivationLimit::Unit::Times1F1B, times};
  }
  if (v.is_string()) {
    const std::string text = v.get<std::string>();
    if (text == "fit") return {};
    double gib = 0;
    int used = 0;
    if (std::sscanf(text.c_str(), "%lf %n", &gib, &used) == 1 && text.substr(std::size_t(used)) == "GiB" && gib > 0 &&
        gib <= 1e6)
      return {ActivationLimit::Unit::Bytes, gib * double(Bytes(1) << 30)};
  }
  throw ConfigError{path, fmt::format("expected {}, got {}", kForms, describe(v))};
}

ScheduleConfig read_schedule(ObjectReader r) {
  ScheduleConfig s;
  s.name = r.string("name", s.name);
  const std::string vocab = r.string("vocab", std::string(vocab_mode_name(s.vocab)));
  const std::optional<VocabMode> mode = vocab_mode_named(vocab);
  if (!mode)
    throw ConfigError{r.at("vocab"), fmt::format("unknown vocabulary mode '{}'{} Modes: {} (`pipesim list` describes "
                                                 "them)", visible(abbreviate(vocab)), did_you_mean(vocab, vocab_mode_names()),
                                                 fmt::join(vocab_mode_names(), ", "))};
  s.vocab = *mode;
  if (r.has("layers_per_stage")) {
    const json& v = r.value("layers_per_stage");
    const std::string path = r.at("layers_per_stage");
    if (v.is_string()) {
      if (v.get<std::string>() != "auto")
        throw ConfigError{path, "expected \"auto\" or an array of layer counts, got " + describe(v)};
    } else if (v.is_array()) {
      for (std::size_t i = 0; i < v.size(); ++i) {
        const std::string item = fmt::format("{}[{}]", path, i);
        if (!v[i].is_number_integer() || v[i].get<long>() < 0)
          throw ConfigError{item, "expected a layer count (integer >= 0), got " + describe(v[i])};
        if (v[i].get<long>() > limits::kLayers)
          throw ConfigError{item, fmt::format("must be at most {}, got {} (pipesim's limit; docs/config.md says why)", limits::kLayers,
                                              v[i].dump())};
        s.layers_per_stage.push_back(v[i].get<int>());
      }
    } else {
      throw ConfigError{path, "expected \"auto\" or an array of layer counts, got " + describe(v)};
    }
  }
  if (r.has("memory_limit")) s.memory_limit = read_activation_limit(r.value("memory_limit"), r.at("memory_limit"));
  r.reject_unknown();
  return s;
}

HardwareConfig read_hardware(const json* object) {
  const json empty = json::object();
  ObjectReader r(object ? *object : empty, "hardware");
  const std::string preset_name = r.string("preset", "h100-sxm");
  const std::optional<HardwareConfig> preset = hardware_preset(preset_name);
  if (!preset) {
    std::string names;
    for (const std::string& n : hardware_preset_names()) names += (names.empty() ? "" : ", ") + n;
    throw ConfigError{"hardware.preset", fmt::format("unknown preset '{}'{} Presets: {}", preset_name,
                                                     did_you_mean(preset_name, hardware_preset_names()), names)};
  }
  HardwareConfig h = *preset;
  h.peak_tflops = r.number("peak_tflops", h.peak_tflops, 0, 1e300, true);
  h.compute_efficiency = r.number("compute_efficiency", h.compute_efficiency, 0, 1, true);
  h.attention_efficiency = r.number("attention_efficiency", h.attention_efficiency, 0, 1, true);
  h.flash2_attention_efficiency = r.number("flash2_attention_efficiency", h.flash2_attention_efficiency, 0, 1, true);
  h.attention_overhead_tokens = r.number("attention_overhead_tokens", h.attention_overhead_tokens, 0);
  h.hbm_gbps = r.number("hbm_gbps", h.hbm_gbps, 0, 1e300, true);
  h.hbm_efficiency = r.number("hbm_efficiency", h.hbm_efficiency, 0, 1, true);
  h.intra_node_gbps = r.number("intra_node_gbps", h.intra_node_gbps, 0, 1e300, true);
  h.intra_node_efficiency = r.number("intra_node_efficiency", h.intra_node_efficiency, 0, 1, true);
  h.intra_node_latency_us = r.number("intra_node_latency_us", h.intra_node_latency_us, 0);
  h.nvls_allreduce_gbps = r.number("nvls_allreduce_gbps", h.nvls_allreduce_gbps, 0);
  h.inter_node_gbps = r.number("inter_node_gbps", h.inter_node_gbps, 0, 1e300, true);
  h.inter_node_latency_us = r.number("inter_node_latency_us", h.inter_node_latency_us, 0);
  h.gpus_per_node = r.integer("gpus_per_node", h.gpus_per_node, 1);
  h.memory_gib = r.number("memory_gib", h.memory_gib, 0, 1e300, true);
  h.reserved_gib = r.number("reserved_gib", std::min(h.reserved_gib, h.memory_gib), 0, h.memory_gib);
  h.kernel_launch_us = r.number("kernel_launch_us", h.kernel_launch_us, 0);
  h.sms = r.integer("sms", h.sms, 0);
  h.comm_sms = r.integer("comm_sms", h.comm_sms, 0);
  h.peak_fp8_tflops = r.number("peak_fp8_tflops", h.peak_fp8_tflops, 0);
  h.fp8_efficiency = r.number("fp8_efficiency", h.fp8_efficiency, 0, 1);
  h.sustained_compute_fraction = r.number("sustained_compute_fraction", h.sustained_compute_fraction, 0, 1, true);
  r.reject_unknown();
  return h;
}

/// `distributed_optimizer`, the precision block's older name for ZeRO stage 1, is read by read_training.
PrecisionConfig read_precision(const json* object) {
  const json empty = json::object();
  ObjectReader r(object ? *object : empty, "precision");
  PrecisionConfig p;
  r.has("distributed_optimizer");
  p.param_bytes = r.number("param_bytes", p.param_bytes, 0, 8, true);
  p.grad_bytes = r.number("grad_bytes", p.grad_bytes, 0, 8, true);
  p.optimizer_bytes = r.number("optimizer_bytes", p.optimizer_bytes, 0, 64);
  p.activation_bytes = r.number("activation_bytes", p.activation_bytes, 0, 8, true);
  p.flash_attention = r.boolean("flash_attention", p.flash_attention);
  if (r.has("attention_kernel")) {
    const std::string kernel = r.choice(
        "attention_kernel", "cudnn",
        {{"cudnn", "cuDNN's fused attention: Transformer Engine, PyTorch's SDPA on Hopper today"},
         {"flash2", "FlashAttention-2"},
         {"flash1", "FlashAttention-1 (flash-attn 1.x)"}});
    if (!p.flash_attention)
      throw ConfigError{r.at("attention_kernel"), "names the fused attention kernel, and precision.flash_attention is "
                                                  "false; remove it or set flash_attention to true"};
    constexpr std::array kKernels{AttentionKernel::Cudnn, AttentionKernel::Flash2, AttentionKernel::Flash1};
    p.attention_kernel = *std::ranges::find(kKernels, kernel, attention_kernel_name);
  }
  if (r.has("fp8") && !r.value("fp8").is_null()) {
    const std::string fp8 = r.string("fp8", "");
    if (fp8 != "hybrid" && fp8 != "e4m3")
      throw ConfigError{r.at("fp8"), fmt::format("expected null (bf16 GEMMs), \"hybrid\" (E4M3 forward, E5M2 gradients) "
                                                 "or \"e4m3\", as Megatron-LM's --fp8-format, got \"{}\"{}",
                                                 visible(abbreviate(fp8)), suggestion(fp8, {"hybrid", "e4m3"}))};
    p.fp8 = fp8 == "hybrid" ? Fp8Format::Hybrid : Fp8Format::E4M3;
  }
  r.reject_unknown();
  return p;
}

/// The training block; `precision.distributed_optimizer: true` (an older spelling) means zero_stage 1.
TrainingConfig read_training(const json* object, const json* precision) {
  const json empty = json::object();
  ObjectReader r(object ? *object : empty, "training");
  TrainingConfig t;
  if (r.has("global_batch_size")) t.global_batch_size = r.integer("global_batch_size", 0, 1);
  const std::string granularity = r.choice("recompute_granularity", "none",
                                           {{"none", ""},
                                            {"selective", "core attention"},
                                            {"selective_op", "torchtitan's per-op policy"},
                                            {"full", "whole layers"}});
  constexpr std::array kGranularities{Recompute::None, Recompute::Selective, Recompute::SelectiveOp, Recompute::Full};
  t.recompute_granularity = *std::ranges::find(kGranularities, granularity, recompute_name);
  const std::string method = r.choice("recompute_method", "uniform",
                                      {{"uniform", "every layer, in groups of recompute_num_layers"},
                                       {"block", "the first recompute_num_layers layers of each stage"}});
  t.recompute_method = method == "block" ? RecomputeMethod::Block : RecomputeMethod::Uniform;
  t.recompute_num_layers = r.integer("recompute_num_layers", 1, 1, false, limits::kLayers);
  t.optimizer_post_validation = r.boolean("optimizer_post_validation", t.optimizer_post_validation);
  const std::string kernels =
      r.choice("kernels", "eager",
               {{"eager", "PyTorch, one kernel an op"},
                {"composite", "eager, RMSNorm and the rotary embedding as tensor ops (torchtitan's Llama of 2024)"},
                {"fused", "Megatron-Core and Transformer Engine, torch.compile"}});
  constexpr std::array kProfiles{KernelProfile::Eager, KernelProfile::Composite, KernelProfile::Fused};
  t.kernels = *std::ranges::find(kProfiles, kernels, kernel_profile_name);
  const std::string rotary =
      r.choice("rotary_embedding", t.kernels == KernelProfile::Composite ? "tensor_ops" : "fused",
               {{"fused", "one kernel (Transformer Engine, Apex, torch.compile)"},
                {"tensor_ops", "a complex multiply in eager ops (torchtitan's Llama)"}});
  t.rotary_embedding = rotary == "tensor_ops" ? RotaryEmbedding::TensorOps : RotaryEmbedding::Fused;
  const std::string accumulation =
      r.choice("grad_accumulation", "fused",
               {{"fused", "the weight-gradient GEMM adds into the fp32 main gradients (Megatron-LM)"},
                {"deepspeed", "fresh gradients each backward, cast to fp32 and added in (DeepSpeed's BF16_Optimizer)"},
                {"fsdp", "fresh gradients each backward, concatenated, cast and divided before the reduce-scatter (PyTorch FSDP's flat parameters)"},
                {"fsdp2", "fresh gradients each backward, copied into the reduce-scatter's input in its type (PyTorch FSDP2, fully_shard)"}});
  constexpr std::array kAccumulations{GradAccumulation::Fused, GradAccumulation::DeepSpeed, GradAccumulation::Fsdp,
                                      GradAccumulation::Fsdp2};
  t.grad_accumulation = *std::ranges::find(kAccumulations, accumulation, grad_accumulation_name);
  const std::string layout =
      r.choice("activation_layout", "sbh",
               {{"sbh", "sequence first: sequence parallelism gathers and scatters in place (Megatron-LM)"},
                {"bsh", "batch first: each sequence-parallel gather and scatter copies the whole tensor (torchtitan's DTensor)"}});
  constexpr std::array kLayouts{ActivationLayout::SequenceFirst, ActivationLayout::BatchFirst};
  t.activation_layout = *std::ranges::find(kLayouts, layout, activation_layout_name);
  t.attention_unpadding = r.boolean("attention_unpadding", false);
  bool distributed_optimizer = false;
  if (precision && precision->contains("distributed_optimizer")) {
    const json& v = precision->at("distributed_optimizer");
    if (!v.is_boolean()) throw ConfigError{"precision.distributed_optimizer", "expected true or false, got " + describe(v)};
    distributed_optimizer = v.get<bool>();
  }
  t.zero_stage = r.integer("zero_stage", distributed_optimizer ? 1 : 0, 0, false, 3);
  if (distributed_optimizer && t.zero_stage == 0)
    throw ConfigError{r.at("zero_stage"), "is 0 but precision.distributed_optimizer is true (ZeRO stage 1); remove "
                                          "one of them or make them agree"};
  t.overlap_grad_reduce = r.boolean("overlap_grad_reduce", false);
  t.overlap_param_gather = r.boolean("overlap_param_gather", false);
  t.bucket_size = r.integer("bucket_size", 0, 0);
  t.tp_comm_overlap = r.boolean("tp_comm_overlap", false);
  t.tp_comm_overlap_proj_sms = r.integer("tp_comm_overlap_proj_sms", TrainingConfig::kTeOverlapSms, 0);
  t.tp_comm_overlap_fc2_sms = r.integer("tp_comm_overlap_fc2_sms", TrainingConfig::kTeOverlapSms, 0);
  t.overlap_p2p_comm = r.boolean("overlap_p2p_comm", false);
  t.overlap_moe_expert_parallel_comm = r.boolean("overlap_moe_expert_parallel_comm", false);
  const std::string dispatcher = r.string("moe_token_dispatcher_type", "alltoall");
  if (dispatcher == "flex") t.moe_token_dispatcher_type = MoeDispatcher::Flex;
  else if (dispatcher != "alltoall")
    throw ConfigError{r.at("moe_token_dispatcher_type"),
                      fmt::format("expected \"alltoall\" or \"flex\" (DeepEP), got \"{}\"{}", dispatcher,
                                  dispatcher == "allgather" ? "; Megatron-Core's all-gather dispatcher is not modelled" : "")};
  const std::string wire = r.string("moe_dispatch_fwd_dtype", "bf16");
  if (wire != "bf16" && wire != "mxfp8")
    throw ConfigError{r.at("moe_dispatch_fwd_dtype"), fmt::format("expected \"bf16\" or \"mxfp8\", got \"{}\"", wire)};
  t.moe_dispatch_mxfp8 = wire == "mxfp8";
  r.reject_unknown();
  return t;
}

/// A number or an array of numbers (one per device).
std::vector<double> per_device_ms(ObjectReader& r, const std::string& key, bool required) {
  if (!r.has(key)) {
    if (required) throw ConfigError{r.at(key), "required in a costs block; give milliseconds per microbatch"};
    return {0.0};
  }
  const json& v = r.value(key);
  if (!v.is_array()) return {ObjectReader::number_value(v, r.at(key), 0, 1e300, false)};
  if (v.empty()) throw ConfigError{r.at(key), "expected a number or a non-empty array of numbers, got []"};
  std::vector<double> values;
  for (std::size_t i = 0; i < v.size(); ++i)
    values.push_back(ObjectReader::number_value(v[i], fmt::format("{}[{}]", r.at(key), i), 0, 1e300, false));
  return values;
}

ExplicitCosts read_costs(ObjectReader r) {
  ExplicitCosts c;
  c.forward_ms = per_device_ms(r, "forward_ms", true);
  c.backward_ms = per_device_ms(r, "backward_ms", true);
  c.weight_ms = per_device_ms(r, "weight_ms", false);
  c.p2p_ms = r.number("p2p_ms", 0, 0);
  if (r.has("activation_bytes")) c.activation_bytes = r.number("activation_bytes", 0, 0);
  c.optimizer_ms = r.number("optimizer_ms", 0, 0);
  c.dp_allreduce_ms = r.number("dp_allreduce_ms", 0, 0);
  c.output_forward_ms = r.number("output_forward_ms", 0, 0);
  c.output_backward_ms = r.number("output_backward_ms", 0, 0);
  c.input_forward_ms = r.number("input_forward_ms", 0, 0);
  c.input_backward_ms = r.number("input_backward_ms", 0, 0);
  c.allreduce_ms = r.number("allreduce_ms", 0, 0);
  c.output_activation_bytes = r.number("output_activation_bytes", 0, 0);
  r.reject_unknown();
  return c;
}

/// `origins` gets the fields taken from the files the config includes.
Config read_config(json root, const std::string& source, FieldOrigins& origins) {
  if (Status s = expand_hf_config(root, source, origins); !s.ok()) throw ConfigError{"model.hf_config", s.error().message};
  if (Status s = expand_hardware_file(root, source, origins); !s.ok())
    throw ConfigError{"hardware.file", s.error().message};
  ObjectReader r(root, "");
  Config c;
  c.source = source;
  if (!r.has("model")) throw ConfigError{"model", "required; give layers, hidden, heads, seq_len and vocab"};
  c.model = read_model(ObjectReader(r.value("model"), "model"));
  if (!r.has("parallel")) throw ConfigError{"parallel", "required; give at least microbatches (and pp)"};
  // Peeked at here, read in its turn below (the order of r.has is the order an unknown key's message lists).
  const json* training = root.contains("training") ? &root.at("training") : nullptr;
  const bool global_batch = training && training->is_object() && training->contains("global_batch_size");
  const bool microbatches_given = r.value("parallel").is_object() && r.value("parallel").contains("microbatches");
  c.parallel = read_parallel(ObjectReader(r.value("parallel"), "parallel"), global_batch);
  if (r.has("schedule")) c.schedule = read_schedule(ObjectReader(r.value("schedule"), "schedule"));
  c.hardware = read_hardware(r.has("hardware") ? &r.value("hardware") : nullptr);
  const json* precision = r.has("precision") ? &r.value("precision") : nullptr;
  c.precision = read_precision(precision);
  c.training = read_training(r.has("training") ? training : nullptr, precision);
  if (r.has("costs")) c.costs = read_costs(ObjectReader(r.value("costs"), "costs"));
  // After every --set (they edited the JSON before it was read), so a new dp or micro-batch size keeps
  // the global batch. Microbatches given as well are checked against it by check_config.
  if (!microbatches_given)
    if (std::optional<FieldError> e = derive_microbatches(c)) throw ConfigError{e->path, e->message};
  r.has("description");  // free text for the reader of the file
  r.reject_unknown();
  // Checked as the named schedule runs it: its own chunk count (1f1b's one) in place of parallel.chunks,
  // which only interleaved-1f1b reads (a parallel.chunks past pipesim's cap is refused all the same).
  Config as_run = c;
  const ScheduleInfo* schedule = find_schedule(c.schedule.name);
  if (schedule && schedule->chunks > 0 && c.parallel.chunks <= limits::kChunks) as_run.parallel.chunks = schedule->chunks;
  if (std::optional<FieldError> e = check_config_for(as_run, schedule)) throw ConfigError{e->path, e->message};
  return c;
}

/// The offset of the first byte of `text` that is not part of well-formed UTF-8; nullopt when all are.
std::optional<std::size_t> invalid_utf8(std::string_view text) {
  for (std::size_t i = 0; i < text.size();) {
    const auto lead = static_cast<unsigned char>(text[i]);
    const std::size_t length = lead < 0x80                 ? 1
                               : lead >= 0xC2 && lead < 0xE0 ? 2
                               : lead >= 0xE0 && lead < 0xF0 ? 3
                               : lead >= 0xF0 && lead < 0xF5 ? 4
                                                             : 0;
    if (length == 0 || i + length > text.size()) return i;
    for (std::size_t k = 1; k < length; ++k)
      if ((static_cast<unsigned char>(text[i + k]) & 0xC0) != 0x80) return i;
    // Overlong forms, UTF-16 surrogates and code points past U+10FFFF.
    const auto second = length > 1 ? static_cast<unsigned char>(text[i + 1]) : 0;
    if ((lead == 0xE0 && second < 0xA0) || (lead == 0xED && second >= 0xA0) || (lead == 0xF0 && second < 0x90) ||
        (lead == 0xF4 && second >= 0x90))
      return i;
    i += length;
  }
  return std::nullopt;
}

/// The value of `--set path=text`: JSON when it parses as JSON (numbers, true, [1,2]), else the text
/// as a string. What pipesim refuses in a file (nesting past kMaxJsonDepth, a key twice) it refuses here.
json override_value(const std::string& shown, const std::string& path, const std::string& text) {
  if (too_deep(text))
    throw ConfigError{"", fmt::format("--set '{}': the value nests deeper than {} levels; {}", shown, kMaxJsonDepth,
                                      kConfigNesting)};
  Result<json> value = parse_json_text(text, "--set " + visible(abbreviate(path)), kConfigNesting);
  if (value.ok()) return value.value();
  if (!json::parse(text, nullptr, false).is_discarded()) throw ConfigError{"", value.error().message};
  return text;
}

/// Applies `key.path=value`; creates missing objects along the path.
void apply_override(json& root, const std::string& assignment) {
  const std::string shown = visible(abbreviate(assignment));
  const std::size_t eq = assignment.find('=');
  // Every string in a config is text: nlohmann checks a file's, and cannot print any other.
  if (const std::optional<std::size_t> bad = invalid_utf8(assignment))
    throw ConfigError{"", fmt::format("--set '{}': byte {} is not UTF-8 text; write the key and value as text", shown,
                                      *bad + 1),
                      *bad < eq};
  if (eq == std::string::npos || eq == 0)
    throw ConfigError{"", fmt::format("--set '{}': expected key.path=value, e.g. --set parallel.pp=4", shown), true};
  const std::string path = assignment.substr(0, eq), text = assignment.substr(eq + 1);
  // Each key opens an object: a path of thousands would nest the config deeper than a file may.
  if (std::count(path.begin(), path.end(), '.') >= kMaxJsonDepth)
    throw ConfigError{"", fmt::format("--set '{}': a path of more than {} keys; config fields are at most 2 keys deep "
                                      "(e.g. parallel.pp)",
                                      shown, kMaxJsonDepth),
                      true};
  const json value = override_value(shown, path, text);
  json* node = &root;
  std::size_t begin = 0;
  while (true) {
    const std::size_t dot = path.find('.', begin);
    const std::string key = path.substr(begin, dot == std::string::npos ? std::string::npos : dot - begin);
    if (key.empty())
      throw ConfigError{"", fmt::format("--set '{}': empty key in '{}'", shown, visible(abbreviate(path))), true};
    if (!node->is_object())
      throw ConfigError{"", fmt::format("--set '{}': '{}' is not an object", shown,
                                        visible(abbreviate(path.substr(0, begin - 1)))),
                        true};
    if (dot == std::string::npos) {
      (*node)[key] = value;
      return;
    }
    node = &(*node)[key];
    if (node->is_null()) *node = json::object();
    begin = dot + 1;
  }
}

/// A --set of training.global_batch_size or of parallel.microbatches (not both) states the batch anew:
/// the other, as the file gives it, is dropped to follow from it rather than contradict it.
void restate_batch(json& root, const std::vector<std::string>& set_paths) {
  const auto set = [&](std::string_view path) {
    return std::find(set_paths.begin(), set_paths.end(), path) != set_paths.end();
  };
  const bool global_batch = set("training.global_batch_size"), microbatches = set("parallel.microbatches");
  if (global_batch == microbatches) return;
  const auto [block, key] = global_batch ? std::pair{"parallel", "microbatches"} : std::pair{"training", "global_batch_size"};
  if (root.contains(block) && root[block].is_object()) root[block].erase(key);
}

/// parse_config, also saying in `key_fault` whether a failure was a key's (ConfigError::about_key).
Result<Config> parse(std::string_view text, const std::string& source, const std::vector<std::string>& overrides,
                     bool& key_fault) {
  key_fault = false;
  Result<json> parsed = parse_json_text(text, source, kConfigNesting);
  if (!parsed.ok()) return parsed.error();
  json& root = parsed.value();
  if (!root.is_object())
    return Error{fmt::format("{}: expected a JSON object at the top level, got {}; a config is {{\"model\": ..., "
                             "\"parallel\": ...}}",
                             source, describe(root))};
  std::vector<std::string> set_paths;
  FieldOrigins origins;
  try {
    for (const std::string& o : overrides) {
      apply_override(root, o);
      set_paths.push_back(o.substr(0, o.find('=')));
    }
    restate_batch(root, set_paths);
    return read_config(root, source, origins);
  } catch (const ConfigError& e) {
    key_fault = e.about_key;
    if (e.path.empty()) return Error{e.message};
    const auto within = [&](const std::string& field) {
      return e.path == field || e.path.starts_with(field + ".") || e.path.starts_with(field + "[");
    };
    // A --set also owns the objects it created on its way: `--set a.b=1` is the reason for "a: unknown key".
    const bool from_set = std::any_of(set_paths.begin(), set_paths.end(), [&](const std::string& set) {
      return within(set) || set.starts_with(e.path + ".");
    });
    std::string from = from_set ? " (from --set)" : "";
    for (const auto& [field, origin] : origins)
      if (within(field)) from = " (from " + origin + ")";
    return Error{fmt::format("{}: {}{}: {}", source, e.path, from, e.message)};
  }
}

}  // namespace

Result<Config> parse_config(std::string_view text, const std::string& source,
                            const std::vector<std::string>& overrides) {
  bool key_fault = false;
  return parse(text, source, overrides, key_fault);
}

std::optional<Error> key_error(std::string_view text, const std::string& source,
                               const std::vector<std::string>& overrides) {
  bool key_fault = false;
  Result<Config> config = parse(text, source, overrides, key_fault);
  if (config.ok() || !key_fault) return std::nullopt;
  return config.error();
}

Result<ExplicitCosts> parse_costs(std::string_view text, const std::string& source) {
  Result<json> parsed = parse_json_text(text, source, "a costs block nests at most 2 levels (forward_ms: [...])");
  if (!parsed.ok()) return parsed.error();
  try {
    return read_costs(ObjectReader(parsed.value(), "costs"));
  } catch (const ConfigError& e) {
    return Error{fmt::format("{}: {}: {}", source, e.path, e.message)};
  }
}

}  // namespace pipesim
