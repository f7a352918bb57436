#pragma once
/// fp32 CPU kernels of a GPT-style decoder, forward and backward written out, for the CPU runtime to
/// execute the task graph with real math. Matrices are row-major; a microbatch of b sequences of
/// length s is n = b·s rows. Backward kernels accumulate into their gradient outputs (+=), so
/// gradients from several microbatches sum without extra buffers.
#include <cstddef>
#include <span>
#include <string>
#include <vector>

namespace pipesim::cpu {

/// The three GEMMs run on OpenBLAS's cblas_sgemm, one thread per call, the library opened at the first
/// GEMM (see gemm_library); on the loops below in a build without OpenBLAS, or when it cannot be opened
/// (said once on stderr).
/// C (n×m) = A (n×k) · B (k×m); `accumulate` adds to C instead of overwriting it. Forward.
void matmul(std::span<const float> a, std::span<const float> b, std::span<float> c, int n, int k, int m,
            bool accumulate = false);
/// C (n×m) += A (n×k) · Bᵀ, with B stored m×k. Input gradients (dx += dy·Wᵀ), the LM head's logits.
void matmul_bt(std::span<const float> a, std::span<const float> b, std::span<float> c, int n, int k, int m);
/// C (k×m) += Aᵀ · B, with A stored n×k and B n×m. Weight gradients (dW += xᵀ·dy).
void matmul_at(std::span<const float> a, std::span<const float> b, std::span<float> c, int n, int k, int m);

/// What the GEMMs above run on: OpenBLAS's configuration, the CPU kernel it picked and its file
/// ("OpenBLAS 0.3.21 NO_LAPACKE DYNAMIC_ARCH NO_AFFINITY Zen MAX_THREADS=64, core Zen (/usr/lib/...)"),
/// or "built-in loops" and why.
std::string gemm_library();

/// Opens the GEMMs' library now rather than at the first GEMM, so that no op's measured time includes
/// it (make_layer calls it: a model's GEMMs follow). Any thread, any number of times.
void open_gemm_library();

/// The same three products as plain loops (4–7 GFLOP/s on the build machine): what the GEMMs above run
/// on without OpenBLAS, and the baseline that cpu-gemm-bench and the kernels test compare them with.
namespace loops {
void matmul(std::span<const float> a, std::span<const float> b, std::span<float> c, int n, int k, int m,
            bool accumulate = false);
void matmul_bt(std::span<const float> a, std::span<const float> b, std::span<float> c, int n, int k, int m);
void matmul_at(std::span<const float> a, std::span<const float> b, std::span<float> c, int n, int k, int m);
}  // namespace loops

/// LayerNorm over rows of width h: y = (x - mean) · rstd · gamma + beta. Keeps mean and rstd for
/// the backward.
void layernorm_forward(std::span<const float> x, std::span<const float> gamma, std::span<const float> beta,
                       std::span<float> y, std::span<float> mean, std::span<float> rstd, int n, int h);
void layernorm_backward(std::span<const float> x, std::span<const float> gamma, std::span<const float> mean,
                        std::span<const float> rstd, std::span<const float> dy, std::span<float> dx,
                        std::span<float> dgamma, std::span<float> dbeta, int n, int h);

/// GELU, tanh approximation (GPT-2).
void gelu_forward(std::span<const float> x, std::span<float> y);
void gelu_backward(std::span<const float> x, std::span<const float> dy, std::span<float> dx);

/// Causal multi-head self-attention on a fused QKV for `batch` sequences of length `seq` (n =
/// batch·seq), heads of width d = h / heads. `kv_heads` key/value heads (0 means `heads`; fewer is
/// grouped-query attention, heads % kv_heads == 0) make QKV rows of width h + 2·kv_heads·d, laid out
/// [q: heads·d | k: kv_heads·d | v: kv_heads·d]; query head i reads key/value head i / (heads /
/// kv_heads). With kv_heads = heads the rows are [q | k | v] of width 3h. Keeps the attention
/// probabilities (batch·heads·seq·seq) for the backward.
void attention_forward(std::span<const float> qkv, std::span<float> out, std::span<float> probs, int batch, int seq,
                       int h, int heads, int kv_heads = 0);
/// dqkv += the gradient; a key/value head shared by several query heads sums their terms in head order.
void attention_backward(std::span<const float> qkv, std::span<const float> probs, std::span<const float> dout,
                        std::span<float> dqkv, int batch, int seq, int h, int heads, int kv_heads = 0);

/// Softmax cross-entropy over rows of `vocab` logits; returns the mean loss over the n rows and
/// writes dlogits = (softmax - onehot) / n.
double cross_entropy(std::span<const float> logits, std::span<const int> targets, std::span<float> dlogits, int n,
                     int vocab);

/// Embedding rows for tokens in [first_row, first_row + rows) -- one device's shard of the table;
/// tokens outside it give zero rows (the IF pass of docs/vocabulary-parallelism.md).
void embedding_forward(std::span<const float> table, std::span<const int> tokens, std::span<float> out, int h,
                       int first_row, int rows);
void embedding_backward(std::span<const int> tokens, std::span<const float> dout, std::span<float> dtable, int h,
                        int first_row, int rows);

}  // namespace pipesim::cpu
