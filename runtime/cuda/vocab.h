#pragma once
/// The vocabulary-parallel output layer on CUDA, one device's shard at a time (docs/runtime.md, "The
/// vocabulary passes"), mirroring runtime/cpu/vocab.h: device i holds rows [first, first + rows) of
/// the LM head W (a VocabShard; rows may be 0 when padding leaves a device none); X (n×h, a RowShape)
/// is the last stage's output. The cross-shard reductions are the caller's collectives; these are what
/// each device computes between them.
///
/// Element types: x, w, A, Y and dX are in the activation type `dtype`; logits are always fp32 (the
/// softmax needs the range); dW accumulates in fp32; every per-token statistic (max, sum_exp,
/// target_logit, the global M and S, scaled) is fp32; losses are one double on the device. targets
/// holds n ints on the device.
#include <cuda_runtime_api.h>

#include "dtype.h"
#include "gemm.h"
#include "shapes.h"

namespace pipesim::runtime::cuda {

// --- the composite passes, as cpu::output_logits, output_input_grad_terms, output_backward ---

struct OutputLogitsTensors {
  const void* x;        ///< X, n×h elements of `dtype`
  const void* w;        ///< W_i, rows×h elements of `dtype`
  const int* targets;   ///< n token ids
  float* logits;        ///< L_i, n×rows floats (written)
  float* max;           ///< m_i, n floats (written)
  float* sum_exp;       ///< s_i, n floats (written)
  float* target_logit;  ///< z_i, n floats (written)
};
/// S pass: logits (n×rows) = X·W_iᵀ, then shard_softmax_stats.
void output_logits(GemmHandle& gemm, const OutputLogitsTensors& t, VocabShard shard, RowShape shape, DType dtype,
                   cudaStream_t stream);

struct OutputInputGradTermsTensors {
  const float* logits;   ///< L_i, n×rows floats
  const float* max;      ///< m_i, n floats
  const float* sum_exp;  ///< s_i, n floats
  const void* w;         ///< W_i, rows×h elements of `dtype`
  const int* targets;    ///< n token ids
  void* a;               ///< A_i, n×h elements of `dtype` (written)
  void* y;               ///< Y_i, n×h elements of `dtype` (written)
};
/// Algorithm 2's extra S work: A_i = softmax_local(L_i)·W_i and Y_i = W_i[target] (0 when absent),
/// both n×h. The n×rows softmax lives in stream-ordered scratch for the call.
void output_input_grad_terms(GemmHandle& gemm, const OutputInputGradTermsTensors& t, VocabShard shard, RowShape shape,
                             DType dtype, cudaStream_t stream);

struct OutputBackwardTensors {
  const float* logits;          ///< L_i, n×rows floats
  const float* global_max;      ///< M, n floats
  const float* global_sum_exp;  ///< S, n floats
  const int* targets;           ///< n token ids
  const void* x;                ///< X, n×h elements of `dtype`
  const void* w;                ///< W_i, rows×h elements of `dtype`
  float* dw;                    ///< dW_i, rows×h floats (+=)
  void* dx;                     ///< dX_i, n×h elements of `dtype` (written), or null: no input gradient
};
/// T pass: G_i = (exp(L_i − M)/S − onehot_i)·g; dW_i (rows×h, fp32) += G_iᵀ·X; when dx is not null
/// (Algorithm 1) also dX_i = G_i·W_i (overwritten; zero for an empty shard).
void output_backward(GemmHandle& gemm, const OutputBackwardTensors& t, VocabShard shard, float g, RowShape shape,
                     DType dtype, cudaStream_t stream);

// --- the element kernels the passes are made of ---

struct ShardSoftmaxStatsTensors {
  const float* logits;  ///< L_i, n×rows floats
  const int* targets;   ///< n token ids
  float* max;           ///< m_i, n floats (written)
  float* sum_exp;       ///< s_i, n floats (written)
  float* target_logit;  ///< z_i, n floats (written)
};
/// Per token: the local max m_i, s_i = Σ exp(L_i − m_i) and the target logit z_i (0 when the target
/// is in another shard). An empty shard gives m_i = −∞ and s_i = 0, the identities of the reductions.
void shard_softmax_stats(const ShardSoftmaxStatsTensors& t, VocabShard shard, int n, cudaStream_t stream);

struct LocalSoftmaxTensors {
  const float* logits;   ///< L_i, n×rows floats
  const float* max;      ///< m_i, n floats
  const float* sum_exp;  ///< s_i, n floats
  void* softmax;         ///< n×rows elements of `dtype` (written)
};
/// softmax_local = exp(L − m_i)/s_i (n×rows) in `dtype`, the left operand of A_i's GEMM.
void local_softmax(const LocalSoftmaxTensors& t, int n, int rows, DType dtype, cudaStream_t stream);

struct GatherTargetRowsTensors {
  const void* w;       ///< W_i, rows×h elements of `dtype`
  const int* targets;  ///< n token ids
  void* y;             ///< n×h elements of `dtype` (written)
};
/// y (n×h) = W_i[target − first] or 0 when the target is outside the shard.
void gather_target_rows(const GatherTargetRowsTensors& t, VocabShard shard, RowShape shape, DType dtype,
                        cudaStream_t stream);
/// After the max all-reduce: scaled = s_i·exp(m_i − M) (0 where s_i = 0), the shard's share of S.
void rescale_sum_exp(const float* max, const float* sum_exp, const float* global_max, float* scaled, int n,
                     cudaStream_t stream);

struct InputGradShareTensors {
  const float* scaled_sum_exp;  ///< the shard's share of S (rescale_sum_exp), n floats
  const float* global_sum_exp;  ///< S, n floats
  const void* a;                ///< A_i, n×h elements of `dtype`
  const void* y;                ///< Y_i, n×h elements of `dtype`
  void* dx;                     ///< n×h elements of `dtype` (written)
};
/// Algorithm 2 after C0: dx = g·((scaled/S)·A − Y), this shard's term of dX (n×h, overwritten).
void input_grad_share(const InputGradShareTensors& t, float g, RowShape shape, DType dtype, cudaStream_t stream);
/// *loss = Σ over the n tokens of M + log S − z, summed in double in a fixed order (one block).
void loss_sum(const float* global_max, const float* global_sum_exp, const float* target_logit, int n, double* loss,
              cudaStream_t stream);

struct OutputGradTensors {
  const float* logits;          ///< L_i, n×rows floats
  const float* global_max;      ///< M, n floats
  const float* global_sum_exp;  ///< S, n floats
  const int* targets;           ///< n token ids
  void* grad;                   ///< G_i, n×rows elements of `dtype` (written)
};
/// G_i (n×rows, `dtype`) = (exp(L − M)/S − onehot)·g, the T pass's left operand.
void output_grad(const OutputGradTensors& t, VocabShard shard, float g, int n, DType dtype, cudaStream_t stream);

}  // namespace pipesim::runtime::cuda
