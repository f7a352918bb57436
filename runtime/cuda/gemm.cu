#include "gemm.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>

#include "check.h"

namespace pipesim::runtime::cuda {
namespace {

cudaDataType_t cuda_type(DType t) {
  switch (t) {
    case DType::F32: return CUDA_R_32F;
    case DType::BF16: return CUDA_R_16BF;
    case DType::F64: break;
  }
  throw CudaError("GEMM: fp64 is not a GEMM type here");
}

void check_types(GemmTypes t) {
  const bool ok = (t.inputs == DType::F32 && t.output == DType::F32) || (t.inputs == DType::BF16 && t.output != DType::F64);
  if (!ok)
    throw CudaError(std::string("GEMM: unsupported types: inputs ") + std::string(dtype_name(t.inputs)) +
                    ", output " + std::string(dtype_name(t.output)) +
                    " (use f32/f32, bf16/bf16 or bf16/f32)");
}

/// The largest power of two (up to 256) dividing the address: cuBLASLt picks algorithms by the
/// alignment it is promised, so the promise is part of the plan's key.
int alignment_of(const void* p) {
  const auto address = reinterpret_cast<std::uintptr_t>(p);
  int alignment = 256;
  while (alignment > 1 && address % std::uintptr_t(alignment) != 0) alignment /= 2;
  return alignment;
}

void destroy(cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
             cublasLtMatrixLayout_t c) noexcept {
  if (c) static_cast<void>(cublasLtMatrixLayoutDestroy(c));
  if (b) static_cast<void>(cublasLtMatrixLayoutDestroy(b));
  if (a) static_cast<void>(cublasLtMatrixLayoutDestroy(a));
  if (desc) static_cast<void>(cublasLtMatmulDescDestroy(desc));
}

}  // namespace

GemmHandle::GemmHandle(std::size_t workspace_bytes) : workspace_bytes_(workspace_bytes) {
  CUBLAS_CHECK(cublasLtCreate(&handle_));
  if (workspace_bytes_ > 0) {
    if (const cudaError_t status = cudaMalloc(&workspace_, workspace_bytes_); status != cudaSuccess) {
      static_cast<void>(cublasLtDestroy(handle_));
      CUDA_CHECK(status);
    }
  }
}

GemmHandle::~GemmHandle() {
  for (auto& [key, plan] : plans_) destroy(plan.desc, plan.a, plan.b, plan.c);
  if (workspace_) static_cast<void>(cudaFree(workspace_));
  if (handle_) static_cast<void>(cublasLtDestroy(handle_));
}

GemmHandle::Plan GemmHandle::make_plan(const Call& call, int align_a, int align_b, int align_c) {
  Plan plan;
  try {
    // CUBLAS_COMPUTE_32F: fp32 accumulate; unlike CUBLAS_COMPUTE_32F_FAST_TF32, never TF32.
    CUBLAS_CHECK(cublasLtMatmulDescCreate(&plan.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t op_a = call.transpose_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasOperation_t op_b = call.transpose_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof(op_a)));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof(op_b)));
    // Stored shapes (before op): A is m×k or, transposed, k×m; likewise B.
    const auto in = cuda_type(call.types.inputs), out = cuda_type(call.types.output);
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan.a, in, call.transpose_a ? call.k : call.m,
                                            call.transpose_a ? call.m : call.k, call.lda));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan.b, in, call.transpose_b ? call.n : call.k,
                                            call.transpose_b ? call.k : call.n, call.ldb));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan.c, out, call.m, call.n, call.ldc));
    if (call.batch > 1) {
      const std::int32_t count = call.batch;
      const std::pair<cublasLtMatrixLayout_t, std::int64_t> layouts[] = {
          {plan.a, call.stride_a}, {plan.b, call.stride_b}, {plan.c, call.stride_c}};
      for (const auto& [layout, stride] : layouts) {
        CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof(count)));
        CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride,
                                                      sizeof(stride)));
      }
    }

    cublasLtMatmulPreference_t preference = nullptr;
    CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&preference));
    const std::uint64_t workspace = workspace_bytes_;
    const std::uint32_t alignments[3] = {std::uint32_t(align_a), std::uint32_t(align_b), std::uint32_t(align_c)};
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    cublasStatus_t status = cublasLtMatmulPreferenceSetAttribute(
        preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace, sizeof(workspace));
    const cublasLtMatmulPreferenceAttributes_t alignment_attributes[3] = {
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES};
    for (int i = 0; i < 3 && status == CUBLAS_STATUS_SUCCESS; ++i)
      status = cublasLtMatmulPreferenceSetAttribute(preference, alignment_attributes[i], &alignments[i],
                                                    sizeof(alignments[i]));
    // D is C here, so its alignment is C's.
    if (status == CUBLAS_STATUS_SUCCESS)
      status = cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
                                                    &alignments[2], sizeof(alignments[2]));
    if (status == CUBLAS_STATUS_SUCCESS)
      status = cublasLtMatmulAlgoGetHeuristic(handle_, plan.desc, plan.a, plan.b, plan.c, plan.c, preference, 1,
                                              &result, &found);
    static_cast<void>(cublasLtMatmulPreferenceDestroy(preference));
    CUBLAS_CHECK(status);
    if (found == 0)
      throw CudaError("cublasLtMatmulAlgoGetHeuristic: no algorithm for m=" + std::to_string(call.m) +
                      " n=" + std::to_string(call.n) + " k=" + std::to_string(call.k) + " (" +
                      std::string(dtype_name(call.types.inputs)) + " -> " +
                      std::string(dtype_name(call.types.output)) + ")");
    plan.algo = result.algo;
  } catch (...) {
    destroy(plan.desc, plan.a, plan.b, plan.c);
    throw;
  }
  return plan;
}

