#pragma once
/// CUDA kernels of the Llama family's layers, mirroring runtime/cpu/llama_kernels.h (same layouts and
/// math) in kernels.h's conventions: host launchers on device pointers, enqueued on `stream`; `void*`
/// tensors hold the activation type `dtype` (F32 or BF16), `float*` ones are fp32 (gains, their
/// gradients, rstd); math is fp32; backward launchers accumulate (+=) except the in-place RoPE; no
/// floating-point atomics, so reruns give the same bits; bad arguments throw CudaError.
/// Grouped-query attention is not here: kernels.h's flash attention and cuDNN's (attention_cudnn.h)
/// take kv_heads.
#include <cstddef>
#include <cuda_runtime_api.h>

#include "dtype.h"

namespace pipesim::runtime::cuda {

/// RMSNorm over rows of width h: y = x·rstd·gain, rstd = 1/sqrt(mean(x²) + 1e-5); keeps rstd (n).
void rmsnorm_forward(const void* x, const float* gain, void* y, float* rstd, int n, int h, DType dtype,
                     cudaStream_t stream);
/// dx += rstd·(g − xhat·mean(g·xhat)) with xhat = x·rstd, g = dy·gain (one block per row); dgain +=
/// Σ dy·xhat, per-chunk partials summed in a second pass (deterministic).
void rmsnorm_backward(const void* x, const float* gain, const float* rstd, const void* dy, void* dx, float* dgain,
                      int n, int h, DType dtype, cudaStream_t stream);

/// Rotary position embedding in place (cpu::rope_forward): in each of n rows of `width` elements, the
/// first `heads` heads of width d (even) turn pair (i, i + d/2) by (row % seq)·theta^(−2i/d). The
/// angle is formed and reduced modulo 2π in double, so fp32 results match the CPU's to ~1e-7 at
/// any position; one thread per pair. Throws when d is odd or heads·d > width.
void rope_forward(void* x, int n, int seq, int width, int heads, int d, float theta, DType dtype, cudaStream_t stream);
/// The backward, in place on the gradient: the rotation by the negative angle.
void rope_backward(void* dx, int n, int seq, int width, int heads, int d, float theta, DType dtype,
                   cudaStream_t stream);

/// SwiGLU on gate_up rows [gate (f) | up (f)]: out (n×f) = silu(gate)·up (cpu::swiglu_forward).
void swiglu_forward(const void* gate_up, void* out, int n, int f, DType dtype, cudaStream_t stream);
/// dgate_up (n×2f) += the gradient, in the same [gate | up] layout.
void swiglu_backward(const void* gate_up, const void* dout, void* dgate_up, int n, int f, DType dtype,
                     cudaStream_t stream);

}  // namespace pipesim::runtime::cuda
