// `pipesim calibrate`: fits the analytic cost model's hardware efficiencies to measured op times, so
// the simulator predicts a machine it has measured. Four parameters are fitted -- the fraction of
// peak FLOP/s GEMMs reach, the fraction fused attention reaches, the fraction of HBM bandwidth
// memory-bound kernels reach, and the fixed overhead of every kernel -- by minimising the squared log
// error over every measured op, so a 10% miss counts the same on a 50 µs op as on a 50 ms one.
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <map>
#include <nlohmann/json.hpp>

#include "cli_support.h"
#include "commands.h"
#include "config_json.h"
#include "cost_model.h"
#include "files.h"

namespace pipesim {
namespace {

using json = nlohmann::ordered_json;

/// Hardware files open with this: pipesim replaces only files that do.
constexpr std::string_view kHardwareGenerator = "{\n  \"generator\": \"pipesim calibrate\"";

/// One measured op and the work the analytic model gives it; `group` gathers like ops in the summary.
struct Sample {
  std::string label;
  OpWork work;
  double seconds = 0;
  std::string group;
};

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
  const std::string text = json{{"model", profile["model"]}, {"parallel", {{"pp", 1}, {"microbatches", 1}}}}.dump();
  Result<Config> config = parse_config(text, path);
  if (!config.ok()) return config.error();
  const std::vector<OpWork> work = analytic_op_work(config.value());
  const auto find = [&](std::string_view name) -> const OpWork& { return op_named(work, name); };
  const json& costs = profile["costs"];
  const int share = std::max(1, int(std::lround(double(config.value().model.layers) / profile["pp"].get<double>())));
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
    samples.push_back({fmt::format("{} {}", path, name), {name, {{flops.value(), bytes.value(), false}}}, ms.value() / 1e3,
                       "op"});
  }
  return samples;
}

/// measure-ops.py's passes of each kind of op, and the analytic op each is.
const std::map<std::string, std::vector<std::pair<std::string, std::string>>> kFrameworkPasses{
    {"layer", {{"F", "layer_forward"}, {"B", "layer_backward"}, {"W", "layer_weight"}}},
    {"head", {{"F", "output_forward"}, {"B", "output_backward"}, {"W", "output_weight"}}},
    {"embedding", {{"F", "input_forward"}, {"W", "input_backward"}}}};

/// Ops measured by tools/measure-ops.py: {"ops": [{"op": "layer"|"head"|"embedding", shape fields,
/// "F", "B", "W" in ms}, ...]}; each is costed through the analytic model at its own shape.
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
    if (kind != "layer" && kind != "head" && kind != "embedding")
      return Error{fmt::format("{}.op: expected \"layer\", \"head\" or \"embedding\" (as tools/measure-ops.py writes)", at)};
    Result<int> b = integer("b", 0), s = integer("s", 0), h = integer("h", 0), heads = integer("heads", 1),
                kv = integer("kv_heads", 0), f = integer("f", 4), vocab = integer("V", 8);
    for (const Result<int>* r : {&b, &s, &h, &heads, &kv, &f, &vocab})
      if (!r->ok()) return r->error();
    if (!b.value() || !s.value() || !h.value()) return Error{fmt::format("{}: needs \"b\", \"s\" and \"h\"", at)};
    if (op.contains("llama") && !op["llama"].is_boolean())
      return Error{fmt::format("{}.llama: expected true (RMSNorm, SwiGLU) or false (GPT)", at)};
    const bool llama = op.value("llama", false);
    const json model{{"layers", 1}, {"hidden", h.value()}, {"heads", heads.value()},
                     {"kv_heads", kv.value() ? kv.value() : heads.value()}, {"ffn_hidden", f.value()},
                     {"seq_len", s.value()}, {"vocab", vocab.value()}, {"micro_batch_size", b.value()},
                     {"mlp", llama ? "swiglu" : "gelu"}};
    Result<Config> config = parse_config(json{{"model", model}, {"parallel", {{"microbatches", 1}}}}.dump(), at);
    if (!config.ok()) return config.error();
    const std::vector<OpWork> work = analytic_op_work(config.value());
    const std::string shape = kind == "layer" ? fmt::format("{} b{} s{} h{}", llama ? "llama" : "gpt", b.value(), s.value(), h.value())
                                              : fmt::format("b{} s{} h{} V{}", b.value(), s.value(), h.value(), vocab.value());
    for (const auto& [pass, name] : kFrameworkPasses.at(kind)) {
      if (!op.contains(pass)) continue;
      if (!op[pass].is_number() || op[pass].get<double>() <= 0) return Error{fmt::format("{}.{}: expected a time in ms > 0", at, pass)};
      samples.push_back({fmt::format("{} {} {}", kind, shape, pass), op_named(work, name), op[pass].get<double>() / 1e3,
                         fmt::format("{} {}", kind, pass)});
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

/// A coarse grid first (9 values a parameter, log-spaced: efficiencies 1e-6..1, launch 1e-3..1e4 µs),
/// so that a machine far from the preset (a CPU) does not leave the descent in a corner where one
/// roofline explains everything; a parameter that changes no measured op's time (attention, for ops
/// without it) is then put back to the preset's value. Then coordinate descent in log space: each
/// parameter in turn is scaled up or down by the step while that lowers the loss; the step halves
/// when no parameter moves.
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

}  // namespace

