#include "torchtitan_toml.h"

#include <fmt/format.h>

#include <array>
#include <toml++/toml.h>

#include "parallel_shape.h"

namespace pipesim {
namespace {

/// torchtitan's Llama 3 flavors (torchtitan/models/llama3/__init__.py): the FFN width is its
/// multiple_of-rounded ffn_dim_multiplier x 8/3 dim; the vocabulary is Llama 3's tokenizer's.
struct Flavor {
  const char* name;
  int layers, hidden, heads, kv_heads, ffn_hidden;
};
constexpr std::array<Flavor, 3> kLlama3 = {{{"8B", 32, 4096, 32, 8, 14336},
                                            {"70B", 80, 8192, 64, 8, 28672},
                                            {"405B", 126, 16384, 128, 8, 53248}}};
constexpr int kLlama3Vocab = 128256;

/// pipesim's schedule names and torch.distributed.pipelining's, as pipeline_parallel_schedule takes them.
constexpr std::array<std::pair<const char*, const char*>, 5> kSchedules = {{{"gpipe", "GPipe"},
                                                                            {"1f1b", "1F1B"},
                                                                            {"interleaved-1f1b", "Interleaved1F1B"},
                                                                            {"zb-v", "ZBVZeroBubble"},
                                                                            {"dualpipe-v", "DualPipeV"}}};

const Flavor* flavor_of(const ModelConfig& m) {
  for (const Flavor& f : kLlama3)
    if (m.layers == f.layers && m.hidden == f.hidden && m.heads == f.heads && m.key_value_heads() == f.kv_heads &&
        m.ffn_hidden == f.ffn_hidden && m.vocab == kLlama3Vocab && m.mlp == MlpKind::SwiGlu)
      return &f;
  return nullptr;
}

std::string quoted(const std::string& s) { return fmt::format("\"{}\"", s); }

}  // namespace

std::string torchtitan_toml(const Config& c, const std::vector<int>& split, const std::string& what) {
  const ModelConfig& m = c.model;
  const ParallelConfig& p = c.parallel;
  const Flavor* flavor = flavor_of(m);
  std::string out = fmt::format("# torchtitan job config for {}\n", what);
  out += fmt::format("# launch on {} GPUs: tp {} x cp {} x dp {} x pp {}; add your dataset, optimizer and checkpoint "
                     "sections\n\n",
                     gpu_count(c.parallel), p.tp, p.cp, p.dp, p.pp);
  out += fmt::format("[job]\ndescription = {}\n\n", quoted("from pipesim: " + what));
  out += "[model]\n";
  if (flavor) {
    out += fmt::format("name = \"llama3\"\nflavor = {}\n", quoted(flavor->name));
  } else {
    out += fmt::format("# no torchtitan flavor has this shape: register one with dim={}, n_layers={}, n_heads={}, "
                       "n_kv_heads={}, ffn hidden {}, vocab_size={}\nname = \"llama3\"\nflavor = \"custom\"\n",
                       m.hidden, m.layers, m.heads, m.key_value_heads(), m.ffn_hidden, m.vocab);
  }
  // torchao's float8 training of the linear layers (torchtitan/components/quantization/float8.py).
  if (c.precision.fp8 != Fp8Format::None) out += "converters = [\"quantize.linear.float8\"]\n";
  // The composite profile is the eager RMSNorm torchtitan's 2024 releases built for this name.
  if (c.training.kernels == KernelProfile::Composite) out += "norm_type = \"rmsnorm\"\n";
  out += "\n";
  const std::int64_t global_batch = global_batch_size(c);
  out += fmt::format("[training]\nlocal_batch_size = {}\nglobal_batch_size = {}\nseq_len = {}\n\n", global_batch / p.dp,
                     global_batch, m.seq_len);
  const bool sharded = p.dp > 1 && c.training.zero_stage >= 2;
  out += fmt::format("[parallelism]\ndata_parallel_replicate_degree = {}\ndata_parallel_shard_degree = {}\n",
                     sharded ? 1 : p.dp, sharded ? p.dp : 1);
  if (sharded) out += fmt::format("fsdp_reshard_after_forward = {}\n", c.training.zero_stage == 2 ? "\"never\"" : "\"always\"");
  out += fmt::format("tensor_parallel_degree = {}\nenable_async_tensor_parallel = {}\n", p.tp,
                     p.tp > 1 && c.training.tp_comm_overlap);
  out += fmt::format("pipeline_parallel_degree = {}\n", p.pp);
  for (const auto& [ours, theirs] : kSchedules)
    if (c.schedule.name == ours) out += fmt::format("pipeline_parallel_schedule = {}\n", quoted(theirs));
  out += fmt::format("pipeline_parallel_microbatch_size = {}\n", m.micro_batch_size);
  const bool one_chunk = c.schedule.name == "gpipe" || c.schedule.name == "1f1b" || p.pp == 1;
  if (one_chunk) {  // the ends' layers as torchtitan says them: fewer than the stages between them
    const int middle = split.size() >= 3 ? split[1] : (split.empty() ? 0 : split.front());
    out += fmt::format("pipeline_parallel_first_stage_less_layers = {}\npipeline_parallel_last_stage_less_layers = {}\n",
                       split.empty() ? 0 : middle - split.front(), split.empty() ? 0 : middle - split.back());
  } else {
    out += fmt::format("pipeline_parallel_layers_per_stage = {}\n", m.layers / (p.pp * p.chunks));
  }
  out += fmt::format("context_parallel_degree = {}\n\n", p.cp);
  const Recompute r = c.training.recompute_granularity;
  const char* mode = r == Recompute::Full ? "full" : r == Recompute::SelectiveOp ? "selective" : "none";
  out += fmt::format("[activation_checkpoint]\nmode = \"{}\"\n", mode);
  if (r == Recompute::SelectiveOp) out += "selective_ac_option = \"op\"\n";
  // torch.compile fuses the elementwise kernels (training.kernels "fused"); async TP needs it too.
  if (c.training.kernels == KernelProfile::Fused) out += "\n[compile]\nenable = true\n";
  return out;
}

Result<ImportedConfig> config_from_torchtitan(const std::string& text, const std::string& source,
                                              const std::optional<ModelConfig>& given) {
  toml::table table;
  try {
    table = toml::parse(text, source);
  } catch (const toml::parse_error& e) {
    return Error{fmt::format("{}:{}:{}: {}", source, e.source().begin.line, e.source().begin.column, e.description())};
  }
  using json = nlohmann::json;
  ImportedConfig imported;
  std::string error;
  const auto integer = [&](const char* section, const char* key, int fallback) {
    const toml::node* node = table.at_path(std::string(section) + "." + key).node();
    if (!node) return fallback;
    const std::optional<std::int64_t> v = node->value<std::int64_t>();
    if ((!v || *v < 1) && error.empty())
      error = fmt::format("{}: [{}] {}: expected a whole number >= 1", source, section, key);
    return v ? int(*v) : fallback;
  };
  const auto text_of = [&](const char* section, const char* key, const char* fallback) {
    return table.at_path(std::string(section) + "." + key).value_or(std::string(fallback));
  };

  ModelConfig model;
  const std::string flavor = text_of("model", "flavor", "");
  if (given) {
    model = *given;
  } else {
    const Flavor* known = nullptr;
    for (const Flavor& f : kLlama3)
      if (text_of("model", "name", "") == "llama3" && flavor == f.name) known = &f;
    if (!known)
      return Error{fmt::format("{}: [model] {} {}: pipesim knows torchtitan's llama3 8B, 70B and 405B; give the model "
                               "with --model CONFIG (a pipesim config or its hf_config)",
                               source, text_of("model", "name", "?"), flavor.empty() ? "(no flavor)" : flavor)};
    model.layers = known->layers, model.hidden = known->hidden, model.heads = known->heads;
    model.kv_heads = known->kv_heads, model.ffn_hidden = known->ffn_hidden, model.vocab = kLlama3Vocab;
    model.mlp = MlpKind::SwiGlu;
  }
  const int seq = integer("training", "seq_len", 2048), local_batch = integer("training", "local_batch_size", 8);
  const int mbs = integer("parallelism", "pipeline_parallel_microbatch_size", 1);
  const int tp = integer("parallelism", "tensor_parallel_degree", 1), pp = integer("parallelism", "pipeline_parallel_degree", 1);
  const int cp = integer("parallelism", "context_parallel_degree", 1);
  const int replicate = integer("parallelism", "data_parallel_replicate_degree", 1);
  const toml::node* shard_node = table.at_path("parallelism.data_parallel_shard_degree").node();
  if (!shard_node || shard_node->value<std::int64_t>().value_or(-1) == -1)
    return Error{fmt::format("{}: [parallelism] data_parallel_shard_degree is -1 (the GPUs left over), which a job file "
                             "alone does not fix: give it as a number",
                             source)};
  const int shard = integer("parallelism", "data_parallel_shard_degree", 1);
  if (!error.empty()) return Error{error};
  if (local_batch % mbs != 0)
    return Error{fmt::format("{}: [training] local_batch_size {} is not a multiple of [parallelism] "
                             "pipeline_parallel_microbatch_size {}",
                             source, local_batch, mbs)};
  const std::string reshard = text_of("parallelism", "fsdp_reshard_after_forward", "default");
  const bool compiled = table.at_path("compile.enable").value_or(table.at_path("training.compile").value_or(false));
  json training{{"zero_stage", shard > 1 ? (reshard == "never" ? 2 : 3) : 0},
                {"overlap_p2p_comm", true},  // torch.distributed.pipelining's transfers overlap
                {"activation_layout", "bsh"},  // DTensor layers shard the sequence, dimension 1
                {"tp_comm_overlap", table.at_path("parallelism.enable_async_tensor_parallel").value_or(false)},
                // PyTorch's async tensor parallelism: no Transformer Engine SM margin (docs/config.md)
                {"tp_comm_overlap_proj_sms", 0},
                {"tp_comm_overlap_fc2_sms", 0},
                // torch.compile (its [compile] section, or [training] compile before) fuses the elementwise
                // ops; uncompiled, the 2024 releases' norm_type "rmsnorm" is RMSNorm in tensor ops, and
                // the rotary embedding is tensor ops whatever the norm
                {"kernels", compiled ? "fused" : text_of("model", "norm_type", "") == "rmsnorm" ? "composite" : "eager"},
                {"rotary_embedding", compiled ? "fused" : "tensor_ops"}};
  const std::string ac = text_of("activation_checkpoint", "mode", "selective");
  // torchtitan's selective_ac_option: "op" (its per-op policy) or a number n (every n-th block in full).
  const std::string option = text_of("activation_checkpoint", "selective_ac_option", "2");
  if (ac == "full") {
    training["recompute_granularity"] = "full";
  } else if (ac == "selective" && option == "op") {
    training["recompute_granularity"] = "selective_op";
  } else if (ac != "none") {
    imported.ignored.push_back(fmt::format("[activation_checkpoint] mode = \"{}\", selective_ac_option = \"{}\" "
                                           "(pipesim has torchtitan's per-op policy, per-layer full recomputation or "
                                           "none; read as none)",
                                           ac, option));
  }
  json schedule{{"name", "1f1b"}, {"vocab", "baseline"}};
  json parallel{{"pp", pp}, {"tp", tp}, {"dp", replicate * shard}, {"cp", cp}, {"microbatches", local_batch / mbs},
                {"sequence_parallel", true}};
  const std::string theirs = text_of("parallelism", "pipeline_parallel_schedule", "1F1B");
  bool named = false;
  for (const auto& [ours, name] : kSchedules)
    if (theirs == name) schedule["name"] = ours, named = true;
  if (!named)
    return Error{fmt::format("{}: [parallelism] pipeline_parallel_schedule \"{}\": pipesim reads GPipe, 1F1B, "
                             "Interleaved1F1B, ZBVZeroBubble and DualPipeV (a CSV schedule: `pipesim simulate "
                             "--schedule-file`)",
                             source, theirs)};
  if (schedule["name"] == "interleaved-1f1b")
    parallel["chunks"] = model.layers / (pp * integer("parallelism", "pipeline_parallel_layers_per_stage",
                                                       model.layers / (2 * pp)));
  const int first_less = table.at_path("parallelism.pipeline_parallel_first_stage_less_layers").value_or(1);
  const int last_less = table.at_path("parallelism.pipeline_parallel_last_stage_less_layers").value_or(1);
  const bool one_chunk = schedule["name"] == "1f1b" || schedule["name"] == "gpipe";
  if (one_chunk && pp > 1 && (first_less > 0 || last_less > 0)) {
    const int total = model.layers + first_less + last_less;
    if (total % pp != 0)
      return Error{fmt::format("{}: {} layers with {} fewer on the first stage and {} on the last do not split over {} "
                               "stages",
                               source, model.layers, first_less, last_less, pp)};
    std::vector<int> split(std::size_t(pp), total / pp);
    split.front() -= first_less, split.back() -= last_less;
    schedule["vocab"] = "redistribute";
    schedule["layers_per_stage"] = split;
  }
  json model_json{{"layers", model.layers}, {"hidden", model.hidden}, {"heads", model.heads},
                  {"kv_heads", model.key_value_heads()}, {"ffn_hidden", model.ffn_hidden}, {"seq_len", seq},
                  {"vocab", model.vocab}, {"micro_batch_size", mbs}, {"tied_embeddings", model.tied_embeddings},
                  {"mlp", std::string(model.mlp == MlpKind::SwiGlu ? "swiglu" : "gelu")}};
  bool float8 = false;
  if (const toml::array* converters = table.at_path("model.converters").as_array())
    for (const toml::node& converter : *converters)
      float8 = float8 || converter.value_or(std::string()).find("float8") != std::string::npos;
  json precision = json::object();
  if (float8) precision["fp8"] = "e4m3";  // torchao's float8 recipes: E4M3 operands at the FP8 rate
  for (const char* section : {"float8", "quantize", "optimizer", "lr_scheduler", "checkpoint", "metrics", "profiling"})
    if (table.contains(section)) imported.ignored.push_back(fmt::format("[{}]", section));
  imported.config = json{{"description", fmt::format("imported from torchtitan job {}", source)},
                         {"model", model_json},
                         {"parallel", parallel},
                         {"schedule", schedule},
                         {"training", training},
                         {"precision", precision}};
  return imported;
}

}  // namespace pipesim
