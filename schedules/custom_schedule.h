#pragma once
/// A schedule given as per-device orders instead of a generator (e.g. loaded from a PyTorch schedule
/// file), and the file's own order of point-to-point transfers, which `assemble` keeps as written.
#include <optional>
#include <string>
#include <vector>

#include "layout.h"
#include "schedule.h"
#include "task_graph.h"

namespace pipesim {

/// One point-to-point transfer as a schedule file orders it on its rank: a SEND of stage `stage`'s
/// output (Activation, to stage + 1) or input gradient (Gradient, to stage - 1), or the RECV of
/// one into `stage`. It is issued after the compute op `after` of its rank (none: at the start).
struct CommStep {
  OpKind kind;  ///< Send or Recv
  Payload payload;
  int stage;
  int microbatch;
  std::optional<ComputeStep> after;
};

/// Per device, its transfers in program order; empty: assemble derives them from the orders.
using DeviceComms = std::vector<std::vector<CommStep>>;

struct CustomSchedule {
  std::string name;  ///< reported as the schedule's name
  Placement placement = Placement::Loop;
  int chunks = 1;
  DeviceOrders orders;
  /// The file's own communication order (PyTorch's compute_comms format), kept as written.
  DeviceComms comms;
  /// What the reader changed to make the file runnable, for the user to see.
  std::vector<std::string> notes;
};

}  // namespace pipesim
