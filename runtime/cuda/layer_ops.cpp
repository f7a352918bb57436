#include "cuda/layer_ops.h"

#include <utility>

#include "cuda/attention_cudnn.h"
#include "cuda/attention_gemm.h"
#include "cuda/gemm.h"
#include "cuda/kernels.h"
#include "cuda/llama_kernels.h"

namespace pipesim::runtime::cuda {

void LayerOps::norm_forward(const DeviceParam& gain, const DeviceParam& bias, const Tensor& x, Tensor& y, Tensor& mean,
                            Tensor& rstd, int rows) {
  y = op_.uninitialized(std::size_t(rows) * std::size_t(op_.h), op_.dtype);
  rstd = op_.uninitialized(std::size_t(rows), DType::F32);
  switch (shape_.family) {
    case LayerFamily::Gpt:
      mean = op_.uninitialized(std::size_t(rows), DType::F32);
      return layernorm_forward({.x = x.data(), .gamma = gain.weight.get(), .beta = bias.weight.get(), .y = y.data(),
                                .mean = f32(mean), .rstd = f32(rstd)},
                               {.n = rows, .h = op_.h}, op_.dtype, op_.stream());
    case LayerFamily::Llama:
      return rmsnorm_forward({.x = x.data(), .gain = gain.weight.get(), .y = y.data(), .rstd = f32(rstd)},
                             {.n = rows, .h = op_.h}, op_.dtype, op_.stream());
  }
}

void LayerOps::add_norm_forward(const DeviceParam& gain, const DeviceParam& bias, Tensor& x, const Tensor& residual,
                                Tensor& y, Tensor& mean, Tensor& rstd, int rows) {
  y = op_.uninitialized(std::size_t(rows) * std::size_t(op_.h), op_.dtype);
  rstd = op_.uninitialized(std::size_t(rows), DType::F32);
  switch (shape_.family) {
    case LayerFamily::Gpt:
      mean = op_.uninitialized(std::size_t(rows), DType::F32);
      return add_layernorm_forward({.x = x.data(), .residual = residual.data(), .sum = x.data(),
                                    .gamma = gain.weight.get(), .beta = bias.weight.get(), .y = y.data(),
                                    .mean = f32(mean), .rstd = f32(rstd)},
                                   {.n = rows, .h = op_.h}, op_.dtype, op_.stream());
    case LayerFamily::Llama:
      return add_rmsnorm_forward({.x = x.data(), .residual = residual.data(), .sum = x.data(),
                                  .gain = gain.weight.get(), .y = y.data(), .rstd = f32(rstd)},
                                 {.n = rows, .h = op_.h}, op_.dtype, op_.stream());
  }
}

void LayerOps::norm_backward(DeviceParam& gain, DeviceParam& bias, const Tensor& x, const Tensor& mean,
                             const Tensor& rstd, const Tensor& dy, Tensor& dx, int rows) {
  switch (shape_.family) {
    case LayerFamily::Gpt:
      return layernorm_backward({.x = x.data(), .gamma = gain.weight.get(), .mean = f32(mean), .rstd = f32(rstd),
                                 .dy = dy.data(), .dx = dx.data(), .dgamma = gain.grad.get(),
                                 .dbeta = bias.grad.get()},
                                {.n = rows, .h = op_.h}, op_.dtype, op_.stream());
    case LayerFamily::Llama:
      return rmsnorm_backward({.x = x.data(), .gain = gain.weight.get(), .rstd = f32(rstd), .dy = dy.data(),
                               .dx = dx.data(), .dgain = gain.grad.get()},
                              {.n = rows, .h = op_.h}, op_.dtype, op_.stream());
  }
}

void LayerOps::rotate_qk(Tensor& qkv, bool backward) {
  if (!llama()) return;
  const auto rope = backward ? rope_backward : rope_forward;
  rope(qkv.data(),
       {.n = op_.n, .seq = shape_.seq, .width = part_.qkv, .heads = part_.heads + part_.kv_heads,
        .d = shape_.head_width(), .theta = shape_.rope_theta},
       op_.dtype, op_.stream());
}

Tensor LayerOps::gathered(const Tensor& part) {
  Tensor whole = op_.uninitialized(op_.activation_size(), part.dtype());
  op_.synchronize();
  tp_->all_gather(part.view(), whole.view());
  return whole;
}

Tensor LayerOps::summed(Tensor partial) {
  if (!tp_) return partial;
  if (!sequence_parallel()) {
    op_.synchronize();
    tp_->all_reduce(partial.view());
    return partial;
  }
  Tensor mine = op_.uninitialized(layer_activation_count(), partial.dtype());
  op_.synchronize();
  tp_->reduce_scatter(partial.view(), mine.view());
  return mine;
}

Tensor LayerOps::row_split(const Tensor& x, const DeviceParam& w, const DeviceParam& b, int in, int out,
                           const Tensor& residual) {
  bool residual_added = false;
  Tensor y = row_split_product(x, w, b, in, out, residual, residual_added);
  if (!residual_added) add(y.data(), residual.data(), y.data(), y.count(), op_.dtype, op_.stream());
  return y;
}

Tensor LayerOps::row_split_norm(const Tensor& x, const DeviceParam& w, const DeviceParam& b, int in, int out,
                                const Tensor& residual, const DeviceParam& gain, const DeviceParam& norm_bias,
                                Tensor& y, Tensor& mean, Tensor& rstd) {
  bool residual_added = false;
  Tensor sum = row_split_product(x, w, b, in, out, residual, residual_added);
  if (residual_added)
    norm_forward(gain, norm_bias, sum, y, mean, rstd, rows());
  else
    add_norm_forward(gain, norm_bias, sum, residual, y, mean, rstd, rows());
  return sum;
}

Tensor LayerOps::row_split_product(const Tensor& x, const DeviceParam& w, const DeviceParam& b, int in, int out,
                                   const Tensor& residual, bool& residual_added) {
  if (!tp_) return linear_product(x, w, b, in, out, &residual, residual_added);
  residual_added = false;  // the residual is this rank's rows of the sum: added after it
  Tensor partial = op_.uninitialized(std::size_t(op_.n) * std::size_t(out), op_.dtype);
  matmul(op_.gemm(), {.a = x.data(), .b = w.compute(op_.dtype), .c = partial.data()}, {.n = op_.n, .k = in, .m = out},
         {op_.dtype, op_.dtype}, false, op_.stream());
  Tensor y = summed(std::move(partial));
  if (b.count() > 0) bias_add(y.data(), b.weight.get(), rows(), out, op_.dtype, op_.stream());
  return y;
}

Tensor LayerOps::linear(const Tensor& x, const DeviceParam& w, const DeviceParam& b, int in, int out) {
  bool residual_added = false;
  return linear_product(x, w, b, in, out, nullptr, residual_added);
}

Tensor LayerOps::linear_product(const Tensor& x, const DeviceParam& w, const DeviceParam& b, int in, int out,
                                const Tensor* residual, bool& residual_added) {
  Tensor y = op_.uninitialized(std::size_t(op_.n) * std::size_t(out), op_.dtype);
  const bool has_bias = b.count() > 0;
  const bool fused = has_bias && linear_bias(op_.gemm(),
                                             {.x = x.data(), .w = w.compute(op_.dtype), .bias = b.weight.get(),
                                              .residual = residual ? residual->data() : nullptr, .y = y.data()},
                                             {.n = op_.n, .in = in, .out = out}, op_.dtype, op_.stream());
  residual_added = fused && residual != nullptr;
  if (fused) return y;
  matmul(op_.gemm(), {.a = x.data(), .b = w.compute(op_.dtype), .c = y.data()}, {.n = op_.n, .k = in, .m = out},
         {op_.dtype, op_.dtype}, false, op_.stream());
  if (has_bias) bias_add(y.data(), b.weight.get(), op_.n, out, op_.dtype, op_.stream());
  return y;
}

void LayerOps::linear_weight_grad(const Tensor& x, const Tensor& dy, DeviceParam& w, DeviceParam& b, int in, int out) {
  if (b.count() == 0) {  // no bias (Llama): the weight gradient alone
    matmul_at(op_.gemm(), {.a = x.data(), .b = dy.data(), .c = w.grad.get()}, {.n = op_.n, .k = in, .m = out},
              {op_.dtype, DType::F32}, true, op_.stream());
    return;
  }
  Tensor db = op_.uninitialized(std::size_t(out), DType::F32);
  if (matmul_at_bgrad(op_.gemm(), {.x = x.data(), .dy = dy.data(), .dw = w.grad.get(), .dbias = f32(db)},
                      {.n = op_.n, .in = in, .out = out}, {op_.dtype, DType::F32}, true, op_.stream())) {
    add(b.grad.get(), db.data(), b.grad.get(), std::size_t(out), DType::F32, op_.stream());
    return;
  }
  matmul_at(op_.gemm(), {.a = x.data(), .b = dy.data(), .c = w.grad.get()}, {.n = op_.n, .k = in, .m = out},
            {op_.dtype, DType::F32}, true, op_.stream());
  bias_grad(dy.data(), b.grad.get(), op_.n, out, op_.dtype, op_.stream());
}

void LayerOps::linear_backward(const Tensor& x, DeviceParam& w, DeviceParam& b, const Tensor& dy, Tensor& dx, int in,
                               int out, bool defer) {
  if (!defer) linear_weight_grad(x, dy, w, b, in, out);
  matmul_bt(op_.gemm(), {.a = dy.data(), .b = w.compute(op_.dtype), .c = dx.data()}, {.n = op_.n, .k = out, .m = in},
            {op_.dtype, op_.dtype}, false, op_.stream());
}

void LayerOps::attention_forward_pass(const Tensor& qkv, Tensor& out, Tensor& lse) {
  const int heads = part_.heads, kv = part_.kv_heads;
  out = op_.scratch(std::size_t(op_.n) * std::size_t(part_.attention), op_.dtype);
  lse = op_.scratch(std::size_t(shape_.batch) * std::size_t(heads) * std::size_t(shape_.seq), DType::F32);
  const AttentionForwardTensors t{.qkv = qkv.data(), .out = out.data(), .lse = f32(lse)};
  const AttentionShape shape = attention_shape();
  if (op_.dtype == DType::BF16) {
    if (use_cudnn_attention() && attention_forward_cudnn(t, shape, op_.stream())) return;
    if (kv == heads) return attention_forward_gemm(op_.gemm(), t, shape, op_.stream());
  }
  attention_forward(t, shape, op_.dtype, op_.stream());
}

void LayerOps::attention_backward_pass(const Tensor& qkv, const Tensor& out, const Tensor& lse, const Tensor& dout,
                                       Tensor& dqkv) {
  const AttentionBackwardTensors t{
      .qkv = qkv.data(), .out = out.data(), .lse = f32(lse), .dout = dout.data(), .dqkv = dqkv.data()};
  const AttentionShape shape = attention_shape();
  if (op_.dtype == DType::BF16) {
    if (use_cudnn_attention() && attention_backward_cudnn(t, shape, op_.stream())) return;
    if (part_.kv_heads == part_.heads) return attention_backward_gemm(op_.gemm(), t, shape, op_.stream());
  }
  attention_backward(t, shape, op_.dtype, op_.stream());
}

}  // namespace pipesim::runtime::cuda
