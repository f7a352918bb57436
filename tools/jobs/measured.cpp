// A run measured in the simulator's terms (measured.h), and the Job of a plan (plan_job.h).
#include "measured.h"

#include <algorithm>
#include <limits>

#include "metrics.h"
#include "parallel_shape.h"
#include "partition.h"

namespace pipesim {

runtime::Job job_of(const Plan& plan) {
  return {.graph = plan.graph, .layout = plan.layout, .shape = runtime::model_shape(plan.config),
          .microbatches = plan.config.parallel.microbatches, .training = plan.config.training,
          .tp = plan.config.parallel.tp, .sequence_parallel = plan.config.parallel.sequence_parallel,
          .dp = plan.config.parallel.dp, .ep = plan.config.parallel.ep,
          .etp = plan.config.model.has_experts() ? plan.config.parallel.expert_tp() : 1};
}

namespace {

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
      case OpKind::AllToAll:  // a costs block with exchanging experts is refused (check_config)
      case OpKind::Recv:  // its time is the wait for the SEND, not a cost of its own
      case OpKind::R:     // a costs block refuses recomputation (docs/config.md)
        break;
    }
  }
  return t;
}

}  // namespace

ExplicitCosts measured_costs(const Plan& plan, const runtime::RunResult& r) {
  const MeasuredTimes t = measured_times(plan, r);
  const auto per_device = [](const std::vector<std::vector<double>>& values) {
    std::vector<double> out;
    for (const auto& v : values) out.push_back(mean(v));
    return out;
  };
  ExplicitCosts c;
  c.forward_ms = per_device(t.forward), c.backward_ms = per_device(t.backward), c.weight_ms = per_device(t.weight);
  c.p2p_ms = fastest(t.sends);
  c.optimizer_ms = mean(t.optimizer);
  c.output_forward_ms = mean(t.out_f), c.output_backward_ms = mean(t.out_b);
  c.input_forward_ms = mean(t.in_f), c.input_backward_ms = mean(t.in_b);
  c.allreduce_ms = fastest(t.collectives);
  c.dp_allreduce_ms = fastest(t.data_parallel);
  return c;
}

nlohmann::ordered_json measured_profile(const Plan& plan, const runtime::RunResult& r) {
  return profile_json(plan, measured_costs(plan, r));
}

}  // namespace pipesim