void GemmHandle::run(const Call& call, const void* a, const void* b, void* c, cudaStream_t stream) {
  check_types(call.types);
  if (call.m == 0 || call.n == 0) return;
  if (call.k == 0) {  // an empty sum: C = 0, or C unchanged when accumulating
    if (!call.accumulate)
      CUDA_CHECK(cudaMemset2DAsync(c, std::size_t(call.ldc) * element_size(call.types.output), 0,
                                   std::size_t(call.m) * element_size(call.types.output), std::size_t(call.n),
                                   stream));
    return;
  }
  const int align_a = alignment_of(a), align_b = alignment_of(b), align_c = alignment_of(c);
  const Key key{call.transpose_a, call.transpose_b, call.m,        call.n,        call.k,
                call.lda,         call.ldb,         call.ldc,      call.types.inputs, call.types.output,
                align_a,          align_b,          align_c,       call.batch,    call.stride_a,
                call.stride_b,    call.stride_c};
  auto found = plans_.find(key);
  if (found == plans_.end()) found = plans_.emplace(key, make_plan(call, align_a, align_b, align_c)).first;
  const Plan& plan = found->second;
  const float alpha = call.alpha, beta = call.accumulate ? 1.0f : 0.0f;
  CUBLAS_CHECK(cublasLtMatmul(handle_, plan.desc, &alpha, a, plan.a, b, plan.b, &beta, c, plan.c, c, plan.c,
                              &plan.algo, workspace_, workspace_bytes_, stream));
}

// Row-major X is column-major Xᵀ with the same leading dimension, so each row-major product
// C = op(A)·op(B) runs as the column-major Cᵀ = op(B)ᵀ·op(A)ᵀ: cuBLAS's A is our B and its B our A.

void matmul(GemmHandle& gemm, const void* a, const void* b, void* c, int n, int k, int m, GemmTypes types,
            bool accumulate, cudaStream_t stream) {
  const GemmHandle::Call call{.m = m, .n = n, .k = k, .lda = m, .ldb = k, .ldc = m, .types = types, .accumulate = accumulate};
  gemm.run(call, b, a, c, stream);
}

void matmul_bt(GemmHandle& gemm, const void* a, const void* b, void* c, int n, int k, int m, GemmTypes types,
               bool accumulate, cudaStream_t stream) {
  const GemmHandle::Call call{.transpose_a = true, .m = m, .n = n, .k = k, .lda = k, .ldb = k, .ldc = m, .types = types,
                              .accumulate = accumulate};
  gemm.run(call, b, a, c, stream);
}

void matmul_at(GemmHandle& gemm, const void* a, const void* b, void* c, int n, int k, int m, GemmTypes types,
               bool accumulate, cudaStream_t stream) {
  const GemmHandle::Call call{.transpose_b = true, .m = m, .n = k, .k = n, .lda = m, .ldb = k, .ldc = m, .types = types,
                              .accumulate = accumulate};
  gemm.run(call, b, a, c, stream);
}

}  // namespace pipesim::runtime::cuda
