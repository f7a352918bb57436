#pragma once
/// The operations a transformer layer is made of on the CUDA backend, on this rank's part of the
/// layer: the family's norms, the rotary embedding, the linear maps (the row-split ones with their
/// tensor-parallel sum), causal attention, and the collectives of tensor and sequence parallelism.
/// Each is cpu/model.cpp's step of the same role, on cuBLASLt GEMMs and the kernels of cuda/kernels.h
/// and cuda/llama_kernels.h, so that an fp32 run reproduces the CPU's numbers. layer.h composes them
/// into a layer's passes; vocab_passes.h uses the norms for the final one.
#include <cstddef>

#include "cuda/device_model.h"
#include "cuda/kernels.h"
#include "cuda/op_context.h"
#include "model_shape.h"
#include "tensor_parallel.h"

namespace pipesim::runtime::cuda {

class LayerOps {
 public:
  /// `op`, `shape` and the group `tp` (null when the layers are whole) outlive this.
  LayerOps(const OpContext& op, const ModelShape& shape, LayerPart part, TensorParallel* tp)
      : op_(op), shape_(shape), part_(part), tp_(tp) {}

  /// The widths of this rank's part of every layer.
  const LayerPart& part() const { return part_; }
  bool llama() const { return shape_.family == LayerFamily::Llama; }
  /// cuBLASLt's GELU epilogues evaluate the tanh approximation their own way; fp32 runs, which the
  /// check compares with the CPU, keep GELU in the kernels that share the CPU's formula. Llama's
  /// SwiGLU has no epilogue.
  bool fused_gelu() const { return op_.dtype == DType::BF16 && !llama(); }
  bool sequence_parallel() const { return tp_ && tp_->sequence_parallel(); }
  /// Rows of a layer's input and output on this rank (cpu::layer_rows): n, or n / tp under sequence
  /// parallelism.
  int rows() const { return sequence_parallel() ? op_.n / tp_->size() : op_.n; }
  /// Elements of a layer's input and output on this rank: rows() × h.
  std::size_t layer_activation_count() const { return std::size_t(rows()) * std::size_t(op_.h); }

  /// The family's norm over `rows` rows of x (cpu::norm_forward): LayerNorm, keeping mean and rstd,
  /// for GPT; RMSNorm, gain only and keeping rstd (mean stays empty), for Llama. A layer's norms run
  /// on its rows() rows, the final norm on all n.
  void norm_forward(const DeviceParam& gain, const DeviceParam& bias, const Tensor& x, Tensor& y, Tensor& mean,
                    Tensor& rstd, int rows);
  /// x += residual and norm_forward of the sum, in one kernel (add_layernorm_forward,
  /// add_rmsnorm_forward): the same numbers as add() then norm_forward, so norm_backward on x is
  /// the backward.
  void add_norm_forward(const DeviceParam& gain, const DeviceParam& bias, Tensor& x, const Tensor& residual, Tensor& y,
                        Tensor& mean, Tensor& rstd, int rows);
  /// dx += the norm's input gradient; the gain's (and LayerNorm's bias') gradients accumulate: under
  /// sequence parallelism partial sums over this rank's rows, until the backend's
  /// sum_partial_gradients.
  void norm_backward(DeviceParam& gain, DeviceParam& bias, const Tensor& x, const Tensor& mean, const Tensor& rstd,
                     const Tensor& dy, Tensor& dx, int rows);
  /// Llama's rotary embedding of the q and k heads of this rank's fused QKV (n × part qkv: its query
  /// heads, then its key and value heads), in place, as cpu::rotate_qk: forward on the projection's
  /// output, backward on its gradient. GPT has none.
  void rotate_qk(Tensor& qkv, bool backward);

  // The tensor-parallel collectives. Each first lets this stream's work finish (the communicator
  // reads and writes from its own stream, NCCL's, or thread) and returns with its result in place,
  // so what this stream launches next reads it.

  /// Every rank's rows (n × h) of a tensor this rank holds rows() rows of (sequence parallelism).
  Tensor gathered(const Tensor& part);
  /// The sum over the group of `partial` (n × h, each rank's partial sum): this rank's rows of it
  /// under sequence parallelism, else all of it, in place; `partial` itself without tensor
  /// parallelism.
  Tensor summed(Tensor partial);

