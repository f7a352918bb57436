// Causal attention on cuDNN's fused flash-attention engines (attention_cudnn.h): the operation
// graphs, plan building and caching, and execution. Built with or without cuDNN: without it
// (PIPESIM_HAVE_CUDNN undefined) every entry point says "not here" and bf16 attention stays on
// attention_gemm.h.
#include "attention_cudnn.h"

#include <cstdlib>
#include <mutex>
#include <string>

#include "check.h"

#ifndef PIPESIM_HAVE_CUDNN

namespace pipesim::runtime::cuda {

bool cudnn_attention_built() { return false; }
bool use_cudnn_attention() { return false; }
bool attention_forward_cudnn(const AttentionForwardTensors&, AttentionShape, cudaStream_t) { return false; }
bool attention_backward_cudnn(const AttentionBackwardTensors&, AttentionShape, cudaStream_t, bool) { return false; }
std::string cudnn_attention_last_problem() { return "this build has no cuDNN"; }

}  // namespace pipesim::runtime::cuda

#else

#include <cudnn.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <deque>
#include <initializer_list>
#include <limits>
#include <map>
#include <memory>
#include <set>
#include <tuple>
#include <utility>
#include <vector>

namespace pipesim::runtime::cuda {
namespace {

using Dims = std::vector<std::int64_t>;

/// One backend descriptor: created on construction, destroyed with the object; typed setters so a
/// call site reads as "attribute = value".
class Descriptor {
 public:
  explicit Descriptor(cudnnBackendDescriptorType_t type) : type_(type) {
    CUDNN_CHECK(cudnnBackendCreateDescriptor(type, &desc_));
  }
  ~Descriptor() {
    if (desc_ != nullptr) static_cast<void>(cudnnBackendDestroyDescriptor(desc_));
  }
  Descriptor(Descriptor&& other) noexcept : desc_(std::exchange(other.desc_, nullptr)), type_(other.type_) {}
  Descriptor& operator=(Descriptor&&) = delete;
  Descriptor(const Descriptor&) = delete;
  Descriptor& operator=(const Descriptor&) = delete;

  cudnnBackendDescriptor_t get() const { return desc_; }

  /// A failure names the descriptor type and attribute by their numbers in cudnn_graph.h, since
  /// the line is the same for every attribute.
  Descriptor& set(cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type, std::int64_t count,
                  const void* values) {
    if (const cudnnStatus_t status = cudnnBackendSetAttribute(desc_, name, type, count, values);
        status != CUDNN_STATUS_SUCCESS)
      fail(status, "setting attribute " + std::to_string(int(name)));
    return *this;
  }
  Descriptor& set(cudnnBackendAttributeName_t name, std::int64_t value) {
    return set(name, CUDNN_TYPE_INT64, 1, &value);
  }
  Descriptor& set(cudnnBackendAttributeName_t name, const Dims& values) {
    return set(name, CUDNN_TYPE_INT64, std::int64_t(values.size()), values.data());
  }
  Descriptor& set(cudnnBackendAttributeName_t name, bool value) { return set(name, CUDNN_TYPE_BOOLEAN, 1, &value); }
  Descriptor& set(cudnnBackendAttributeName_t name, cudnnDataType_t value) {
    return set(name, CUDNN_TYPE_DATA_TYPE, 1, &value);
  }
  Descriptor& set(cudnnBackendAttributeName_t name, cudnnPointwiseMode_t value) {
    return set(name, CUDNN_TYPE_POINTWISE_MODE, 1, &value);
  }
  Descriptor& set(cudnnBackendAttributeName_t name, cudnnReduceTensorOp_t value) {
    return set(name, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &value);
  }
  Descriptor& set(cudnnBackendAttributeName_t name, cudnnBackendHeurMode_t value) {
    return set(name, CUDNN_TYPE_HEUR_MODE, 1, &value);
  }
  Descriptor& set(cudnnBackendAttributeName_t name, cudnnHandle_t value) {
    return set(name, CUDNN_TYPE_HANDLE, 1, &value);
  }
  Descriptor& set(cudnnBackendAttributeName_t name, cudnnBackendDescriptor_t value) {
    return set(name, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &value);
  }
  Descriptor& finalize() {
    if (const cudnnStatus_t status = cudnnBackendFinalize(desc_); status != CUDNN_STATUS_SUCCESS)
      fail(status, "finalizing");
    return *this;
  }

 private:
  /// CUDNN_CHECK's message, with the descriptor type and what was being done in place of the call.
  [[noreturn]] void fail(cudnnStatus_t status, const std::string& what) const {
    char detail[1024] = "";
    cudnnGetLastErrorString(detail, sizeof detail);
    const std::string call = "cuDNN descriptor type " + std::to_string(int(type_)) + ", " + what;
    throw_cuda_error(__FILE__, __LINE__, call.c_str(), std::string(cudnnGetErrorString(status)) + " (" + detail + ")");
  }

