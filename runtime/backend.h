#pragma once
/// The seam between the executor, which walks the task graph, and a backend, which computes and
/// owns memory. The executor decides which op runs when and which buffers it reads and writes; a
/// backend (CPU: cpu_backend.h; CUDA: cuda/cuda_backend.h) holds one rank's part of the model and
/// runs each op's math on Tensors it allocated. Tokens and targets are host data given once per
/// step; everything else stays where the backend keeps it, except the few scalars the executor
/// reads (losses, gradient-check terms).
#include <algorithm>
#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "tensor.h"
#include "tensor_parallel.h"
#include "units.h"

namespace pipesim::runtime {

/// Tokens of one microbatch and their targets, on the host.
struct Batch {
  std::vector<int> tokens, targets;
};

/// What one layer (or the final norm and LM head) keeps from its forward for its backward and weight
/// pass: the backend's own layout.
class Activations {
 public:
  virtual ~Activations() = default;
  virtual Bytes bytes() const = 0;
  /// After an input-gradient-only backward: drops all but what the weight pass still needs.
  virtual void keep_for_weight_pass() {}
};

/// One tensor's gradient as a rank holds it, copied to the host for the gradient check: elements
/// [offset, offset + values.size()) of tensor `tensor` of the whole model (tensor_names' order), or,
/// where `elements` is given (a tensor-parallel rank's columns), elements offset + elements[i].
struct HostGradient {
  std::size_t tensor = 0;
  std::size_t offset = 0;
  std::vector<float> values;
  std::vector<std::size_t> elements;
};

enum class OptimizerKind { Adam, Sgd };

/// What the OPTIMIZER op does: Adam on the fp32 weights, as users train (its two moments are state the
/// backend keeps per parameter, counted in its static memory), or plain SGD. No weight decay.
struct OptimizerSettings {
  OptimizerKind kind = OptimizerKind::Adam;
  float learning_rate = 1e-3f;
  float beta1 = 0.9f, beta2 = 0.999f, epsilon = 1e-8f;  ///< Adam's (PyTorch's defaults)
};

/// Under ZeRO (stage 1 or 2: Megatron's distributed optimizer), which part of each tensor one
/// data-parallel rank updates: rank `index` of `count` owns elements [index·p, min(c, (index + 1)·p))
/// of a tensor of c, where p = ⌈c / count⌉ (the collectives pad every tensor to count·p). One rank
/// of one owns every element.
struct OwnedPart {
  int index = 0, count = 1;
  std::size_t block(std::size_t c) const { return (c + std::size_t(count) - 1) / std::size_t(count); }
  std::size_t begin(std::size_t c) const { return std::min(c, std::size_t(index) * block(c)); }
  std::size_t end(std::size_t c) const { return std::min(c, std::size_t(index + 1) * block(c)); }
};

/// What the S pass leaves for the barrier and the T pass.
struct OutputShard {
  Tensor logits;  ///< n × shard rows
  Tensor local;   ///< fp32, 3n: local max | local sum-exp | target logit
  Tensor terms;   ///< Algorithm 2: A | Y (2 · n × h); empty otherwise
};

/// The device's own timeline, for the op times a trace and a profile report: the span of the work an
/// op issued rather than of the host thread that issued it, which adds launch overhead and the wait
/// for the device. Bound to the thread that made it (its stream); marks stay valid for its lifetime.
class DeviceClock {
 public:
  using Mark = std::size_t;
  virtual ~DeviceClock() = default;
  /// Marks the point the calling thread's work has reached.
  virtual Mark mark() = 0;
  /// Device time between two marks, once the device has passed both (after Backend::synchronize()).
  virtual TimeNs elapsed(Mark from, Mark to) = 0;
};

class Backend : public Allocator {
 public:
  virtual std::string_view name() const = 0;
  /// A clock for the calling thread's work where the device keeps its own (CUDA events); null where
  /// an op's work is done when its call returns (CPU), so host time is the device's.
  virtual std::unique_ptr<DeviceClock> device_clock() { return nullptr; }

  // ---- memory ----
  /// `count` zeros of `dtype`.
  virtual Tensor allocate(std::size_t count, DType dtype) = 0;
  /// The dtype of the activations and gradients that stages pass on.
  virtual DType activation_dtype() const = 0;
  /// dst[dst_at .. dst_at + count) = src[src_at .. src_at + count); same dtype.
  virtual void copy(const Tensor& src, std::size_t src_at, Tensor& dst, std::size_t dst_at, std::size_t count) = 0;
  /// Returns once every op issued so far has completed: the executor's time stamps then bound it.
  virtual void synchronize() = 0;
  /// The calling thread is done with this backend (it is about to end): per-thread state can go.
  virtual void release_thread() {}
  /// Runs, once before the first step and before any communication is posted, what loads the
  /// libraries and kernels a step uses (CUDA: the cuBLASLt handle, every GEMM and attention shape of
  /// a layer), leaving the model as it was. Nothing by default (the CPU's kernels are loaded).
  virtual void warm_up() {}
  /// This step's tokens and targets, by microbatch.
  virtual void set_batches(std::span<const Batch> batches) = 0;

