#pragma once
/// Internal to the runtime: what each op of the IR does on one rank (docs/runtime.md: "What runs" for
/// the buffers keyed by kind, stage and microbatch, "The vocabulary passes" for those). Compute ops
/// run a stage's layers, the vocabulary passes and the optimizer through the Backend; communication
/// ops move the buffers their collective's CollectiveData names over the lane the op names.
#include <atomic>
#include <optional>
#include <vector>

#include "buffers.h"
#include "job.h"
#include "walker.h"

namespace pipesim::runtime {

class OpInterpreter final : public OpRunner {
 public:
  /// `comm` joins the rank's pipeline (its rank there is place.device); `data` its data-parallel
  /// group, when the job has replicas; `tied` the first and the last stage's devices of its pipeline,
  /// when the graph sums a tied embedding's gradient between them and this rank is one of the two;
  /// `tensor` its tensor-parallel group, when the job has one (the backend's layers use it too);
  /// `expert_data` under expert parallelism the replicas that hold the same routed experts, when
  /// there are more than one (null: the experts' gradients are this rank's alone).
  OpInterpreter(const Job& job, const RankPlace& place, Transport& comm, Transport* data, Transport* tied,
                TensorParallel* tensor, Backend& backend, const OptimizerSettings& optimizer,
                Transport* expert_data = nullptr);

  void compute(TaskId id, DeviceClock& clock, std::vector<MarkSpan>& vocab_parts) override;
  void start(InFlight& f) override;
  bool advance(InFlight& f) override;

  /// Before a step: its batches; `capture_gradients`: keep the gradients the optimizer op is about
  /// to apply (the gradient check's).
  void begin_step(std::span<const Batch> batches, bool capture_gradients);
  /// This rank's share of the step's loss (the mean over every token of the iteration).
  double loss_part() const { return loss_part_; }
  /// The gradients kept by the step begun with capture_gradients.
  std::vector<HostGradient> take_gradients() { return std::exchange(gradients_, std::nullopt).value(); }
  BufferStore& buffers() { return buffers_; }

 private:
  /// dloss/dlogit scale: the loss is the mean over every token of the iteration, of every replica
  /// (whose gradients the data-parallel collectives then sum).
  float token_weight() const { return 1.0f / float(n_ * microbatches_ * replicas_); }
  /// A microbatch's share of that loss (the baseline head scales its mean by it).
  float microbatch_weight() const { return 1.0f / float(microbatches_ * replicas_); }
  /// A whole activation, n × h: what the vocabulary passes and their collectives move.
  std::size_t activation_size() const { return std::size_t(n_) * std::size_t(h_); }
  /// Whether layers' inputs and outputs are split by rows over the tensor-parallel group.
  bool sequence_parallel() const { return tensor_ && tensor_->sequence_parallel(); }
  /// Under sequence parallelism, this rank's rows of a whole activation (the embedding's output, the
  /// final norm's input gradient); otherwise `whole` itself.
  Tensor sequence_part(Tensor whole);
  /// Under sequence parallelism, every rank's rows gathered over the group (the last layer's output,
  /// the first layer's input gradient); otherwise `part` itself.
  Tensor sequence_whole(Tensor part);
  bool on_this_rank(int stage) const { return layout_.stages[std::size_t(stage)].device == rank_; }
  /// Runs `work` between two marks, a part of the op the profile reports apart.
  template <class F>
  void vocab_layer(F&& work);

  // ---- compute ops ----
  void forward(const Task& t);
  /// R: the activations of the stage's recomputed layers, from the inputs F kept.
  void recompute(const Task& t);
  /// Under full recomputation, whether F keeps the input of recomputed layer `i` of a stage: the first
  /// layer of each group that R rebuilds from one input.
  bool keeps_input(int i) const;
  void backward(const Task& t);
  void weight(const Task& t);
  /// S: logits of this device's shard and the local softmax statistics (+ A and Y for Algorithm 2).
  void output_forward(int mb);
  /// T: the softmax gradient of this shard, dW (+ this shard's dX for Algorithm 1).
  void output_backward(int mb);
  void optimizer();
  /// Under ZeRO, what a replica holds of a weight between the collectives that gather it: its own
  /// part. The rest is zeroed, so that a gather the graph lacks, or that comes too late, fails the
  /// check rather than passing on the weights of an earlier step. `gathered_per_stage`: only the
  /// tensors of stages whose weights have their own gathers.
  void drop_unowned_weights(bool gathered_per_stage);
  /// Whether tensor `index` of parameter_buffers is one a DP_ALLREDUCE of stage `stage` moves
  /// (task_graph.h: -1 takes what no per-stage op of its kind takes).
  bool moved_by(std::size_t index, int stage, bool weights) const;

