#include "gemm.h"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <utility>

#include "check.h"
#include "device_util.cuh"
#include "kernels.h"

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


cublasLtEpilogue_t epilogue_of(GemmHandle::Epilogue e) {
  switch (e) {
    case GemmHandle::Epilogue::None: return CUBLASLT_EPILOGUE_DEFAULT;
    case GemmHandle::Epilogue::Bias: return CUBLASLT_EPILOGUE_BIAS;
    case GemmHandle::Epilogue::GeluAuxBias: return CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    case GemmHandle::Epilogue::DGelu: return CUBLASLT_EPILOGUE_DGELU;
    case GemmHandle::Epilogue::BiasGradA: return CUBLASLT_EPILOGUE_BGRADA;
  }
  return CUBLASLT_EPILOGUE_DEFAULT;
}

bool uses_bias(GemmHandle::Epilogue e) {
  return e == GemmHandle::Epilogue::Bias || e == GemmHandle::Epilogue::GeluAuxBias ||
         e == GemmHandle::Epilogue::BiasGradA;
}
bool uses_aux(GemmHandle::Epilogue e) {
  return e == GemmHandle::Epilogue::GeluAuxBias || e == GemmHandle::Epilogue::DGelu;
}

/// cuBLASLt's answers that mean "not for this call", as opposed to a failure of the library.
bool unsupported(cublasStatus_t status) {
  return status == CUBLAS_STATUS_NOT_SUPPORTED || status == CUBLAS_STATUS_INVALID_VALUE;
}

/// The operands' transposes and, under a green context, the SMs the heuristics plan for.
void set_operations(cublasLtMatmulDesc_t desc, const GemmHandle::Call& call, int sm_count) {
  const cublasOperation_t op_a = call.transpose_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_b = call.transpose_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof(op_a)));
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof(op_b)));
  if (sm_count > 0) {
    const std::int32_t sms = sm_count;
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET, &sms, sizeof(sms)));
  }
}

/// The call's epilogue and the attributes it needs: cuBLASLt's status rather than a throw, so that
/// an optional call falls back where cuBLASLt has no such epilogue.
cublasStatus_t set_epilogue(cublasLtMatmulDesc_t desc, const GemmHandle::Call& call) {
  const auto epilogue = std::uint32_t(epilogue_of(call.epilogue));
  cublasStatus_t status =
      cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue));
  if (status == CUBLAS_STATUS_SUCCESS && uses_bias(call.epilogue)) {
    const auto bias_type = std::int32_t(cuda_type(call.bias_type));
    status = cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type, sizeof(bias_type));
  }
  if (status == CUBLAS_STATUS_SUCCESS && uses_aux(call.epilogue)) {
    const std::int64_t ld = call.ld_aux;
    status = cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld, sizeof(ld));
  }
  // The heuristics read the pointers' alignment from the descriptor.
  if (status == CUBLAS_STATUS_SUCCESS && uses_bias(call.epilogue))
    status = cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &call.bias, sizeof(call.bias));
  if (status == CUBLAS_STATUS_SUCCESS && uses_aux(call.epilogue))
    status = cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &call.aux,
                                            sizeof(call.aux));
  return status;
}

/// The layouts of A, B and C, each set as soon as it is made (the caller destroys what was made when
/// a later call throws), with the batch's count and strides.
void make_layouts(const GemmHandle::Call& call, cublasLtMatrixLayout_t& a, cublasLtMatrixLayout_t& b,
                  cublasLtMatrixLayout_t& c) {
  // Stored shapes (before op): A is m×k or, transposed, k×m; likewise B.
  const auto in = cuda_type(call.types.inputs), out = cuda_type(call.types.output);
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&a, in, call.transpose_a ? call.k : call.m,
                                          call.transpose_a ? call.m : call.k, call.lda));
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&b, in, call.transpose_b ? call.n : call.k,
                                          call.transpose_b ? call.k : call.n, call.ldb));
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&c, out, call.m, call.n, call.ldc));
  if (call.batch <= 1) return;
  const std::int32_t count = call.batch;
  const std::pair<cublasLtMatrixLayout_t, std::int64_t> layouts[] = {
      {a, call.stride_a}, {b, call.stride_b}, {c, call.stride_c}};
  for (const auto& [layout, stride] : layouts) {
    CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof(count)));
    CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride,
                                                  sizeof(stride)));
  }
}

