#pragma once
/// The vocabulary-parallel output layer on CUDA, one device's shard at a time (docs/runtime.md, "The
/// vocabulary passes"), mirroring runtime/cpu/vocab.h: device i holds rows [first, first + rows) of
/// the LM head W (rows may be 0 when padding leaves a device none); X (n×h) is the last stage's
/// output. The cross-shard reductions are the caller's collectives; these are what each device
/// computes between them.
///
/// Element types: x, w, A, Y and dX are in the activation type `dtype`; logits are always fp32 (the
/// softmax needs the range); dW accumulates in fp32; every per-token statistic (max, sum_exp,
/// target_logit, the global M and S, scaled) is fp32; losses are one double on the device. targets
/// holds n ints on the device.
#include <cuda_runtime_api.h>

#include "dtype.h"
#include "gemm.h"

namespace pipesim::runtime::cuda {

// --- the composite passes, as cpu::output_logits, output_input_grad_terms, output_backward ---

/// S pass: logits (n×rows) = X·W_iᵀ, then shard_softmax_stats.
void output_logits(GemmHandle& gemm, const void* x, const void* w, const int* targets, int first, int rows, int n,
                   int h, float* logits, float* max, float* sum_exp, float* target_logit, DType dtype,
                   cudaStream_t stream);
/// Algorithm 2's extra S work: A_i = softmax_local(L_i)·W_i and Y_i = W_i[target] (0 when absent),
/// both n×h. The n×rows softmax lives in stream-ordered scratch for the call.
void output_input_grad_terms(GemmHandle& gemm, const float* logits, const float* max, const float* sum_exp,
                             const void* w, const int* targets, int first, int rows, int n, int h, void* a, void* y,
                             DType dtype, cudaStream_t stream);
/// T pass: G_i = (exp(L_i − M)/S − onehot_i)·g; dW_i (rows×h, fp32) += G_iᵀ·X; when dx is not null
/// (Algorithm 1) also dX_i = G_i·W_i (overwritten; zero for an empty shard).
void output_backward(GemmHandle& gemm, const float* logits, const float* global_max, const float* global_sum_exp,
                     const int* targets, int first, int rows, float g, const void* x, const void* w, int n, int h,
                     float* dw, void* dx, DType dtype, cudaStream_t stream);

// --- the element kernels the passes are made of ---

/// Per token: the local max m_i, s_i = Σ exp(L_i − m_i) and the target logit z_i (0 when the target
/// is in another shard). An empty shard gives m_i = −∞ and s_i = 0, the identities of the reductions.
void shard_softmax_stats(const float* logits, const int* targets, int first, int rows, int n, float* max,
                         float* sum_exp, float* target_logit, cudaStream_t stream);
/// softmax_local = exp(L − m_i)/s_i (n×rows) in `dtype`, the left operand of A_i's GEMM.
void local_softmax(const float* logits, const float* max, const float* sum_exp, int n, int rows, void* softmax,
                   DType dtype, cudaStream_t stream);
/// y (n×h) = W_i[target − first] or 0 when the target is outside the shard.
void gather_target_rows(const void* w, const int* targets, int first, int rows, int n, int h, void* y, DType dtype,
                        cudaStream_t stream);
/// After the max all-reduce: scaled = s_i·exp(m_i − M) (0 where s_i = 0), the shard's share of S.
void rescale_sum_exp(const float* max, const float* sum_exp, const float* global_max, float* scaled, int n,
                     cudaStream_t stream);
/// Algorithm 2 after C0: dx = g·((scaled/S)·A − Y), this shard's term of dX (n×h, overwritten).
void input_grad_share(const float* scaled_sum_exp, const float* global_sum_exp, const void* a, const void* y, float g,
                      int n, int h, void* dx, DType dtype, cudaStream_t stream);
/// *loss = Σ over the n tokens of M + log S − z, summed in double in a fixed order (one block).
void loss_sum(const float* global_max, const float* global_sum_exp, const float* target_logit, int n, double* loss,
              cudaStream_t stream);
/// G_i (n×rows, `dtype`) = (exp(L − M)/S − onehot)·g, the T pass's left operand.
void output_grad(const float* logits, const float* global_max, const float* global_sum_exp, const int* targets,
                 int first, int rows, float g, int n, void* grad, DType dtype, cudaStream_t stream);

}  // namespace pipesim::runtime::cuda
