// The measured profile's JSON (profile.h): written from a plan and its measured costs, read back into a
// config's costs.
#include "profile.h"

#include <fmt/format.h>

#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "config_json.h"
#include "json_text.h"
#include "sizes.h"

namespace pipesim {
namespace {

using json = nlohmann::ordered_json;

/// The profile's layers_per_stage: what `pipesim run` wrote, or a hand edit refused with its path.
Result<std::vector<int>> layer_counts(const json& value, const std::string& path) {
  const std::string usage = fmt::format(
      "{}: layers_per_stage: expected an array of layer counts (integers from 0 to {}), as `pipesim run --profile` "
      "writes",
      path, limits::kLayers);
  if (!value.is_array()) return Error{usage};
  std::vector<int> counts;
  for (const json& count : value) {
    if (!count.is_number_integer() || count.get<std::int64_t>() < 0 || count.get<std::int64_t>() > limits::kLayers)
      return Error{usage};
    counts.push_back(count.get<int>());
  }
  return counts;
}

/// A profile's costs are one model's ops on one pipeline size: timing another model with them would
/// answer a question nobody asked. Profiles without the record (hand-written ones) are taken as they are.
Status check_measured_shape(const json& profile, const Config& config, const std::string& path) {
  const ModelConfig& m = config.model;
  const std::pair<const char*, long long> fields[] = {
      {"layers", m.layers},   {"hidden", m.hidden}, {"heads", m.heads},
      {"ffn_hidden", m.ffn_hidden}, {"seq_len", m.seq_len}, {"vocab", m.vocab},
      {"micro_batch_size", m.micro_batch_size}};
  const auto mismatch = [&](const std::string& field, const json& measured, long long here) {
    return Error{fmt::format("{}: measured with {} = {}, but this config has {}; simulate the model the profile "
                             "measured (the same --set flags as the run: `pipesim run --profile` prints the command)",
                             path, field, measured.dump(), here)};
  };
  if (const auto model = profile.find("model"); model != profile.end() && model->is_object())
    for (const auto& [name, here] : fields)
      if (const auto measured = model->find(name);
          measured != model->end() && !(measured->is_number_integer() && measured->get<long long>() == here))
        return mismatch(fmt::format("model.{}", name), *measured, here);
  for (const auto& [name, here] : {std::pair{"pp", config.parallel.pp}, {"tp", config.parallel.tp}})
    if (const auto measured = profile.find(name);
        measured != profile.end() && !(measured->is_number_integer() && measured->get<long long>() == here))
      return mismatch(fmt::format("parallel.{}", name), *measured, here);
  return Status::Ok();
}

}  // namespace

json profile_json(const Plan& plan, const ExplicitCosts& costs) {
  const Config& c = plan.config;
  std::vector<int> layers;
  for (const VirtualStage& s : plan.layout.stages) layers.push_back(s.layers);
  return {{"generator", "pipesim run"},
          {"config", c.source},
          {"schedule", c.schedule.name},
          {"vocab", vocab_mode_name(c.schedule.vocab)},
          {"layers_per_stage", layers},
          {"model",  // the shape measured (a run's --set may have changed the config's), for calibration
           {{"layers", c.model.layers}, {"hidden", c.model.hidden}, {"heads", c.model.heads},
            {"ffn_hidden", c.model.ffn_hidden}, {"seq_len", c.model.seq_len}, {"vocab", c.model.vocab},
            {"micro_batch_size", c.model.micro_batch_size}}},
          {"pp", plan.layout.devices},
          {"tp", c.parallel.tp},  // the layers' ops include their tensor-parallel collectives
          {"costs",
           {{"forward_ms", costs.forward_ms},
            {"backward_ms", costs.backward_ms},
            {"weight_ms", costs.weight_ms},
            {"p2p_ms", costs.p2p_ms},
            {"optimizer_ms", costs.optimizer_ms},
            {"output_forward_ms", costs.output_forward_ms},
            {"output_backward_ms", costs.output_backward_ms},
            {"input_forward_ms", costs.input_forward_ms},
            {"input_backward_ms", costs.input_backward_ms},
            {"allreduce_ms", costs.allreduce_ms},
            {"dp_allreduce_ms", costs.dp_allreduce_ms}}}};
}

Result<Config> apply_profile(Config config, std::string_view text, const std::string& path) {
  const json profile = json::parse(text, nullptr, false);
  if (profile.is_discarded() || !profile.is_object() || !profile.contains("costs") || !profile["costs"].is_object())
    return Error{fmt::format("{}: not a profile: expected a JSON object with a \"costs\" object, as `pipesim run "
                             "--profile` writes",
                             path)};
  // The costs go through the config reader, so a hand-edited profile gets the same field errors.
  Result<ExplicitCosts> costs = parse_costs(json_text(profile["costs"]), path);
  if (!costs.ok()) return costs.error();
  config.costs = std::move(costs).value();
  if (std::optional<FieldError> e = check_config(config)) return Error{fmt::format("{}: {}: {}", path, e->path, e->message)};
  if (config.schedule.vocab == VocabMode::Redistribute && profile.contains("layers_per_stage") &&
      config.schedule.layers_per_stage.empty()) {
    Result<std::vector<int>> split = layer_counts(profile["layers_per_stage"], path);
    if (!split.ok()) return split.error();
    config.schedule.layers_per_stage = std::move(split).value();
    // The counts must also fit this config (a profile of another model, or a hand edit).
    if (std::optional<FieldError> e = check_config(config)) return Error{fmt::format("{}: {}: {}", path, e->path, e->message)};
  }
  if (Status same = check_measured_shape(profile, config, path); !same.ok()) return same.error();
  return config;
}

}  // namespace pipesim