/// Bytes from the first element to one past the last of `batch` column-major rows×cols matrices
/// (leading dimension ld) `stride` elements apart, rounded up to 256 so a buffer after it stays
/// aligned as cudaMalloc's are.
std::size_t span_bytes(long long rows, long long cols, long long ld, int batch, long long stride, DType type) {
  const auto elements = std::size_t((cols - 1) * ld + rows + (batch - 1) * stride);
  return (elements * element_size(type) + 255) / 256 * 256;
}

/// A candidate's timed launches: between its two events.
struct Timed {
  std::size_t candidate;
  cudaEvent_t start, stop;
};

/// CUDA events (with timing) made one by one, destroyed with this.
class Events {
 public:
  Events() = default;
  ~Events() {
    for (cudaEvent_t e : events_) static_cast<void>(cudaEventDestroy(e));
  }
  Events(const Events&) = delete;
  Events& operator=(const Events&) = delete;
  cudaEvent_t add() {
    cudaEvent_t e = nullptr;
    CUDA_CHECK(cudaEventCreate(&e));
    events_.push_back(e);
    return e;
  }

 private:
  std::vector<cudaEvent_t> events_;
};

[[noreturn]] void throw_no_algorithm(const GemmHandle::Call& call) {
  throw CudaError("cublasLtMatmulAlgoGetHeuristic: no algorithm for m=" + std::to_string(call.m) +
                  " n=" + std::to_string(call.n) + " k=" + std::to_string(call.k) + " (" +
                  std::string(dtype_name(call.types.inputs)) + " -> " + std::string(dtype_name(call.types.output)) +
                  ")");
}

}  // namespace

bool GemmHandle::autotune_by_default() {
  static const bool on = [] {
    const char* value = std::getenv("PIPESIM_GEMM_AUTOTUNE");
    const std::string choice = value != nullptr ? value : "";
    if (choice.empty() || choice == "1" || choice == "on") return true;
    if (choice == "0" || choice == "off") return false;
    throw CudaError("PIPESIM_GEMM_AUTOTUNE=" + choice + ": expected 1, on, 0 or off");
  }();
  return on;
}

