#pragma once
/// Row-major GEMMs on cuBLASLt: the three products the CPU runtime uses (cpu::matmul, matmul_bt,
/// matmul_at), on device pointers, in fp32 or bf16.
///
/// Types: A and B share one element type; C has its own. Allowed: {F32, F32} (fp32 math, no TF32 --
/// the correctness path), {BF16, BF16} and {BF16, F32} (bf16 inputs, fp32 accumulate; the F32 output
/// keeps weight gradients accumulating in fp32). Anything else throws CudaError.
///
/// Fused linear-layer products (linear_bias, linear_bias_gelu, matmul_bt_dgelu, matmul_at_bgrad) run
/// cuBLASLt epilogues so that a bias, a residual, GELU or a bias gradient costs no pass of its own.
/// cuBLASLt does not offer every epilogue for every type, shape and alignment: those calls return
/// false, having written nothing, and the caller runs the unfused products and kernels instead.
#include <cstddef>
#include <map>
#include <set>
#include <vector>

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
///
/// Autotuning: the heuristic's first answer is often not the fastest (94 % of cuBLAS's own at bf16
/// 8192³), so on a shape's first call the handle takes the heuristic's top kCandidates, times each
/// on the caller's stream (one warm-up launch, then kTimedLaunches between CUDA events) with every
/// output redirected to scratch memory, and keeps the fastest for the shape's later calls; the
/// caller's outputs are written once, by the chosen algorithm. That first call waits for the stream
/// (the timing is read on the host). A stream being captured into a CUDA graph cannot wait: such a
/// call runs the heuristic's first and the shape is tuned on its first call outside a capture. Where
/// the scratch cannot be allocated the heuristic's first stays. Results are bitwise repeatable for
/// one handle; two runs may pick different algorithms, whose roundings differ: autotuning off is
/// the repeatable choice.
class GemmHandle {
 public:
  /// Heuristic answers timed per shape, and launches timed per answer.
  static constexpr int kCandidates = 8, kTimedLaunches = 3;
  /// Whether handles autotune unless told: PIPESIM_GEMM_AUTOTUNE in the environment (read once),
  /// unset, "1" or "on" for yes, "0" or "off" for the heuristic's first answer; anything else throws
  /// CudaError.
  static bool autotune_by_default();

  /// 32 MiB: what cuBLAS recommends for Hopper; Ampere needs less. `sm_count` > 0 tells cuBLASLt's
  /// heuristics how many SMs the caller's streams run on (a green context's share), 0 the whole GPU;
  /// autotuning then times the candidates on those SMs, as the caller's stream runs in that share.
  explicit GemmHandle(std::size_t workspace_bytes = std::size_t(32) << 20, int sm_count = 0,
                      bool autotune = autotune_by_default());
  ~GemmHandle();
  GemmHandle(const GemmHandle&) = delete;
  GemmHandle& operator=(const GemmHandle&) = delete;

  /// What cuBLASLt does to the product before storing D (column-major D is m×n; vectors have m
  /// elements, one per row of D).
  enum class Epilogue {
    None,
    Bias,         ///< D = product + bias
    GeluAuxBias,  ///< aux = product + bias, D = gelu(aux) (tanh approximation)
    DGelu,        ///< D = product ∘ gelu'(aux)
    BiasGradA,    ///< D as None; bias_grad = Σ over k of op(A) (overwritten, not accumulated)
  };

