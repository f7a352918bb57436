#include "megatron_args.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <functional>
#include <map>
#include <regex>
#include <sstream>

#include "frameworks.h"
#include "parallel_shape.h"

namespace pipesim {
namespace {

std::string recompute_method_name(RecomputeMethod m) { return m == RecomputeMethod::Block ? "block" : "uniform"; }

/// The arguments as name → value ("" for a flag), in the order given; a later one replaces an earlier.
struct Arguments {
  std::map<std::string, std::string> values;
  std::vector<std::string> order;
};

Arguments tokenize(const std::string& text) {
  Arguments args;
  std::vector<std::string> tokens;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    if (const std::size_t hash = line.find('#'); hash != std::string::npos) line.resize(hash);
    std::istringstream words(line);
    for (std::string word; words >> word;)
      if (word != "\\") tokens.push_back(word);
  }
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i].rfind("--", 0) != 0) continue;  // a value, taken below, or a stray word
    std::string name = tokens[i].substr(2), value;
    if (const std::size_t eq = name.find('='); eq != std::string::npos)
      value = name.substr(eq + 1), name.resize(eq);
    else if (i + 1 < tokens.size() && tokens[i + 1].rfind("--", 0) != 0)
      value = tokens[++i];
    if (!args.values.count(name)) args.order.push_back(name);
    args.values[name] = value;
  }
  return args;
}

/// The MoE layer and its parallelism, as TransformerConfig's and ModelParallelConfig's fields name them.
template <class Arg, class Flag>
void add_experts(const Config& c, const Arg& arg, const Flag& flag) {
  const ModelConfig& m = c.model;
  arg("num-experts", m.num_experts);
  arg("moe-router-topk", m.moe_router_topk);
  arg("moe-ffn-hidden-size", m.expert_ffn_hidden());
  if (m.moe_shared_expert_intermediate_size > 0) arg("moe-shared-expert-intermediate-size", m.moe_shared_expert_intermediate_size);
  if (m.moe_layer_pattern.empty()) {
    arg("moe-layer-freq", m.moe_layer_freq);
  } else {  // a Python list expression, which --moe-layer-freq evaluates, in runs: ([0]*3+[1]*58). In
    // parentheses, so that the shell's word expansion of $(grep ...) takes it for no file name.
    std::string runs;
    const std::vector<int>& pattern = m.moe_layer_pattern;
    for (std::size_t i = 0, j = 0; i < pattern.size(); i = j) {
      while (j < pattern.size() && pattern[j] == pattern[i]) ++j;
      runs += fmt::format("{}[{}]*{}", runs.empty() ? "" : "+", pattern[i], j - i);
    }
    arg("moe-layer-freq", "(" + runs + ")");
  }
  if (m.moe_capacity_factor) arg("moe-expert-capacity-factor", *m.moe_capacity_factor);
  if (m.moe_router_num_groups > 0) {
    arg("moe-router-num-groups", m.moe_router_num_groups);
    arg("moe-router-group-topk", m.moe_router_group_topk);
  }
  flag("moe-grouped-gemm");  // pipesim prices the experts as grouped GEMMs
  arg("expert-model-parallel-size", c.parallel.ep);
  arg("expert-tensor-parallel-size", c.parallel.expert_tp());
  arg("moe-token-dispatcher-type", moe_dispatcher_name(c.training.moe_token_dispatcher_type));
  if (c.training.moe_dispatch_mxfp8) {  // Megatron-Core sends MXFP8 through its NCCL EP backend only
    arg("moe-flex-dispatcher-backend", "ncclep");
    arg("moe-dispatch-fwd-dtype", "mxfp8");
  }
  if (c.training.overlap_moe_expert_parallel_comm) flag("overlap-moe-expert-parallel-comm");
}

