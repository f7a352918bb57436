// `pipesim calibrate`: the preset's and the fitted model's error on every measured op, and the fitted
// hardware file (tools/calibrate/calibrate.h fits it).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

#include "calibrate.h"
#include "commands.h"
#include "config_json.h"
#include "files.h"
#include "json_text.h"
#include "options.h"

namespace pipesim {
namespace {

using json = nlohmann::ordered_json;

/// Hardware files open with this: pipesim replaces only files that do.
constexpr std::string_view kHardwareGenerator = "{\n  \"generator\": \"pipesim calibrate\"";

/// `pipesim calibrate`: hardware efficiencies fitted to measured op times.
struct CalibrateOptions {
  std::vector<std::string> profiles;  ///< `run --profile` files, measure-ops.py output, or {"ops": [{name, flops, bytes, ms}]}
  std::string output;                 ///< the hardware file to write; empty: print the errors only
  std::string preset = "h100-sxm";    ///< whose peak FLOP/s and bandwidth the efficiencies scale
  bool force = false;                 ///< write the fit even when it misses the ops more than the preset does
};

/// A fit whose mean error is above this is warned of: it predicts the machine it measured that poorly.
constexpr double kPoorFitPercent = 10;

ExitStatus run_calibrate(const CalibrateOptions& o) {
  Result<Config> base =
      parse_config(json_text(json{{"model", {{"layers", 1}, {"hidden", 8}, {"heads", 1}, {"seq_len", 1}, {"vocab", 8}}},
                                  {"parallel", {{"microbatches", 1}}},
                                  {"hardware", {{"preset", o.preset}}}}),
                   "--preset");
  if (!base.ok()) return fail(base.error().message);
  std::vector<Sample> samples;
  for (const std::string& path : o.profiles) {
    Result<std::string> text = read_text_file(path);
    if (!text.ok()) return fail(text.error().message);
    Result<std::vector<Sample>> more = read_samples(text.value(), path);
    if (!more.ok()) return fail(more.error().message);
    samples.insert(samples.end(), more.value().begin(), more.value().end());
    if (samples.size() > kMaxSamples)
      return fail(fmt::format("{}: more than {} measured ops in the profiles so far; the fit takes about a second per "
                              "10,000: give fewer or smaller profiles",
                              path, kMaxSamples));
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
  // The fit minimises the squared log error; the mean |error| in percent, which the table shows, can
  // still come out large, or larger than the preset's (profiles of several machines, ops the model
  // does not cover): say so rather than hand over a hardware file that predicts worse.
  const double mean_before = all.sum_before / all.ops, mean_after = all.sum_after / all.ops;
  if (mean_after > kPoorFitPercent)
    fmt::print(stderr, "pipesim: warning: calibrate: the fit misses the {} measured ops by {:.1f}% on average ({:.1f}% "
                       "at worst); its predictions are no better: check that the profiles measure one machine\n",
               all.ops, mean_after, all.max_after);
  if (o.output.empty()) return ExitStatus::Success;
  if (mean_after > mean_before && !o.force)
    return fail(fmt::format("calibrate: the fit's mean error, {:.1f}% ({:.1f}% at worst), is worse than the preset {}'s, "
                            "{:.1f}% ({:.1f}% at worst), on the {} measured ops; {} not written: keep the preset, or "
                            "pass --force to write the fit anyway",
                            mean_after, all.max_after, o.preset, mean_before, all.max_before, all.ops, o.output));
  const json file{{"generator", "pipesim calibrate"},
                  {"description", fmt::format("fitted by pipesim calibrate to {} measured ops", samples.size())},
                  {"preset", o.preset},
                  {"compute_efficiency", after.compute_efficiency},
                  {"attention_efficiency", after.attention_efficiency},
                  {"hbm_efficiency", after.hbm_efficiency},
                  {"kernel_launch_us", after.kernel_launch_us}};
  if (Status s = write_output_file(o.output, json_text(file, 2) + "\n", kHardwareGenerator); !s.ok())
    return fail(s.error().message);
  note_written(o.output, fmt::format("use: \"hardware\": {{\"file\": \"{}\"}} in a config", o.output));
  return ExitStatus::Success;
}

}  // namespace

void define_calibrate(CLI::App& cal, ExitStatus& status) {
  auto o = std::make_shared<CalibrateOptions>();
  cal.add_option("profiles", o->profiles,
                 "`pipesim run --profile` files, tools/measure-ops.py output, or {\"ops\": [{name, flops, bytes, ms}]}")
      ->required();
  cal.add_option("-o,--output", o->output,
                 "the hardware file to write (configs name it: hardware.file); without it, only the errors are printed")
      ->check(kNonEmpty);
  cal.add_option("--preset", o->preset, "the preset whose peak and bandwidth are scaled (default h100-sxm)")
      ->check(kNonEmpty);
  cal.add_flag("--force", o->force,
               "with -o: write the fit even when its mean error is worse than the preset's (refused otherwise)")
      ->needs("-o");
  cal.callback([o, &status] { status = run_calibrate(*o); });
}

}  // namespace pipesim
