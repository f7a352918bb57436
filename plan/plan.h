#pragma once
/// From a config to a validated task graph: pick the schedule and vocabulary mode, lay out the
/// model, generate the per-device orders, assemble and validate the graph.
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "config.h"
#include "cost_model.h"
#include "assemble.h"
#include "custom_schedule.h"
#include "layout.h"
#include "schedule.h"
#include "status.h"
#include "task_graph.h"
#include "timeline.h"

namespace pipesim {

struct VocabModeInfo {
  VocabMode mode;
  std::string description;
  VocabPlacement placement;
};

/// The vocabulary placement table, in the order `pipesim list` shows it (VocabMode's).
std::span<const VocabModeInfo> vocab_modes();

struct Plan {
  Config config;  ///< as run: parallel.chunks set to what the schedule uses
  const ScheduleInfo* schedule = nullptr;  ///< nullptr for a custom schedule
  Layout layout;
  TaskGraph graph;
  std::vector<Bytes> static_bytes;  ///< per device
  /// The cost model the graph was planned with (the config's own costs): a caller timing the graph
  /// under the same costs uses it rather than building another.
  std::shared_ptr<const CostModel> costs;
  /// The graph simulated under the config's own costs, where planning had to simulate it (to choose
  /// between two versions of the vocabulary passes): a caller timing it with the same costs reuses
  /// it. Such a graph is validated whatever the Validation asked: its structure checked, and the
  /// simulation ran to its end.
  std::optional<Timeline> timeline;
};

/// The first step of make_plan, for callers that need the layout without the graph (`tune`'s
/// bounds): finds the schedule and vocabulary mode, sets in `config` what the plan runs with (the
/// schedule's chunk count; layers_per_stage only for `redistribute`, where it must have one count per
/// device or one per virtual stage), checks it and lays the model out. Errors as make_plan's.
/// check_config for the schedule that runs (`schedule`, or `custom`; neither: check_config alone), with
/// `config.parallel.chunks` already its chunk count: layers too few for its virtual stages are refused
/// in its terms (pp × its own chunks; parallel.chunks only for interleaved-1f1b) with the fixes that
/// apply to it.
std::optional<FieldError> check_config_for(const Config& config, const ScheduleInfo* schedule,
                                           const CustomSchedule* custom = nullptr);

struct PlannedLayout {
  const ScheduleInfo* schedule = nullptr;  ///< nullptr for a custom schedule
  const VocabModeInfo* vocab = nullptr;
  Layout layout;
};
Result<PlannedLayout> plan_layout(Config& config, const CustomSchedule* custom = nullptr);

/// What assemble needs of the data-parallel side: the replicas, ZeRO's stage, the overlaps, and the
/// vocabulary shards the layout puts on every device.
DataParallelWork data_parallel_work(const Config& config, const Layout& layout);

/// What make_plan gives the schedule's generator for `config` laid out as `layout`: stage times and
/// work, the transfer between devices 0 and 1, and the vocabulary passes' delay.
ScheduleContext schedule_context(const Config& config, const Layout& layout, const CostModel& costs);

/// Who validates the graph (validate.h). A caller that simulates it next does so itself: it checks
/// the structure while the graph is simulated, and the simulation proves that the graph runs to its
/// end (it walks the same waits as check_orderable). Failures read as make_plan's
/// (invalid_graph).
enum class Validation { InPlan, ByCaller };

/// Builds and validates the graph for config.schedule.name (or `custom`, when given) and
/// config.schedule.vocab. Errors start with the JSON path of the field to change (e.g.
/// "schedule.name: unknown schedule ...").
Result<Plan> make_plan(const Config& config, const CustomSchedule* custom = nullptr,
                       Validation validation = Validation::InPlan);

/// make_plan's error for a graph that fails validation: which schedule produced it, and why.
Error invalid_graph(const Config& config, const Error& why);

}  // namespace pipesim