/// --moe-layer-freq: an integer N, or a Python list expression of 0s and 1s ("([0]*3+[1]*58)", "[1,0,1,0]").
/// nullopt when it is neither.
std::optional<nlohmann::json> moe_layer_freq(std::string text) {
  std::erase_if(text, [](char ch) { return ch == '"' || ch == '\'' || ch == ' '; });
  if (!text.empty() && std::all_of(text.begin(), text.end(), [](char ch) { return ch >= '0' && ch <= '9'; }))
    return nlohmann::json(std::stoll(text.substr(0, 9)));
  std::size_t at = 0;
  bool ok = true;
  const auto number = [&] {
    std::size_t digits = 0;
    while (at + digits < text.size() && std::isdigit(static_cast<unsigned char>(text[at + digits])) && digits < 9) ++digits;
    if (digits == 0) ok = false;
    const long long n = digits ? std::stoll(text.substr(at, digits)) : 0;
    at += digits;
    return n;
  };
  const auto eat = [&](char ch) { return at < text.size() && text[at] == ch ? (++at, true) : false; };
  // list := term ('+' term)*; term := ('[' digits,... ']' | '(' list ')') ('*' count)?
  std::function<std::vector<int>()> list = [&] {
    std::vector<int> out;
    do {
      std::vector<int> term;
      if (eat('[')) {
        while (ok && !eat(']')) {
          term.push_back(int(number()));
          if (at < text.size() && text[at] != ']' && !eat(',')) ok = false;
        }
      } else if (eat('(')) {
        term = list();
        if (!eat(')')) ok = false;
      } else {
        ok = false;
      }
      const long long times = eat('*') ? number() : 1;
      if (!ok || times > 100000 || term.size() * std::size_t(times) > 100000) return ok = false, out;
      for (long long i = 0; i < times; ++i) out.insert(out.end(), term.begin(), term.end());
    } while (ok && eat('+'));
    return out;
  };
  const std::vector<int> pattern = list();
  if (!ok || at != text.size()) return std::nullopt;
  return nlohmann::json(pattern);
}

}  // namespace