  /// Column-major cuBLASLt call D = alpha·op(A)·op(B) + beta·C plus the epilogue; D is `c` and, unless
  /// `c_in` is given, C is too. The row-major wrappers below are the interface; this is the one place
  /// the cache and the launch live.
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
    Epilogue epilogue = Epilogue::None;
    /// m elements: the bias read (Bias, GeluAuxBias) or the bias gradient written (BiasGradA).
    const void* bias = nullptr;
    DType bias_type = DType::F32;
    /// GeluAuxBias writes, DGelu reads: m×n column-major in the output type, leading dimension
    /// `ld_aux` (a multiple of 8, >= m).
    const void* aux = nullptr;
    long long ld_aux = 0;
    /// C when it is not D (accumulate only): D = product + C leaves C as it was. Same type and
    /// leading dimension as D.
    const void* c_in = nullptr;
  };
  /// Throws CudaError when cuBLASLt has no algorithm for the call.
  void run(const Call& call, const void* a, const void* b, void* c, cudaStream_t stream);
  /// As run(), but returns false, having launched nothing, when cuBLASLt has no algorithm for the
  /// call's epilogue with these types, shape and alignments (remembered: later calls of that kind
  /// return false at once). Calls without an epilogue behave as run().
  bool try_run(const Call& call, const void* a, const void* b, void* c, cudaStream_t stream);

  bool autotune() const { return autotune_; }
  /// Shapes cached so far, and those whose algorithm was chosen by timing (for tests of the cache).
  std::size_t cached_plans() const { return plans_.size(); }
  std::size_t tuned_plans() const { return tuned_plans_; }
  /// The algorithm of the last call that launched one (for tests: a cached shape keeps its choice).
  const cublasLtMatmulAlgo_t& last_algorithm() const { return last_algorithm_; }

 private:
  /// A named type around cuBLASLt's unnamed struct: nvcc 13 stops with an internal error on a
  /// std::vector of the latter.
  struct Candidate {
    cublasLtMatmulAlgo_t algo;
  };
  struct Plan {
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
    cublasLtMatmulAlgo_t algo{};  ///< what calls launch: the heuristic's first until tuned
    /// The heuristic's answers, best first, still to be timed: empty once chosen or when there is
    /// nothing to choose from (autotuning off, one answer).
    std::vector<Candidate> candidates;
  };
  /// The call's shape, types, batch and epilogue plus the alignments (bytes, up to 256) of every
  /// pointer: cuBLASLt picks algorithms by the alignment it is promised.
  struct Key {
    bool transpose_a, transpose_b;
    int m, n, k, lda, ldb, ldc;
    DType inputs, output;
    int batch;
    long long stride_a, stride_b, stride_c;
    Epilogue epilogue;
    DType bias_type;
    long long ld_aux;
    bool separate_c;
    int align_a, align_b, align_c, align_c_in, align_bias, align_aux;
    auto operator<=>(const Key&) const = default;
  };
  Key key_of(const Call& call, const void* a, const void* b, const void* c) const;
  /// Null plan descriptors when cuBLASLt has no algorithm and `optional` is set; throws otherwise.
  Plan make_plan(const Call& call, const Key& key, bool optional);
  /// cuBLASLt's best algorithm for the plan's descriptors within the workspace and the key's
  /// alignments, into plan.algo, and with autotuning its next best into plan.candidates; `found` is
  /// 0 where there is none. Returns cuBLASLt's status.
  cublasStatus_t find_algorithm(Plan& plan, const Key& key, int& found) const;
  /// Points the plan's descriptor at this call's bias and aux and launches `algo`.
  cublasStatus_t launch(const Plan& plan, const cublasLtMatmulAlgo_t& algo, const Call& call, const void* a,
                        const void* b, void* c, cudaStream_t stream);
  /// Times plan.candidates on `stream` into scratch outputs and keeps the fastest that launched in
  /// plan.algo (see the class comment); leaves the plan as it was under graph capture.
  void tune(Plan& plan, const Call& call, const void* a, const void* b, const void* c, cudaStream_t stream);
  bool run_checked(const Call& call, const void* a, const void* b, void* c, cudaStream_t stream, bool optional);

  cublasLtHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
  std::size_t workspace_bytes_ = 0;
  int sm_count_ = 0;
  bool autotune_ = true;
  std::size_t tuned_plans_ = 0;
  cublasLtMatmulAlgo_t last_algorithm_{};
  std::map<Key, Plan> plans_;
  std::set<Key> unsupported_;
};

/// The sizes of a plain product, as each of matmul, matmul_bt and matmul_at names them below (for
/// matmul: C n×m = A n×k · B k×m). No defaults: -Wmissing-field-initializers catches one left out.
struct GemmShape {
  int n, k, m;
};