GemmHandle::GemmHandle(std::size_t workspace_bytes, int sm_count, bool autotune)
    : workspace_bytes_(workspace_bytes), sm_count_(sm_count), autotune_(autotune) {
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

GemmHandle::Key GemmHandle::key_of(const Call& call, const void* a, const void* b, const void* c) const {
  const bool separate_c = call.accumulate && call.c_in != nullptr && call.c_in != c;
  const bool bias = uses_bias(call.epilogue), aux = uses_aux(call.epilogue);
  return Key{.transpose_a = call.transpose_a,
             .transpose_b = call.transpose_b,
             .m = call.m,
             .n = call.n,
             .k = call.k,
             .lda = call.lda,
             .ldb = call.ldb,
             .ldc = call.ldc,
             .inputs = call.types.inputs,
             .output = call.types.output,
             .batch = call.batch,
             .stride_a = call.stride_a,
             .stride_b = call.stride_b,
             .stride_c = call.stride_c,
             .epilogue = call.epilogue,
             .bias_type = bias ? call.bias_type : DType::F32,
             .ld_aux = aux ? call.ld_aux : 0,
             .separate_c = separate_c,
             .align_a = alignment_of(a),
             .align_b = alignment_of(b),
             .align_c = alignment_of(c),
             .align_c_in = separate_c ? alignment_of(call.c_in) : 0,
             .align_bias = bias ? alignment_of(call.bias) : 0,
             .align_aux = aux ? alignment_of(call.aux) : 0};
}

GemmHandle::Plan GemmHandle::make_plan(const Call& call, const Key& key, bool optional) {
  Plan plan;
  try {
    // CUBLAS_COMPUTE_32F: fp32 accumulate; unlike CUBLAS_COMPUTE_32F_FAST_TF32, never TF32.
    CUBLAS_CHECK(cublasLtMatmulDescCreate(&plan.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    set_operations(plan.desc, call, sm_count_);
    const cublasStatus_t epilogue_status = set_epilogue(plan.desc, call);
    if (optional && unsupported(epilogue_status)) {
      destroy(plan.desc, nullptr, nullptr, nullptr);
      return Plan{};
    }
    CUBLAS_CHECK(epilogue_status);
    make_layouts(call, plan.a, plan.b, plan.c);
    int found = 0;
    const cublasStatus_t status = find_algorithm(plan, key, found);
    if (optional && (unsupported(status) || (status == CUBLAS_STATUS_SUCCESS && found == 0))) {
      destroy(plan.desc, plan.a, plan.b, plan.c);
      return Plan{};
    }
    CUBLAS_CHECK(status);
    if (found == 0) throw_no_algorithm(call);
  } catch (...) {
    destroy(plan.desc, plan.a, plan.b, plan.c);
    throw;
  }
  return plan;
}

cublasStatus_t GemmHandle::find_algorithm(Plan& plan, const Key& key, int& found) const {
  cublasLtMatmulPreference_t preference = nullptr;
  CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&preference));
  const std::uint64_t workspace = workspace_bytes_;
  // D is `c`; C is `c_in` when it is separate, else `c` too.
  const std::uint32_t alignments[4] = {std::uint32_t(key.align_a), std::uint32_t(key.align_b),
                                       std::uint32_t(key.separate_c ? key.align_c_in : key.align_c),
                                       std::uint32_t(key.align_c)};
  cublasLtMatmulHeuristicResult_t results[kCandidates]{};
  cublasStatus_t status = cublasLtMatmulPreferenceSetAttribute(
      preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace, sizeof(workspace));
  const cublasLtMatmulPreferenceAttributes_t alignment_attributes[4] = {
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
  for (int i = 0; i < 4 && status == CUBLAS_STATUS_SUCCESS; ++i)
    status = cublasLtMatmulPreferenceSetAttribute(preference, alignment_attributes[i], &alignments[i],
                                                  sizeof(alignments[i]));
  if (status == CUBLAS_STATUS_SUCCESS)
    status = cublasLtMatmulAlgoGetHeuristic(handle_, plan.desc, plan.a, plan.b, plan.c, plan.c, preference,
                                            autotune_ ? kCandidates : 1, results, &found);
  static_cast<void>(cublasLtMatmulPreferenceDestroy(preference));
  if (status != CUBLAS_STATUS_SUCCESS) return status;
  // The workspace preference should already exclude bigger ones; an answer cuBLASLt marks as
  // failed is no candidate either.
  plan.candidates.clear();
  for (int i = 0; i < found; ++i)
    if (results[i].state == CUBLAS_STATUS_SUCCESS && results[i].workspaceSize <= workspace_bytes_)
      plan.candidates.push_back({results[i].algo});
  found = int(plan.candidates.size());
  if (found > 0) plan.algo = plan.candidates.front().algo;
  if (found < 2) plan.candidates.clear();  // nothing to choose between
  return status;
}

void GemmHandle::tune(Plan& plan, const Call& call, const void* a, const void* b, const void* c,
                      cudaStream_t stream) {
  // The timing is read on the host, and a stream being captured into a graph cannot be waited for.
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &capture) != cudaSuccess) {
    static_cast<void>(cudaGetLastError());  // not left for the next launch check to find
    return;
  }
  if (capture != cudaStreamCaptureStatusNone) return;
  const std::vector<Candidate> candidates = std::exchange(plan.candidates, {});

  // Every output in scratch: D, and the GELU aux or the bias gradient where the epilogue writes one.
  // The caller's C is read (accumulate) but not written, so each trial sees the same inputs.
  const std::size_t d_bytes = span_bytes(call.m, call.n, call.ldc, call.batch, call.stride_c, call.types.output);
  const std::size_t aux_bytes = call.epilogue == Epilogue::GeluAuxBias
                                    ? span_bytes(call.m, call.n, call.ld_aux, 1, 0, call.types.output)
                                    : 0;
  const std::size_t bias_bytes =
      call.epilogue == Epilogue::BiasGradA ? span_bytes(call.m, 1, call.m, 1, 0, call.bias_type) : 0;
  std::unique_ptr<detail::StreamScratch> scratch;
  try {
    scratch = std::make_unique<detail::StreamScratch>(d_bytes + aux_bytes + bias_bytes, stream);
  } catch (const CudaError&) {
    static_cast<void>(cudaGetLastError());
    return;  // no memory to spare now: the heuristic's first stays
  }
  std::byte* d = scratch->as<std::byte>();
  Call trial = call;
  if (call.accumulate && call.c_in == nullptr) trial.c_in = c;  // C = the caller's, D = the scratch
  if (aux_bytes > 0) trial.aux = d + d_bytes;
  if (bias_bytes > 0) trial.bias = d + d_bytes + aux_bytes;

  Events events;
  std::vector<Timed> timed;
  for (std::size_t i = 0; i < candidates.size(); ++i) {
    // The warm-up launch: a candidate that cannot run this call (status not SUCCESS) is dropped.
    cublasStatus_t status = launch(plan, candidates[i].algo, trial, a, b, d, stream);
    if (status != CUBLAS_STATUS_SUCCESS) continue;
    const Timed t{i, events.add(), events.add()};
    CUDA_CHECK(cudaEventRecord(t.start, stream));
    for (int r = 0; r < kTimedLaunches && status == CUBLAS_STATUS_SUCCESS; ++r)
      status = launch(plan, candidates[i].algo, trial, a, b, d, stream);
    CUDA_CHECK(cudaEventRecord(t.stop, stream));
    if (status == CUBLAS_STATUS_SUCCESS) timed.push_back(t);
  }
  if (timed.empty()) return;  // the heuristic's first stays; the caller's launch reports its status
  CUDA_CHECK(cudaEventSynchronize(timed.back().stop));  // the stream's order: every stop before it too
  const Timed* best = nullptr;
  float best_ms = 0;
  for (const Timed& t : timed) {
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, t.start, t.stop));
    if (best == nullptr || ms < best_ms) best = &t, best_ms = ms;  // ties: the heuristic's order
  }
  plan.algo = candidates[best->candidate].algo;
  ++tuned_plans_;
}

