// Causal attention through cuBLASLt (attention_gemm.h): per sequence and group of heads, the heads'
// score matrices in one strided-batched GEMM, a row kernel for the probabilities, and batched GEMMs
// for everything else.
//
// Layouts (row-major): qkv rows [q | k | v] of width 3h, head `head` at columns head·d of each part;
// scores and probabilities [head][i][j], seq × seq per head. cuBLASLt is column-major, so a row-major
// matrix X with row stride ld is the column-major Xᵀ with leading dimension ld: the comments give each
// product in row-major terms and the call in column-major ones.
#include "attention_gemm.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "attention_common.cuh"

namespace pipesim::runtime::cuda {
namespace {

using namespace detail;

constexpr int kRowThreads = 256;

/// One block per row i of one head's scores S (already scaled): P[i][j] = exp(S[i][j] − lse_i) for
/// j <= i, 0 after. With `lse_out` the row's logsumexp is computed and written there, else read from
/// `lse_in`.
__global__ void __launch_bounds__(kRowThreads)
    causal_probabilities_kernel(const float* scores, bf16* probs, const float* lse_in, float* lse_out, int seq) {
  __shared__ float scratch[32];
  const std::size_t row = blockIdx.x;
  const int i = int(row % std::size_t(seq));
  const float* s = scores + row * std::size_t(seq);
  bf16* p = probs + row * std::size_t(seq);
  float log_sum;
  if (lse_out != nullptr) {
    float max = -INFINITY;
    for (int j = int(threadIdx.x); j <= i; j += blockDim.x) max = fmaxf(max, s[j]);
    max = block_reduce(max, Max{}, -INFINITY, scratch);
    float sum = 0;
    for (int j = int(threadIdx.x); j <= i; j += blockDim.x) sum += expf(s[j] - max);
    sum = block_reduce(sum, Sum{}, 0.0f, scratch);
    log_sum = max + logf(sum);  // j = 0 is always in the row: max is finite, sum >= 1
    if (threadIdx.x == 0) lse_out[row] = log_sum;
  } else {
    log_sum = lse_in[row];
  }
  for (int j = int(threadIdx.x); j < seq; j += blockDim.x) p[j] = from_float<bf16>(j <= i ? expf(s[j] - log_sum) : 0.0f);
}

/// dS[i][j] = scale·P[i][j]·(dP[i][j] − D_i) for j <= i, 0 after, with P recomputed in fp32 from the
/// scores and the logsumexp; one block per row. Written over the probabilities' buffer.
__global__ void __launch_bounds__(kRowThreads)
    causal_score_grad_kernel(const float* scores, const float* lse, const float* dp, const float* delta, bf16* ds,
                             int seq, float scale) {
  const std::size_t row = blockIdx.x;
  const int i = int(row % std::size_t(seq));
  const float log_sum = lse[row], d = delta[row];
  const std::size_t at = row * std::size_t(seq);
  for (int j = int(threadIdx.x); j < seq; j += blockDim.x) {
    const float g = j <= i ? scale * expf(scores[at + std::size_t(j)] - log_sum) * (dp[at + std::size_t(j)] - d) : 0.0f;
    ds[at + std::size_t(j)] = from_float<bf16>(g);
  }
}

/// The call shapes shared by forward and backward, for one sequence's heads.
struct HeadGemms {
  const AttentionLayout& s;
  long long square() const { return (long long)s.seq * s.seq; }
  /// Row-major C[i][j] = alpha·Σ_e A[i][e]·B[j][e] over one head (A, B: seq × d, row stride lda/ldb;
  /// C: seq × seq). Column-major: Cᵀ = Bᵀᵀ·Aᵀ, i.e. op(B-as-A) transposed.
  GemmHandle::Call rows_dot_rows(int lda, int ldb, float alpha) const {
    return {.transpose_a = true, .m = s.seq, .n = s.seq, .k = s.d, .lda = ldb, .ldb = lda, .ldc = s.seq,
            .types = {DType::BF16, DType::F32}, .alpha = alpha, .batch = s.heads, .stride_a = s.d, .stride_b = s.d,
            .stride_c = square()};
  }
  /// Row-major C[i][e] (+)= Σ_j M[i][j]·X[j][e] (M: seq × seq, X: seq × d with row stride ldx; C with
  /// row stride ldc); with `transpose_m`, Σ_j M[j][i]·X[j][e] instead.
  GemmHandle::Call matrix_times_rows(int ldx, int ldc, bool transpose_m, bool accumulate) const {
    return {.transpose_b = transpose_m, .m = s.d, .n = s.seq, .k = s.seq, .lda = ldx, .ldb = s.seq, .ldc = ldc,
            .types = {DType::BF16, DType::BF16}, .accumulate = accumulate, .batch = s.heads, .stride_a = s.d,
            .stride_b = square(), .stride_c = s.d};
  }
};

/// Heads per call: as many as keep their seq × seq matrices (`square_bytes` for each element: what
/// one call holds at once) within `budget`, at least one, spread evenly over the calls.
int heads_per_call(const AttentionLayout& s, std::size_t square_bytes, std::size_t budget) {
  const std::size_t per_head = square_bytes * std::size_t(s.seq) * std::size_t(s.seq);
  const int most = int(std::clamp<std::size_t>(budget / per_head, 1, std::size_t(s.heads)));
  const int calls = (s.heads + most - 1) / most;
  return (s.heads + calls - 1) / calls;
}

/// Calls step(b, first_head, part) for each sequence b and each group of heads, `part` being the
/// shape with heads = the group's size (what HeadGemms and the row kernels batch over).
template <class Step>
void for_head_groups(const AttentionLayout& s, int group, Step step) {
  for (int b = 0; b < s.batch; ++b)
    for (int first = 0; first < s.heads; first += group) {
      AttentionLayout part = s;
      part.heads = std::min(group, s.heads - first);
      step(b, first, part);
    }
}

std::size_t squares(const AttentionLayout& s) { return std::size_t(s.heads) * std::size_t(s.seq) * std::size_t(s.seq); }

/// The layout of `shape`, which must be multi-head attention: these products read one key/value head
/// per query head.
AttentionLayout multi_head_layout(const AttentionShape& shape) {
  if (shape.kv_heads != 0 && shape.kv_heads != shape.heads)
    throw CudaError("attention (cuBLASLt): multi-head attention only; got heads=" + std::to_string(shape.heads) +
                    " kv_heads=" + std::to_string(shape.kv_heads));
  return attention_layout(shape.batch, shape.seq, shape.h, shape.heads, shape.heads);
}

}  // namespace

void attention_forward_gemm(GemmHandle& gemm, const AttentionForwardTensors& t, AttentionShape shape,
                            cudaStream_t stream, std::size_t workspace_bytes) {
  const void* qkv = t.qkv;
  void* out = t.out;
  float* lse = t.lse;
  const int seq = shape.seq, h = shape.h, heads = shape.heads;
  const AttentionLayout s = multi_head_layout(shape);
  AttentionLayout most = s;
  most.heads = heads_per_call(s, sizeof(float) + sizeof(bf16), workspace_bytes);
  StreamScratch scores(squares(most) * sizeof(float), stream), probs(squares(most) * sizeof(bf16), stream);
  for_head_groups(s, most.heads, [&](int b, int first, const AttentionLayout& part) {
    const HeadGemms g{part};
    const std::size_t column = std::size_t(first) * std::size_t(s.d), rows = std::size_t(part.heads) * std::size_t(seq);
    const bf16* q = static_cast<const bf16*>(qkv) + std::size_t(b) * std::size_t(seq) * 3 * std::size_t(h) + column;
    // S[i][j] = scale·Σ_e Q[i][e]·K[j][e]
    gemm.run(g.rows_dot_rows(3 * h, 3 * h, s.scale), q + h, q, scores.as<float>(), stream);
    causal_probabilities_kernel<<<unsigned(rows), kRowThreads, 0, stream>>>(
        scores.as<float>(), probs.as<bf16>(), nullptr, lse + (std::size_t(b) * heads + first) * std::size_t(seq), seq);
    CUDA_CHECK_LAUNCH();
    // O[i][e] = Σ_j P[i][j]·V[j][e]
    gemm.run(g.matrix_times_rows(3 * h, h, false, false), q + 2 * h, probs.as<bf16>(),
             static_cast<bf16*>(out) + std::size_t(b) * std::size_t(seq) * std::size_t(h) + column, stream);
  });
}

void attention_backward_gemm(GemmHandle& gemm, const AttentionBackwardTensors& t, AttentionShape shape,
                             cudaStream_t stream, std::size_t workspace_bytes) {
  const void *qkv = t.qkv, *out = t.out, *dout = t.dout;
  const float* lse = t.lse;
  void* dqkv = t.dqkv;
  const int batch = shape.batch, seq = shape.seq, h = shape.h, heads = shape.heads;
  const AttentionLayout s = multi_head_layout(shape);
  AttentionLayout most = s;
  most.heads = heads_per_call(s, 2 * sizeof(float) + sizeof(bf16), workspace_bytes);
  StreamScratch scores(squares(most) * sizeof(float), stream), probs(squares(most) * sizeof(bf16), stream),
      dp(squares(most) * sizeof(float), stream), delta(std::size_t(batch) * heads * seq * sizeof(float), stream);
  attention_delta(out, dout, delta.as<float>(), s, DType::BF16, stream);
  for_head_groups(s, most.heads, [&](int b, int first, const AttentionLayout& part) {
    const HeadGemms g{part};
    const std::size_t column = std::size_t(first) * std::size_t(s.d), rows = std::size_t(part.heads) * std::size_t(seq);
    const std::size_t qkv_at = std::size_t(b) * std::size_t(seq) * 3 * std::size_t(h) + column;
    const std::size_t out_at = std::size_t(b) * std::size_t(seq) * std::size_t(h) + column;
    const std::size_t stats_at = (std::size_t(b) * heads + first) * std::size_t(seq);
    const bf16* q = static_cast<const bf16*>(qkv) + qkv_at;
    const bf16* d_o = static_cast<const bf16*>(dout) + out_at;
    bf16* dq = static_cast<bf16*>(dqkv) + qkv_at;

    gemm.run(g.rows_dot_rows(3 * h, 3 * h, s.scale), q + h, q, scores.as<float>(), stream);  // S again
    causal_probabilities_kernel<<<unsigned(rows), kRowThreads, 0, stream>>>(
        scores.as<float>(), probs.as<bf16>(), lse + stats_at, nullptr, seq);
    CUDA_CHECK_LAUNCH();
    // dV[j][e] += Σ_i P[i][j]·dO[i][e]
    gemm.run(g.matrix_times_rows(h, 3 * h, true, true), d_o, probs.as<bf16>(), dq + 2 * h, stream);
    // dP[i][j] = Σ_e dO[i][e]·V[j][e]
    gemm.run(g.rows_dot_rows(h, 3 * h, 1.0f), q + 2 * h, d_o, dp.as<float>(), stream);
    causal_score_grad_kernel<<<unsigned(rows), kRowThreads, 0, stream>>>(
        scores.as<float>(), lse + stats_at, dp.as<float>(), delta.as<float>() + stats_at, probs.as<bf16>(), seq,
        s.scale);
    CUDA_CHECK_LAUNCH();
    // dQ[i][e] += Σ_j dS[i][j]·K[j][e];  dK[j][e] += Σ_i dS[i][j]·Q[i][e]
    gemm.run(g.matrix_times_rows(3 * h, 3 * h, false, true), q + h, probs.as<bf16>(), dq, stream);
    gemm.run(g.matrix_times_rows(3 * h, 3 * h, true, true), q, probs.as<bf16>(), dq + h, stream);
  });
}

}  // namespace pipesim::runtime::cuda