/// A plain product's operands: C from A and B, in the layouts each product states.
struct MatmulTensors {
  const void* a;
  const void* b;
  void* c;  ///< written, or added to with `accumulate`
};

/// C (n×m) = A (n×k) · B (k×m); with `accumulate`, C += instead.
void matmul(GemmHandle& gemm, const MatmulTensors& t, GemmShape shape, GemmTypes types, bool accumulate,
            cudaStream_t stream);
/// C (n×m) = A (n×k) · Bᵀ, B stored m×k (a linear layer's dx from dy and W, or logits = X·Wᵀ).
/// cpu::matmul_bt always accumulates: pass accumulate = true to match it.
void matmul_bt(GemmHandle& gemm, const MatmulTensors& t, GemmShape shape, GemmTypes types, bool accumulate,
               cudaStream_t stream);
/// C (k×m) = Aᵀ · B, A stored n×k and B n×m (a weight gradient). cpu::matmul_at always accumulates.
void matmul_at(GemmHandle& gemm, const MatmulTensors& t, GemmShape shape, GemmTypes types, bool accumulate,
               cudaStream_t stream);

// Fused linear-layer products: row-major, activations and weights in `dtype` (F32 or BF16), biases
// and bias gradients fp32 (where cuBLASLt takes no fp32 bias with a bf16 output, the bias epilogues
// use a bf16 copy made for the call). Each returns false, having written nothing, where cuBLASLt has
// no such epilogue here (see GemmHandle::try_run).

/// A linear map's sizes: n rows (tokens) through W (in×out), from width `in` to width `out`.
struct LinearShape {
  int n, in, out;
};

struct LinearBiasTensors {
  const void* x;         ///< n×in
  const void* w;         ///< in×out
  const float* bias;     ///< out floats
  const void* residual;  ///< n×out, or null: none
  void* y;               ///< n×out (written)
};
/// y (n×out) = x (n×in)·W (in×out) + bias, plus `residual` (n×out, may be null) when given: a linear
/// layer and the residual connection after it in one pass.
bool linear_bias(GemmHandle& gemm, const LinearBiasTensors& t, LinearShape shape, DType dtype, cudaStream_t stream);

struct LinearBiasGeluTensors {
  const void* x;      ///< n×in
  const void* w;      ///< in×out
  const float* bias;  ///< out floats
  void* pre;          ///< n×out: x·W + bias (written)
  void* y;            ///< n×out: gelu(pre) (written)
};
/// pre (n×out) = x·W + bias and y = gelu(pre), the tanh approximation; pre is what the backward
/// needs. out must be a multiple of 8.
bool linear_bias_gelu(GemmHandle& gemm, const LinearBiasGeluTensors& t, LinearShape shape, DType dtype,
                      cudaStream_t stream);

struct MatmulBtDgeluTensors {
  const void* dy;   ///< n×out
  const void* w;    ///< in×out
  const void* pre;  ///< n×in: the pre-activation of the GELU before the linear map
  void* dx;         ///< n×in (written)
};
/// dx (n×in) = (dy (n×out)·Wᵀ) ∘ gelu'(pre), pre n×in; dx is overwritten (the linear layer's input
/// gradient through the GELU before it). in must be a multiple of 8.
bool matmul_bt_dgelu(GemmHandle& gemm, const MatmulBtDgeluTensors& t, LinearShape shape, DType dtype,
                     cudaStream_t stream);

struct MatmulAtBgradTensors {
  const void* x;   ///< n×in
  const void* dy;  ///< n×out
  void* dw;        ///< in×out (written, or added to with `accumulate`)
  float* dbias;    ///< out floats (written)
};
/// dW (in×out) = xᵀ·dy (+= with `accumulate`) and dbias (out, fp32) = the column sums of dy,
/// overwritten: a weight gradient and its bias gradient in one pass. types.output F32.
bool matmul_at_bgrad(GemmHandle& gemm, const MatmulAtBgradTensors& t, LinearShape shape, GemmTypes types,
                     bool accumulate, cudaStream_t stream);

}  // namespace pipesim::runtime::cuda
