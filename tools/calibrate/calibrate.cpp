#include "calibrate.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <map>
#include <nlohmann/json.hpp>

#include "config_json.h"
#include "json_text.h"
#include "sizes.h"

namespace pipesim {
namespace {

using json = nlohmann::ordered_json;

/// The op of analytic_op_work's list with this name (every name looked up here is in it).
const OpWork& op_named(const std::vector<OpWork>& work, std::string_view name) {
  return *std::find_if(work.begin(), work.end(), [&](const OpWork& w) { return w.name == name; });
}

/// The ops of a `pipesim run --profile` file: per-layer compute (an op runs the device's share of the
/// layers, L/p of them) and the vocabulary layers, where measured.
Result<std::vector<Sample>> run_profile_samples(const json& profile, const std::string& path) {
  if (!profile.contains("model") || !profile.contains("pp") || !profile.contains("costs"))
    return Error{fmt::format("{}: not a profile with op shapes: expected \"model\", \"pp\" and \"costs\" as `pipesim run "
                             "--profile` writes (or \"ops\": [{{\"name\", \"flops\", \"bytes\", \"ms\"}}])",
                             path)};
  // A layer op runs the device's share of the layers, repeated that many times: pp bounds the work.
  const json& pp = profile["pp"];
  if (!pp.is_number() || pp.get<double>() < 1 || pp.get<double>() > limits::kPp ||
      pp.get<double>() != std::floor(pp.get<double>()))
    return Error{fmt::format("{}: pp: expected the pipeline devices the profile was measured on, a whole number from 1 "
                             "to {} (as `pipesim run --profile` writes)",
                             path, limits::kPp)};
  const std::string text = json_text(json{{"model", profile["model"]}, {"parallel", {{"pp", 1}, {"microbatches", 1}}}});
  Result<Config> config = parse_config(text, path);
  if (!config.ok()) return config.error();
  const std::vector<OpWork> work = analytic_op_work(config.value());
  const auto find = [&](std::string_view name) -> const OpWork& { return op_named(work, name); };
  const json& costs = profile["costs"];
  const int share = std::max(1, int(std::lround(double(config.value().model.layers) / pp.get<double>())));
  const auto mean_ms = [&](const char* key) {
    if (!costs.contains(key)) return 0.0;
    if (costs[key].is_number()) return costs[key].get<double>();
    double sum = 0;
    for (const json& v : costs[key]) sum += v.get<double>();
    return costs[key].empty() ? 0.0 : sum / double(costs[key].size());
  };
  const auto layers_op = [&](std::string label, std::initializer_list<const char*> names) {
    OpWork op{label, {}};
    for (int l = 0; l < share; ++l)
      for (const char* name : names) {
        const OpWork& w = find(name);
        op.kernels.insert(op.kernels.end(), w.kernels.begin(), w.kernels.end());
      }
    return op;
  };
  std::vector<Sample> samples;
  const std::string from = fmt::format("{} ", path);
  const bool split = mean_ms("weight_ms") > 0;
  const auto add = [&](const OpWork& op, double ms) { samples.push_back({from + op.name, op, ms / 1e3, op.name}); };
  add(layers_op("F", {"layer_forward"}), mean_ms("forward_ms"));
  if (split) {
    add(layers_op("B", {"layer_backward"}), mean_ms("backward_ms"));
    add(layers_op("W", {"layer_weight"}), mean_ms("weight_ms"));
  } else {
    add(layers_op("B+W", {"layer_backward", "layer_weight"}), mean_ms("backward_ms"));
  }
  // The runtime's head backward computes dX and dW in one op.
  OpWork head_backward = find("output_backward");
  const OpWork& head_weight = find("output_weight");
  head_backward.kernels.insert(head_backward.kernels.end(), head_weight.kernels.begin(), head_weight.kernels.end());
  for (const OpWork& op : {find("output_forward"), head_backward, find("input_forward"), find("input_backward")})
    add(op, mean_ms((op.name + "_ms").c_str()));
  std::erase_if(samples, [](const Sample& s) { return s.seconds <= 0; });
  return samples;
}

/// A simple profile of op shapes: {"ops": [{"name": "...", "flops": F, "bytes": B, "ms": t}, ...]}.
Result<std::vector<Sample>> shape_samples(const json& profile, const std::string& path) {
  std::vector<Sample> samples;
  for (std::size_t i = 0; i < profile["ops"].size(); ++i) {
    const json& op = profile["ops"][i];
    const auto number = [&](const char* key) -> Result<double> {
      if (!op.is_object() || !op.contains(key) || !op[key].is_number() || op[key].get<double>() < 0)
        return Error{fmt::format("{}: ops[{}].{}: expected a number >= 0", path, i, key)};
      return op[key].get<double>();
    };
    Result<double> flops = number("flops"), bytes = number("bytes"), ms = number("ms");
    for (const Result<double>* r : {&flops, &bytes, &ms})
      if (!r->ok()) return r->error();
    const std::string name = op.contains("name") && op["name"].is_string() ? op["name"].get<std::string>() : fmt::format("ops[{}]", i);
    samples.push_back({fmt::format("{} {}", path, name), {name, {{flops.value(), bytes.value(), false, 0, 0}}}, ms.value() / 1e3,
                       "op"});
  }
  return samples;
}

/// measure-ops.py's passes of each kind of op: the label, the field it times the pass in, and the
/// analytic op it is. The embedding's W is the dense gradient autograd makes, added into the fp32
/// main gradient (its "W_dense"), as the analytic op counts it; measure-ops.py's "W", an index_add of
/// the tokens' rows alone, is what a sparse gradient would cost and no framework's step runs.
struct FrameworkPass {
  std::string label, field, op;
};
const std::map<std::string, std::vector<FrameworkPass>> kFrameworkPasses{
    {"layer", {{"F", "F", "layer_forward"}, {"B", "B", "layer_backward"}, {"W", "W", "layer_weight"}}},
    {"head", {{"F", "F", "output_forward"}, {"B", "B", "output_backward"}, {"W", "W", "output_weight"}}},
    {"embedding", {{"F", "F", "input_forward"}, {"W", "W_dense", "input_backward"}}},
    // measure-ops.py --attention: fused attention alone, each kernel's own time.
    {"attention", {{"F", "fwd_kernels", "attention_forward"}, {"F+B", "fwd_bwd_kernels", "attention_forward_backward"}}}};

/// The fused attention kernels of a layer's forward, and of its forward and backward.
void add_attention_ops(std::vector<OpWork>& work) {
  const auto attention_of = [&](std::string_view name) {
    std::vector<Kernel> kernels;
    for (const Kernel& k : op_named(work, name).kernels)
      if (k.attention) kernels.push_back(k);
    return kernels;
  };
  OpWork forward{"attention_forward", attention_of("layer_forward")};
  OpWork both{"attention_forward_backward", forward.kernels};
  for (const Kernel& k : attention_of("layer_backward")) both.kernels.push_back(k);
  work.push_back(std::move(forward));
  work.push_back(std::move(both));
}

/// Ops measured by tools/measure-ops.py: {"ops": [{"op": "layer"|"head"|"embedding"|"attention",
/// shape fields, "F", "B", "W" (or the attention's "fwd_kernels", "fwd_bwd_kernels") in ms}, ...]};
/// each is costed through the analytic model at its own shape.
Result<std::vector<Sample>> framework_samples(const json& profile, const std::string& path) {
  std::vector<Sample> samples;
  for (std::size_t i = 0; i < profile["ops"].size(); ++i) {
    const json& op = profile["ops"][i];
    const std::string at = fmt::format("{}: ops[{}]", path, i);
    if (!op.is_object()) return Error{fmt::format("{}: expected an object with \"op\" and the shape", at)};
    if (op.contains("error")) continue;  // a shape the measurement could not run (out of memory)
    const auto integer = [&](const char* key, int fallback) -> Result<int> {
      if (!op.contains(key)) return fallback;
      if (!op[key].is_number_integer() || op[key].get<long long>() < 1 || op[key].get<long long>() > (1 << 30))
        return Error{fmt::format("{}.{}: expected a positive integer", at, key)};
      return op[key].get<int>();
    };
    const std::string kind = op.contains("op") && op["op"].is_string() ? op["op"].get<std::string>() : "";
    if (!kFrameworkPasses.contains(kind))
      return Error{fmt::format(
          "{}.op: expected \"layer\", \"head\", \"embedding\" or \"attention\" (as tools/measure-ops.py writes)", at)};
    const bool attention = kind == "attention";
    Result<int> b = integer("b", 0), s = integer("s", 0), heads = integer("heads", 1), head_dim = integer("head_dim", 128),
                kv = integer("kv_heads", 0), f = integer("f", 4), vocab = integer("V", 8), tp = integer("tp", 1);
    for (const Result<int>* r : {&b, &s, &heads, &head_dim, &kv, &f, &vocab, &tp})
      if (!r->ok()) return r->error();
    // Attention alone is measured by its heads and their width: the hidden size they make.
    Result<int> h = attention ? Result<int>(heads.value() * head_dim.value()) : integer("h", 0);
    if (!h.ok()) return h.error();
    if (!b.value() || !s.value() || !h.value())
      return Error{fmt::format("{}: needs \"b\", \"s\" and \"{}\"", at, attention ? "heads" : "h")};
    if (op.contains("llama") && !op["llama"].is_boolean())
      return Error{fmt::format("{}.llama: expected true (RMSNorm, SwiGLU) or false (GPT)", at)};
    const bool llama = op.value("llama", false);
    const int kv_heads = kv.value() ? kv.value() : heads.value();  // none given: multi-head attention
    const json model{{"layers", 1}, {"hidden", h.value()}, {"heads", heads.value()},
                     {"kv_heads", kv_heads}, {"ffn_hidden", f.value()},
                     {"seq_len", s.value()}, {"vocab", vocab.value()}, {"micro_batch_size", b.value()},
                     {"mlp", llama ? "swiglu" : "gelu"}};
    // "tp": one tensor-parallel rank's part of the op (measure-ops.py --tensor-parallel), its
    // collectives left out, as the analytic op leaves them out.
    Result<Config> config =
        parse_config(json_text(json{{"model", model}, {"parallel", {{"microbatches", 1}, {"tp", tp.value()}}}}), at);
    if (!config.ok()) return config.error();
    std::vector<OpWork> work = analytic_op_work(config.value());
    if (attention) add_attention_ops(work);
    const std::string split = tp.value() > 1 ? fmt::format(" tp{}", tp.value()) : "";
    const std::string shape =
        kind == "layer" ? fmt::format("{} b{} s{} h{}{}", llama ? "llama" : "gpt", b.value(), s.value(), h.value(), split)
        : attention     ? fmt::format("b{} s{} heads{} kv{}", b.value(), s.value(), heads.value(), kv_heads)
                        : fmt::format("b{} s{} h{} V{}{}", b.value(), s.value(), h.value(), vocab.value(), split);
    for (const FrameworkPass& pass : kFrameworkPasses.at(kind)) {
      if (!op.contains(pass.field)) continue;
      const json& ms = op[pass.field];
      if (!ms.is_number() || ms.get<double>() <= 0) return Error{fmt::format("{}.{}: expected a time in ms > 0", at, pass.field)};
      samples.push_back({fmt::format("{} {} {}", kind, shape, pass.label), op_named(work, pass.op), ms.get<double>() / 1e3,
                         fmt::format("{} {}", kind, pass.label)});
    }
  }
  return samples;
}

/// The samples of one file, whichever of the three formats it is. Each reader checks the fields it
/// uses; a field of another JSON type than expected anywhere else is refused with the file's name
/// rather than ending the program.
Result<std::vector<Sample>> samples_of(const json& profile, const std::string& path) {
  try {
    if (!profile.contains("ops") || !profile["ops"].is_array()) return run_profile_samples(profile, path);
    const bool framework = !profile["ops"].empty() && profile["ops"][0].is_object() && profile["ops"][0].contains("op");
    return framework ? framework_samples(profile, path) : shape_samples(profile, path);
  } catch (const json::exception& e) {
    return Error{fmt::format("{}: unexpected JSON ({}); see `pipesim calibrate --help` for the formats", path, e.what())};
  }
}

double loss(const std::vector<Sample>& samples, const HardwareConfig& h) {
  double sum = 0;
  for (const Sample& s : samples) sum += std::pow(std::log(analytic_seconds(s.work, h) / s.seconds), 2);
  return sum;
}

/// A fitted parameter of HardwareConfig: the coarse grid spans [grid_low, upper] in log space; the
/// descent stays in [1e-7, upper].
struct FittedField {
  double HardwareConfig::*field;
  double grid_low, upper;
};
constexpr std::array<FittedField, 4> kFittedFields{{{&HardwareConfig::compute_efficiency, 1e-6, 1.0},
                                                     {&HardwareConfig::attention_efficiency, 1e-6, 1.0},
                                                     {&HardwareConfig::hbm_efficiency, 1e-6, 1.0},
                                                     {&HardwareConfig::kernel_launch_us, 1e-3, 1e4}}};


}  // namespace

Result<std::vector<Sample>> read_samples(std::string_view text, const std::string& path) {
  const json profile = json::parse(text, nullptr, false);
  if (profile.is_discarded() || !profile.is_object()) return Error{fmt::format("{}: not a JSON object", path)};
  return samples_of(profile, path);
}

HardwareConfig fit(const std::vector<Sample>& samples, const HardwareConfig& preset) {
  HardwareConfig h = preset;
  double best = loss(samples, h);
  constexpr int kSteps = 9;
  for (int point = 0; point < kSteps * kSteps * kSteps * kSteps; ++point) {
    HardwareConfig t = preset;
    int rest = point;  // the point's index in each field, base kSteps
    for (const auto& [field, low, upper] : kFittedFields) {
      t.*field = low * std::pow(upper / low, double(rest % kSteps) / (kSteps - 1));
      rest /= kSteps;
    }
    if (const double l = loss(samples, t); l < best) best = l, h = t;
  }
  for (const auto& [field, low, upper] : kFittedFields) {
    HardwareConfig t = h;
    t.*field = preset.*field;
    if (const double l = loss(samples, t); l <= best) best = l, h = t;
  }
  for (double step = std::log(2.0); step > 1e-5;) {
    bool moved = false;
    for (const auto& [field, low, upper] : kFittedFields)
      for (const double direction : {1.0, -1.0})
        for (;;) {
          HardwareConfig t = h;
          t.*field = std::clamp(h.*field * std::exp(direction * step), 1e-7, upper);
          const double l = loss(samples, t);
          if (!(l < best)) break;
          best = l, h = t, moved = true;
        }
    if (!moved) step /= 2;
  }
  return h;
}


}  // namespace pipesim
