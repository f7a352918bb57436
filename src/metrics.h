#pragma once
/// Metrics of one run (simulated or measured), derived from the graph and its timeline alone.
#include <vector>

#include "config.h"
#include "parallel_shape.h"
#include "task_graph.h"
#include "timeline.h"
#include "units.h"

namespace pipesim {

struct DeviceMetrics {
  int rank = 0;
  TimeNs busy_ns = 0;            ///< compute stream busy time
  double bubble_fraction = 0;    ///< 1 - busy / iteration time
  Bytes static_bytes = 0;        ///< parameters, gradients, optimizer states
  Bytes peak_activation_bytes = 0;
  Bytes peak_memory_bytes = 0;   ///< static + peak activation
  TaskId peak_op = kNoTask;      ///< the op whose allocation reached the peak; kNoTask if none
  TimeNs peak_time_ns = 0;
  TimeNs comm_ns = 0;            ///< time any communication stream was busy
  TimeNs exposed_comm_ns = 0;    ///< part of comm_ns with the compute stream idle
};

struct RunMetrics {
  TimeNs iteration_ns = 0;
  double tokens_per_s = 0;
  double mfu = 0;                ///< fraction, with the Vocabulary Parallelism paper's FLOP count
  double bubble_fraction = 0;    ///< mean over devices
  double memory_imbalance = 1;   ///< max / min peak memory over devices
  Bytes memory_capacity_bytes = 0;  ///< hardware.memory_gib less hardware.reserved_gib
  bool fits_in_memory = true;
  Bytes headroom_bytes = 0;         ///< capacity less the largest device peak; negative: does not fit
  std::vector<DeviceMetrics> devices;
};

/// One step of a device's live activation memory.
struct MemoryChange {
  TimeNs time;
  Bytes delta;  ///< + at an op's start (alloc_bytes), - at its end (free_bytes)
  TaskId op;
};

/// A device's activation allocations and releases in time order; at equal times releases come
/// first, because an op that starts as another ends can reuse its memory.
std::vector<MemoryChange> memory_changes(const TaskGraph& graph, const Timeline& timeline, int device);

RunMetrics compute_metrics(const Config& config, const TaskGraph& graph, const Timeline& timeline,
                           const std::vector<Bytes>& static_bytes);

}  // namespace pipesim