std::string megatron_arguments(const Config& c, const std::vector<int>& layers_per_stage, const std::string& what) {
  const ModelConfig& m = c.model;
  const ParallelConfig& p = c.parallel;
  const TrainingConfig& t = c.training;
  std::string out = fmt::format("# pretrain_gpt.py arguments for {}\n", what);
  out += fmt::format("# launch on {} GPUs: tp {} x cp {} x dp {} x pp {} (torchrun --nproc-per-node ... pretrain_gpt.py "
                     "$(grep -v '^#' THIS_FILE) with your data, tokenizer and optimiser arguments)\n",
                     gpu_count(c.parallel), p.tp, p.cp, p.dp, p.pp);
  const auto arg = [&out](std::string_view name, const auto& value) { out += fmt::format("--{} {}\n", name, value); };
  const auto flag = [&out](std::string_view name) { out += fmt::format("--{}\n", name); };
  arg("num-layers", m.layers);
  arg("hidden-size", m.hidden);
  arg("ffn-hidden-size", m.ffn_hidden);
  arg("num-attention-heads", m.heads);
  if (m.key_value_heads() != m.heads) {
    flag("group-query-attention");
    arg("num-query-groups", m.key_value_heads());
  }
  arg("seq-length", m.seq_len);
  arg("max-position-embeddings", m.seq_len);
  arg("vocab-size", m.vocab);
  if (m.mlp == MlpKind::SwiGlu) {  // the Llama family as pipesim's runtime runs it
    flag("swiglu");
    arg("normalization", "RMSNorm");
    arg("position-embedding-type", "rope");
    flag("disable-bias-linear");
    // Megatron-Core fuses SwiGLU by default (bias_swiglu_fusion); eager kernels are its opt-out.
    if (c.training.kernels != KernelProfile::Fused) flag("no-bias-swiglu-fusion");
  }
  if (!m.tied_embeddings) flag("untie-embeddings-and-output-weights");
  if (m.head_dim > 0) arg("kv-channels", m.head_dim);
  if (m.latent_attention()) {
    flag("multi-latent-attention");
    if (m.q_lora_rank > 0) arg("q-lora-rank", m.q_lora_rank);
    arg("kv-lora-rank", m.kv_lora_rank);
    arg("qk-head-dim", m.qk_nope_head_dim);
    arg("qk-pos-emb-head-dim", m.qk_rope_head_dim);
    arg("v-head-dim", m.v_head_dim);
  }
  if (m.has_experts()) {
    add_experts(c, arg, flag);
    // Not an argument: the load the run will see, which import reads back from this comment.
    if (m.moe_imbalance != 1)
      out += fmt::format("# pipesim priced the busiest expert at model.moe_imbalance {} times the mean tokens\n", m.moe_imbalance);
  }
  arg("micro-batch-size", m.micro_batch_size);
  arg("global-batch-size", global_batch_size(c));
  arg("tensor-model-parallel-size", p.tp);
  arg("pipeline-model-parallel-size", p.pp);
  arg("context-parallel-size", p.cp);
  if (c.schedule.name == "interleaved-1f1b") arg("num-virtual-stages-per-pipeline-rank", p.chunks);
  if (c.schedule.vocab == VocabMode::Redistribute && layers_per_stage.size() >= 2) {
    if (c.schedule.name == "interleaved-1f1b" && accounts_for_vocabulary(layers_per_stage)) {
      flag("account-for-embedding-in-pipeline-split");
      flag("account-for-loss-in-pipeline-split");
    } else {
      arg("decoder-first-pipeline-num-layers", layers_per_stage.front());
      arg("decoder-last-pipeline-num-layers", layers_per_stage.back());
    }
  }
  if (p.tp > 1 && p.sequence_parallel) flag("sequence-parallel");
  if (t.recompute_granularity != Recompute::None) arg("recompute-granularity", recompute_name(t.recompute_granularity));
  if (t.recompute_granularity == Recompute::Full) {
    arg("recompute-method", recompute_method_name(t.recompute_method));
    arg("recompute-num-layers", t.recompute_num_layers);
  }
  if (p.dp > 1 && t.zero_stage == 1) flag("use-distributed-optimizer");
  if (p.dp > 1 && t.zero_stage >= 2) {  // Megatron-FSDP: gradients, then parameters, sharded too
    flag("use-megatron-fsdp");
    arg("data-parallel-sharding-strategy", t.zero_stage == 2 ? "optim_grads" : "optim_grads_params");
  }
  if (t.overlap_grad_reduce) flag("overlap-grad-reduce");
  if (t.overlap_grad_reduce && t.bucket_size > 0) arg("ddp-bucket-size", t.bucket_size);
  if (t.overlap_param_gather) flag("overlap-param-gather");
  if (t.tp_comm_overlap) flag("tp-comm-overlap");
  // Not arguments: Transformer Engine reads them from a --tp-comm-overlap-cfg file; import reads them back.
  constexpr int kTeDefault = TrainingConfig::kTeOverlapSms;
  if (t.tp_comm_overlap && (t.tp_comm_overlap_proj_sms != kTeDefault || t.tp_comm_overlap_fc2_sms != kTeDefault))
    out += fmt::format("# pipesim priced Transformer Engine's overlap with num_sm proj_fprop {} fc2_fprop {} "
                       "(set them in a --tp-comm-overlap-cfg file)\n",
                       t.tp_comm_overlap_proj_sms, t.tp_comm_overlap_fc2_sms);
  if (c.schedule.name == "interleaved-1f1b" && !t.overlap_p2p_comm) flag("no-overlap-p2p-communication");
  if (c.precision.param_bytes == 2) flag("bf16");
  if (c.precision.fp8 != Fp8Format::None) arg("fp8-format", std::string(fp8_format_name(c.precision.fp8)));
  return out;
}

