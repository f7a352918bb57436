#pragma once
/// The cost model: op -> duration. Two sources share one interface: analytic (roofline over the
/// kernels' FLOPs and bytes, kernels.h; α-β links, ring collectives) and explicit (per-op times from
/// the config, for calibration and exact closed-form tests). The work and memory each op carries are
/// in op_work.h, the parallel shape and static memory in parallel_shape.h.
#include <algorithm>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "config.h"
#include "layout.h"
#include "op_work.h"
#include "parallel_shape.h"
#include "task_graph.h"
#include "units.h"

namespace pipesim {

/// Relative cost of one layer, the embedding and the head (forward + backward), for "auto" splits.
StageWeights stage_weights(const Config& config);

struct StageTimes {
  TimeNs forward = 0;
  /// Input-gradient part, with the recomputation (an R op just before each B) that precedes it: what
  /// a schedule plans with. A schedule without W runs backward + weight.
  TimeNs backward = 0;
  TimeNs weight = 0;
  TimeNs recompute = 0;  ///< the part of `backward` that R runs (its MoE layers' all-to-alls included)
  /// The MoE layers' expert-parallel all-to-alls of F and of B (the ALLTOALL ops after them).
  TimeNs exchange_forward = 0, exchange_backward = 0;
};

class CostModel {
 public:
  virtual ~CostModel() = default;
  /// Duration of one op. `split_weight`: the graph has separate W ops.
  TimeNs duration(const TaskGraph& graph, TaskId id, bool split_weight) const;
  const StageTimes& stage(int s) const { return stages_[static_cast<std::size_t>(s)]; }
  /// Duration of a SEND or RECV as it would appear in a graph.
  TimeNs transfer(const Task& task, const TaskWork& work) const { return p2p(task, work); }
  /// Duration of one collective of `work` over `group` in one piece (a bucketed DP_ALLREDUCE's
  /// `duration` is built from these).
  TimeNs collective_time(const Task& task, const TaskWork& work, const CollectiveGroup& group) const {
    return collective(task, work, group);
  }
  virtual std::string_view source() const = 0;

 protected:
  virtual TimeNs p2p(const Task& task, const TaskWork& work) const = 0;
  virtual TimeNs collective(const Task& task, const TaskWork& work, const CollectiveGroup& group) const = 0;
  virtual TimeNs optimizer(int device) const = 0;
  virtual TimeNs vocab_pass(const Task& task, const TaskWork& work) const = 0;  ///< S, T, IF, IB
  std::vector<StageTimes> stages_;
};

/// Analytic unless the config has a `costs` block. The model keeps what it needs of `config` and
/// `layout`: they need not outlive it.
std::unique_ptr<CostModel> make_cost_model(const Config& config, const Layout& layout);

/// The shortest time a transfer of `boundary_bytes` between the devices of two neighbouring stages
/// takes under `model`, in either direction; the largest TimeNs when every boundary stays on a device.
TimeNs shortest_transfer(const CostModel& model, const Layout& layout, Bytes boundary_bytes);

/// What `buckets` collectives of `bucket` each leave after a pass of `pass` that fills them one after
/// another (or, mirrored, before the pass that reads them), on one stream (TaskWork::buckets).
TimeNs bucketed_tail(TimeNs bucket, int buckets, TimeNs pass);

/// Durations of every op of `graph`, indexed by TaskId.
std::vector<TimeNs> op_durations(const CostModel& model, const TaskGraph& graph);

}  // namespace pipesim
