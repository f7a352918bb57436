#include "cuda/layer.h"

#include <utility>

#include "cuda/check.h"
#include "cuda/gemm.h"
#include "cuda/kernels.h"
#include "cuda/llama_kernels.h"

namespace pipesim::runtime::cuda {

void LayerPasses::forward(DeviceLayer& w, Tensor& x, CudaLayerActivations& c) {
  const LayerPart& part = ops_.part();
  const int f = part.ffn, n = op_.n, h = op_.h;
  c.input = std::move(x);
  ops_.norm_forward(w.ln1_gain, w.ln1_bias, c.input, c.ln1, c.mean1, c.rstd1, ops_.rows());
  if (ops_.sequence_parallel()) c.ln1 = ops_.gathered(c.ln1);  // the column-split map reads every row
  c.qkv = ops_.linear(c.ln1, w.qkv_weight, w.qkv_bias, h, part.qkv);
  ops_.rotate_qk(c.qkv, false);  // the cache keeps the rotated q and k, which attention reads
  ops_.attention_forward_pass(c.qkv, c.attention, c.lse);
  // + residual (in proj's GEMM epilogue, else in the norm's kernel), then the second norm
  c.middle = ops_.row_split_norm(c.attention, w.proj_weight, w.proj_bias, part.attention, h, c.input, w.ln2_gain,
                                 w.ln2_bias, c.ln2, c.mean2, c.rstd2);
  if (ops_.sequence_parallel()) c.ln2 = ops_.gathered(c.ln2);
  // fc1 keeps its pre-activation (c.fc1) for the activation's backward.
  const std::size_t nf = std::size_t(n) * std::size_t(f);
  c.gelu = op_.uninitialized(nf, op_.dtype);
  if (ops_.llama()) {
    c.fc1 = ops_.linear(c.ln2, w.fc1_weight, w.fc1_bias, h, part.fc1);  // [gate | up], n × 2f
    swiglu_forward(c.fc1.data(), c.gelu.data(), n, f, op_.dtype, op_.stream());
  } else {
    c.fc1 = op_.uninitialized(nf, op_.dtype);
    if (!ops_.fused_gelu() || !linear_bias_gelu(op_.gemm(),
                                                {.x = c.ln2.data(), .w = w.fc1_weight.compute(op_.dtype),
                                                 .bias = w.fc1_bias.weight.get(), .pre = c.fc1.data(),
                                                 .y = c.gelu.data()},
                                                {.n = n, .in = h, .out = f}, op_.dtype, op_.stream())) {
      matmul(op_.gemm(), {.a = c.ln2.data(), .b = w.fc1_weight.compute(op_.dtype), .c = c.fc1.data()},
             {.n = n, .k = h, .m = f}, {op_.dtype, op_.dtype}, false, op_.stream());
      bias_add(c.fc1.data(), w.fc1_bias.weight.get(), n, f, op_.dtype, op_.stream());
      gelu_forward(c.fc1.data(), c.gelu.data(), nf, op_.dtype, op_.stream());
    }
  }
  x = ops_.row_split(c.gelu, w.fc2_weight, w.fc2_bias, f, h, c.middle);  // with the residual
}

Tensor LayerPasses::activation_backward(DeviceLayer& w, const CudaLayerActivations& c, const Tensor& dy) {
  const int f = ops_.part().ffn, n = op_.n, h = op_.h;
  const std::size_t nf = std::size_t(n) * std::size_t(f);
  Tensor dfc1 = op_.uninitialized(std::size_t(n) * std::size_t(ops_.part().fc1), op_.dtype);
  if (ops_.fused_gelu() &&
      matmul_bt_dgelu(op_.gemm(),
                      {.dy = dy.data(), .w = w.fc2_weight.compute(op_.dtype), .pre = c.fc1.data(), .dx = dfc1.data()},
                      {.n = n, .in = f, .out = h}, op_.dtype, op_.stream()))
    return dfc1;
  Tensor dgelu = op_.uninitialized(nf, op_.dtype);
  matmul_bt(op_.gemm(), {.a = dy.data(), .b = w.fc2_weight.compute(op_.dtype), .c = dgelu.data()},
            {.n = n, .k = h, .m = f}, {op_.dtype, op_.dtype}, false, op_.stream());
  CUDA_CHECK(cudaMemsetAsync(dfc1.data(), 0, dfc1.bytes(), op_.stream()));  // both backwards add
  if (ops_.llama())
    swiglu_backward(c.fc1.data(), dgelu.data(), dfc1.data(), n, f, op_.dtype, op_.stream());
  else
    gelu_backward(c.fc1.data(), dgelu.data(), dfc1.data(), nf, op_.dtype, op_.stream());
  return dfc1;
}

void LayerPasses::backward(DeviceLayer& w, CudaLayerActivations& c, Tensor& dy, bool defer) {
  const LayerPart& part = ops_.part();
  const int f = part.ffn, n = op_.n, h = op_.h;
  CudaLayerActivations::Deferred* keep = defer ? &c.deferred : nullptr;
  Tensor dmiddle = op_.uninitialized(ops_.layer_activation_count(), op_.dtype);  // through the second residual
  op_.copy(dy, 0, dmiddle, 0, dy.count());
  // A row-split map reads the whole output gradient: under sequence parallelism every rank's rows.
  if (ops_.sequence_parallel()) dy = ops_.gathered(dy);
  if (!defer) ops_.linear_weight_grad(c.gelu, dy, w.fc2_weight, w.fc2_bias, f, h);
  Tensor dfc1 = activation_backward(w, c, dy);
  if (defer) keep->fc2_dy = std::move(dy);
  Tensor dln2 = op_.uninitialized(op_.activation_size(), op_.dtype);
  ops_.linear_backward(c.ln2, w.fc1_weight, w.fc1_bias, dfc1, dln2, h, part.fc1, defer);
  if (defer) keep->fc1_dy = std::move(dfc1);
  dln2 = ops_.summed(std::move(dln2));  // each rank's FFN slice contributes
  ops_.norm_backward(w.ln2_gain, w.ln2_bias, c.middle, c.mean2, c.rstd2, dln2, dmiddle, ops_.rows());
  Tensor dmiddle_gathered = ops_.sequence_parallel() ? ops_.gathered(dmiddle) : Tensor();
  const Tensor& dmiddle_whole = ops_.sequence_parallel() ? dmiddle_gathered : dmiddle;
  Tensor dattention = op_.uninitialized(std::size_t(n) * std::size_t(part.attention), op_.dtype);
  Tensor dqkv = op_.scratch(std::size_t(n) * std::size_t(part.qkv), op_.dtype);
  ops_.linear_backward(c.attention, w.proj_weight, w.proj_bias, dmiddle_whole, dattention, part.attention, h, defer);
  if (defer && ops_.sequence_parallel()) {
    keep->proj_dy = std::move(dmiddle_gathered);  // read for the last time above
  } else if (defer) {
    keep->proj_dy = op_.uninitialized(dmiddle.count(), op_.dtype);
    op_.copy(dmiddle, 0, keep->proj_dy, 0, dmiddle.count());
  }
  ops_.attention_backward_pass(c.qkv, c.attention, c.lse, dattention, dqkv);
  ops_.rotate_qk(dqkv, true);  // back to the projection's output: what qkv's weight gradient reads
  Tensor dln1 = op_.uninitialized(op_.activation_size(), op_.dtype);
  ops_.linear_backward(c.ln1, w.qkv_weight, w.qkv_bias, dqkv, dln1, h, part.qkv, defer);
  if (defer) keep->qkv_dy = std::move(dqkv);
  dln1 = ops_.summed(std::move(dln1));  // likewise each rank's heads
  // dx: through the first residual, plus the first norm's backward.
  ops_.norm_backward(w.ln1_gain, w.ln1_bias, c.input, c.mean1, c.rstd1, dln1, dmiddle, ops_.rows());
  dy = std::move(dmiddle);
}

void LayerPasses::weight(DeviceLayer& w, const CudaLayerActivations& c) {
  const LayerPart& part = ops_.part();
  const int h = op_.h;
  const CudaLayerActivations::Deferred& d = c.deferred;
  ops_.linear_weight_grad(c.gelu, d.fc2_dy, w.fc2_weight, w.fc2_bias, part.ffn, h);
  ops_.linear_weight_grad(c.ln2, d.fc1_dy, w.fc1_weight, w.fc1_bias, h, part.fc1);
  ops_.linear_weight_grad(c.attention, d.proj_dy, w.proj_weight, w.proj_bias, part.attention, h);
  ops_.linear_weight_grad(c.ln1, d.qkv_dy, w.qkv_weight, w.qkv_bias, h, part.qkv);
}

}  // namespace pipesim::runtime::cuda
