#pragma once
/// fp32 CPU kernels of the Llama family's layers, beside the GPT kernels of kernels.h and in their
/// conventions: row-major, n = batch·seq rows, backward kernels accumulate (+=) into gradients.
/// RMSNorm (gain only), rotary position embeddings (HF Llama's rotate-half) and SwiGLU. Grouped-query
/// attention is kernels.h's attention_forward/backward with kv_heads < heads.
#include <span>

namespace pipesim::cpu {

/// RMSNorm's epsilon (Llama 2's rms_norm_eps).
constexpr float kRmsNormEpsilon = 1e-5f;

/// RMSNorm over rows of width h: y = x · rstd · gain with rstd = 1 / sqrt(mean(x²) + epsilon). Keeps
/// rstd (n) for the backward.
void rmsnorm_forward(std::span<const float> x, std::span<const float> gain, std::span<float> y, std::span<float> rstd,
                     int n, int h);
/// dx += rstd · (g − xhat · mean(g · xhat)) with xhat = x · rstd, g = dy · gain; dgain += Σ dy · xhat.
void rmsnorm_backward(std::span<const float> x, std::span<const float> gain, std::span<const float> rstd,
                      std::span<const float> dy, std::span<float> dx, std::span<float> dgain, int n, int h);

/// Rotary position embedding, in place. Each of the n rows (row stride `width`) holds, from column 0,
/// `heads` head vectors of width d (even), and each is rotated by its token's position p = row % seq
/// (positions restart with each sequence of a microbatch): with half = d/2 and, for i < half, angle
/// a = p · theta^(−2i/d), the pair (x[i], x[i + half]) becomes (x[i]·cos a − x[i + half]·sin a,
/// x[i + half]·cos a + x[i]·sin a). Columns past heads·d are left as they are, so a fused QKV row is
/// rotated in its q and k heads by passing heads + kv_heads. Angles are computed in double: at
/// positions in the thousands an fp32 angle would be off by about 1e-4 rad.
void rope_forward(std::span<float> x, int n, int seq, int width, int heads, int d, float theta);
/// The backward of rope_forward, in place on the gradient: the rotation is orthogonal, so its
/// transpose is the rotation by −a. rope_backward(rope_forward(x)) gives back x (up to rounding).
void rope_backward(std::span<float> dx, int n, int seq, int width, int heads, int d, float theta);

/// SwiGLU on a fused gate and up projection: gate_up rows are [gate (f) | up (f)]; out (n×f) =
/// silu(gate) · up with silu(g) = g · sigmoid(g).
void swiglu_forward(std::span<const float> gate_up, std::span<float> out, int n, int f);
/// dgate_up += the gradient of swiglu_forward, in the same [gate | up] layout.
void swiglu_backward(std::span<const float> gate_up, std::span<const float> dout, std::span<float> dgate_up, int n,
                     int f);

}  // namespace pipesim::cpu
