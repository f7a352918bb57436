#pragma once
/// gpu-bench --attention: bf16 causal attention alone, forward and forward + backward, through the
/// path bf16 runs take (cuDNN's fused attention; PIPESIM_ATTENTION=gemm for the unfused one where
/// kv_heads = heads), with grouped-query shapes the runtime's layers do not have yet (Llama-3-8B's
/// 32 query and 8 key/value heads), to set beside PyTorch's scaled_dot_product_attention on the same
/// GPU (tools/measure-ops.py --reference, its "attention" piece).
namespace pipesim {

struct AttentionBenchShape {
  int heads = 32, kv_heads = 8, head_dim = 128, seq = 2048, micro_batch = 1;
};

int bench_attention(const AttentionBenchShape& shape, int iterations);

}  // namespace pipesim