cublasStatus_t GemmHandle::launch(const Plan& plan, const cublasLtMatmulAlgo_t& algo, const Call& call, const void* a,
                                  const void* b, void* c, cudaStream_t stream) {
  // A cached plan serves every call of its key: the vectors' addresses are this call's.
  if (uses_bias(call.epilogue)) {
    const cublasStatus_t status =
        cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &call.bias, sizeof(call.bias));
    if (status != CUBLAS_STATUS_SUCCESS) return status;
  }
  if (uses_aux(call.epilogue)) {
    const cublasStatus_t status = cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER,
                                                                 &call.aux, sizeof(call.aux));
    if (status != CUBLAS_STATUS_SUCCESS) return status;
  }
  const float alpha = call.alpha, beta = call.accumulate ? 1.0f : 0.0f;
  const void* c_in = call.accumulate && call.c_in != nullptr ? call.c_in : c;
  return cublasLtMatmul(handle_, plan.desc, &alpha, a, plan.a, b, plan.b, &beta, c_in, plan.c, c, plan.c, &algo,
                        workspace_, workspace_bytes_, stream);
}

bool GemmHandle::run_checked(const Call& call, const void* a, const void* b, void* c, cudaStream_t stream,
                             bool optional) {
  check_types(call.types);
  const bool fused = call.epilogue != Epilogue::None;
  optional = optional && fused;
  if (fused) {
    // Outside what this class plans for: batched epilogues, and empty products (whose epilogue
    // output would still be owed).
    if (call.batch > 1 || call.m == 0 || call.n == 0 || call.k == 0) {
      if (optional) return false;
      throw CudaError("GEMM: an epilogue needs a non-empty, unbatched product");
    }
    if (uses_aux(call.epilogue) && (call.ld_aux % 8 != 0 || call.ld_aux < call.m)) {
      if (optional) return false;
      throw CudaError("GEMM: the GELU aux leading dimension must be a multiple of 8 and >= m");
    }
  }
  if (call.m == 0 || call.n == 0) return true;
  if (call.k == 0) {  // an empty sum: C = 0, or C unchanged when accumulating
    const std::size_t element = element_size(call.types.output);
    const std::size_t pitch = std::size_t(call.ldc) * element, width = std::size_t(call.m) * element;
    if (!call.accumulate)
      CUDA_CHECK(cudaMemset2DAsync(c, pitch, 0, width, std::size_t(call.n), stream));
    else if (call.c_in != nullptr && call.c_in != c)
      CUDA_CHECK(cudaMemcpy2DAsync(c, pitch, call.c_in, pitch, width, std::size_t(call.n), cudaMemcpyDeviceToDevice,
                                   stream));
    return true;
  }
  const Key key = key_of(call, a, b, c);
  if (optional && unsupported_.contains(key)) return false;
  auto found = plans_.find(key);
  if (found == plans_.end()) {
    Plan plan = make_plan(call, key, optional);
    if (plan.desc == nullptr) {
      unsupported_.insert(key);
      return false;
    }
    found = plans_.emplace(key, plan).first;
  }
  Plan& plan = found->second;
  if (!plan.candidates.empty()) tune(plan, call, a, b, c, stream);  // the shape's first call
  const cublasStatus_t status = launch(plan, plan.algo, call, a, b, c, stream);
  if (optional && unsupported(status)) {
    unsupported_.insert(key);
    return false;
  }
  CUBLAS_CHECK(status);
  last_algorithm_ = plan.algo;
  return true;
}