  // ---- communication ops ----
  void start_collective(InFlight& f, const CollectiveGroup& group);
  /// DP_ALLREDUCE: every tensor's gradients all-reduced, or under ZeRO reduce-scattered (each
  /// replica gets the part it owns), or its updated weights all-gathered.
  void start_data_parallel(InFlight& f, const CollectiveGroup& group);
  /// Puts what a reduce-scatter or an all-gather brought into the backend's tensors.
  void finish_data_parallel(const CollectiveGroup& group);
  /// Barrier C0 after each round: M -> (S, z) -> (Algorithm 2) dX.
  bool barrier0_round(InFlight& f, const CollectiveGroup& group);
  Communicator& lane(TaskId id) { return comm_.lane(graph_.task(id).lane); }

  const TaskGraph& graph_;
  const Layout& layout_;
  const int rank_;
  Transport& comm_;
  Backend& backend_;
  const OptimizerSettings optimizer_;
  int updates_ = 0;  ///< optimizer steps taken
  const int microbatches_, n_, h_;
  Transport* const data_;     ///< the data-parallel group; null with one replica
  Transport* const tied_;     ///< the first and last stage's devices, for a tied embedding; or null
  TensorParallel* const tensor_;  ///< the tensor-parallel group; null without one
  Transport* const expert_data_;  ///< the replicas holding this rank's routed experts; null when it alone does
  /// Whether the routed experts are split over replicas (job.expert_replicas() > 1): then their
  /// gradients sum over expert_data_, not data_.
  const bool expert_parallel_;
  /// For each tensor of the backend's parameter_buffers, whether it is a routed experts' map.
  const std::vector<bool> routed_experts_;
  const int replicas_;
  const OwnedPart owned_;     ///< what this replica's optimizer updates (ZeRO); all of every tensor otherwise
  /// Of the routed experts' maps: its block among the replicas that hold the same experts (ZeRO).
  const OwnedPart expert_owned_;
  /// What this replica's optimizer updates of tensor `i` of the backend's parameter_buffers.
  const OwnedPart& owned_of(std::size_t i) const { return routed_experts_.at(i) ? expert_owned_ : owned_; }
  const int last_device_, last_stage_;
  const bool split_weight_;  ///< whether W runs apart from B (the graph has W ops)
  const TrainingConfig training_;  ///< which layers recompute (recomputed_layers)
  /// The virtual stage of each tensor of the backend's parameter_buffers, and the stages whose
  /// gradients, and whose weights, have DP_ALLREDUCE ops of their own on this device.
  const std::vector<int> tensor_stages_;
  std::vector<bool> own_gradient_ops_, own_weight_ops_;
  bool weights_dropped_ = false;  ///< before the first step, by drop_unowned_weights

  BufferStore buffers_;
  /// The DP_ALLREDUCE in flight (one at a time: they share a lane): per tensor, the padded buffers
  /// its collective reads and fills, and the backend's tensor they come from and go back to.
  struct PaddedTransfer {
    Buffer tensor;
    Tensor in, out;
    Communicator* lane;  ///< the data-parallel group's, or for a routed experts' map the expert data-parallel group's
    OwnedPart owned;     ///< this replica's part of the tensor
  };
  std::vector<PaddedTransfer> data_parallel_;
  std::atomic<double> loss_part_ = 0;  ///< the head runs on either thread
  bool capture_gradients_ = false;
  std::optional<std::vector<HostGradient>> gradients_;
  /// The compute op in progress: its clock and where its vocabulary parts go.
  DeviceClock* clock_ = nullptr;
  std::vector<MarkSpan>* vocab_parts_ = nullptr;
};

}  // namespace pipesim::runtime
