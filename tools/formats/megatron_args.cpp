#include "megatron_args.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <map>
#include <regex>
#include <sstream>

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
  }
  if (!m.tied_embeddings) flag("untie-embeddings-and-output-weights");
  arg("micro-batch-size", m.micro_batch_size);
  arg("global-batch-size", global_batch_size(c));
  arg("tensor-model-parallel-size", p.tp);
  arg("pipeline-model-parallel-size", p.pp);
  arg("context-parallel-size", p.cp);
  if (c.schedule.name == "interleaved-1f1b") arg("num-virtual-stages-per-pipeline-rank", p.chunks);
  if (c.schedule.vocab == VocabMode::Redistribute && layers_per_stage.size() >= 2) {
    arg("decoder-first-pipeline-num-layers", layers_per_stage.front());
    arg("decoder-last-pipeline-num-layers", layers_per_stage.back());
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
  if (t.overlap_param_gather) flag("overlap-param-gather");
  if (t.tp_comm_overlap) flag("tp-comm-overlap");
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
  json parallel{{"pp", pp}, {"tp", tp}, {"dp", dp}, {"cp", cp}, {"microbatches", *microbatches},
                {"sequence_parallel", has("sequence-parallel")}};
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
                {"overlap_p2p_comm", schedule.value("name", "") == "interleaved-1f1b" && !has("no-overlap-p2p-communication")}};
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
      "decoder-first-pipeline-num-layers", "decoder-last-pipeline-num-layers", "sequence-parallel",
      "recompute-granularity", "recompute-method", "recompute-num-layers", "use-distributed-optimizer",
      "use-megatron-fsdp", "data-parallel-sharding-strategy", "overlap-grad-reduce", "overlap-param-gather",
      "tp-comm-overlap", "no-overlap-p2p-communication", "fp8-format", "swiglu", "untie-embeddings-and-output-weights",
      // what the runtime's Llama layers are, and the precision pipesim assumes: read, nothing to set
      "normalization", "position-embedding-type", "disable-bias-linear", "max-position-embeddings", "bf16"};
  for (const std::string& name : args.order)
    if (std::find(kRead.begin(), kRead.end(), name) == kRead.end()) imported.ignored.push_back("--" + name);
  return imported;
}

}  // namespace pipesim