void GemmHandle::run(const Call& call, const void* a, const void* b, void* c, cudaStream_t stream) {
  static_cast<void>(run_checked(call, a, b, c, stream, false));
}

bool GemmHandle::try_run(const Call& call, const void* a, const void* b, void* c, cudaStream_t stream) {
  return run_checked(call, a, b, c, stream, true);
}

// Row-major X is column-major Xᵀ with the same leading dimension, so each row-major product
// C = op(A)·op(B) runs as the column-major Cᵀ = op(B)ᵀ·op(A)ᵀ: cuBLAS's A is our B and its B our A.

void matmul(GemmHandle& gemm, const MatmulTensors& t, GemmShape shape, GemmTypes types, bool accumulate,
            cudaStream_t stream) {
  const auto [n, k, m] = shape;
  const GemmHandle::Call call{.m = m, .n = n, .k = k, .lda = m, .ldb = k, .ldc = m, .types = types, .accumulate = accumulate};
  gemm.run(call, t.b, t.a, t.c, stream);
}

void matmul_bt(GemmHandle& gemm, const MatmulTensors& t, GemmShape shape, GemmTypes types, bool accumulate,
               cudaStream_t stream) {
  const auto [n, k, m] = shape;
  const GemmHandle::Call call{.transpose_a = true, .m = m, .n = n, .k = k, .lda = k, .ldb = k, .ldc = m, .types = types,
                              .accumulate = accumulate};
  gemm.run(call, t.b, t.a, t.c, stream);
}

void matmul_at(GemmHandle& gemm, const MatmulTensors& t, GemmShape shape, GemmTypes types, bool accumulate,
               cudaStream_t stream) {
  const auto [n, k, m] = shape;
  const GemmHandle::Call call{.transpose_b = true, .m = m, .n = k, .k = n, .lda = m, .ldb = k, .ldc = m, .types = types,
                              .accumulate = accumulate};
  gemm.run(call, t.b, t.a, t.c, stream);
}

