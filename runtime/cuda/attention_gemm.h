#pragma once
/// Causal attention on the tensor cores, for bf16 runs: the score and probability matrices of each
/// head come from strided-batched cuBLASLt GEMMs (bf16 operands, fp32 accumulate) and two row
/// kernels, as unfused attention does. Same arguments, layouts and accumulate-into-dqkv contract as
/// kernels.h's attention_forward / attention_backward, whose flash-style fp32 kernels stay the
/// correctness path (fp32 runs and --check). Workspace: the seq × seq scores of every head of one
/// sequence at a time (fp32, plus bf16 probabilities; the backward adds fp32 dP), taken from the
/// stream's pool for the call.
#include <cuda_runtime_api.h>

#include "gemm.h"

namespace pipesim::runtime::cuda {

void attention_forward_gemm(GemmHandle& gemm, const void* qkv, void* out, float* lse, int batch, int seq, int h,
                            int heads, cudaStream_t stream);
void attention_backward_gemm(GemmHandle& gemm, const void* qkv, const void* out, const float* lse, const void* dout,
                             void* dqkv, int batch, int seq, int h, int heads, cudaStream_t stream);

}  // namespace pipesim::runtime::cuda