ExitStatus run_calibrate(const CalibrateOptions& o) {
  Result<Config> base = parse_config(json{{"model", {{"layers", 1}, {"hidden", 8}, {"heads", 1}, {"seq_len", 1}, {"vocab", 8}}},
                                          {"parallel", {{"microbatches", 1}}},
                                          {"hardware", {{"preset", o.preset}}}}.dump(),
                                     "--preset");
  if (!base.ok()) return fail(base.error().message);
  std::vector<Sample> samples;
  for (const std::string& path : o.profiles) {
    Result<std::string> text = read_text_file(path);
    if (!text.ok()) return fail(text.error().message);
    const json profile = json::parse(text.value(), nullptr, false);
    if (profile.is_discarded() || !profile.is_object()) return fail(fmt::format("{}: not a JSON object", path));
    Result<std::vector<Sample>> more = samples_of(profile, path);
    if (!more.ok()) return fail(more.error().message);
    samples.insert(samples.end(), more.value().begin(), more.value().end());
  }
  if (samples.size() < 3)
    return fail(fmt::format("calibrate: {} measured op(s) with a time > 0; the fit needs at least 3 (give more "
                            "profiles)", samples.size()));
  const HardwareConfig& before = base.value().hardware;
  const HardwareConfig after = fit(samples, before);
  fmt::print("{:<48} {:>12} {:>12} {:>12} {:>14}\n", "op", "measured_ms", "preset_ms", "fitted_ms", "fitted_err_%");
  struct Summary {
    int ops = 0;
    double sum_before = 0, max_before = 0, sum_after = 0, max_after = 0;
    void add(double before, double after) {
      ++ops, sum_before += std::abs(before), sum_after += std::abs(after);
      max_before = std::max(max_before, std::abs(before)), max_after = std::max(max_after, std::abs(after));
    }
  };
  std::vector<std::pair<std::string, Summary>> groups;  // in first-seen order
  Summary all;
  for (const Sample& s : samples) {
    const double preset_s = analytic_seconds(s.work, before), fitted_s = analytic_seconds(s.work, after);
    const double preset_error = 100 * (preset_s / s.seconds - 1), fitted_error = 100 * (fitted_s / s.seconds - 1);
    fmt::print("{:<48} {:>12.4f} {:>12.4f} {:>12.4f} {:>+14.1f}\n", s.label, s.seconds * 1e3, preset_s * 1e3, fitted_s * 1e3,
               fitted_error);
    auto group = std::find_if(groups.begin(), groups.end(), [&](const auto& g) { return g.first == s.group; });
    if (group == groups.end()) group = groups.insert(groups.end(), {s.group, {}});
    group->second.add(preset_error, fitted_error);
    all.add(preset_error, fitted_error);
  }
  fmt::print("\n{:<24} {:>5} {:>22} {:>22}\n", "|error| by op", "ops", fmt::format("{} mean / max", o.preset), "fitted mean / max");
  groups.emplace_back("all", all);
  for (const auto& [name, g] : groups)
    fmt::print("{:<24} {:>5} {:>13.1f}% / {:>5.1f}% {:>13.1f}% / {:>5.1f}%\n", name, g.ops, g.sum_before / g.ops, g.max_before,
               g.sum_after / g.ops, g.max_after);
  fmt::print("fitted: compute_efficiency {:.3g}, attention_efficiency {:.3g}, hbm_efficiency {:.3g}, kernel_launch_us {:.3g}\n",
             after.compute_efficiency, after.attention_efficiency, after.hbm_efficiency, after.kernel_launch_us);
  if (o.output.empty()) return ExitStatus::Success;
  const json file{{"generator", "pipesim calibrate"},
                  {"description", fmt::format("fitted by pipesim calibrate to {} measured ops", samples.size())},
                  {"preset", o.preset},
                  {"compute_efficiency", after.compute_efficiency},
                  {"attention_efficiency", after.attention_efficiency},
                  {"hbm_efficiency", after.hbm_efficiency},
                  {"kernel_launch_us", after.kernel_launch_us}};
  if (Status s = write_output_file(o.output, file.dump(2) + "\n", kHardwareGenerator); !s.ok()) return fail(s.error().message);
  fmt::print("hardware written to {} (use: \"hardware\": {{\"file\": \"{}\"}} in a config)\n", o.output, o.output);
  return ExitStatus::Success;
}

}  // namespace pipesim