  cudnnBackendDescriptor_t desc_ = nullptr;
  cudnnBackendDescriptorType_t type_;
};

// The graph and plan descriptors still take the handle on the cuDNN 9 versions GPUs run (9.14);
// newer headers mark the attribute deprecated in favour of a device-properties descriptor.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
constexpr cudnnBackendAttributeName_t kGraphHandle = CUDNN_ATTR_OPERATIONGRAPH_HANDLE;
constexpr cudnnBackendAttributeName_t kPlanHandle = CUDNN_ATTR_EXECUTION_PLAN_HANDLE;
#pragma GCC diagnostic pop

/// Fixed unique ids of the tensors a call binds (the variant pack); virtual tensors count up from
/// kFirstVirtual.
enum Uid : std::int64_t {
  kQ = 1, kK, kV, kO, kStats, kdO, kdQ, kdK, kdV, kSoftmaxSum, kSeqLenQ, kSeqLenKV, kdQAccumulator,
  kScale = 20, kNegativeInfinity, kOne,
  kFirstVirtual = 100,
};

struct Tensor {
  cudnnBackendDescriptor_t desc = nullptr;
  std::int64_t uid = 0;
  Dims dims;
};

Dims contiguous(const Dims& dims) {
  Dims strides(dims.size(), 1);
  for (std::size_t i = dims.size() - 1; i-- > 0;) strides[i] = strides[i + 1] * dims[i + 1];
  return strides;
}

/// Optional sequence-length overrides of a GEMM's M, N, K (the padding-mask graphs).
struct Overrides {
  const Tensor *m = nullptr, *n = nullptr, *k = nullptr;
};

/// Builds one operation graph: tensors and operations in the order the engines' patterns expect,
/// all kept alive for the plan's lifetime.
class GraphBuilder {
 public:
  Tensor tensor(std::int64_t uid, const Dims& dims, const Dims& strides, cudnnDataType_t type, bool is_virtual,
                bool by_value = false) {
    Descriptor& d = keep(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
    d.set(CUDNN_ATTR_TENSOR_UNIQUE_ID, uid)
        .set(CUDNN_ATTR_TENSOR_DATA_TYPE, type)
        .set(CUDNN_ATTR_TENSOR_DIMENSIONS, dims)
        .set(CUDNN_ATTR_TENSOR_STRIDES, strides)
        .set(CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, std::int64_t(16))
        .set(CUDNN_ATTR_TENSOR_IS_VIRTUAL, is_virtual);
    if (by_value) d.set(CUDNN_ATTR_TENSOR_IS_BY_VALUE, true);
    d.finalize();
    return {d.get(), uid, dims};
  }
  Tensor io(std::int64_t uid, const Dims& dims, const Dims& strides, cudnnDataType_t type) {
    return tensor(uid, dims, strides, type, false);
  }
  Tensor virtual_tensor(const Dims& dims, cudnnDataType_t type) { return virtual_tensor(dims, contiguous(dims), type); }
  Tensor virtual_tensor(const Dims& dims, const Dims& strides, cudnnDataType_t type) {
    return tensor(next_uid_++, dims, strides, type, true);
  }
  /// A scalar passed by value: its host address goes into the variant pack.
  Tensor scalar(std::int64_t uid, cudnnDataType_t type) { return tensor(uid, {1, 1, 1, 1}, {1, 1, 1, 1}, type, false, true); }

  /// y = mode(x[, b[, t]]); `axis` only for GEN_INDEX.
  void pointwise(cudnnPointwiseMode_t mode, const Tensor& x, const Tensor* b, const Tensor* t, const Tensor& y,
                 cudnnDataType_t math = CUDNN_DATA_FLOAT, std::int64_t axis = -1) {
    Descriptor& pw = keep(CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
    pw.set(CUDNN_ATTR_POINTWISE_MODE, mode).set(CUDNN_ATTR_POINTWISE_MATH_PREC, math);
    if (axis >= 0) pw.set(CUDNN_ATTR_POINTWISE_AXIS, axis);
    pw.finalize();
    Descriptor& op = keep(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
    op.set(CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, pw.get()).set(CUDNN_ATTR_OPERATION_POINTWISE_XDESC, x.desc);
    if (b != nullptr) op.set(CUDNN_ATTR_OPERATION_POINTWISE_BDESC, b->desc);
    if (t != nullptr) op.set(CUDNN_ATTR_OPERATION_POINTWISE_TDESC, t->desc);
    op.set(CUDNN_ATTR_OPERATION_POINTWISE_YDESC, y.desc).finalize();
    ops_.push_back(op.get());
  }
  /// A new virtual tensor of x's shape (or `dims`) holding mode(x, b, t).
  Tensor pointwise(cudnnPointwiseMode_t mode, const Tensor& x, const Tensor* b = nullptr, const Tensor* t = nullptr,
                   cudnnDataType_t out = CUDNN_DATA_FLOAT, cudnnDataType_t math = CUDNN_DATA_FLOAT) {
    Tensor y = virtual_tensor(x.dims, out);
    pointwise(mode, x, b, t, y, math);
    return y;
  }
  Tensor index(const Tensor& x, std::int64_t axis, cudnnDataType_t math = CUDNN_DATA_FLOAT) {
    Tensor y = virtual_tensor(x.dims, CUDNN_DATA_INT32);
    pointwise(CUDNN_POINTWISE_GEN_INDEX, x, nullptr, nullptr, y, math, axis);
    return y;
  }

  void matmul(const Tensor& a, const Tensor& b, const Tensor& c, Overrides o = {}) {
    Descriptor& mm = keep(CUDNN_BACKEND_MATMUL_DESCRIPTOR);
    mm.set(CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_DATA_FLOAT).finalize();
    Descriptor& op = keep(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR);
    op.set(CUDNN_ATTR_OPERATION_MATMUL_ADESC, a.desc)
        .set(CUDNN_ATTR_OPERATION_MATMUL_BDESC, b.desc)
        .set(CUDNN_ATTR_OPERATION_MATMUL_CDESC, c.desc)
        .set(CUDNN_ATTR_OPERATION_MATMUL_DESC, mm.get());
    if (o.m) op.set(CUDNN_ATTR_OPERATION_MATMUL_GEMM_M_OVERRIDE_DESC, o.m->desc);
    if (o.n) op.set(CUDNN_ATTR_OPERATION_MATMUL_GEMM_N_OVERRIDE_DESC, o.n->desc);
    if (o.k) op.set(CUDNN_ATTR_OPERATION_MATMUL_GEMM_K_OVERRIDE_DESC, o.k->desc);
    op.finalize();
    ops_.push_back(op.get());
  }
  void reduction(cudnnReduceTensorOp_t mode, const Tensor& x, const Tensor& y) {
    Descriptor& red = keep(CUDNN_BACKEND_REDUCTION_DESCRIPTOR);
    red.set(CUDNN_ATTR_REDUCTION_OPERATOR, mode).set(CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_DATA_FLOAT).finalize();
    Descriptor& op = keep(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR);
    op.set(CUDNN_ATTR_OPERATION_REDUCTION_XDESC, x.desc)
        .set(CUDNN_ATTR_OPERATION_REDUCTION_YDESC, y.desc)
        .set(CUDNN_ATTR_OPERATION_REDUCTION_DESC, red.get())
        .finalize();
    ops_.push_back(op.get());
  }
  /// Per-row reduction of x [b, h, s, n] to a new virtual [b, h, s, 1].
  Tensor row_reduction(cudnnReduceTensorOp_t mode, const Tensor& x) {
    Dims dims = x.dims;
    dims.back() = 1;
    Tensor y = virtual_tensor(dims, CUDNN_DATA_FLOAT);
    reduction(mode, x, y);
    return y;
  }
  /// The same elements seen with other dims and strides (a transposed view).
  void reshape(const Tensor& x, const Tensor& y) {
    Descriptor& op = keep(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR);
    op.set(CUDNN_ATTR_OPERATION_RESHAPE_XDESC, x.desc).set(CUDNN_ATTR_OPERATION_RESHAPE_YDESC, y.desc).finalize();
    ops_.push_back(op.get());
  }

  /// The finalized operation graph.
  cudnnBackendDescriptor_t graph(cudnnHandle_t handle) {
    Descriptor& g = keep(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
    g.set(CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, std::int64_t(ops_.size()), ops_.data())
        .set(kGraphHandle, handle)
        .finalize();
    return g.get();
  }
  std::deque<Descriptor> release() { return std::move(kept_); }

 private:
  /// A deque: references stay valid as descriptors are added (an operation refers to the ones
  /// created just before it).
  Descriptor& keep(cudnnBackendDescriptorType_t type) { return kept_.emplace_back(type); }

  std::deque<Descriptor> kept_;
  std::vector<cudnnBackendDescriptor_t> ops_;
  std::int64_t next_uid_ = kFirstVirtual;
};

struct Key {
  int batch, seq, heads, kv_heads, d;
  bool backward, deterministic;
  int device;
  auto tie() const { return std::tie(batch, seq, heads, kv_heads, d, backward, deterministic, device); }
  bool operator<(const Key& o) const { return tie() < o.tie(); }
  std::string name() const {
    return std::string(backward ? "backward" : "forward") + " batch=" + std::to_string(batch) +
           " seq=" + std::to_string(seq) + " heads=" + std::to_string(heads) + " kv_heads=" +
           std::to_string(kv_heads) + " d=" + std::to_string(d) +
           (backward ? (deterministic ? " deterministic" : " non-deterministic") : "") + " (bf16, causal, device " +
           std::to_string(device) + ")";
  }
};

/// A finalized execution plan with every descriptor it was built from, its workspace size and what
/// the graph needs besides the caller's tensors.
struct Plan {
  std::deque<Descriptor> descriptors;
  Descriptor* plan = nullptr;
  std::int64_t workspace = 0;
  /// The backward's padding-mask graph (see build_backward) reads these: batch int32s each.
  bool sequence_lengths = false;
  std::int32_t* lengths = nullptr;  ///< [batch] of seq, then again; cudaMalloc'd, kept with the plan
  bool accumulator = false;         ///< the non-deterministic backward's fp32 dQ
  float scale = 0, negative_infinity = -std::numeric_limits<float>::infinity(), one = 1;
};

/// The head layout of one call, in elements, as cuDNN 4-D [batch, heads, seq, d] views.
struct Views {
  std::int64_t b, s, hq, hk, d, width;  ///< width: the qkv row, (hq + 2·hk)·d
  Dims q_dims() const { return {b, hq, s, d}; }
  Dims q_strides() const { return {s * width, d, width, 1}; }  // also K and V, from their column offsets
  Dims kv_dims() const { return {b, hk, s, d}; }
  Dims kt_dims() const { return {b, hk, d, s}; }             // K (or V) transposed, as the score GEMM's B
  Dims kt_strides() const { return {s * width, d, 1, width}; }
  Dims o_strides() const { return {s * hq * d, d, hq * d, 1}; }
  Dims stats_dims() const { return {b, hq, s, 1}; }
  Dims scores() const { return {b, hq, s, s}; }
  /// A [b, hq, s, s] matrix seen transposed (what the dV and dK products read).
  Dims transposed_strides() const { return {hq * s * s, s * s, 1, s}; }
};

/// Scores S = scale·Q·Kᵀ, the causal mask (key column j > query row i gets −inf) from generated
/// indices, as both graphs start. `sequence_lengths`: first the padding mask the backward needs.
Tensor causal_scores(GraphBuilder& g, const Views& v, const Tensor& q, const Tensor& kt, const Tensor& scale,
                     const Tensor& negative_infinity, Overrides overrides, const Tensor* stats = nullptr) {
  const Tensor s = g.virtual_tensor(v.scores(), CUDNN_DATA_FLOAT);
  g.matmul(q, kt, s, overrides);
  Tensor scaled = g.pointwise(CUDNN_POINTWISE_MUL, s, &scale);
  if (overrides.m != nullptr) {  // padding mask: rows < seq_len_q and columns < seq_len_kv survive
    const Tensor row = g.index(scaled, 2, CUDNN_DATA_INT32), column = g.index(scaled, 3, CUDNN_DATA_INT32);
    const Tensor row_in = g.pointwise(CUDNN_POINTWISE_CMP_LT, row, overrides.m, nullptr, CUDNN_DATA_BOOLEAN,
                                      CUDNN_DATA_BOOLEAN);
    const Tensor column_in = g.pointwise(CUDNN_POINTWISE_CMP_LT, column, overrides.n != nullptr ? overrides.n : overrides.k,
                                         nullptr, CUDNN_DATA_BOOLEAN, CUDNN_DATA_BOOLEAN);
    const Tensor inside = g.pointwise(CUDNN_POINTWISE_LOGICAL_AND, row_in, &column_in, nullptr, CUDNN_DATA_BOOLEAN,
                                      CUDNN_DATA_BOOLEAN);
    scaled = g.pointwise(CUDNN_POINTWISE_BINARY_SELECT, scaled, &negative_infinity, &inside);
  }
  if (stats != nullptr) scaled = g.pointwise(CUDNN_POINTWISE_SUB, scaled, stats);  // backward: S − lse
  const Tensor row = g.index(scaled, 2), column = g.index(scaled, 3);
  const Tensor keep = g.pointwise(CUDNN_POINTWISE_CMP_GE, row, &column, nullptr, CUDNN_DATA_BOOLEAN, CUDNN_DATA_BOOLEAN);
  return g.pointwise(CUDNN_POINTWISE_BINARY_SELECT, scaled, &negative_infinity, &keep);
}

void build_forward(GraphBuilder& g, const Views& v) {
  const Tensor q = g.io(kQ, v.q_dims(), v.q_strides(), CUDNN_DATA_BFLOAT16);
  const Tensor kt = g.io(kK, v.kt_dims(), v.kt_strides(), CUDNN_DATA_BFLOAT16);
  const Tensor val = g.io(kV, v.kv_dims(), v.q_strides(), CUDNN_DATA_BFLOAT16);
  const Tensor o = g.io(kO, v.q_dims(), v.o_strides(), CUDNN_DATA_BFLOAT16);
  const Tensor stats = g.io(kStats, v.stats_dims(), contiguous(v.stats_dims()), CUDNN_DATA_FLOAT);
  const Tensor scale = g.scalar(kScale, CUDNN_DATA_FLOAT), negative_infinity = g.scalar(kNegativeInfinity, CUDNN_DATA_FLOAT);

  const Tensor masked = causal_scores(g, v, q, kt, scale, negative_infinity, {});
  // Softmax, keeping the logsumexp: stats = max + log Σ exp(S − max).
  const Tensor max = g.row_reduction(CUDNN_REDUCE_TENSOR_MAX, masked);
  const Tensor shifted = g.pointwise(CUDNN_POINTWISE_SUB, masked, &max);
  const Tensor e = g.pointwise(CUDNN_POINTWISE_EXP, shifted);
  const Tensor sum = g.row_reduction(CUDNN_REDUCE_TENSOR_ADD, e);
  const Tensor log_sum = g.pointwise(CUDNN_POINTWISE_LOG, sum);
  g.pointwise(CUDNN_POINTWISE_ADD, max, &log_sum, nullptr, stats);
  // P in the input type: the P·V GEMM's A operand must be.
  const Tensor p = g.pointwise(CUDNN_POINTWISE_DIV, e, &sum, nullptr, CUDNN_DATA_BFLOAT16);
  g.matmul(p, val, o);
}

void build_backward(GraphBuilder& g, const Views& v, bool deterministic, bool sequence_lengths) {
  const Tensor q = g.io(kQ, v.q_dims(), v.q_strides(), CUDNN_DATA_BFLOAT16);
  const Tensor kt = g.io(kK, v.kt_dims(), v.kt_strides(), CUDNN_DATA_BFLOAT16);
  const Tensor vt = g.io(kV, v.kt_dims(), v.kt_strides(), CUDNN_DATA_BFLOAT16);
  const Tensor o = g.io(kO, v.q_dims(), v.o_strides(), CUDNN_DATA_BFLOAT16);
  const Tensor d_o = g.io(kdO, v.q_dims(), v.o_strides(), CUDNN_DATA_BFLOAT16);
  const Tensor stats = g.io(kStats, v.stats_dims(), contiguous(v.stats_dims()), CUDNN_DATA_FLOAT);
  const Tensor dq = g.io(kdQ, v.q_dims(), v.q_strides(), CUDNN_DATA_BFLOAT16);
  const Tensor dk = g.io(kdK, v.kv_dims(), v.q_strides(), CUDNN_DATA_BFLOAT16);
  const Tensor dv = g.io(kdV, v.kv_dims(), v.q_strides(), CUDNN_DATA_BFLOAT16);
  const Tensor scale = g.scalar(kScale, CUDNN_DATA_FLOAT), negative_infinity = g.scalar(kNegativeInfinity, CUDNN_DATA_FLOAT),
               one = g.scalar(kOne, CUDNN_DATA_FLOAT);
  Tensor seq_q, seq_kv;
  if (sequence_lengths) {
    seq_q = g.io(kSeqLenQ, {v.b, 1, 1, 1}, {1, 1, 1, 1}, CUDNN_DATA_INT32);
    seq_kv = g.io(kSeqLenKV, {v.b, 1, 1, 1}, {1, 1, 1, 1}, CUDNN_DATA_INT32);
  }
  const Tensor* lq = sequence_lengths ? &seq_q : nullptr;
  const Tensor* lkv = sequence_lengths ? &seq_kv : nullptr;

  // D = rowsum(dO∘O), the softmax backward's Σ_j P·dP; stored (fp32) for the engine's second pass.
  const Tensor d_o_o = g.virtual_tensor(v.q_dims(), {v.hq * v.s * v.d, v.s * v.d, v.hq * v.d, 1}, CUDNN_DATA_FLOAT);
  g.pointwise(CUDNN_POINTWISE_MUL, d_o, &o, nullptr, d_o_o);
  const Tensor row_sum = g.row_reduction(CUDNN_REDUCE_TENSOR_ADD, d_o_o);
  const Tensor softmax_sum = g.io(kSoftmaxSum, v.stats_dims(), contiguous(v.stats_dims()), CUDNN_DATA_FLOAT);
  g.pointwise(CUDNN_POINTWISE_MUL, row_sum, &one, nullptr, softmax_sum);

  // P = exp(mask(scale·Q·Kᵀ) − lse), recomputed.
  const Tensor masked = causal_scores(g, v, q, kt, scale, negative_infinity, {lq, lkv, nullptr}, &stats);
  const Tensor p = g.pointwise(CUDNN_POINTWISE_EXP, masked);

  // dV = Pᵀ·dO, summed over the query heads sharing a V head.
  const auto head_sum_product = [&](const Tensor& transposed, const Tensor& b, const Tensor& out) {
    const Overrides o_kv_q{lkv, nullptr, lq};
    if (v.hq == v.hk) {
      g.matmul(transposed, b, out, o_kv_q);
    } else {
      const Tensor full = g.virtual_tensor(v.q_dims(), CUDNN_DATA_BFLOAT16);
      g.matmul(transposed, b, full, o_kv_q);
      g.reduction(CUDNN_REDUCE_TENSOR_ADD, full, out);
    }
  };
  const Tensor pt = g.virtual_tensor(v.scores(), v.transposed_strides(), CUDNN_DATA_BFLOAT16);
  g.reshape(p, pt);
  head_sum_product(pt, d_o, dv);

  // dS = scale·P∘(dO·Vᵀ − D)
  const Tensor dp = g.virtual_tensor(v.scores(), CUDNN_DATA_FLOAT);
  g.matmul(d_o, vt, dp, {lq, lkv, nullptr});
  const Tensor centred = g.pointwise(CUDNN_POINTWISE_SUB, dp, &softmax_sum);
  const Tensor ds_unscaled = g.pointwise(CUDNN_POINTWISE_MUL, centred, &p);
  const Tensor ds = g.pointwise(CUDNN_POINTWISE_MUL, ds_unscaled, &scale);

  // dK = dSᵀ·Q, summed over the query heads sharing a K head.
  const Tensor dst = g.virtual_tensor(v.scores(), v.transposed_strides(), CUDNN_DATA_BFLOAT16);
  g.reshape(ds, dst);
  head_sum_product(dst, q, dk);

  // dQ = dS·K: K is the score GEMM's Kᵀ seen untransposed (typed fp32 like the graph's other
  // intermediates, as the engines' pattern has it; dS, its other operand, is fp32 too).
  const Tensor k = g.virtual_tensor(v.kv_dims(), v.q_strides(), CUDNN_DATA_FLOAT);
  g.reshape(kt, k);
  if (deterministic) {
    g.matmul(ds, k, dq, {lq, nullptr, lkv});
  } else {
    const Tensor accumulator = g.io(kdQAccumulator, v.q_dims(), contiguous(v.q_dims()), CUDNN_DATA_FLOAT);
    g.matmul(ds, k, accumulator, {lq, nullptr, lkv});
    g.pointwise(CUDNN_POINTWISE_IDENTITY, accumulator, nullptr, nullptr, dq);
  }
}

/// The first engine configuration the heuristics offer that finalizes into a plan.
Descriptor* choose_plan(std::deque<Descriptor>& keep, cudnnHandle_t handle, cudnnBackendDescriptor_t graph,
                        std::string& problems) {
  for (const cudnnBackendHeurMode_t mode : {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK}) {
    Descriptor heuristics(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
    heuristics.set(CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, graph).set(CUDNN_ATTR_ENGINEHEUR_MODE, mode);
    if (const cudnnStatus_t status = cudnnBackendFinalize(heuristics.get()); status != CUDNN_STATUS_SUCCESS) {
      char detail[512] = "";
      cudnnGetLastErrorString(detail, sizeof detail);
      problems = std::string("heuristics: ") + cudnnGetErrorString(status) + " " + detail;
      continue;
    }
    std::int64_t count = 0;
    CUDNN_CHECK(cudnnBackendGetAttribute(heuristics.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                         CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count, nullptr));
    std::vector<Descriptor> configs;
    std::vector<cudnnBackendDescriptor_t> raw;
    for (std::int64_t i = 0; i < count; ++i) raw.push_back(configs.emplace_back(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR).get());
    CUDNN_CHECK(cudnnBackendGetAttribute(heuristics.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                         CUDNN_TYPE_BACKEND_DESCRIPTOR, count, &count, raw.data()));
    for (std::int64_t i = 0; i < count; ++i) {
      Descriptor plan(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
      plan.set(kPlanHandle, handle).set(CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, raw[std::size_t(i)]);
      const cudnnStatus_t status = cudnnBackendFinalize(plan.get());
      if (status == CUDNN_STATUS_SUCCESS) {
        keep.push_back(std::move(configs[std::size_t(i)]));
        return &keep.emplace_back(std::move(plan));
      }
      char detail[512] = "";
      cudnnGetLastErrorString(detail, sizeof detail);
      problems = std::string(cudnnGetErrorString(status)) + " " + detail;
    }
    if (count == 0 && problems.empty()) problems = "the heuristics offered no engine configuration";
  }
  return nullptr;
}

/// Whether cuDNN's backward needs the padding-mask form: the frontend builds it, with sequence
/// lengths equal to seq, where seq_kv is not a multiple of 128 on cuDNN up to 9.15 (the engines
/// mis-handle the last partial tile otherwise).
bool backward_needs_lengths(int seq) { return seq % 128 != 0 && cudnnGetVersion() <= 91500; }

std::unique_ptr<Plan> build_plan(cudnnHandle_t handle, const Key& key) {
  // The engines' own limits (Hopper; 128 elsewhere): refused here with a plain message rather than
  // by heuristics that find nothing.
  if (key.d % 8 != 0 || key.d > 256) throw CudaError("the engines need a head width that is a multiple of 8, at most 256");
  if (key.seq == 1) throw CudaError("the engines do not take seq = 1");
  const Views v{key.batch, key.seq, key.heads, key.kv_heads, key.d, std::int64_t(key.heads + 2 * key.kv_heads) * key.d};
  auto plan = std::make_unique<Plan>();
  plan->scale = 1.0f / std::sqrt(float(key.d));
  GraphBuilder g;
  if (key.backward) {
    plan->sequence_lengths = backward_needs_lengths(key.seq);
    plan->accumulator = !key.deterministic;
    build_backward(g, v, key.deterministic, plan->sequence_lengths);
  } else {
    build_forward(g, v);
  }
  const cudnnBackendDescriptor_t graph = g.graph(handle);
  plan->descriptors = g.release();
  std::string problems;
  plan->plan = choose_plan(plan->descriptors, handle, graph, problems);
  if (plan->plan == nullptr) throw CudaError("no cuDNN engine finalizes for this graph: " + problems);
  CUDNN_CHECK(cudnnBackendGetAttribute(plan->plan->get(), CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64,
                                       1, nullptr, &plan->workspace));
  if (plan->sequence_lengths) {
    // Constant per shape: set once (a synchronous copy, at plan-building time only).
    const std::vector<std::int32_t> lengths(2 * std::size_t(key.batch), key.seq);
    CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&plan->lengths), lengths.size() * sizeof(std::int32_t)));
    CUDA_CHECK(cudaMemcpy(plan->lengths, lengths.data(), lengths.size() * sizeof(std::int32_t), cudaMemcpyHostToDevice));
  }
  return plan;
}

/// A cuDNN handle and the plans built on it. Handles are not for concurrent use, so each call leases
/// one (the pool below) rather than each thread owning one: the executor starts threads per step,
/// and plans outlive them.
struct Context {
  cudnnHandle_t handle = nullptr;
  std::map<Key, std::unique_ptr<Plan>> plans;  ///< nullptr: no engine for this shape
};

struct Pool {
  std::mutex mutex;
  std::map<int, std::vector<Context*>> idle;  ///< per device
  std::set<Key> reported;
  std::string last_problem;
};
/// Never destroyed: at static destruction the CUDA runtime may already be gone, and cudnnDestroy
/// with it.
Pool& pool() {
  static Pool* p = new Pool;
  return *p;
}

class Lease {
 public:
  explicit Lease(int device) : device_(device) {
    {
      std::lock_guard lock(pool().mutex);
      auto& idle = pool().idle[device];
      if (!idle.empty()) context_ = idle.back(), idle.pop_back();
    }
    if (context_ == nullptr) {
      auto fresh = std::make_unique<Context>();
      CUDNN_CHECK(cudnnCreate(&fresh->handle));
      context_ = fresh.release();
    }
  }
  ~Lease() {
    std::lock_guard lock(pool().mutex);
    pool().idle[device_].push_back(context_);
  }
  Lease(const Lease&) = delete;
  Lease& operator=(const Lease&) = delete;
  Context& operator*() const { return *context_; }

 private:
  int device_;
  Context* context_ = nullptr;
};

/// The tensors of one call, by unique id.
struct Binding {
  std::vector<std::int64_t> uids;
  std::vector<void*> pointers;
  void add(std::int64_t uid, const void* pointer) {
    uids.push_back(uid);
    pointers.push_back(const_cast<void*>(pointer));
  }
};

/// Runs `key`'s plan with the caller's tensors; false when cuDNN has no engine for it.
template <class Bind>
bool run(const Key& key, cudaStream_t stream, Bind bind) {
  if (key.batch < 1 || key.seq < 1 || key.d < 1 || key.kv_heads < 1 || key.heads % key.kv_heads != 0)
    throw CudaError("attention (cuDNN): need batch, seq, d, kv_heads >= 1 and heads divisible by kv_heads; got " +
                    key.name());
  Lease lease(key.device);
  Context& context = *lease;
  auto found = context.plans.find(key);
  if (found == context.plans.end()) {
    std::unique_ptr<Plan> plan;
    try {
      plan = build_plan(context.handle, key);
    } catch (const CudaError& e) {
      const std::string problem = key.name() + ": " + e.what();
      std::lock_guard lock(pool().mutex);
      pool().last_problem = problem;
      if (pool().reported.insert(key).second)
        std::fprintf(stderr, "pipesim: cuDNN attention unavailable, using the cuBLASLt path: %s\n", problem.c_str());
    }
    found = context.plans.emplace(key, std::move(plan)).first;
  }
  Plan* plan = found->second.get();
  if (plan == nullptr) return false;

  Binding binding;
  bind(binding);
  binding.add(kScale, &plan->scale);
  binding.add(kNegativeInfinity, &plan->negative_infinity);
  // Scratch from the stream's pool: the backward's D (and dQ accumulator), then the workspace.
  const std::size_t rows = std::size_t(key.batch) * std::size_t(key.heads) * std::size_t(key.seq);
  const std::size_t sum_bytes = key.backward ? (rows * sizeof(float) + 255) / 256 * 256 : 0;  // keeps the next aligned
  const std::size_t accumulator_bytes = plan->accumulator ? rows * std::size_t(key.d) * sizeof(float) : 0;
  const std::size_t workspace_at = (sum_bytes + accumulator_bytes + 255) / 256 * 256;
  const std::size_t bytes = workspace_at + std::size_t(plan->workspace);
  std::byte* scratch = nullptr;
  if (bytes > 0) CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&scratch), bytes, stream));
  if (key.backward) {
    binding.add(kOne, &plan->one);
    binding.add(kSoftmaxSum, scratch);
    if (plan->accumulator) {
      // Zeroed: the engines of cuDNN 9.6 and later clear it themselves; the cost is small next to them.
      CUDA_CHECK(cudaMemsetAsync(scratch + sum_bytes, 0, accumulator_bytes, stream));
      binding.add(kdQAccumulator, scratch + sum_bytes);
    }
    if (plan->sequence_lengths) {
      binding.add(kSeqLenQ, plan->lengths);
      binding.add(kSeqLenKV, plan->lengths + key.batch);
    }
  }
  void* workspace = plan->workspace > 0 ? scratch + workspace_at : nullptr;
  Descriptor pack(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
  pack.set(CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, std::int64_t(binding.uids.size()), binding.uids.data())
      .set(CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, std::int64_t(binding.pointers.size()),
           binding.pointers.data())
      .set(CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &workspace)
      .finalize();
  CUDNN_CHECK(cudnnSetStream(context.handle, stream));
  const cudnnStatus_t status = cudnnBackendExecute(context.handle, plan->plan->get(), pack.get());
  if (scratch != nullptr) CUDA_CHECK(cudaFreeAsync(scratch, stream));
  CUDNN_CHECK(status);
  return true;
}

int current_device() {
  int device = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  return device;
}

/// Element offsets of one token row's parts.
struct Columns {
  std::size_t k, v;
};
Columns columns(int heads, int kv_heads, int d) {
  return {std::size_t(heads) * std::size_t(d), std::size_t(heads + kv_heads) * std::size_t(d)};
}

/// The plan cache's key of a call: the head width from AttentionShape's h = heads·d, and its
/// kv_heads 0 as heads.
Key key_of(const AttentionShape& shape, bool backward, bool deterministic) {
  if (shape.heads < 1 || shape.h % shape.heads != 0)
    throw CudaError("attention (cuDNN): need heads >= 1 and h divisible by heads; got h=" + std::to_string(shape.h) +
                    " heads=" + std::to_string(shape.heads));
  const int kv_heads = shape.kv_heads > 0 ? shape.kv_heads : shape.heads;
  return Key{shape.batch, shape.seq, shape.heads, kv_heads, shape.h / shape.heads, backward, deterministic,
             current_device()};
}
using bf16_bits = std::uint16_t;  // pointer arithmetic only

}  // namespace

bool cudnn_attention_built() { return true; }

bool use_cudnn_attention() {
  static const bool use = [] {
    const char* value = std::getenv("PIPESIM_ATTENTION");
    const std::string choice = value != nullptr ? value : "";
    if (choice.empty() || choice == "cudnn") return true;
    if (choice == "gemm") return false;
    throw CudaError("PIPESIM_ATTENTION=" + choice + ": expected cudnn or gemm");
  }();
  return use;
}

bool attention_forward_cudnn(const AttentionForwardTensors& t, AttentionShape shape, cudaStream_t stream) {
  const Key key = key_of(shape, false, false);
  const auto* row = static_cast<const bf16_bits*>(t.qkv);
  const Columns c = columns(key.heads, key.kv_heads, key.d);
  return run(key, stream, [&](Binding& b) {
    b.add(kQ, row);
    b.add(kK, row + c.k);
    b.add(kV, row + c.v);
    b.add(kO, t.out);
    b.add(kStats, t.lse);
  });
}

bool attention_backward_cudnn(const AttentionBackwardTensors& t, AttentionShape shape, cudaStream_t stream,
                              bool deterministic) {
  const Key key = key_of(shape, true, deterministic);
  const auto* row = static_cast<const bf16_bits*>(t.qkv);
  auto* grad = static_cast<bf16_bits*>(t.dqkv);
  const Columns c = columns(key.heads, key.kv_heads, key.d);
  return run(key, stream, [&](Binding& b) {
    b.add(kQ, row);
    b.add(kK, row + c.k);
    b.add(kV, row + c.v);
    b.add(kO, t.out);
    b.add(kdO, t.dout);
    b.add(kStats, t.lse);
    b.add(kdQ, grad);
    b.add(kdK, grad + c.k);
    b.add(kdV, grad + c.v);
  });
}

std::string cudnn_attention_last_problem() {
  std::lock_guard lock(pool().mutex);
  return pool().last_problem;
}

}  // namespace pipesim::runtime::cuda

#endif  // PIPESIM_HAVE_CUDNN
