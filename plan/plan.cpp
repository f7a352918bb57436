#include "plan.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <optional>
#include <utility>

#include "assemble.h"
#include "model_math.h"
#include "sizes.h"
#include "validate.h"
#include "vocab_passes.h"
#include "vocab_placement.h"

namespace pipesim {
namespace {

/// The generators and evaluate_orders add stage times along chains of at most 3·stages·m ops, each
/// also waiting for a transfer: if that bound fits below 2^62 ns, none of their sums can overflow.
Status check_times(const ScheduleContext& context) {
  const std::int64_t ops = 3 * std::int64_t(context.times.size()) * context.microbatches;
  TimeNs total = times_ns(ops, context.transfer_ns);
  for (const StageTimes& t : context.times)
    total = add_ns(total, times_ns(context.microbatches, add_ns(add_ns(t.forward, t.backward), t.weight)));
  if (total >= 0) return Status::Ok();
  return Error{"the stage times add up to over 146 years (or one is not a number); check the hardware speeds, the "
               "costs and the model sizes"};
}

const std::array<VocabModeInfo, 5> kVocabModes = {{
    {VocabMode::Baseline, "embedding in the first stage, LM head and loss in the last; layers split evenly",
     VocabPlacement::OnStages},
    {VocabMode::Redistribute, "as baseline, but schedule.layers_per_stage (or \"auto\": balance the slowest stage) moves "
                     "layers off the stages holding vocabulary layers",
     VocabPlacement::OnStages},
    {VocabMode::Vocab1, "Vocabulary Parallelism, Algorithm 1: vocabulary layers split over all devices as S/T/IF/IB passes, "
                "barriers C0 (softmax statistics) and C1 (input gradient), overlapped with the pipeline",
     VocabPlacement::Vocab1},
    {VocabMode::Vocab2, "Vocabulary Parallelism, Algorithm 2: as vocab-1 with a single barrier carrying the input gradient",
     VocabPlacement::Vocab2},
    {VocabMode::Interlaced, "vocabulary layers split over all devices, computed tensor-parallel style with synchronous, "
                   "non-overlapped all-reduces",
     VocabPlacement::Interlaced},
}};

const VocabModeInfo& vocab_mode_info(VocabMode mode) {
  return *std::find_if(kVocabModes.begin(), kVocabModes.end(), [&](const VocabModeInfo& m) { return m.mode == mode; });
}

LayerSplit layer_split(const Config& config) {
  if (config.schedule.vocab != VocabMode::Redistribute) return LayerSplit::Even;
  return config.schedule.layers_per_stage.empty() ? LayerSplit::Balanced : LayerSplit::Explicit;
}

/// A layer split that fits neither form for this schedule, refused with the lengths it takes and why:
/// the schedule decides how many chunks each device runs, and so what one per virtual stage is.
Status check_split_length(const Config& config, const ScheduleInfo* schedule) {
  const std::vector<int>& split = config.schedule.layers_per_stage;
  const int devices = config.parallel.pp, chunks = config.parallel.chunks;
  if (split.empty() || int(split.size()) == devices || int(split.size()) == devices * chunks) return Status::Ok();
  const std::string& name = config.schedule.name;
  const std::string prefix = fmt::format("schedule.layers_per_stage: has {} entries; ", split.size());
  if (chunks == 1)
    return Error{prefix + fmt::format("{} runs one stage per device, so on {} devices (pp) it takes {}, one per "
                                      "device; give {} counts or \"auto\"",
                                      name, devices, devices, devices)};
  std::string why = fmt::format("{} always runs {} stages per device", name, chunks);
  if (!schedule) why = fmt::format("the schedule file {} runs {} stages per device", name, chunks);
  else if (schedule->chunks == 0) why = fmt::format("{} runs parallel.chunks = {} stages per device", name, chunks);
  return Error{prefix + fmt::format("{}, so on {} devices (pp) it takes {} (one per device, spread over its chunks) or "
                                    "{} (one per virtual stage); give {} or {} counts or \"auto\"",
                                    why, devices, devices, devices * chunks, devices, devices * chunks)};
}

/// Every F and B of every (stage, microbatch) exactly once, and every W when there are any, each on
/// the device that holds its stage: what the passes after this (delays, vocabulary passes) index by.
/// A schedule file can say anything, so this is checked, not assumed.
Status check_orders(const DeviceOrders& orders, const Layout& layout, int microbatches) {
  if (static_cast<int>(orders.size()) != layout.devices)
    return Error{fmt::format("orders for {} devices, expected {}", orders.size(), layout.devices)};
  const std::size_t stages = std::size_t(layout.stage_count()), m = std::size_t(microbatches);
  const auto slot = [&](OpKind kind, std::size_t stage, std::size_t mb) {
    return (std::size_t(pass_index(kind)) * stages + stage) * m + mb;
  };
  std::vector<std::uint8_t> seen(3 * stages * m, 0);
  bool split_weight = false;
  for (int d = 0; d < layout.devices; ++d)
    for (const ComputeStep& s : orders[std::size_t(d)]) {
      if (s.stage < 0 || s.stage >= layout.stage_count() || s.microbatch < 0 || s.microbatch >= microbatches ||
          (s.kind != OpKind::F && s.kind != OpKind::B && s.kind != OpKind::W))
        return Error{fmt::format("{}(s{},m{}) is outside {} stages x {} microbatches",
                                 op_kind_name(s.kind), s.stage, s.microbatch, layout.stage_count(), microbatches)};
      const int owner = layout.stages[std::size_t(s.stage)].device;
      if (owner != d)
        return Error{fmt::format("{}(s{},m{}) runs on device {}, but stage {} lives on device {}",
                                 op_kind_name(s.kind), s.stage, s.microbatch, d, s.stage, owner)};
      if (seen[slot(s.kind, std::size_t(s.stage), std::size_t(s.microbatch))]++)
        return Error{fmt::format("{}(s{},m{}) appears twice", op_kind_name(s.kind), s.stage, s.microbatch)};
      split_weight |= s.kind == OpKind::W;
    }
  for (OpKind kind : {OpKind::F, OpKind::B, OpKind::W})
    for (std::size_t stage = 0; stage < stages && (kind != OpKind::W || split_weight); ++stage)
      for (std::size_t mb = 0; mb < m; ++mb)
        if (!seen[slot(kind, stage, mb)])
          return Error{fmt::format("missing {}(s{},m{}); every stage runs F and B (and W, if any does) once per "
                                   "microbatch",
                                   op_kind_name(kind), stage, mb)};
  return Status::Ok();
}

}  // namespace

std::span<const VocabModeInfo> vocab_modes() { return kVocabModes; }

std::optional<FieldError> check_config_for(const Config& config, const ScheduleInfo* schedule,
                                           const CustomSchedule* custom) {
  const int pp = config.parallel.pp, chunks = config.parallel.chunks, layers = config.model.layers;
  // Past a cap check_sizes names the cap; below them pp × chunks is exact.
  const bool within_caps = pp <= limits::kPp && chunks <= limits::kChunks && layers <= limits::kLayers;
  if ((!schedule && !custom) || !within_caps) return check_config(config);
  const int stages = pp * chunks, spare = vocabulary_only_stages(config.schedule.vocab),
            needed = int(fewest_layers(config.schedule.vocab, stages));
  if (needed <= layers) return check_config(config);
  const std::string& name = config.schedule.name;
  const std::string runs = !schedule               ? fmt::format("the schedule file {} runs {} chunks per device", name, chunks)
                           : schedule->chunks == 0 ? fmt::format("{} runs parallel.chunks = {} chunks per device", name, chunks)
                           : chunks == 1           ? fmt::format("{} runs one stage per device", name)
                                                   : fmt::format("{} runs {} chunks per device", name, chunks);
  std::vector<std::string> fixes;
  if (schedule && schedule->chunks == 0 && (layers + spare) / pp >= 2)
    fixes.push_back(fmt::format("parallel.chunks of at most {}", (layers + spare) / pp));
  if ((layers + spare) / chunks >= 1) fixes.push_back(fmt::format("parallel.pp of at most {}", (layers + spare) / chunks));
  fixes.push_back(fmt::format("at least {} layers", needed));
  if (chunks > 1 && (!schedule || schedule->chunks > 0)) {
    std::string single;
    for (const ScheduleInfo& s : schedules())
      if (s.chunks == 1) single += (single.empty() ? "" : ", ") + s.name;
    fixes.push_back(fmt::format("a schedule with one stage per device ({})", single));
  }
  std::string fix;
  for (std::size_t i = 0; i < fixes.size(); ++i)
    fix += (i == 0 ? "" : i + 1 == fixes.size() ? " or " : ", ") + fixes[i];
  return FieldError{"model.layers", fmt::format("{} layers cannot fill {} virtual stages: {}, so pp {} needs {}; use {}",
                                                layers, stages, runs, pp, needed, fix)};
}

Result<PlannedLayout> plan_layout(Config& config, const CustomSchedule* custom) {
  PlannedLayout planned;
  if (custom) {
    config.schedule.name = custom->name;
  } else {
    planned.schedule = find_schedule(config.schedule.name);
    if (!planned.schedule) {
      std::string names;
      for (const std::string& name : schedule_names()) names += (names.empty() ? "" : ", ") + name;
      return Error{fmt::format("schedule.name: unknown schedule '{}'{} Schedules: {} (`pipesim list` describes them)",
                               config.schedule.name, schedule_did_you_mean(config.schedule.name), names)};
    }
  }
  planned.vocab = &vocab_mode_info(config.schedule.vocab);
  const int chunks = custom ? custom->chunks : planned.schedule->chunks;
  if (chunks > 0) config.parallel.chunks = chunks;
  if (layer_split(config) != LayerSplit::Explicit) config.schedule.layers_per_stage.clear();
  if (std::optional<FieldError> e = check_config_for(config, planned.schedule, custom))
    return Error{e->path + ": " + e->message};
  if (Status s = check_split_length(config, planned.schedule); !s.ok()) return s.error();

  Result<Layout> layout = make_layout(config, custom ? custom->placement : planned.schedule->placement,
                                      layer_split(config), stage_weights(config), planned.vocab->placement);
  if (!layout.ok()) return layout.error();
  planned.layout = std::move(layout).value();
  return planned;
}

Error invalid_graph(const Config& config, const Error& why) {
  return Error{fmt::format("schedule '{}' produced an invalid graph: {}", config.schedule.name, why.message)};
}

DataParallelWork data_parallel_work(const Config& config, const Layout& layout) {
  const TrainingConfig& t = config.training;
  return {.zero = zero_sharding(config), .grad_bytes = config.precision.grad_bytes,
          .param_bytes = config.precision.param_bytes, .shard_params = vocab_shard_params(config, layout),
          .tied_params = tied_apart_params(config, layout),
          .overlap_grad_reduce = t.overlap_grad_reduce, .overlap_param_gather = t.overlap_param_gather,
          .bucket_params = gradient_bucket_params(config)};
}

ScheduleContext schedule_context(const Config& config, const Layout& layout, const CostModel& costs) {
  ScheduleContext context{.layout = layout, .microbatches = config.parallel.microbatches,
                          .work = stage_work(config, layout), .vocab_delay = vocab_delay(layout.vocab, layout.devices)};
  for (int s = 0; s < layout.stage_count(); ++s) context.times.push_back(costs.stage(s));
  context.memory_limit = config.schedule.memory_limit;
  context.iterations_overlap = config.training.optimizer_post_validation;
  const Bytes capacity = memory_capacity_bytes(config.hardware);
  for (const Bytes held : static_memory_bytes(config, layout))
    context.activation_room.push_back(std::max<Bytes>(capacity - held, 0));
  const int next_device = std::min(1, layout.devices - 1);
  context.transfer_ns = costs.transfer({.kind = OpKind::Send, .device = 0, .peer = next_device},
                                       {.bytes = double(Bytes(hidden_activation_bytes(config)))});
  return context;
}

/// Whether interlaced passes run as the lockstep 1F1B program: for the 1f1b schedule, and for a
/// compute-only file whose order is that program's (as `export` writes it: without the passes), so
/// that export then import gives the same graph.
namespace {
bool runs_interlaced_1f1b(const ScheduleInfo* schedule, const CustomSchedule* custom, const ScheduleContext& context) {
  if (schedule && schedule->generate == generate_1f1b) return true;
  if (!custom || !custom->comms.empty() || context.layout.stage_count() != context.layout.devices) return false;
  DeviceOrders program = interlaced_1f1b_orders(context);
  for (std::vector<ComputeStep>& order : program)
    std::erase_if(order, [](const ComputeStep& s) { return s.stage < 0; });  // the vocabulary passes
  return program == custom->orders;
}
}  // namespace

namespace {
/// DualPipeV pairs each forward chunk with a backward chunk of another microbatch to hide one's
/// expert-parallel all-to-all behind the other's compute (DeepSeek-V3 report, §3.2.1); other
/// schedules overlap them only under Megatron-Core's overlap_moe_expert_parallel_comm.
ExpertComm expert_comm(const Config& config, const ScheduleInfo* schedule) {
  const bool paired = schedule && schedule->generate == generate_dualpipe_v;
  return paired || config.training.overlap_moe_expert_parallel_comm ? ExpertComm::Overlapped : ExpertComm::Blocking;
}
}  // namespace

Result<Plan> make_plan(const Config& requested, const CustomSchedule* custom, Validation validation) {
  Plan plan;
  plan.config = requested;
  Config& config = plan.config;
  Result<PlannedLayout> planned = plan_layout(config, custom);
  if (!planned.ok()) return planned.error();
  plan.schedule = planned.value().schedule;
  const VocabModeInfo* vocab = planned.value().vocab;
  plan.layout = std::move(planned.value().layout);
  const int m = config.parallel.microbatches;
  const Bytes boundary = Bytes(hidden_activation_bytes(config));  // an activation crossing a stage
  plan.costs = make_cost_model(config, plan.layout);
  const CostModel& costs = *plan.costs;
  const ScheduleContext context = schedule_context(config, plan.layout, costs);
  if (Status s = check_times(context); !s.ok()) return s.error();
  Result<DeviceOrders> generated = custom ? Result<DeviceOrders>(custom->orders) : plan.schedule->generate(context);
  if (!generated.ok()) return generated.error();
  if (Status s = check_orders(generated.value(), plan.layout, m); !s.ok())
    return Error{fmt::format("schedule '{}': {}", config.schedule.name, s.error().message)};
  DeviceOrders orders = std::move(generated).value();
  const auto build = [&](const DeviceOrders& final_orders) {
    return assemble(plan.layout, final_orders, context.work, vocab_work(config, plan.layout), m, boundary,
                    data_parallel_work(config, plan.layout),
                    config.training.overlap_p2p_comm ? P2pMode::Overlapped : P2pMode::Synchronous,
                    custom ? custom->comms : DeviceComms{}, expert_comm(config, plan.schedule));
  };
  if (vocab->placement == VocabPlacement::Interlaced && runs_interlaced_1f1b(plan.schedule, custom, context)) {
    plan.graph = build(interlaced_1f1b_orders(context));  // the lockstep program replaces 1F1B's order
  } else if (vocab->placement != VocabPlacement::OnStages) {
    Result<PlacedGraph> placed = with_vocab_passes(context, std::move(orders), vocab->placement, costs,
                                                   shortest_transfer(costs, plan.layout, boundary), build);
    if (!placed.ok()) return placed.error();
    if (!placed.value().structure.ok()) return invalid_graph(config, placed.value().structure.error());
    plan.graph = std::move(placed.value().graph);
    plan.timeline = std::move(placed.value().timeline);
  } else {
    plan.graph = build(orders);
  }
  // A graph that planning simulated has had its structure checked, and it runs to its end.
  if (validation == Validation::InPlan && !plan.timeline)
    if (Status s = validate(plan.graph, plan.layout, m); !s.ok()) return invalid_graph(config, s.error());
  plan.static_bytes = static_memory_bytes(config, plan.layout);
  return plan;
}

}  // namespace pipesim
