#pragma once
/// Row-major GEMMs on cuBLASLt: the three products the CPU runtime uses (cpu::matmul, matmul_bt,
/// matmul_at), on device pointers, in fp32 or bf16.
///
/// Types: A and B share one element type; C has its own. Allowed: {F32, F32} (fp32 math, no TF32 --
/// the correctness path), {BF16, BF16} and {BF16, F32} (bf16 inputs, fp32 accumulate; the F32 output
/// keeps weight gradients accumulating in fp32). Anything else throws CudaError.
#include <cstddef>
#include <map>
#include <tuple>

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include "dtype.h"

namespace pipesim::runtime::cuda {

struct GemmTypes {
  DType inputs = DType::F32;  ///< A and B
  DType output = DType::F32;  ///< C
};

/// Owns a cuBLASLt handle, a workspace and the descriptors and chosen algorithm of every shape it has
/// run, so a repeated shape costs one cublasLtMatmul call and no heuristic query. One GemmHandle per
/// host thread (not thread-safe); the device it was created on is the one it runs on.
class GemmHandle {
 public:
  /// 32 MiB: what cuBLAS recommends for Hopper; Ampere needs less.
  explicit GemmHandle(std::size_t workspace_bytes = std::size_t(32) << 20);
  ~GemmHandle();
  GemmHandle(const GemmHandle&) = delete;
  GemmHandle& operator=(const GemmHandle&) = delete;

  /// Column-major cuBLASLt call D = alpha·op(A)·op(B) + beta·C with D = C. The row-major wrappers
  /// below are the interface; this is the one place the cache and the launch live.
  struct Call {
    bool transpose_a = false, transpose_b = false;
    int m = 0, n = 0, k = 0;  ///< op(A) is m×k, op(B) k×n, C m×n (column-major)
    int lda = 0, ldb = 0, ldc = 0;
    GemmTypes types;
    bool accumulate = false;  ///< beta = 1 (else 0)
    float alpha = 1.0f;       ///< D = alpha·op(A)·op(B) (+ C)
    /// Strided batch: `batch` products, the i-th on A + i·stride_a, B + i·stride_b, C + i·stride_c
    /// (strides in elements).
    int batch = 1;
    long long stride_a = 0, stride_b = 0, stride_c = 0;
  };
  void run(const Call& call, const void* a, const void* b, void* c, cudaStream_t stream);

  /// Shapes cached so far (for tests of the cache).
  std::size_t cached_plans() const { return plans_.size(); }

 private:
  struct Plan {
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
    cublasLtMatmulAlgo_t algo{};
  };
  /// The call's shape, types and batch plus the alignments (bytes, up to 256) of A, B and C.
  using Key = std::tuple<bool, bool, int, int, int, int, int, int, DType, DType, int, int, int, int, long long,
                         long long, long long>;
  Plan make_plan(const Call& call, int align_a, int align_b, int align_c);

  cublasLtHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
  std::size_t workspace_bytes_ = 0;
  std::map<Key, Plan> plans_;
};

/// C (n×m) = A (n×k) · B (k×m); with `accumulate`, C += instead.
void matmul(GemmHandle& gemm, const void* a, const void* b, void* c, int n, int k, int m, GemmTypes types,
            bool accumulate, cudaStream_t stream);
/// C (n×m) = A (n×k) · Bᵀ, B stored m×k (a linear layer's dx from dy and W, or logits = X·Wᵀ).
/// cpu::matmul_bt always accumulates: pass accumulate = true to match it.
void matmul_bt(GemmHandle& gemm, const void* a, const void* b, void* c, int n, int k, int m, GemmTypes types,
               bool accumulate, cudaStream_t stream);
/// C (k×m) = Aᵀ · B, A stored n×k and B n×m (a weight gradient). cpu::matmul_at always accumulates.
void matmul_at(GemmHandle& gemm, const void* a, const void* b, void* c, int n, int k, int m, GemmTypes types,
               bool accumulate, cudaStream_t stream);

}  // namespace pipesim::runtime::cuda
