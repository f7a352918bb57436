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
#include "shapes.h"

namespace pipesim::runtime::cuda {

struct RmsNormForwardTensors {
  const void* x;      ///< input, n×h elements of `dtype`
  const float* gain;  ///< h floats
  void* y;            ///< output, n×h elements of `dtype`
  float* rstd;        ///< per-row 1/sqrt(mean(x²) + epsilon), n floats (written)
};
/// RMSNorm over rows of width h: y = x·rstd·gain, rstd = 1/sqrt(mean(x²) + 1e-5); keeps rstd (n).
void rmsnorm_forward(const RmsNormForwardTensors& t, RowShape shape, DType dtype, cudaStream_t stream);

struct AddRmsNormForwardTensors {
  const void* x;         ///< n×h elements of `dtype`
  const void* residual;  ///< n×h elements of `dtype`
  void* sum;             ///< x + residual, n×h elements of `dtype` (written; may be x or residual)
  const float* gain;     ///< h floats
  void* y;               ///< RMSNorm of sum, n×h elements of `dtype`
  float* rstd;           ///< per-row rstd of sum, n floats (written)
};
/// The residual connection and the RMSNorm after it in one kernel: sum = x + residual (rounded to
/// `dtype`, the next residual stream) and y = RMSNorm(sum), each row read once. The same bits as
/// add() then rmsnorm_forward on sum, so rmsnorm_backward on sum is its backward.
void add_rmsnorm_forward(const AddRmsNormForwardTensors& t, RowShape shape, DType dtype, cudaStream_t stream);

struct RmsNormBackwardTensors {
  const void* x;      ///< the forward's input, n×h elements of `dtype`
  const float* gain;  ///< h floats
  const float* rstd;  ///< the forward's per-row rstd, n floats
  const void* dy;     ///< output gradient, n×h elements of `dtype`
  void* dx;           ///< input gradient, n×h elements of `dtype` (+=)
  float* dgain;       ///< gain gradient, h floats (+=)
};
/// dx += rstd·(g − xhat·mean(g·xhat)) with xhat = x·rstd, g = dy·gain (one block per row); dgain +=
/// Σ dy·xhat, per-chunk partials summed in a second pass (deterministic).
void rmsnorm_backward(const RmsNormBackwardTensors& t, RowShape shape, DType dtype, cudaStream_t stream);

/// Which elements the rotary embedding turns, and by how much.
struct RopeShape {
  int n;        ///< rows
  int seq;      ///< tokens per sequence: a row's position is row % seq
  int width;    ///< elements per row (the row stride)
  int heads;    ///< heads rotated, from column 0 (a fused QKV's query and key heads)
  int d;        ///< head width in elements, even
  float theta;  ///< the frequencies' base: pair i of a head turns by position·theta^(−2i/d) radians
};
/// Rotary position embedding in place (cpu::rope_forward): in each of n rows of `width` elements, the
/// first `heads` heads of width d (even) turn pair (i, i + d/2) by (row % seq)·theta^(−2i/d). The
/// angle is formed and reduced modulo 2π in double, so fp32 results match the CPU's to ~1e-7 at
/// any position; one thread per pair. Throws when d is odd or heads·d > width.
void rope_forward(void* x, RopeShape shape, DType dtype, cudaStream_t stream);
/// The backward, in place on the gradient: the rotation by the negative angle.
void rope_backward(void* dx, RopeShape shape, DType dtype, cudaStream_t stream);

/// SwiGLU on gate_up rows [gate (f) | up (f)]: out (n×f) = silu(gate)·up (cpu::swiglu_forward).
void swiglu_forward(const void* gate_up, void* out, int n, int f, DType dtype, cudaStream_t stream);
/// dgate_up (n×2f) += the gradient, in the same [gate | up] layout.
void swiglu_backward(const void* gate_up, const void* dout, void* dgate_up, int n, int f, DType dtype,
                     cudaStream_t stream);

}  // namespace pipesim::runtime::cuda
