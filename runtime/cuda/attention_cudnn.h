#pragma once
/// Causal attention for bf16 runs through cuDNN's fused flash-attention engines: forward and
/// backward each one cudnnBackendExecute, no fp32 score matrix anywhere. Grouped-query attention is
/// supported (K and V with `kv_heads` heads, each shared by heads / kv_heads query heads).
///
/// API: cuDNN 9's backend (graph) API in C -- cudnnBackendCreateDescriptor, SetAttribute, Finalize,
/// Execute -- behind a small RAII wrapper in attention_cudnn.cpp. The C++ frontend (cudnn-frontend)
/// that usually builds these graphs is a header library this project does not ship; the backend API
/// is what libcudnn.so.9 itself exports, so nothing beyond cuDNN is needed. The graphs are the
/// operation patterns the fused engines recognise (matmul, scale, causal mask from generated indices,
/// softmax as max/sub/exp/sum with the logsumexp as stats, matmul; and the matching backward).
///
/// Shapes: kernels.h's AttentionShape, whose h is heads·d (the head width d = h / heads) and whose
/// kv_heads 0 means heads.
///
/// Layouts (row-major, as kernels.h): qkv rows of width (heads + 2·kv_heads)·d holding
/// [Q: heads·d | K: kv_heads·d | V: kv_heads·d], head `i` at columns i·d of its part; out and dout
/// rows of width heads·d; lse fp32 at (b·heads + head)·seq + i, the natural-log logsumexp of the
/// scaled scores (1/sqrt(d)) -- the same convention as attention_forward and attention_gemm.h, so a
/// forward of one path and a backward of another agree. Q, K, V, O and their gradients are given to
/// cuDNN as 4-D [batch, heads, seq, d] views with strides into these rows: nothing is copied or
/// transposed.
///
/// Backward writes dqkv (=), it does not add to it as kernels.h's backward does: the backend's
/// dqkv is freshly zeroed scratch, where the two agree. Deterministic backward (the default): dQ
/// is computed by the engine variant that gives each element one writer (the frontend's "dP
/// workspace" graph, in which the dS·K product writes dQ directly); without it dQ goes through an
/// fp32 accumulator the engine adds into atomically, faster but not bitwise repeatable. The
/// deterministic form's workspace holds dP in bf16 (the frontend sizes it batch·heads·seq²·2 bytes:
/// 256 MiB for 32 heads at seq 2048); the plan reports the size and the stream's pool provides it.
/// There is no separate determinism knob on Hopper: the graph's form is the setting. (On Blackwell
/// the deterministic engine is chosen by engine knobs this code does not set.)
///
/// Plans are built once per (batch, seq, heads, kv_heads, d, deterministic, device) and kept for the
/// process; workspace comes from the stream's pool per call. On Hopper the engines are compiled at
/// run time (NVRTC, through the driver), so the first call of a shape takes longer than the rest:
/// a benchmark should time steps after the first. Requirements of the engines: d a
/// multiple of 8, at most 128 (256 on Hopper), a GPU of compute capability 8.0 or later.
#include <cuda_runtime_api.h>

#include <string>

#include "kernels.h"

namespace pipesim::runtime::cuda {

/// Whether this build has cuDNN (Meson found it).
bool cudnn_attention_built();

/// Whether bf16 attention should go through cuDNN: built with cuDNN and the environment variable
/// PIPESIM_ATTENTION (read once) is unset or "cudnn"; "gemm" selects attention_gemm.h instead, for
/// comparing the two. Any other value throws CudaError.
bool use_cudnn_attention();

/// The forward: out and lse as above. Returns false, having changed nothing, when this build has no
/// cuDNN or cuDNN has no engine for the shape (the reason goes to stderr once per shape, and to
/// cudnn_attention_last_problem()); the caller then runs attention_forward_gemm. Other failures throw.
/// Falling back rather than failing: a shape without an engine (a head width, an older GPU or cuDNN)
/// still trains, at the unfused path's speed, and the stderr line says why; the GPU test counts a
/// refusal as a failure, so a graph the engines stop accepting cannot pass unnoticed there.
bool attention_forward_cudnn(const AttentionForwardTensors& t, AttentionShape shape, cudaStream_t stream);
/// The backward: dqkv (=) from qkv, the forward's out and lse, and dout. Same return contract.
bool attention_backward_cudnn(const AttentionBackwardTensors& t, AttentionShape shape, cudaStream_t stream,
                              bool deterministic = true);

/// Why the last refused call was refused (empty if none was): the shape and cuDNN's message.
std::string cudnn_attention_last_problem();

}  // namespace pipesim::runtime::cuda
