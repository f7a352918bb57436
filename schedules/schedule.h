#pragma once
/// Schedule generators: each returns, for every device, the program order of its compute ops.
/// `assemble` turns those orders into the one TaskGraph (adding the P2P ops and dependencies), so
/// a generator is only the interesting part: who computes what, when.
#include <span>
#include <string>
#include <vector>

#include "config.h"
#include "layout.h"
#include "status.h"
#include "task_graph.h"

namespace pipesim {

struct ComputeStep {
  OpKind kind;  ///< F, B or W
  int stage;    ///< virtual stage
  int microbatch;
};

/// Per device, its compute ops in program order.
using DeviceOrders = std::vector<std::vector<ComputeStep>>;

struct ScheduleInfo {
  std::string name;
  std::string description;
  Placement placement;
  int chunks;  ///< chunks per device the schedule needs; 0: parallel.chunks, which must be >= 2
  /// Refuses (p, m) it cannot schedule with an error that says what to change.
  Result<DeviceOrders> (*generate)(const Layout& layout, int microbatches);
};

/// The schedule table, in the order `pipesim list` shows it.
std::span<const ScheduleInfo> schedules();
/// nullptr for an unknown name.
const ScheduleInfo* find_schedule(const std::string& name);
std::vector<std::string> schedule_names();

// Generators registered in the table (one file each).
Result<DeviceOrders> generate_gpipe(const Layout& layout, int microbatches);
Result<DeviceOrders> generate_1f1b(const Layout& layout, int microbatches);
Result<DeviceOrders> generate_interleaved_1f1b(const Layout& layout, int microbatches);

}  // namespace pipesim
