#pragma once
/// Causal attention on the tensor cores, for bf16 runs: the score and probability matrices of each
/// head come from strided-batched cuBLASLt GEMMs (bf16 operands, fp32 accumulate) and two row
/// kernels, as unfused attention does. Same arguments, layouts and accumulate-into-dqkv contract as
/// kernels.h's attention_forward / attention_backward, whose flash-style fp32 kernels stay the
/// correctness path (fp32 runs and --check). Workspace, from the stream's pool for the call: the
/// seq × seq scores of as many heads of one sequence as fit `workspace_bytes` (fp32 scores and bf16
/// probabilities; the backward adds fp32 dP), at least one head: a long sequence runs its heads in
/// groups rather than asking for all of them at once (64 heads at seq 8192 would need 43 GB).
#include <cuda_runtime_api.h>

#include <cstddef>

#include "gemm.h"
#include "kernels.h"

namespace pipesim::runtime::cuda {

/// Per call. At seq 4096 that is up to 12 heads a call backward (10 bytes a score) and 21 forward (6).
constexpr std::size_t kAttentionWorkspaceBytes = std::size_t(2) << 30;

/// Multi-head attention only: `shape.kv_heads` must be 0 or `shape.heads` (else CudaError).
void attention_forward_gemm(GemmHandle& gemm, const AttentionForwardTensors& t, AttentionShape shape,
                            cudaStream_t stream, std::size_t workspace_bytes = kAttentionWorkspaceBytes);
void attention_backward_gemm(GemmHandle& gemm, const AttentionBackwardTensors& t, AttentionShape shape,
                             cudaStream_t stream, std::size_t workspace_bytes = kAttentionWorkspaceBytes);

}  // namespace pipesim::runtime::cuda
