#pragma once
/// Schedule generators: each returns, for every device, the program order of its compute ops.
/// `assemble` turns those orders into the one TaskGraph (adding the P2P ops and dependencies), so
/// a generator is only the interesting part: who computes what, when.
#include <algorithm>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "config.h"
#include "cost_model.h"
#include "layout.h"
#include "status.h"
#include "task_graph.h"
#include "two_threads.h"

namespace pipesim {

struct ComputeStep {
  OpKind kind;  ///< F, B or W; or a vocabulary pass S, T, IF, IB
  int stage;    ///< virtual stage; -1 for vocabulary passes (they run on every device)
  int microbatch;
  bool operator==(const ComputeStep&) const = default;
};

/// Per device, its compute ops in program order.
using DeviceOrders = std::vector<std::vector<ComputeStep>>;

/// Whether the orders split the backward: with W ops, B computes only the input gradient and W the
/// weight gradient; without, B does both. (Of a built graph, TaskGraph::has(OpKind::W) says so.)
inline bool splits_weight(const DeviceOrders& orders) {
  return std::any_of(orders.begin(), orders.end(), [](const std::vector<ComputeStep>& order) {
    return std::any_of(order.begin(), order.end(), [](const ComputeStep& s) { return s.kind == OpKind::W; });
  });
}

/// What a generator may use: the layout and microbatch count, and per-stage costs and memory so
/// that greedy generators can place ops by time under a memory budget.
struct ScheduleContext {
  const Layout& layout;
  int microbatches;
  std::vector<StageTimes> times{};  ///< per virtual stage; backward is the input-gradient part
  std::vector<StageWork> work{};    ///< per virtual stage: activation_bytes, weight_held_bytes
  TimeNs transfer_ns = 0;         ///< one activation or gradient between neighbouring devices
  /// Microbatches by which the last stage's backward trails its forward, waiting for the vocabulary
  /// passes (0 when the vocabulary layers sit on the stages). 1F1B-style generators add it to
  /// every device's warm-up, the greedy scheduler builds it in, and the planner
  /// (plan/vocab_placement.cpp) moves the last stage's backwards for the other schedules where the
  /// orders stay executable.
  int vocab_delay = 0;
  /// What zb-auto may fill with activations (schedule.memory_limit), and per device the room beside
  /// its static memory (device memory less reserved and static; empty: unbounded), for "fit".
  ActivationLimit memory_limit{};
  std::vector<Bytes> activation_room{};
  /// training.optimizer_post_validation: iterations overlap, so an iteration lasts the longest
  /// device span, not the makespan (metrics.h). The zero-bubble scheduler chooses by it.
  bool iterations_overlap = false;

  /// Whether generating orders for it repays a second thread (two_threads.h): 2^13
  /// stage-microbatches are about 2^16 ops.
  bool worth_a_thread() const { return times.size() * std::size_t(microbatches) >= kOpsWorthAThread / 8; }
};

struct ScheduleInfo {
  std::string name;
  std::string description;
  Placement placement;
  int chunks;  ///< chunks per device the schedule needs; 0: parallel.chunks, which must be >= 2
  /// Refuses (p, m) it cannot schedule with an error that says what to change.
  Result<DeviceOrders> (*generate)(const ScheduleContext& context);
};

/// The schedule table, in the order `pipesim list` shows it.
std::span<const ScheduleInfo> schedules();
/// nullptr for an unknown name.
const ScheduleInfo* find_schedule(const std::string& name);
std::vector<std::string> schedule_names();
/// did_you_mean (spellcheck.h) for a schedule name: the names close to `name`; when none is, those
/// whose description holds every word of it ("zero-bubble": zb-h1 and zb-v, "megatron": interleaved-1f1b).
std::string schedule_did_you_mean(std::string_view name);

/// The activation limit the zero-bubble paper's automatic scheduler runs a schedule under: 1x 1F1B's
/// peak for zb-1p, 2x for zb-2p, `configured` (schedule.memory_limit) for zb-auto; none for the others.
std::optional<ActivationLimit> automatic_limit(std::string_view schedule, const ActivationLimit& configured);

// Generators registered in the table (one file each).
Result<DeviceOrders> generate_gpipe(const ScheduleContext& context);
Result<DeviceOrders> generate_1f1b(const ScheduleContext& context);
Result<DeviceOrders> generate_interleaved_1f1b(const ScheduleContext& context);
Result<DeviceOrders> generate_zb_h1(const ScheduleContext& context);
Result<DeviceOrders> generate_zb_h2(const ScheduleContext& context);
Result<DeviceOrders> generate_zb_1p(const ScheduleContext& context);
Result<DeviceOrders> generate_zb_2p(const ScheduleContext& context);
Result<DeviceOrders> generate_zb_auto(const ScheduleContext& context);
Result<DeviceOrders> generate_v_half(const ScheduleContext& context);
Result<DeviceOrders> generate_v_min(const ScheduleContext& context);
Result<DeviceOrders> generate_zb_v(const ScheduleContext& context);
Result<DeviceOrders> generate_dualpipe_v(const ScheduleContext& context);

}  // namespace pipesim
