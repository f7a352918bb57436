#pragma once
/// The vocabulary's ends of the model on the CUDA backend: the embedding (baseline F and B, the
/// vocabulary-parallel modes' IF and IB), the final norm and the baseline LM head over the whole
/// vocabulary, and the vocabulary-parallel output layer on this rank's shard (docs/runtime.md, "The
/// vocabulary passes": the S pass, the barrier's local terms, the T pass), on cuda/vocab.h's
/// launchers. Microbatches are the backend's: each pass takes the device pointer of its tokens or
/// targets.
#include <memory>

#include "backend.h"
#include "cuda/device_model.h"
#include "cuda/layer_ops.h"
#include "cuda/op_context.h"
#include "cuda/shapes.h"
#include "model_shape.h"

namespace pipesim::runtime::cuda {

/// The final norm's input and output (mean empty for RMSNorm), and the baseline LM head's logit
/// gradients (last stage).
struct CudaHeadActivations final : Activations {
  Tensor input, mean, rstd, normed, dlogits;
  Bytes bytes() const override {
    return Bytes(input.bytes() + mean.bytes() + rstd.bytes() + normed.bytes() + dlogits.bytes());
  }
};

class VocabPasses {
 public:
  /// The embedding and head of `model`, this rank's rows `shard` of the vocabulary; the final norm
  /// through `norms`. All of them outlive this.
  VocabPasses(const OpContext& op, const ModelShape& shape, DeviceModel& model, const VocabShard& shard,
              LayerOps& norms)
      : op_(op), shape_(shape), model_(model), shard_(shard), norms_(norms) {}

  /// The embedding rows this rank holds for `tokens` (n ids on the device); other rows are 0.
  Tensor embed(const int* tokens);
  /// Adds dy's rows into the gradient of the embedding rows this rank holds.
  void embed_backward(const int* tokens, const Tensor& dy);

  /// The final norm of x over all n rows; the cache keeps x and the output.
  std::unique_ptr<Activations> final_norm(Tensor x);
  /// A copy of the final norm's output.
  Tensor final_output(const CudaHeadActivations& cache);
  /// The final norm's input gradient from its output's.
  Tensor final_norm_backward(CudaHeadActivations& cache, const Tensor& dnormed);
  /// Baseline: logits over the whole vocabulary, the mean cross-entropy over `targets` and the
  /// logits' gradient (kept in the cache), both scaled by `scale`; returns the loss × scale.
  double head_forward(CudaHeadActivations& cache, const int* targets, float scale);
  /// Baseline: adds the LM head's weight gradient; returns the final norm output's gradient.
  Tensor head_backward(CudaHeadActivations& cache);

  /// S: this shard's logits and local statistics [max | sum-exp | target logit] from X; with
  /// `algorithm2` also A and Y.
  OutputShard output_forward(const int* targets, const Tensor& x, bool algorithm2);
  /// After the barrier's max round: [s_i·exp(m_i − M) | z_i], what its sum round adds up.
  Tensor softmax_sums(const Tensor& local, const Tensor& global_max);
  /// Σ over tokens of M + log S − z.
  double loss_sum(const Tensor& global_max, const Tensor& sums);
  /// Algorithm 2: this shard's term of dX.
  Tensor input_grad_share(const Tensor& local, const Tensor& global_max, const Tensor& sums, const Tensor& terms,
                          float g);
  /// T: adds this shard's dW; with `input_grad` returns its dX_i, else an empty tensor.
  Tensor output_backward(const int* targets, const Tensor& logits, const Tensor& stats, const Tensor& x, float g,
                         bool input_grad);

 private:
  const OpContext& op_;
  const ModelShape& shape_;
  DeviceModel& model_;
  const VocabShard& shard_;  ///< this rank's rows of the vocabulary (RankModel::shard)
  LayerOps& norms_;
};

}  // namespace pipesim::runtime::cuda
