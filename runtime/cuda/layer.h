#pragma once
/// One transformer layer's passes on the CUDA backend: F, B (with or without the weight gradients)
/// and W, on LayerOps' building blocks. The math and tensor layouts are cpu::layer_forward's and
/// cpu::layer_backward's step for step, so that an fp32 run reproduces the CPU's numbers.
#include <cstddef>

#include "backend.h"
#include "cuda/device_model.h"
#include "cuda/layer_ops.h"
#include "cuda/op_context.h"

namespace pipesim::runtime::cuda {

/// What a layer keeps from F to B (and W): the inputs of every kernel's backward, and for a W split
/// off B the output gradients of the four linear maps. As in cpu::LayerCache, for Llama ln1/ln2 are
/// RMSNorm outputs (mean1/mean2 stay empty), qkv is after the rotary embedding, fc1 is the fused
/// [gate | up] and gelu holds silu(gate)·up.
struct CudaLayerActivations final : Activations {
  Tensor input, ln1, mean1, rstd1, qkv, attention, lse, middle, ln2, mean2, rstd2, fc1, gelu;
  struct Deferred {
    Tensor fc2_dy, fc1_dy, proj_dy, qkv_dy;
  } deferred;

  Bytes bytes() const override {
    std::size_t total = 0;
    for (const Tensor* t : {&input, &ln1, &mean1, &rstd1, &qkv, &attention, &lse, &middle, &ln2, &mean2, &rstd2, &fc1,
                            &gelu, &deferred.fc2_dy, &deferred.fc1_dy, &deferred.proj_dy, &deferred.qkv_dy})
      total += t->bytes();
    return Bytes(total);
  }
};

class LayerPasses {
 public:
  /// `op` and `ops` outlive this.
  LayerPasses(const OpContext& op, LayerOps& ops) : op_(op), ops_(ops) {}

  /// F: x (the layer's input, which `c` keeps) becomes its output. Under tensor parallelism the QKV
  /// map and fc1 are split by output columns (this rank's heads and FFN slice; their biases too),
  /// proj and fc2 by input rows (row_split sums them over the group).
  void forward(DeviceLayer& w, Tensor& x, CudaLayerActivations& c);
  /// B: dy (the output's gradient) becomes the input's. With `defer` (a W pass split off), the four
  /// output gradients move into c.deferred instead of feeding weight GEMMs now; only proj's, which
  /// the first residual's gradient goes on adding to, is copied. Under tensor parallelism the
  /// column-split maps' input gradients (dln2, dln1) are this rank's partial sums, summed over the
  /// group before the norms' backward (this rank's rows of the sums under sequence parallelism,
  /// where dy and dx are its rows too).
  void backward(DeviceLayer& w, CudaLayerActivations& c, Tensor& dy, bool defer);
  /// W: the four linear maps' weight gradients from what a deferring backward kept.
  void weight(DeviceLayer& w, const CudaLayerActivations& c);

 private:
  /// The MLP activation's input gradient dfc1 (n × fc1 width) from fc2's output gradient dy: GELU's
  /// backward, fused into fc2's input-gradient GEMM where cuBLASLt can, or SwiGLU's.
  Tensor activation_backward(DeviceLayer& w, const CudaLayerActivations& c, const Tensor& dy);

  const OpContext& op_;
  LayerOps& ops_;
};

}  // namespace pipesim::runtime::cuda