Result<ImportedConfig> config_from_megatron(const std::string& text, const std::string& source, std::optional<int> gpus) {
  const Arguments args = tokenize(text);
  const auto has = [&](const std::string& name) { return args.values.count(name) > 0; };
  std::string error;
  const auto integer = [&](const std::string& name, std::optional<int> fallback) -> int {
    if (!has(name)) {
      if (!fallback && error.empty())
        error = fmt::format("{}: --{} is missing; pipesim needs it to plan the run", source, name);
      return fallback.value_or(1);
    }
    const std::string& v = args.values.at(name);
    int value = 0;
    const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), value);
    if ((ec != std::errc() || end != v.data() + v.size() || value < 1) && error.empty())
      error = fmt::format("{}: --{} {}: expected a whole number >= 1", source, name, v);
    return value;
  };
  const int layers = integer("num-layers", std::nullopt), hidden = integer("hidden-size", std::nullopt);
  const int heads = integer("num-attention-heads", std::nullopt), seq = integer("seq-length", std::nullopt);
  const int tp = integer("tensor-model-parallel-size", 1), pp = integer("pipeline-model-parallel-size", 1);
  const int cp = integer("context-parallel-size", 1), mbs = integer("micro-batch-size", std::nullopt);
  const int global = integer("global-batch-size", std::nullopt);
  if (!has("vocab-size") && error.empty())
    error = fmt::format("{}: --vocab-size is missing: Megatron-LM takes the vocabulary from the tokenizer; add "
                        "--vocab-size N (the tokenizer's size) for pipesim", source);
  const int vocab = integer("vocab-size", 1);
  if (!gpus) {  // the comment megatron_arguments writes
    std::smatch match;
    if (std::regex_search(text, match, std::regex("launch on ([0-9]+) GPUs"))) gpus = std::stoi(match[1]);
  }
  if (!gpus && error.empty())
    error = fmt::format("{}: the arguments do not say how many GPUs run them (Megatron-LM takes the data-parallel "
                        "size from the world size): give --gpus N",
                        source);
  if (!error.empty()) return Error{error};
  const int per_replica = tp * cp * pp;
  if (*gpus % per_replica != 0)
    return Error{fmt::format("{}: {} GPUs are not a multiple of tp {} x cp {} x pp {} = {}", source, *gpus, tp, cp, pp,
                             per_replica)};
  const int dp = *gpus / per_replica;
  const std::optional<int> microbatches = microbatches_for(global, mbs, dp);
  if (!microbatches)
    return Error{fmt::format("{}: --global-batch-size {} is not a multiple of --micro-batch-size {} x data-parallel size {}",
                             source, global, mbs, dp)};

  using json = nlohmann::json;
  json model{{"layers", layers}, {"hidden", hidden}, {"heads", heads}, {"seq_len", seq}, {"vocab", vocab},
             {"micro_batch_size", mbs}, {"tied_embeddings", !has("untie-embeddings-and-output-weights")}};
  if (has("ffn-hidden-size")) model["ffn_hidden"] = integer("ffn-hidden-size", 1);
  if (has("group-query-attention") || has("num-query-groups")) model["kv_heads"] = integer("num-query-groups", heads);
  if (has("swiglu")) model["mlp"] = "swiglu";
  if (has("kv-channels")) model["head_dim"] = integer("kv-channels", 1);
  if (has("multi-latent-attention")) {  // Megatron-LM's defaults where an argument is absent
    if (has("q-lora-rank")) model["q_lora_rank"] = integer("q-lora-rank", 1);
    model["kv_lora_rank"] = integer("kv-lora-rank", 32);
    model["qk_nope_head_dim"] = integer("qk-head-dim", 128);
    model["qk_rope_head_dim"] = integer("qk-pos-emb-head-dim", 64);
    model["v_head_dim"] = integer("v-head-dim", 128);
  }
  json parallel{{"pp", pp}, {"tp", tp}, {"dp", dp}, {"cp", cp}, {"microbatches", *microbatches},
                {"sequence_parallel", has("sequence-parallel")}};
  json moe_training = json::object();
  if (has("num-experts")) {
    model["num_experts"] = integer("num-experts", 1);
    model["moe_router_topk"] = integer("moe-router-topk", 2);
    for (const auto& [name, field] : {std::pair{"moe-ffn-hidden-size", "moe_ffn_hidden_size"},
                                      std::pair{"moe-shared-expert-intermediate-size", "moe_shared_expert_intermediate_size"},
                                      std::pair{"moe-router-num-groups", "moe_router_num_groups"},
                                      std::pair{"moe-router-group-topk", "moe_router_group_topk"}})
      if (has(name)) model[field] = integer(name, 1);
    if (has("moe-layer-freq")) {
      const std::optional<json> freq = moe_layer_freq(args.values.at("moe-layer-freq"));
      if (!freq && error.empty())
        error = fmt::format("{}: --moe-layer-freq {}: expected an integer or a list expression of 0s and 1s such as "
                            "\"([0]*3+[1]*58)\"", source, args.values.at("moe-layer-freq"));
      if (freq) model["moe_layer_freq"] = *freq;
    }
    if (has("moe-expert-capacity-factor")) {
      try {
        model["moe_capacity_factor"] = std::stod(args.values.at("moe-expert-capacity-factor"));
      } catch (const std::exception&) {
        if (error.empty()) error = fmt::format("{}: --moe-expert-capacity-factor {}: expected a number", source,
                                               args.values.at("moe-expert-capacity-factor"));
      }
    }
    std::smatch imbalance;
    if (std::regex_search(text, imbalance, std::regex("model\\.moe_imbalance ([0-9]+(\\.[0-9]+)?)")))
      model["moe_imbalance"] = std::stod(imbalance[1]);
    parallel["ep"] = integer("expert-model-parallel-size", 1);
    if (has("expert-tensor-parallel-size")) parallel["etp"] = integer("expert-tensor-parallel-size", 1);
    if (has("moe-token-dispatcher-type")) moe_training["moe_token_dispatcher_type"] = args.values.at("moe-token-dispatcher-type");
    if (has("moe-dispatch-fwd-dtype")) moe_training["moe_dispatch_fwd_dtype"] = args.values.at("moe-dispatch-fwd-dtype");
    moe_training["overlap_moe_expert_parallel_comm"] = has("overlap-moe-expert-parallel-comm");
  }
  json schedule{{"name", "1f1b"}, {"vocab", "baseline"}};
  if (has("num-virtual-stages-per-pipeline-rank") || has("num-layers-per-virtual-pipeline-stage")) {
    schedule["name"] = "interleaved-1f1b";
    parallel["chunks"] = has("num-virtual-stages-per-pipeline-rank")
                             ? integer("num-virtual-stages-per-pipeline-rank", 1)
                             : layers / (pp * integer("num-layers-per-virtual-pipeline-stage", 1));
  }
  if (has("decoder-first-pipeline-num-layers") || has("decoder-last-pipeline-num-layers")) {
    // The stages between the ends split the rest evenly, as Megatron-LM requires.
    const int first = integer("decoder-first-pipeline-num-layers", 0), last = integer("decoder-last-pipeline-num-layers", 0);
    const int middle_stages = pp - 2, rest = layers - first - last;
    if (middle_stages < 1 || rest % middle_stages != 0)
      return Error{fmt::format("{}: --decoder-first/last-pipeline-num-layers {} and {} leave {} layers for {} middle stages",
                               source, first, last, rest, middle_stages)};
    std::vector<int> split(std::size_t(pp), rest / middle_stages);
    split.front() = first, split.back() = last;
    schedule["vocab"] = "redistribute";
    schedule["layers_per_stage"] = split;
  }
  const bool embedding_layer = has("account-for-embedding-in-pipeline-split"),
             loss_layer = has("account-for-loss-in-pipeline-split");
  if (embedding_layer || loss_layer) {
    // Megatron-LM counts the embedding and the loss each as a layer of its stage and splits the sum
    // evenly over the virtual stages.
    const int stages = pp * parallel.value("chunks", 1), counted = layers + embedding_layer + loss_layer;
    if (counted % stages != 0 || counted / stages < 1)
      return Error{fmt::format("{}: --account-for-embedding/loss-in-pipeline-split: {} layers and {} counted for "
                               "the vocabulary do not split evenly over {} virtual stages",
                               source, layers, embedding_layer + loss_layer, stages)};
    std::vector<int> split(std::size_t(stages), counted / stages);
    split.front() -= embedding_layer, split.back() -= loss_layer;
    schedule["vocab"] = "redistribute";
    schedule["layers_per_stage"] = split;
  }
  json training{{"zero_stage", has("use-megatron-fsdp")
                                   ? (args.values.count("data-parallel-sharding-strategy") &&
                                              args.values.at("data-parallel-sharding-strategy") == "optim_grads"
                                          ? 2
                                          : 3)
                               : has("use-distributed-optimizer") ? 1
                                                                  : 0},
                {"overlap_grad_reduce", has("overlap-grad-reduce")},
                {"overlap_param_gather", has("overlap-param-gather")},
                {"tp_comm_overlap", has("tp-comm-overlap")},
                // megatron/training/arguments.py: on by default, and only, with a virtual pipeline
                {"overlap_p2p_comm", schedule.value("name", "") == "interleaved-1f1b" && !has("no-overlap-p2p-communication")},
                // Megatron-Core's fused kernels (bias_swiglu_fusion on unless --no-bias-swiglu-fusion)
                {"kernels", has("no-bias-swiglu-fusion") ? "eager" : "fused"}};
  training.update(moe_training);
  // Megatron-LM ignores the bucket size without --overlap-grad-reduce; so does the import.
  const bool reads_bucket_size = has("overlap-grad-reduce");
  if (reads_bucket_size && has("ddp-bucket-size")) training["bucket_size"] = integer("ddp-bucket-size", 1);
  std::smatch sms;
  if (std::regex_search(text, sms, std::regex("num_sm proj_fprop ([0-9]{1,4}) fc2_fprop ([0-9]{1,4})")))
    training["tp_comm_overlap_proj_sms"] = std::stoi(sms[1]), training["tp_comm_overlap_fc2_sms"] = std::stoi(sms[2]);
  if (has("recompute-granularity")) {
    training["recompute_granularity"] = args.values.at("recompute-granularity");
    if (has("recompute-method")) training["recompute_method"] = args.values.at("recompute-method");
    if (has("recompute-num-layers")) training["recompute_num_layers"] = integer("recompute-num-layers", 1);
  }
  json precision = json::object();
  if (has("fp8-format")) {
    const std::string format = args.values.at("fp8-format");
    if (format != "hybrid" && format != "e4m3")
      error = fmt::format("{}: --fp8-format {}: pipesim models hybrid and e4m3", source, format);
    precision["fp8"] = format;
  }
  if (!error.empty()) return Error{error};
  ImportedConfig imported;
  imported.config = json{{"description", fmt::format("imported from Megatron-LM arguments {} on {} GPUs", source, *gpus)},
                         {"model", model},
                         {"parallel", parallel},
                         {"schedule", schedule},
                         {"training", training},
                         {"precision", precision}};
  static const std::vector<std::string> kRead = {
      "num-layers", "hidden-size", "ffn-hidden-size", "num-attention-heads", "group-query-attention",
      "num-query-groups", "seq-length", "vocab-size", "micro-batch-size", "global-batch-size",
      "tensor-model-parallel-size", "pipeline-model-parallel-size", "context-parallel-size",
      "num-virtual-stages-per-pipeline-rank", "num-layers-per-virtual-pipeline-stage",
      "decoder-first-pipeline-num-layers", "decoder-last-pipeline-num-layers",
      "account-for-embedding-in-pipeline-split", "account-for-loss-in-pipeline-split", "sequence-parallel",
      "recompute-granularity", "recompute-method", "recompute-num-layers", "use-distributed-optimizer",
      "use-megatron-fsdp", "data-parallel-sharding-strategy", "overlap-grad-reduce", "overlap-param-gather",
      "ddp-bucket-size", "tp-comm-overlap", "no-overlap-p2p-communication", "fp8-format", "swiglu", "no-bias-swiglu-fusion", "untie-embeddings-and-output-weights",
      "kv-channels", "multi-latent-attention", "q-lora-rank", "kv-lora-rank", "qk-head-dim", "qk-pos-emb-head-dim",
      "v-head-dim", "num-experts", "moe-router-topk", "moe-ffn-hidden-size", "moe-shared-expert-intermediate-size",
      "moe-layer-freq", "moe-expert-capacity-factor", "moe-router-num-groups", "moe-router-group-topk",
      "expert-model-parallel-size", "expert-tensor-parallel-size", "moe-token-dispatcher-type",
      "moe-dispatch-fwd-dtype", "overlap-moe-expert-parallel-comm",
      // what the runtime's Llama layers are, and the precision pipesim assumes: read, nothing to set
      "normalization", "position-embedding-type", "disable-bias-linear", "max-position-embeddings", "bf16",
      // how the experts' GEMMs and the dispatch run: what pipesim prices already
      "moe-grouped-gemm", "moe-flex-dispatcher-backend"};
  for (const std::string& name : args.order)
    if (std::find(kRead.begin(), kRead.end(), name) == kRead.end() ||
        (name == "ddp-bucket-size" && !reads_bucket_size))
      imported.ignored.push_back("--" + name);
  return imported;
}

}  // namespace pipesim
