#pragma once
/// The cost model: op -> duration, plus the work and memory each op carries. Two sources share one
/// interface: analytic (roofline over the model's FLOPs and bytes, α-β links, ring collectives) and
/// explicit (per-op times from the config, for calibration and exact closed-form tests).
#include <memory>
#include <string_view>
#include <vector>

#include "config.h"
#include "layout.h"
#include "task_graph.h"
#include "units.h"

namespace pipesim {

/// Work and memory of one virtual stage for one microbatch, per tensor-parallel rank.
struct StageWork {
  double forward_flops = 0, backward_flops = 0, weight_flops = 0;  ///< backward: input-gradient part
  double forward_bytes = 0, backward_bytes = 0, weight_bytes = 0;  ///< HBM traffic
  Bytes activation_bytes = 0;   ///< taken at F, kept until the backward has used it
  Bytes weight_held_bytes = 0;  ///< part of it kept past B until W when W is split off
  double params = 0;            ///< parameters of this stage on one TP rank
};

/// Per-stage work under the analytic model; `costs.activation_bytes` overrides the memory.
std::vector<StageWork> stage_work(const Config& config, const Layout& layout);

/// Relative cost of one layer, the embedding and the head (forward + backward), for "auto" splits.
StageWeights stage_weights(const Config& config);

/// Parameters + gradients + optimizer states held by each device, in bytes.
std::vector<Bytes> static_memory_bytes(const Config& config, const Layout& layout);

struct StageTimes {
  TimeNs forward = 0;
  TimeNs backward = 0;  ///< input-gradient part; a schedule without W runs backward + weight
  TimeNs weight = 0;
};

class CostModel {
 public:
  virtual ~CostModel() = default;
  /// Duration of one op. `split_weight`: the graph has separate W ops.
  TimeNs duration(const TaskGraph& graph, TaskId id, bool split_weight) const;
  const StageTimes& stage(int s) const { return stages_[static_cast<std::size_t>(s)]; }
  /// Duration of a SEND or RECV as it would appear in a graph.
  TimeNs transfer(const Task& task) const { return p2p(task); }
  virtual std::string_view source() const = 0;

 protected:
  virtual TimeNs p2p(const Task& task) const = 0;
  virtual TimeNs collective(const Task& task, int ranks) const = 0;
  virtual TimeNs optimizer(int device) const = 0;
  std::vector<StageTimes> stages_;
};

/// Analytic unless the config has a `costs` block. The model borrows `config` and `layout`: keep
/// them alive while it is used.
std::unique_ptr<CostModel> make_cost_model(const Config& config, const Layout& layout);

/// Durations of every op of `graph`, indexed by TaskId.
std::vector<TimeNs> op_durations(const CostModel& model, const TaskGraph& graph);

}  // namespace pipesim
