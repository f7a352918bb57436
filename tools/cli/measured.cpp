#include "measured.h"

#include <fmt/format.h>
#include <algorithm>

#include "config_json.h"
#include "json_text.h"
#include "metrics.h"
#include "partition.h"
#include "sizes.h"

namespace pipesim {

runtime::Job job_of(const Plan& plan) {
  return {.graph = plan.graph, .layout = plan.layout, .shape = runtime::model_shape(plan.config),
          .microbatches = plan.config.parallel.microbatches, .training = plan.config.training,
          .tp = plan.config.parallel.tp, .sequence_parallel = plan.config.parallel.sequence_parallel,
          .dp = plan.config.parallel.dp};
}
namespace {

using json = nlohmann::ordered_json;

/// A communication op is timed from its post to its completion, which includes waiting for the
/// peers; the fastest one observed is the closest to the transfer itself.
double fastest(const std::vector<double>& values) {
  return values.empty() ? 0 : *std::min_element(values.begin(), values.end());
}

double mean(const std::vector<double>& values) {
  double total = 0;
  for (double v : values) total += v;
  return values.empty() ? 0 : total / double(values.size());
}

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

}  // namespace

RunReport measured_report(const Plan& plan, const runtime::RunResult& r, const std::string& backend) {
  RunMetrics m = compute_metrics(plan.config, plan.graph, r.timeline, r.static_bytes);
  Bytes most = 0, least = std::numeric_limits<Bytes>::max();
  for (DeviceMetrics& d : m.devices) {
    const std::size_t rank = std::size_t(d.rank);
    d.static_bytes = r.static_bytes[rank];
    d.peak_activation_bytes = r.peak_activation_bytes[rank];
    d.peak_memory_bytes = d.static_bytes + d.peak_activation_bytes;
    d.peak_op = r.peak_op[rank];
    d.peak_time_ns = d.peak_op == kNoTask ? 0 : r.timeline.end[std::size_t(d.peak_op)];
    most = std::max(most, d.peak_memory_bytes), least = std::min(least, d.peak_memory_bytes);
  }
  m.memory_imbalance = least > 0 ? double(most) / double(least) : 1.0;
  m.mfu = 0;
  m.memory_capacity_bytes = host_memory_bytes();
  m.fits_in_memory = most <= m.memory_capacity_bytes;
  RunReport report = make_report(plan, "measured (" + backend + ")", m);
  report.mfu_defined = false;
  return report;
}

namespace {

/// A run's op times sorted by what a profile's `costs` call them.
struct MeasuredTimes {
  /// Transformer compute per device, per even share of the layers (what costs.forward_ms means).
  std::vector<std::vector<double>> forward, backward, weight;
  std::vector<double> sends, collectives, optimizer;
  std::vector<double> out_f, out_b, in_f, in_b;  ///< LM head (output) and embedding (input) layers, whole
  /// Per device: its data-parallel collectives together (the all-reduce, or ZeRO's reduce-scatter
  /// and all-gather), what costs.dp_allreduce_ms means.
  std::vector<double> data_parallel;
};

MeasuredTimes measured_times(const Plan& plan, const runtime::RunResult& r) {
  const TaskGraph& g = plan.graph;
  const int devices = plan.layout.devices;
  const auto ms = [&](TaskId id) { return double(r.timeline.end[std::size_t(id)] - r.timeline.start[std::size_t(id)]) / 1e6; };
  const auto vocab_ms = [&](TaskId id) { return double(r.vocab_layer_ns[std::size_t(id)]) / 1e6; };
  MeasuredTimes t;
  t.forward.resize(static_cast<std::size_t>(devices)), t.backward = t.forward, t.weight = t.forward;
  for (TaskId id = 0; id < TaskId(g.size()); ++id) {
    const Task& task = g.task(id);
    switch (task.kind) {  // vocabulary passes run 1/p of the layer each; costs give the whole layer
      case OpKind::F:
      case OpKind::B:
      case OpKind::W: {
        const VirtualStage& stage = plan.layout.stages[std::size_t(task.stage)];
        // The head's and the embedding's work is all in F and B (B takes their weight gradients too);
        // a W op has none of it to average in.
        if (stage.has_head && task.kind != OpKind::W) (task.kind == OpKind::F ? t.out_f : t.out_b).push_back(vocab_ms(id));
        if (stage.has_embedding && task.kind != OpKind::W) (task.kind == OpKind::F ? t.in_f : t.in_b).push_back(vocab_ms(id));
        if (stage.layers == 0) break;
        const double share = double(stage.layers) * devices / plan.config.model.layers;
        auto& into = task.kind == OpKind::F ? t.forward : task.kind == OpKind::B ? t.backward : t.weight;
        into[std::size_t(task.device)].push_back((ms(id) - vocab_ms(id)) / share);
        break;
      }
      case OpKind::S: t.out_f.push_back(ms(id) * devices); break;
      case OpKind::T: t.out_b.push_back(ms(id) * devices); break;
      case OpKind::IF: t.in_f.push_back(ms(id) * devices); break;
      case OpKind::IB: t.in_b.push_back(ms(id) * devices); break;
      case OpKind::Send: t.sends.push_back(ms(id)); break;
      case OpKind::AllReduce:
      case OpKind::Broadcast:
      case OpKind::Reduce: t.collectives.push_back(ms(id)); break;
      case OpKind::Optimizer: t.optimizer.push_back(ms(id)); break;
      case OpKind::DpAllReduce:
        t.data_parallel.resize(std::size_t(devices), 0.0);
        t.data_parallel[std::size_t(task.device)] += ms(id);
        break;
      case OpKind::Recv:  // its time is the wait for the SEND, not a cost of its own
      case OpKind::R:     // a costs block refuses recomputation (docs/config.md)
        break;
    }
  }
  return t;
}

}  // namespace

json measured_profile(const Plan& plan, const runtime::RunResult& r) {
  const Config& c = plan.config;
  const MeasuredTimes t = measured_times(plan, r);
  const auto per_device = [](const std::vector<std::vector<double>>& values) {
    json out = json::array();
    for (const auto& v : values) out.push_back(mean(v));
    return out;
  };
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
           {{"forward_ms", per_device(t.forward)},
            {"backward_ms", per_device(t.backward)},
            {"weight_ms", per_device(t.weight)},
            {"p2p_ms", fastest(t.sends)},
            {"optimizer_ms", mean(t.optimizer)},
            {"output_forward_ms", mean(t.out_f)},
            {"output_backward_ms", mean(t.out_b)},
            {"input_forward_ms", mean(t.in_f)},
            {"input_backward_ms", mean(t.in_b)},
            {"allreduce_ms", fastest(t.collectives)},
            {"dp_allreduce_ms", fastest(t.data_parallel)}}}};
}

namespace {

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
