#pragma once
/// CUDA kernels of the GPT-style decoder (docs/runtime.md, "The CUDA backend"), host launchers on
/// device pointers, mirroring runtime/cpu/kernels.h: row-major matrices, n = batch·seq rows, fused
/// QKV rows [q | k | v], heads of width h/heads, pre-LN with epsilon 1e-5, GELU tanh approximation.
/// Backward launchers accumulate (+=) into their gradient outputs, as the CPU's do. Each launcher
/// enqueues work on `stream` and returns; errors (bad arguments, launch failures) throw CudaError.
///
/// Element types. Tensors typed `void*` hold the activation type `dtype` (F32 or BF16): activations
/// and their gradients. Tensors typed `float*` are always fp32: parameters read element-wise (LayerNorm
/// gain and bias, biases, the embedding table), every parameter gradient, optimizer state and the
/// per-row statistics (mean, rstd, attention logsumexp). Math is fp32 throughout.
///
/// Determinism: no kernel here uses floating-point atomics; each output element is summed in a fixed
/// order, so a rerun gives the same bits.
#include <cstddef>
#include <cuda_runtime_api.h>

#include "dtype.h"
#include "shapes.h"

namespace pipesim::runtime::cuda {

/// out = a + b element-wise (the residual connection); out may be a or b.
void add(const void* a, const void* b, void* out, std::size_t count, DType dtype, cudaStream_t stream);
/// dst = src converted; for the bf16 operand copies of fp32 master weights and back.
void convert(const void* src, DType src_type, void* dst, DType dst_type, std::size_t count, cudaStream_t stream);

/// y (n×m) += bias broadcast over rows (a linear layer's bias after its GEMM).
void bias_add(void* y, const float* bias, int n, int m, DType dtype, cudaStream_t stream);
/// dbias (m) += column sums of dy (n×m). Two passes over fixed row chunks, no atomics.
void bias_grad(const void* dy, float* dbias, int n, int m, DType dtype, cudaStream_t stream);

struct LayerNormForwardTensors {
  const void* x;       ///< input, n×h elements of `dtype`
  const float* gamma;  ///< gain, h floats
  const float* beta;   ///< bias, h floats
  void* y;             ///< output, n×h elements of `dtype`
  float* mean;         ///< per-row mean, n floats (written)
  float* rstd;         ///< per-row 1/sqrt(variance + epsilon), n floats (written)
};
/// LayerNorm over rows of width h: y = (x − mean)·rstd·gamma + beta; keeps mean and rstd (n each).
void layernorm_forward(const LayerNormForwardTensors& t, RowShape shape, DType dtype, cudaStream_t stream);

struct AddLayerNormForwardTensors {
  const void* x;         ///< n×h elements of `dtype`
  const void* residual;  ///< n×h elements of `dtype`
  void* sum;             ///< x + residual, n×h elements of `dtype` (written; may be x or residual)
  const float* gamma;    ///< gain, h floats
  const float* beta;     ///< bias, h floats
  void* y;               ///< LayerNorm of sum, n×h elements of `dtype`
  float* mean;           ///< per-row mean of sum, n floats (written)
  float* rstd;           ///< per-row rstd of sum, n floats (written)
};
/// The residual connection and the LayerNorm after it in one kernel: sum = x + residual (rounded to
/// `dtype`, the next residual stream) and y = LayerNorm(sum), each row read once. The same bits as
/// add() then layernorm_forward on sum, so layernorm_backward on sum is its backward.
void add_layernorm_forward(const AddLayerNormForwardTensors& t, RowShape shape, DType dtype, cudaStream_t stream);

struct LayerNormBackwardTensors {
  const void* x;       ///< the forward's input, n×h elements of `dtype`
  const float* gamma;  ///< gain, h floats
  const float* mean;   ///< the forward's per-row mean, n floats
  const float* rstd;   ///< the forward's per-row rstd, n floats
  const void* dy;      ///< output gradient, n×h elements of `dtype`
  void* dx;            ///< input gradient, n×h elements of `dtype` (+=)
  float* dgamma;       ///< gain gradient, h floats (+=)
  float* dbeta;        ///< bias gradient, h floats (+=)
};
/// dx += ..., dgamma += Σ dy·xhat, dbeta += Σ dy (cpu::layernorm_backward). dx is one block per row;
/// dgamma and dbeta sum per-chunk partials in a second pass (deterministic).
void layernorm_backward(const LayerNormBackwardTensors& t, RowShape shape, DType dtype, cudaStream_t stream);

/// GELU, tanh approximation: y = gelu(x); dx += dy·gelu'(x). `count` elements.
void gelu_forward(const void* x, void* y, std::size_t count, DType dtype, cudaStream_t stream);
void gelu_backward(const void* x, const void* dy, void* dx, std::size_t count, DType dtype, cudaStream_t stream);

/// The shape of causal self-attention on a fused QKV: n = batch·seq rows, heads of width d = h/heads.
struct AttentionShape {
  int batch;         ///< sequences
  int seq;           ///< tokens per sequence
  int h;             ///< the query and output width: heads·d elements
  int heads;         ///< query heads
  int kv_heads = 0;  ///< key/value heads; 0 means heads (multi-head attention)
};

struct AttentionForwardTensors {
  const void* qkv;  ///< fused QKV, n rows of h + 2·kv_heads·d elements of `dtype`
  void* out;        ///< output, n×h elements of `dtype`
  float* lse;       ///< per-row logsumexp, batch·heads·seq floats (written)
};
/// Causal self-attention on a fused QKV for `batch` sequences of length `seq`, flash-attention
/// style: the seq×seq probabilities are never stored. QKV rows are cpu::attention_forward's: [q: h |
/// k: kv·d | v: kv·d] with d = h/heads and kv = kv_heads (0 means heads: multi-head attention, rows
/// of 3h; fewer is grouped-query attention, query head i reading key/value head i / (heads / kv)).
/// Writes out (n×h) and the per-row logsumexp `lse` (batch·heads·seq floats, index (b·heads +
/// head)·seq + i) for the backward. Needs h % heads == 0, heads % kv_heads == 0 and h/heads <= 128
/// (throws otherwise); any seq >= 1.
void attention_forward(const AttentionForwardTensors& t, AttentionShape shape, DType dtype, cudaStream_t stream);

struct AttentionBackwardTensors {
  const void* qkv;   ///< the forward's fused QKV, n rows of h + 2·kv_heads·d elements of `dtype`
  const void* out;   ///< the forward's output, n×h elements of `dtype`
  const float* lse;  ///< the forward's logsumexp, batch·heads·seq floats
  const void* dout;  ///< output gradient, n×h elements of `dtype`
  void* dqkv;        ///< QKV gradient, laid out as qkv (+=)
};
/// dqkv += the gradient of attention_forward (same layout), recomputing the probabilities from qkv
/// and lse; `out` is the forward's output. Three kernels: D = rowsum(dout∘out), then dK and dV per key
/// tile of each key/value head (summing its query heads in head order, as the CPU does) and dQ per
/// query tile, so every element has one writer (no atomics).
void attention_backward(const AttentionBackwardTensors& t, AttentionShape shape, DType dtype, cudaStream_t stream);

struct CrossEntropyTensors {
  const float* logits;  ///< n×vocab floats
  const int* targets;   ///< n token ids
  void* dlogits;        ///< n×vocab elements of `dtype` (written)
  double* loss;         ///< one double: the mean loss (written)
};
/// Full-vocabulary softmax cross-entropy (the baseline output layer, cpu::cross_entropy): logits
/// (n×vocab, fp32) and targets in [0, vocab); writes dlogits = (softmax − onehot)/n in `dtype` and the
/// mean loss over the n rows to `*loss` (one double on the device). A target outside the vocabulary
/// gives a NaN loss.
void cross_entropy(const CrossEntropyTensors& t, int n, int vocab, DType dtype, cudaStream_t stream);

struct EmbeddingForwardTensors {
  const float* table;  ///< the shard's rows of the embedding, shard.rows×h floats
  const int* tokens;   ///< n token ids
  void* out;           ///< n×h elements of `dtype` (written)
};
/// Embedding rows for tokens in [shard.first, shard.first + shard.rows) of the table (one device's
/// shard, fp32, rows×h); other tokens give zero rows (cpu::embedding_forward). out is n×h in `dtype`.
void embedding_forward(const EmbeddingForwardTensors& t, RowShape shape, VocabShard shard, DType dtype,
                       cudaStream_t stream);

struct EmbeddingBackwardTensors {
  const int* tokens;  ///< n token ids
  const void* dout;   ///< output gradient, n×h elements of `dtype`
  float* dtable;      ///< the shard's rows' gradient, shard.rows×h floats (+=)
};
/// dtable (rows×h, fp32) += dout rows of the shard's tokens. Tokens are sorted by row (a stable radix
/// sort), then each row sums its tokens in token order: deterministic however often a token repeats.
void embedding_backward(const EmbeddingBackwardTensors& t, RowShape shape, VocabShard shard, DType dtype,
                        cudaStream_t stream);

/// w −= lr·g, then g = 0 (RankModel::sgd_step).
void sgd_step(float* w, float* g, std::size_t count, float learning_rate, cudaStream_t stream);

struct AdamParams {
  float learning_rate = 1e-3f, beta1 = 0.9f, beta2 = 0.999f, epsilon = 1e-8f;
  float weight_decay = 0;  ///< decoupled (AdamW): w −= lr·weight_decay·w; 0 is plain Adam
};
/// Adam's fp32 state, `count` floats each.
struct AdamTensors {
  float* w;  ///< master weights (updated)
  float* g;  ///< gradient (zeroed)
  float* m;  ///< first moment (updated)
  float* v;  ///< second moment (updated)
};
/// One Adam step on fp32 master state: m, v updated, bias-corrected with `step` (1 on the first
/// call), w updated, then g = 0 like sgd_step.
void adam_step(const AdamTensors& t, std::size_t count, const AdamParams& params, int step, cudaStream_t stream);

}  // namespace pipesim::runtime::cuda