  /// A row-split map (proj, fc2): x (n × in, this rank's part) times its rows of W, summed over the
  /// group (this rank's rows of the sum under sequence parallelism), then the bias (whole on every
  /// rank) and the residual (rows() rows), as cpu::finish_row_split adds them; without tensor
  /// parallelism one GEMM with the bias and the residual in its epilogue where cuBLASLt has one.
  Tensor row_split(const Tensor& x, const DeviceParam& w, const DeviceParam& b, int in, int out,
                   const Tensor& residual);
  /// row_split, then the family's norm of its output into y, mean and rstd, for the norm that follows
  /// a residual connection inside a layer. Where the GEMM's epilogue does not take the residual
  /// (Llama's maps have no bias; tensor parallelism sums over the group first), the residual add
  /// runs in the norm's kernel (add_norm_forward) instead of a pass of its own.
  Tensor row_split_norm(const Tensor& x, const DeviceParam& w, const DeviceParam& b, int in, int out,
                        const Tensor& residual, const DeviceParam& gain, const DeviceParam& norm_bias, Tensor& y,
                        Tensor& mean, Tensor& rstd);
  /// y = x·W + b, keeping x (the layer's cache holds it) and returning y: one GEMM with the bias in
  /// its epilogue where cuBLASLt has one, else the GEMM and a kernel. An empty b (Llama's layers
  /// have no biases) adds nothing.
  Tensor linear(const Tensor& x, const DeviceParam& w, const DeviceParam& b, int in, int out);
  /// dW += xᵀ·dy and db += Σ dy, accumulated in fp32. The GEMM's BGRADA epilogue sums dy while it
  /// reads it (a deterministic reduction, as every cuBLAS result is run to run on one GPU), into a
  /// vector that is then added: cuBLASLt overwrites a bias gradient, and gradients accumulate over
  /// microbatches.
  void linear_weight_grad(const Tensor& x, const Tensor& dy, DeviceParam& w, DeviceParam& b, int in, int out);
  /// dx = dy·Wᵀ (dx is overwritten) and the weight gradients now, unless a W pass will compute them
  /// from the kept dy.
  void linear_backward(const Tensor& x, DeviceParam& w, DeviceParam& b, const Tensor& dy, Tensor& dx, int in, int out,
                       bool defer);

  /// Causal attention of this rank's heads: `out` (n × part attention, made here) from the fused
  /// `qkv`, its query heads over its key/value heads, keeping the logsumexp in `lse` (made here).
  /// bf16 runs use the tensor cores: cuDNN, else cuBLASLt (multi-head attention only), else the
  /// flash kernels, which also stay the fp32 (checked) path. All three keep the same logsumexp, so
  /// any forward pairs with any backward.
  void attention_forward_pass(const Tensor& qkv, Tensor& out, Tensor& lse);
  /// dqkv (fresh zeros, n × part qkv) = the gradient of attention_forward_pass from the output's
  /// gradient `dout`: cuDNN writes it, the others add to it, the same on zeros.
  void attention_backward_pass(const Tensor& qkv, const Tensor& out, const Tensor& lse, const Tensor& dout,
                               Tensor& dqkv);

 private:
  /// row_split's product and bias, with the residual where one GEMM epilogue adds bias and residual
  /// together (no tensor parallelism, a bias, cuBLASLt willing): `residual_added` says whether.
  Tensor row_split_product(const Tensor& x, const DeviceParam& w, const DeviceParam& b, int in, int out,
                           const Tensor& residual, bool& residual_added);
  /// linear() with, where given, the residual in the bias epilogue; `residual_added` as above.
  Tensor linear_product(const Tensor& x, const DeviceParam& w, const DeviceParam& b, int in, int out,
                        const Tensor* residual, bool& residual_added);

  /// This rank's attention: its query heads (of the model's head width: the config has heads divide
  /// hidden and tp divide heads, so part attention / part heads is hidden / heads) over its key/value
  /// heads, for every path's launcher.
  AttentionShape attention_shape() const {
    return {.batch = shape_.batch, .seq = shape_.seq, .h = part_.attention, .heads = part_.heads,
            .kv_heads = part_.kv_heads};
  }

  const OpContext& op_;
  const ModelShape& shape_;
  LayerPart part_;
  TensorParallel* tp_;  ///< this rank's tensor-parallel group; null when its layers are whole
};

}  // namespace pipesim::runtime::cuda
