#include "cuda/vocab_passes.h"

#include <utility>

#include "cuda/check.h"
#include "cuda/gemm.h"
#include "cuda/kernels.h"
#include "cuda/reduce.h"
#include "cuda/vocab.h"

namespace pipesim::runtime::cuda {

Tensor VocabPasses::embed(const int* tokens) {
  Tensor x = op_.activation();
  embedding_forward({.table = model_.embedding.weight.get(), .tokens = tokens, .out = x.data()},
                    {.n = op_.n, .h = op_.h}, shard_, op_.dtype, op_.stream());
  return x;
}

void VocabPasses::embed_backward(const int* tokens, const Tensor& dy) {
  embedding_backward({.tokens = tokens, .dout = dy.data(), .dtable = model_.embedding.grad.get()},
                     {.n = op_.n, .h = op_.h}, shard_, op_.dtype, op_.stream());
}

std::unique_ptr<Activations> VocabPasses::final_norm(Tensor x) {
  auto cache = std::make_unique<CudaHeadActivations>();
  cache->input = std::move(x);
  norms_.norm_forward(model_.final_gain, model_.final_bias, cache->input, cache->normed, cache->mean, cache->rstd,
                      op_.n);
  return cache;
}

Tensor VocabPasses::final_output(const CudaHeadActivations& cache) {
  Tensor x = op_.uninitialized(op_.activation_size(), op_.dtype);
  op_.copy(cache.normed, 0, x, 0, cache.normed.count());
  return x;
}

Tensor VocabPasses::final_norm_backward(CudaHeadActivations& cache, const Tensor& dnormed) {
  Tensor dy = op_.activation();
  norms_.norm_backward(model_.final_gain, model_.final_bias, cache.input, cache.mean, cache.rstd, dnormed, dy, op_.n);
  return dy;
}

double VocabPasses::head_forward(CudaHeadActivations& cache, const int* targets, float scale) {
  const int vocab = shape_.vocab;
  Tensor logits = op_.uninitialized(std::size_t(op_.n) * std::size_t(vocab), DType::F32);
  matmul_bt(op_.gemm(), {.a = cache.normed.data(), .b = model_.head.compute(op_.dtype), .c = logits.data()},
            {.n = op_.n, .k = op_.h, .m = vocab}, {op_.dtype, DType::F32}, false, op_.stream());
  cache.dlogits = op_.uninitialized(logits.count(), op_.dtype);  // cross_entropy writes every element
  Tensor loss = op_.scratch(1, DType::F64);
  cross_entropy({.logits = f32(logits), .targets = targets, .dlogits = cache.dlogits.data(),
                 .loss = static_cast<double*>(loss.data())},
                op_.n, vocab, op_.dtype, op_.stream());
  cuda::scale(cache.dlogits.data(), scale, cache.dlogits.count(), op_.dtype, op_.stream());
  return op_.download_scalar(loss) * scale;
}

Tensor VocabPasses::head_backward(CudaHeadActivations& cache) {
  const int vocab = shape_.vocab;
  Tensor dnormed = op_.uninitialized(op_.activation_size(), op_.dtype);
  matmul_at(op_.gemm(), {.a = cache.dlogits.data(), .b = cache.normed.data(), .c = model_.head.grad.get()},
            {.n = op_.n, .k = vocab, .m = op_.h}, {op_.dtype, DType::F32}, true, op_.stream());
  matmul(op_.gemm(), {.a = cache.dlogits.data(), .b = model_.head.compute(op_.dtype), .c = dnormed.data()},
         {.n = op_.n, .k = vocab, .m = op_.h}, {op_.dtype, op_.dtype}, false, op_.stream());
  return dnormed;
}

OutputShard VocabPasses::output_forward(const int* targets, const Tensor& x, bool algorithm2) {
  const std::size_t n = std::size_t(op_.n);
  const VocabShard sh = shard_;
  OutputShard out{.logits = op_.scratch(n * std::size_t(sh.rows), DType::F32), .local = op_.scratch(3 * n, DType::F32),
                  .terms = {}};
  float* local = f32(out.local);
  output_logits(op_.gemm(),
                {.x = x.data(), .w = model_.head.compute(op_.dtype), .targets = targets, .logits = f32(out.logits),
                 .max = local, .sum_exp = local + n, .target_logit = local + 2 * n},
                sh, {.n = op_.n, .h = op_.h}, op_.dtype, op_.stream());
  if (algorithm2) {
    out.terms = op_.scratch(2 * op_.activation_size(), op_.dtype);
    output_input_grad_terms(op_.gemm(),
                            {.logits = f32(out.logits), .max = local, .sum_exp = local + n,
                             .w = model_.head.compute(op_.dtype), .targets = targets, .a = out.terms.data(),
                             .y = element(out.terms, op_.activation_size())},
                            sh, {.n = op_.n, .h = op_.h}, op_.dtype, op_.stream());
  }
  return out;
}

Tensor VocabPasses::softmax_sums(const Tensor& local, const Tensor& global_max) {
  const std::size_t n = std::size_t(op_.n);
  Tensor sums = op_.scratch(2 * n, DType::F32);
  const float* l = f32(local);
  rescale_sum_exp(l, l + n, f32(global_max), f32(sums), op_.n, op_.stream());
  CUDA_CHECK(cudaMemcpyAsync(f32(sums) + n, l + 2 * n, n * sizeof(float), cudaMemcpyDeviceToDevice, op_.stream()));
  return sums;
}

double VocabPasses::loss_sum(const Tensor& global_max, const Tensor& sums) {
  Tensor total = op_.scratch(1, DType::F64);
  cuda::loss_sum(f32(global_max), f32(sums), f32(sums) + op_.n, op_.n, static_cast<double*>(total.data()),
                 op_.stream());
  return op_.download_scalar(total);
}

Tensor VocabPasses::input_grad_share(const Tensor& local, const Tensor& global_max, const Tensor& sums,
                                     const Tensor& terms, float g) {
  const float* l = f32(local);
  Tensor scaled = op_.stats(), dx = op_.activation();
  rescale_sum_exp(l, l + op_.n, f32(global_max), f32(scaled), op_.n, op_.stream());
  cuda::input_grad_share({.scaled_sum_exp = f32(scaled), .global_sum_exp = f32(sums), .a = terms.data(),
                          .y = element(terms, op_.activation_size()), .dx = dx.data()},
                         g, {.n = op_.n, .h = op_.h}, op_.dtype, op_.stream());
  return dx;
}

Tensor VocabPasses::output_backward(const int* targets, const Tensor& logits, const Tensor& stats, const Tensor& x,
                                    float g, bool input_grad) {
  const VocabShard sh = shard_;
  Tensor dx = input_grad ? op_.activation() : Tensor();
  cuda::output_backward(op_.gemm(),
                        {.logits = f32(logits), .global_max = f32(stats), .global_sum_exp = f32(stats) + op_.n,
                         .targets = targets, .x = x.data(), .w = model_.head.compute(op_.dtype),
                         .dw = model_.head.grad.get(), .dx = input_grad ? dx.data() : nullptr},
                        sh, g, {.n = op_.n, .h = op_.h}, op_.dtype, op_.stream());
  return dx;
}

}  // namespace pipesim::runtime::cuda