  // ---- transformer layers (the executor runs a stage's layers in order) ----
  /// Elements of an activation passed between layers and stages: n × h, or under sequence
  /// parallelism this rank's rows of it (the executor splits and gathers the rows between the
  /// embedding, the layers and the head, on allocate, copy and the tensor-parallel group).
  virtual std::size_t layer_activation_count() const = 0;
  /// The embedding rows this rank holds for microbatch `mb`'s tokens (the whole table on the first
  /// stage in baseline, the rank's shard in the vocabulary-parallel modes: IF); other rows are 0.
  virtual Tensor embed(int mb) = 0;
  /// Adds dy's rows into the gradient of the embedding rows this rank holds (baseline B, IB).
  virtual void embed_backward(int mb, const Tensor& dy) = 0;
  /// Runs transformer layer `layer` (the model's index) on x, which becomes its output.
  virtual std::unique_ptr<Activations> layer_forward(int layer, Tensor& x) = 0;
  /// dy (the layer output's gradient) becomes the layer input's gradient; adds weight gradients,
  /// except the linear maps' when `defer_weights` (the schedule's W does those).
  virtual void layer_backward(int layer, Activations& cache, Tensor& dy, bool defer_weights) = 0;
  /// The linear maps' weight gradients that layer_backward deferred.
  virtual void layer_weight(int layer, Activations& cache) = 0;
  /// Last stage: the final norm of x; what it returns is the cache of the head calls below.
  virtual std::unique_ptr<Activations> final_norm(Tensor x) = 0;
  /// A copy of the final norm's output: the X that the vocabulary passes read.
  virtual Tensor final_output(const Activations& head) = 0;
  /// The gradient of the last layer's output from that of the final norm's.
  virtual Tensor final_norm_backward(Activations& head, const Tensor& dnormed) = 0;
  /// Baseline: the LM head over the whole vocabulary and the loss of microbatch `mb`, both scaled by
  /// `scale`; returns the mean token loss × scale and keeps the logits' gradient in `head`.
  virtual double head_forward(Activations& head, int mb, float scale) = 0;
  /// Baseline: adds the LM head's weight gradient; returns the gradient of the final norm's output.
  virtual Tensor head_backward(Activations& head) = 0;

  // ---- vocabulary passes (docs/runtime.md, "The vocabulary passes"), on this rank's shard ----
  /// S: logits and local statistics of microbatch `mb` from X; Algorithm 2 also A and Y.
  virtual OutputShard output_forward(int mb, const Tensor& x, bool algorithm2) = 0;
  /// Barrier C0 after its max round: [s_i·exp(m_i − M) | z_i], what its sum round adds up.
  virtual Tensor softmax_sums(const Tensor& local, const Tensor& global_max) = 0;
  /// Σ over tokens of M + log S − z: the loss of a microbatch, summed.
  virtual double loss_sum(const Tensor& global_max, const Tensor& sums) = 0;
  /// Algorithm 2: this shard's term of dX, for the barrier's last round; `g` is dloss/dtoken.
  virtual Tensor input_grad_share(const Tensor& local, const Tensor& global_max, const Tensor& sums,
                                  const Tensor& terms, float g) = 0;
  /// T: adds this shard's dW; with `input_grad` (Algorithm 1) returns its dX_i, else an empty tensor.
  /// `stats` is [M | S], fp32.
  virtual Tensor output_backward(int mb, const Tensor& logits, const Tensor& stats, const Tensor& x, float g,
                                 bool input_grad) = 0;

  // ---- per iteration ----
  /// This rank's weights (or, with `gradients`, their gradients), tensor by tensor in a fixed order:
  /// views of what the backend keeps, which the data-parallel collectives reduce or gather in place.
  virtual std::vector<Buffer> parameter_buffers(bool gradients) = 0;
  /// Update `step` (1 on the first) of every weight this rank owns (under ZeRO, its part of each
  /// tensor), then zeroes the gradients.
  virtual void optimizer_step(const OptimizerSettings& settings, int step) = 0;
  /// The weights were written through parameter_buffers (a data-parallel gather of the replicas'
  /// updated parts): whatever the backend derives from them, such as the CUDA backend's bf16 GEMM
  /// copies, is made again. Nothing to do for a backend that computes on the weights themselves.
  virtual void weights_written() {}
  /// The gradients this rank holds (under ZeRO, of the part it owns), on the host (for the gradient check).
  virtual std::vector<HostGradient> gradients() = 0;
  /// Bytes of this rank's weights, gradients and optimizer state.
  virtual Bytes static_bytes() const = 0;
};

}  // namespace pipesim::runtime
