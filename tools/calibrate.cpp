// `pipesim calibrate`: fits the analytic cost model's hardware efficiencies to measured op times, so
// the simulator predicts a machine it has measured. Three parameters are fitted -- the fraction of
// peak FLOP/s large GEMMs reach, the fraction of HBM bandwidth memory-bound kernels reach, and the
// fixed overhead of every op -- by minimising the squared log error over every measured op, so a
// 10% miss counts the same on a 50 µs op as on a 50 ms one.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
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

/// One measured op and the work the analytic model gives it.
struct Sample {
  std::string label;
  OpWork work;
  double seconds = 0;
};

/// The ops of a `pipesim run --profile` file: per-layer compute (an op runs the device's share of the
/// layers, L/p of them, and pays one launch) and the vocabulary layers, where measured.
Result<std::vector<Sample>> run_profile_samples(const json& profile, const std::string& path) {
  if (!profile.contains("model") || !profile.contains("pp") || !profile.contains("costs"))
    return Error{fmt::format("{}: not a profile with op shapes: expected \"model\", \"pp\" and \"costs\" as `pipesim run "
                             "--profile` writes (or \"ops\": [{{\"name\", \"flops\", \"bytes\", \"ms\"}}])",
                             path)};
  const std::string text = json{{"model", profile["model"]}, {"parallel", {{"pp", 1}, {"microbatches", 1}}}}.dump();
  Result<Config> config = parse_config(text, path);
  if (!config.ok()) return config.error();
  const std::vector<OpWork> work = analytic_op_work(config.value());
  const auto find = [&](std::string_view name) { return *std::find_if(work.begin(), work.end(), [&](const OpWork& w) { return w.name == name; }); };
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
        op.pieces.insert(op.pieces.end(), w.pieces.begin(), w.pieces.end());
      }
    return op;
  };
  std::vector<Sample> samples;
  const std::string from = fmt::format("{} ", path);
  const bool split = mean_ms("weight_ms") > 0;
  samples.push_back({from + "F", layers_op("F", {"layer_forward"}), mean_ms("forward_ms") / 1e3});
  if (split) {
    samples.push_back({from + "B", layers_op("B", {"layer_backward"}), mean_ms("backward_ms") / 1e3});
    samples.push_back({from + "W", layers_op("W", {"layer_weight"}), mean_ms("weight_ms") / 1e3});
  } else {
    samples.push_back({from + "B+W", layers_op("B+W", {"layer_backward", "layer_weight"}), mean_ms("backward_ms") / 1e3});
  }
  for (const char* name : {"output_forward", "output_backward", "input_forward", "input_backward"})
    if (const double ms = mean_ms((std::string(name) + "_ms").c_str()); ms > 0) samples.push_back({from + name, find(name), ms / 1e3});
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
    samples.push_back({fmt::format("{} {}", path, name), {name, {{flops.value(), bytes.value()}}}, ms.value() / 1e3});
  }
  return samples;
}

double loss(const std::vector<Sample>& samples, const HardwareConfig& h) {
  double sum = 0;
  for (const Sample& s : samples) sum += std::pow(std::log(analytic_seconds(s.work, h) / s.seconds), 2);
  return sum;
}

/// Grid search in log space over the three parameters, zooming in around the best point.
HardwareConfig fit(const std::vector<Sample>& samples, HardwareConfig h) {
  double lo[3] = {std::log(1e-7), std::log(1e-6), std::log(1e-3)}, hi[3] = {0, 0, std::log(1e4)};  // launch in µs
  for (int round = 0; round < 10; ++round) {
    const int steps = 24;
    double best = INFINITY, at[3] = {0, 0, 0};
    for (int i = 0; i <= steps; ++i)
      for (int j = 0; j <= steps; ++j)
        for (int k = 0; k <= steps; ++k) {
          HardwareConfig t = h;
          t.compute_efficiency = std::exp(lo[0] + (hi[0] - lo[0]) * i / steps);
          t.hbm_efficiency = std::exp(lo[1] + (hi[1] - lo[1]) * j / steps);
          t.kernel_launch_us = std::exp(lo[2] + (hi[2] - lo[2]) * k / steps);
          if (const double l = loss(samples, t); l < best)
            best = l, at[0] = std::log(t.compute_efficiency), at[1] = std::log(t.hbm_efficiency), at[2] = std::log(t.kernel_launch_us);
        }
    for (int d = 0; d < 3; ++d) {
      const double half = (hi[d] - lo[d]) / 4;
      lo[d] = at[d] - half, hi[d] = std::min(d < 2 ? 0.0 : INFINITY, at[d] + half);
    }
    h.compute_efficiency = std::exp(at[0]), h.hbm_efficiency = std::exp(at[1]), h.kernel_launch_us = std::exp(at[2]);
  }
  return h;
}

double error_pct(const Sample& s, const HardwareConfig& h) { return 100.0 * (analytic_seconds(s.work, h) / s.seconds - 1); }

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
    Result<std::vector<Sample>> more = profile.contains("ops") && profile["ops"].is_array() ? shape_samples(profile, path)
                                                                                            : run_profile_samples(profile, path);
    if (!more.ok()) return fail(more.error().message);
    samples.insert(samples.end(), more.value().begin(), more.value().end());
  }
  if (samples.size() < 3)
    return fail(fmt::format("calibrate: {} measured op(s) with a time > 0; three parameters need at least 3 (give more "
                            "profiles)", samples.size()));
  const HardwareConfig before = base.value().hardware, after = fit(samples, before);
  fmt::print("{:<48} {:>12} {:>14} {:>14}\n", "op", "measured_ms", "preset_err_%", "fitted_err_%");
  double mean_before = 0, mean_after = 0;
  for (const Sample& s : samples) {
    fmt::print("{:<48} {:>12.4f} {:>+14.1f} {:>+14.1f}\n", s.label, s.seconds * 1e3, error_pct(s, before), error_pct(s, after));
    mean_before += std::abs(error_pct(s, before)) / double(samples.size());
    mean_after += std::abs(error_pct(s, after)) / double(samples.size());
  }
  fmt::print("mean |error|: {:.1f}% with preset {}, {:.1f}% fitted: compute_efficiency {:.3g}, hbm_efficiency {:.3g}, "
             "kernel_launch_us {:.3g}\n",
             mean_before, o.preset, mean_after, after.compute_efficiency, after.hbm_efficiency, after.kernel_launch_us);
  const json file{{"generator", "pipesim calibrate"},
                  {"description", fmt::format("fitted by pipesim calibrate to {} measured ops", samples.size())},
                  {"preset", o.preset},
                  {"compute_efficiency", after.compute_efficiency},
                  {"hbm_efficiency", after.hbm_efficiency},
                  {"kernel_launch_us", after.kernel_launch_us}};
  if (Status s = write_output_file(o.output, file.dump(2) + "\n", kHardwareGenerator); !s.ok()) return fail(s.error().message);
  fmt::print("hardware written to {} (use: \"hardware\": {{\"file\": \"{}\"}} in a config)\n", o.output, o.output);
  return ExitStatus::Success;
}

}  // namespace pipesim
