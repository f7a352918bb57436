#pragma once
/// The cost model: op -> duration, plus the work and memory each op carries. Two sources share one
/// interface: analytic (roofline over the model's FLOPs and bytes, α-β links, ring collectives) and
/// explicit (per-op times from the config, for calibration and exact closed-form tests).
#include <algorithm>
#include <memory>
#include <string>
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
  double recompute_flops = 0, recompute_bytes = 0;  ///< R, the recomputation before B; 0: no R
  Bytes activation_bytes = 0;   ///< taken at F, kept until the backward has used it
  Bytes recomputed_bytes = 0;   ///< taken at R (what it rebuilds, at its largest), returned by B
  Bytes weight_held_bytes = 0;  ///< kept past B until W when W is split off
  double params = 0;            ///< parameters of this stage on one TP rank
  bool recomputes() const { return recompute_flops > 0 || recompute_bytes > 0; }
  /// What R takes: under a W split, at least what W will need beyond what F kept.
  Bytes recompute_alloc(bool split_weight) const {
    if (!recomputes()) return 0;
    return split_weight ? std::max(recomputed_bytes, weight_held_bytes - activation_bytes) : recomputed_bytes;
  }
  /// What B returns: everything F and R took except what W still needs.
  Bytes backward_free(bool split_weight) const {
    return activation_bytes + recompute_alloc(split_weight) - (split_weight ? weight_held_bytes : 0);
  }
};

/// Per-stage work under the analytic model; `costs.activation_bytes` overrides the memory.
std::vector<StageWork> stage_work(const Config& config, const Layout& layout);

/// Work of the vocabulary-parallel passes on one device for one microbatch (DESIGN.md §5), with
/// the vocabulary split into layout.padded_vocab / p rows per device. GEMM FLOPs and memory-bound
/// bytes are kept apart: the passes run them as separate kernels, one after the other.
struct VocabWork {
  double s_flops = 0, s_bytes = 0;    ///< S: logits (+ softmax·W for Algorithm 2), local softmax stats
  double t_flops = 0, t_bytes = 0;    ///< T: dW (+ dX for Algorithm 1), softmax gradient
  double input_forward_bytes = 0;     ///< IF: gather of the rows in this shard
  double input_backward_bytes = 0;    ///< IB: scatter-add into this shard's gradient
  Bytes s_activation_bytes = 0;       ///< kept from S to T: fp32 logits shard and the input X
  double output_broadcast_bytes = 0;  ///< the last transformer output X, to every device
  double barrier0_bytes = 0;          ///< C0: max, sum-exp, target logit (+ dX for Algorithm 2)
  double barrier1_bytes = 0;          ///< C1 (Algorithm 1): dX
  double input_reduce_bytes = 0;      ///< the summed embedding output, to the first stage
  double grad_broadcast_bytes = 0;    ///< the embedding output's gradient, from the first stage
};
VocabWork vocab_work(const Config& config, const Layout& layout);

/// Relative cost of one layer, the embedding and the head (forward + backward), for "auto" splits.
StageWeights stage_weights(const Config& config);

/// Parameters of the vocabulary shards each device holds when the vocabulary is split over devices
/// (per tensor-parallel rank; one matrix for both uses when the embeddings are tied); 0 when it is not.
double vocab_shard_params(const Config& config, const Layout& layout);

/// Parameters + gradients + optimizer states held by each device, in bytes.
std::vector<Bytes> static_memory_bytes(const Config& config, const Layout& layout);

struct StageTimes {
  TimeNs forward = 0;
  /// Input-gradient part, with the recomputation (an R op just before each B) that precedes it: what
  /// a schedule plans with. A schedule without W runs backward + weight.
  TimeNs backward = 0;
  TimeNs weight = 0;
  TimeNs recompute = 0;  ///< the part of `backward` that R runs
};

class CostModel {
 public:
  virtual ~CostModel() = default;
  /// Duration of one op. `split_weight`: the graph has separate W ops.
  TimeNs duration(const TaskGraph& graph, TaskId id, bool split_weight) const;
  const StageTimes& stage(int s) const { return stages_[static_cast<std::size_t>(s)]; }
  /// Duration of a SEND or RECV as it would appear in a graph.
  TimeNs transfer(const Task& task, const TaskWork& work) const { return p2p(task, work); }
  virtual std::string_view source() const = 0;

 protected:
  virtual TimeNs p2p(const Task& task, const TaskWork& work) const = 0;
  virtual TimeNs collective(const Task& task, const TaskWork& work, const CollectiveGroup& group) const = 0;
  virtual TimeNs optimizer(int device) const = 0;
  virtual TimeNs vocab_pass(const Task& task, const TaskWork& work) const = 0;  ///< S, T, IF, IB
  std::vector<StageTimes> stages_;
};

/// Analytic unless the config has a `costs` block. The model borrows `config` and `layout`: keep
/// them alive while it is used.
std::unique_ptr<CostModel> make_cost_model(const Config& config, const Layout& layout);

/// The shortest time a transfer of `boundary_bytes` between the devices of two neighbouring stages
/// takes under `model`, in either direction; the largest TimeNs when every boundary stays on a device.
TimeNs shortest_transfer(const CostModel& model, const Layout& layout, Bytes boundary_bytes);

/// Durations of every op of `graph`, indexed by TaskId.
std::vector<TimeNs> op_durations(const CostModel& model, const TaskGraph& graph);

/// One kernel as the analytic model times it: its FLOPs at peak × compute_efficiency (GEMMs) or ×
/// attention_efficiency (fused attention), or its bytes at HBM bandwidth × hbm_efficiency, whichever
/// is slower, plus one kernel launch. An op's time is the sum over its kernels.
struct Kernel {
  double flops = 0;
  double bytes = 0;
  bool attention = false;
  double rows = 0, cols = 0;  ///< a GEMM's output shape, for its tile fill (0: not a GEMM)
};
/// The share of a GEMM's tile work that is useful on `sms` streaming multiprocessors: ragged edges
/// cost whole tiles, and fewer tiles than SMs leave SMs idle. 1 for other kernels and for sms = 0.
double tile_fill(const Kernel& kernel, int sms);
double kernel_seconds(const Kernel& kernel, const HardwareConfig& hardware);

/// One op's kernels, for calibration.
struct OpWork {
  std::string name;
  std::vector<Kernel> kernels;
};

/// The work of one transformer layer's F, B and W (`layer_forward`, `layer_backward`, `layer_weight`)
/// and of the whole vocabulary layers (`output_forward`, `output_backward` (dX), `output_weight` (dW),
/// `input_forward`, `input_backward`), without tensor parallelism: what calibration fits hardware to.
std::vector<OpWork> analytic_op_work(const Config& config);
/// Seconds the analytic model gives `work` on `hardware`.
double analytic_seconds(const OpWork& work, const HardwareConfig& hardware);

}  // namespace pipesim