// The fused products. Column-major D is the row-major output transposed, so its rows (m) are the
// output's columns: the per-feature vectors (bias, bias gradient) have m elements, as cuBLASLt's
// epilogues want, and the GELU aux in row-major n×out is column-major out×n with leading dimension out.

namespace {

/// A bias epilogue with the fp32 bias (parameters stay fp32 in this runtime) or, where cuBLASLt only
/// takes a bias of the output type, a bf16 copy of it made for the call: a bf16 output is rounded
/// anyway, and the copy costs one tiny kernel where the unfused path costs a pass over the output.
bool run_with_bias(GemmHandle& gemm, GemmHandle::Call call, const void* a, const void* b, void* c, cudaStream_t stream) {
  if (gemm.try_run(call, a, b, c, stream)) return true;
  if (call.types.output != DType::BF16) return false;
  // Only the scratch copy is written if cuBLASLt refuses this too: the caller's outputs are not.
  const auto m = std::size_t(call.m);
  const detail::StreamScratch bias(m * element_size(DType::BF16), stream);
  convert(call.bias, DType::F32, bias.as<void>(), DType::BF16, m, stream);
  call.bias = bias.as<void>(), call.bias_type = DType::BF16;
  return gemm.try_run(call, a, b, c, stream);
}

}  // namespace

bool linear_bias(GemmHandle& gemm, const LinearBiasTensors& t, LinearShape shape, DType dtype, cudaStream_t stream) {
  const auto [n, in, out] = shape;
  const GemmHandle::Call call{.m = out, .n = n, .k = in, .lda = out, .ldb = in, .ldc = out, .types = {dtype, dtype},
                              .accumulate = t.residual != nullptr, .epilogue = GemmHandle::Epilogue::Bias,
                              .bias = t.bias, .c_in = t.residual};
  return run_with_bias(gemm, call, t.w, t.x, t.y, stream);
}

bool linear_bias_gelu(GemmHandle& gemm, const LinearBiasGeluTensors& t, LinearShape shape, DType dtype,
                      cudaStream_t stream) {
  const auto [n, in, out] = shape;
  const GemmHandle::Call call{.m = out, .n = n, .k = in, .lda = out, .ldb = in, .ldc = out, .types = {dtype, dtype},
                              .epilogue = GemmHandle::Epilogue::GeluAuxBias, .bias = t.bias, .aux = t.pre,
                              .ld_aux = out};
  return run_with_bias(gemm, call, t.w, t.x, t.y, stream);
}

bool matmul_bt_dgelu(GemmHandle& gemm, const MatmulBtDgeluTensors& t, LinearShape shape, DType dtype,
                     cudaStream_t stream) {
  const auto [n, in, out] = shape;
  const GemmHandle::Call call{.transpose_a = true, .m = in, .n = n, .k = out, .lda = out, .ldb = out, .ldc = in,
                              .types = {dtype, dtype}, .epilogue = GemmHandle::Epilogue::DGelu, .aux = t.pre,
                              .ld_aux = in};
  return gemm.try_run(call, t.w, t.dy, t.dx, stream);
}

bool matmul_at_bgrad(GemmHandle& gemm, const MatmulAtBgradTensors& t, LinearShape shape, GemmTypes types,
                     bool accumulate, cudaStream_t stream) {
  const auto [n, in, out] = shape;
  // cuBLAS's A is dy (out×n column-major): BGRADA sums it over k = n, one sum per output feature.
  const GemmHandle::Call call{.transpose_b = true, .m = out, .n = in, .k = n, .lda = out, .ldb = in, .ldc = out,
                              .types = types, .accumulate = accumulate, .epilogue = GemmHandle::Epilogue::BiasGradA,
                              .bias = t.dbias};
  return gemm.try_run(call, t.dy, t.x, t.dw, stream);
}

}  // namespace pipesim::runtime::cuda
