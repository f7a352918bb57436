// The CUDA backend: each op's math as cuBLASLt GEMMs and the kernels of cuda/kernels.h (and, for
// the Llama family, cuda/llama_kernels.h) on this rank's GPU, in fp32 (TF32 off: the correctness
// check) or bf16 with fp32 accumulation. The layer's math and tensor layouts are cpu::layer_forward's
// and cpu::layer_backward's step for step, so that an fp32 run reproduces the CPU's numbers. Each
// calling thread's stream, GEMM handle and memory: op_context.h.
#include "cuda/cuda_backend.h"

#include <fmt/format.h>

#include <cmath>
#include <utility>

#include "cuda/check.h"
#include "cuda/device_model.h"
#include "cuda/attention_cudnn.h"
#include "cuda/attention_gemm.h"
#include "cuda/event_clock.h"
#include "cuda/gemm.h"
#include "cuda/kernels.h"
#include "cuda/llama_kernels.h"
#include "cuda/op_context.h"
#include "cuda/reduce.h"
#include "cuda/sm_share.h"
#include "cuda/vocab.h"

namespace pipesim::runtime::cuda {
namespace {

/// What a layer keeps from F to B (and W): the inputs of every kernel's backward, and for a W split
/// off B the output gradients of the four linear maps. As in cpu::LayerCache, for Llama ln1/ln2 are
/// RMSNorm outputs (mean1/mean2 stay empty), qkv is after the rotary embedding, fc1 is the fused
/// [gate | up] and gelu holds silu(gate)·up.
struct CudaLayerActivations final : Activations {
  Tensor input, ln1, mean1, rstd1, qkv, attention, lse, middle, ln2, mean2, rstd2, fc1, gelu;
  struct Deferred {
    Tensor fc2_dy, fc1_dy, proj_dy, qkv_dy;
  } deferred;

  Bytes bytes() const override {
    std::size_t total = 0;
    for (const Tensor* t : {&input, &ln1, &mean1, &rstd1, &qkv, &attention, &lse, &middle, &ln2, &mean2, &rstd2, &fc1,
                            &gelu, &deferred.fc2_dy, &deferred.fc1_dy, &deferred.proj_dy, &deferred.qkv_dy})
      total += t->bytes();
    return Bytes(total);
  }
};

/// The final norm's input and output (mean empty for RMSNorm), and the baseline LM head's logit
/// gradients (last stage).
struct CudaHeadActivations final : Activations {
  Tensor input, mean, rstd, normed, dlogits;
  Bytes bytes() const override {
    return Bytes(input.bytes() + mean.bytes() + rstd.bytes() + normed.bytes() + dlogits.bytes());
  }
};

/// The widths of this rank's part of a layer (cpu/model.cpp's Part): split over the tensor-parallel
/// group as Megatron splits it (its query and key/value heads, its slice of the FFN), the whole layer
/// without tensor parallelism.
struct LayerPart {
  int heads, kv_heads;
  int attention;  ///< the attention output's width: heads · head width
  int qkv, ffn, fc1;
  LayerPart(const ModelShape& s, int ranks)
      : heads(s.heads / ranks), kv_heads(s.key_value_heads() / ranks), attention(s.hidden / ranks),
        qkv(s.qkv_width() / ranks), ffn(s.ffn / ranks), fc1(s.fc1_width() / ranks) {}
};

int group_size(const BackendOptions& o) { return o.tensor_parallel ? o.tensor_parallel->size() : 1; }

CudaLayerActivations& layer_cache(Activations& cache) { return static_cast<CudaLayerActivations&>(cache); }
CudaHeadActivations& head_cache(Activations& cache) { return static_cast<CudaHeadActivations&>(cache); }
const CudaHeadActivations& head_cache(const Activations& cache) { return static_cast<const CudaHeadActivations&>(cache); }

class CudaBackend final : public Backend {
 public:
  CudaBackend(const ModelShape& shape, const Layout& layout, int pipeline_device, std::uint64_t seed,
              const BackendOptions& o)
      : shape_(shape), options_(o), n_(shape.tokens()), h_(shape.hidden), tp_(o.tensor_parallel),
        part_(shape, group_size(o)),
        host_(make_rank_model(shape, layout,
                              {.device = pipeline_device, .tp_rank = o.tp_rank, .tp = group_size(o), .owned = o.owned},
                              seed)),
        share_(bind_device(o)), model_(host_, o.dtype), threads_(o.device, share_),
        op_{.threads = threads_, .owner = *this, .dtype = o.dtype, .n = shape.tokens(), .h = shape.hidden} {
    // Freed blocks stay in the pool for the next step instead of going back to the driver.
    cudaMemPool_t pool = nullptr;
    CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, o.device));
    std::uint64_t keep = UINT64_MAX;
    CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep));
  }

  std::string_view name() const override { return "cuda"; }
  std::unique_ptr<DeviceClock> device_clock() override { return std::make_unique<EventClock>(stream()); }

  void release_thread() override { threads_.release_thread(); }

  // ---- memory ----
  /// Ready for any thread when it returns (the executor hands these between threads).
  Tensor allocate(std::size_t count, DType dtype) override {
    Tensor t = scratch(count, dtype);
    synchronize();
    return t;
  }
  void free(void* data, std::size_t) noexcept override {
    try {
      static_cast<void>(cudaFreeAsync(data, stream()));
    } catch (const std::exception&) {  // no stream for this thread: the device is gone, nothing to give back
    }
  }
  DType activation_dtype() const override { return options_.dtype; }
  void copy(const Tensor& src, std::size_t src_at, Tensor& dst, std::size_t dst_at, std::size_t count) override {
    op_.copy(src, src_at, dst, dst_at, count);
  }
  void synchronize() override { op_.synchronize(); }
  void set_batches(std::span<const Batch> batches) override {
    std::vector<int> tokens, targets;
    for (const Batch& b : batches) {
      tokens.insert(tokens.end(), b.tokens.begin(), b.tokens.end());
      targets.insert(targets.end(), b.targets.begin(), b.targets.end());
    }
    tokens_ = DeviceBuffer<int>(std::span<const int>(tokens));
    targets_ = DeviceBuffer<int>(std::span<const int>(targets));
  }

  // ---- transformer stages ----
  Tensor embed(int mb) override {
    Tensor x = activation();
    embedding_forward({.table = model_.embedding.weight.get(), .tokens = tokens(mb), .out = x.data()},
                      {.n = n_, .h = h_}, host_.shard, dtype(), stream());
    return x;
  }
  void embed_backward(int mb, const Tensor& dy) override {
    embedding_backward({.tokens = tokens(mb), .dout = dy.data(), .dtable = model_.embedding.grad.get()},
                       {.n = n_, .h = h_}, host_.shard, dtype(), stream());
  }

  std::size_t layer_activation_count() const override { return std::size_t(rows()) * std::size_t(h_); }
  std::unique_ptr<Activations> layer_forward(int layer, Tensor& x) override {
    auto cache = std::make_unique<CudaLayerActivations>();
    forward(model_.layers.at(layer), x, *cache);
    return cache;
  }
  void layer_backward(int layer, Activations& cache, Tensor& dy, bool defer_weights) override {
    partial_gradients_ = partial_gradients_ || sequence_parallel();
    backward(model_.layers.at(layer), layer_cache(cache), dy, defer_weights);
  }
  void layer_weight(int layer, Activations& base) override {
    DeviceLayer& w = model_.layers.at(layer);
    const CudaLayerActivations& c = layer_cache(base);
    const CudaLayerActivations::Deferred& d = c.deferred;
    linear_weight_grad(c.gelu, d.fc2_dy, w.fc2_weight, w.fc2_bias, part_.ffn, h_);
    linear_weight_grad(c.ln2, d.fc1_dy, w.fc1_weight, w.fc1_bias, h_, part_.fc1);
    linear_weight_grad(c.attention, d.proj_dy, w.proj_weight, w.proj_bias, part_.attention, h_);
    linear_weight_grad(c.ln1, d.qkv_dy, w.qkv_weight, w.qkv_bias, h_, part_.qkv);
  }

  std::unique_ptr<Activations> final_norm(Tensor x) override {
    auto cache = std::make_unique<CudaHeadActivations>();
    cache->input = std::move(x);
    norm_forward(model_.final_gain, model_.final_bias, cache->input, cache->normed, cache->mean, cache->rstd, n_);
    return cache;
  }
  Tensor final_output(const Activations& base) override {
    const CudaHeadActivations& cache = head_cache(base);
    Tensor x = uninitialized(activation_size(), dtype());
    copy(cache.normed, 0, x, 0, cache.normed.count());
    return x;
  }
  Tensor final_norm_backward(Activations& base, const Tensor& dnormed) override {
    CudaHeadActivations& cache = head_cache(base);
    Tensor dy = activation();
    norm_backward(model_.final_gain, model_.final_bias, cache.input, cache.mean, cache.rstd, dnormed, dy, n_);
    return dy;
  }

  double head_forward(Activations& base, int mb, float scale) override {
    CudaHeadActivations& cache = head_cache(base);
    const int vocab = shape_.vocab;
    Tensor logits = uninitialized(std::size_t(n_) * std::size_t(vocab), DType::F32);
    matmul_bt(gemm(), cache.normed.data(), model_.head.compute(dtype()), logits.data(), n_, h_, vocab,
              {dtype(), DType::F32}, false, stream());
    cache.dlogits = uninitialized(logits.count(), dtype());  // cross_entropy writes every element
    Tensor loss = scratch(1, DType::F64);
    cross_entropy({.logits = f32(logits), .targets = targets(mb), .dlogits = cache.dlogits.data(),
                   .loss = static_cast<double*>(loss.data())},
                  n_, vocab, dtype(), stream());
    cuda::scale(cache.dlogits.data(), scale, cache.dlogits.count(), dtype(), stream());
    return download_scalar(loss) * scale;
  }
  Tensor head_backward(Activations& base) override {
    CudaHeadActivations& cache = head_cache(base);
    const int vocab = shape_.vocab;
    Tensor dnormed = uninitialized(activation_size(), dtype());
    matmul_at(gemm(), cache.dlogits.data(), cache.normed.data(), model_.head.grad.get(), n_, vocab, h_,
              {dtype(), DType::F32}, true, stream());
    matmul(gemm(), cache.dlogits.data(), model_.head.compute(dtype()), dnormed.data(), n_, vocab, h_, {dtype(), dtype()},
           false, stream());
    return dnormed;
  }

  // ---- vocabulary passes ----
  OutputShard output_forward(int mb, const Tensor& x, bool algorithm2) override {
    const std::size_t n = std::size_t(n_);
    const Shard sh = shard();
    OutputShard out{.logits = scratch(n * std::size_t(sh.rows), DType::F32), .local = scratch(3 * n, DType::F32),
                    .terms = {}};
    float* local = f32(out.local);
    output_logits(gemm(),
                  {.x = x.data(), .w = model_.head.compute(dtype()), .targets = targets(mb), .logits = f32(out.logits),
                   .max = local, .sum_exp = local + n, .target_logit = local + 2 * n},
                  sh, {.n = n_, .h = h_}, dtype(), stream());
    if (algorithm2) {
      out.terms = scratch(2 * activation_size(), dtype());
      output_input_grad_terms(gemm(),
                              {.logits = f32(out.logits), .max = local, .sum_exp = local + n,
                               .w = model_.head.compute(dtype()), .targets = targets(mb), .a = out.terms.data(),
                               .y = element(out.terms, activation_size())},
                              sh, {.n = n_, .h = h_}, dtype(), stream());
    }
    return out;
  }
  Tensor softmax_sums(const Tensor& local, const Tensor& global_max) override {
    const std::size_t n = std::size_t(n_);
    Tensor sums = scratch(2 * n, DType::F32);
    const float* l = f32(local);
    rescale_sum_exp(l, l + n, f32(global_max), f32(sums), n_, stream());
    CUDA_CHECK(cudaMemcpyAsync(f32(sums) + n, l + 2 * n, n * sizeof(float), cudaMemcpyDeviceToDevice, stream()));
    return sums;
  }
  double loss_sum(const Tensor& global_max, const Tensor& sums) override {
    Tensor total = scratch(1, DType::F64);
    cuda::loss_sum(f32(global_max), f32(sums), f32(sums) + n_, n_, static_cast<double*>(total.data()), stream());
    return download_scalar(total);
  }
  Tensor input_grad_share(const Tensor& local, const Tensor& global_max, const Tensor& sums, const Tensor& terms,
                          float g) override {
    const float* l = f32(local);
    Tensor scaled = stats(), dx = activation();
    rescale_sum_exp(l, l + n_, f32(global_max), f32(scaled), n_, stream());
    cuda::input_grad_share({.scaled_sum_exp = f32(scaled), .global_sum_exp = f32(sums), .a = terms.data(),
                            .y = element(terms, activation_size()), .dx = dx.data()},
                           g, {.n = n_, .h = h_}, dtype(), stream());
    return dx;
  }
  Tensor output_backward(int mb, const Tensor& logits, const Tensor& stats, const Tensor& x, float g,
                         bool input_grad) override {
    const Shard sh = shard();
    Tensor dx = input_grad ? activation() : Tensor();
    cuda::output_backward(gemm(),
                          {.logits = f32(logits), .global_max = f32(stats), .global_sum_exp = f32(stats) + n_,
                           .targets = targets(mb), .x = x.data(), .w = model_.head.compute(dtype()),
                           .dw = model_.head.grad.get(), .dx = input_grad ? dx.data() : nullptr},
                          sh, g, {.n = n_, .h = h_}, dtype(), stream());
    return dx;
  }

  // ---- per iteration ----
  std::vector<Buffer> parameter_buffers(bool gradients) override { return model_.buffers(gradients); }
  void optimizer_step(const OptimizerSettings& settings, int step) override {
    sum_partial_gradients();
    model_.optimizer_step(settings, step, stream());
  }
  void weights_written() override { model_.refresh_compute_copies(stream()); }
  std::vector<HostGradient> gradients() override {
    sum_partial_gradients();
    model_.download_grads(host_);
    return host_gradients(host_);
  }
  Bytes static_bytes() const override { return Bytes(model_.bytes()); }

 private:
  cudaStream_t stream() { return op_.stream(); }
  GemmHandle& gemm() { return op_.gemm(); }

  static SmShare bind_device(const BackendOptions& o) {
    CUDA_CHECK(cudaSetDevice(o.device));
    return SmShare(o.device, o.ranks_on_device, o.index_on_device);
  }

  /// cuBLASLt's GELU epilogues evaluate the tanh approximation their own way; fp32 runs, which the
  /// check compares with the CPU, keep GELU in the kernels that share the CPU's formula. Llama's
  /// SwiGLU has no epilogue.
  bool fused_gelu() const { return dtype() == DType::BF16 && !llama(); }
  bool llama() const { return shape_.family == LayerFamily::Llama; }

  /// The family's norm over `rows` rows of x (cpu::norm_forward): LayerNorm, keeping mean and rstd,
  /// for GPT; RMSNorm, gain only and keeping rstd (mean stays empty), for Llama. A layer's norms run
  /// on its rows() rows, the final norm on all n.
  void norm_forward(const DeviceParam& gain, const DeviceParam& bias, const Tensor& x, Tensor& y, Tensor& mean,
                    Tensor& rstd, int rows) {
    y = uninitialized(std::size_t(rows) * std::size_t(h_), dtype());
    rstd = uninitialized(std::size_t(rows), DType::F32);
    switch (shape_.family) {
      case LayerFamily::Gpt:
        mean = uninitialized(std::size_t(rows), DType::F32);
        return layernorm_forward({.x = x.data(), .gamma = gain.weight.get(), .beta = bias.weight.get(), .y = y.data(),
                                  .mean = f32(mean), .rstd = f32(rstd)},
                                 {.n = rows, .h = h_}, dtype(), stream());
      case LayerFamily::Llama:
        return rmsnorm_forward({.x = x.data(), .gain = gain.weight.get(), .y = y.data(), .rstd = f32(rstd)},
                               {.n = rows, .h = h_}, dtype(), stream());
    }
  }
  /// dx += the norm's input gradient; the gain's (and LayerNorm's bias') gradients accumulate: under
  /// sequence parallelism partial sums over this rank's rows, until sum_partial_gradients.
  void norm_backward(DeviceParam& gain, DeviceParam& bias, const Tensor& x, const Tensor& mean, const Tensor& rstd,
                     const Tensor& dy, Tensor& dx, int rows) {
    switch (shape_.family) {
      case LayerFamily::Gpt:
        return layernorm_backward({.x = x.data(), .gamma = gain.weight.get(), .mean = f32(mean), .rstd = f32(rstd),
                                   .dy = dy.data(), .dx = dx.data(), .dgamma = gain.grad.get(),
                                   .dbeta = bias.grad.get()},
                                  {.n = rows, .h = h_}, dtype(), stream());
      case LayerFamily::Llama:
        return rmsnorm_backward({.x = x.data(), .gain = gain.weight.get(), .rstd = f32(rstd), .dy = dy.data(),
                                 .dx = dx.data(), .dgain = gain.grad.get()},
                                {.n = rows, .h = h_}, dtype(), stream());
    }
  }
  /// Llama's rotary embedding of the q and k heads of this rank's fused QKV (n × part qkv: its query
  /// heads, then its key and value heads), in place, as cpu::rotate_qk: forward on the projection's
  /// output, backward on its gradient. GPT has none.
  void rotate_qk(Tensor& qkv, bool backward) {
    if (!llama()) return;
    const auto rope = backward ? rope_backward : rope_forward;
    rope(qkv.data(),
         {.n = n_, .seq = shape_.seq, .width = part_.qkv, .heads = part_.heads + part_.kv_heads,
          .d = shape_.head_width(), .theta = shape_.rope_theta},
         dtype(), stream());
  }
  bool sequence_parallel() const { return tp_ && tp_->sequence_parallel(); }
  /// Rows of a layer's input and output on this rank (cpu::layer_rows): n, or n / tp under sequence
  /// parallelism.
  int rows() const { return sequence_parallel() ? n_ / tp_->size() : n_; }

  // The tensor-parallel collectives. Each first lets this stream's work finish (the communicator
  // reads and writes from its own stream, NCCL's, or thread) and returns with its result in place,
  // so what this stream launches next reads it.

  /// Every rank's rows (n × h) of a tensor this rank holds rows() rows of (sequence parallelism).
  Tensor gathered(const Tensor& part) {
    Tensor whole = uninitialized(activation_size(), part.dtype());
    synchronize();
    tp_->all_gather(part.view(), whole.view());
    return whole;
  }
  /// The sum over the group of `partial` (n × h, each rank's partial sum): this rank's rows of it
  /// under sequence parallelism, else all of it, in place; `partial` itself without tensor
  /// parallelism.
  Tensor summed(Tensor partial) {
    if (!tp_) return partial;
    if (!sequence_parallel()) {
      synchronize();
      tp_->all_reduce(partial.view());
      return partial;
    }
    Tensor mine = uninitialized(layer_activation_count(), partial.dtype());
    synchronize();
    tp_->reduce_scatter(partial.view(), mine.view());
    return mine;
  }
  /// Under sequence parallelism, once a step before the gradients are read: the norms' parameter
  /// gradients, partial sums over each rank's rows, summed over the group (cpu::sum_partial_gradients).
  void sum_partial_gradients() {
    if (!std::exchange(partial_gradients_, false)) return;
    synchronize();
    for (auto& [index, layer] : model_.layers)
      for (DeviceParam* p : {&layer.ln1_gain, &layer.ln1_bias, &layer.ln2_gain, &layer.ln2_bias})
        if (p->count() > 0) tp_->all_reduce({p->grad.get(), p->count(), DType::F32});
  }
  /// A row-split map (proj, fc2): x (n × in, this rank's part) times its rows of W, summed over the
  /// group (this rank's rows of the sum under sequence parallelism), then the bias (whole on every
  /// rank) and the residual (rows() rows), as cpu::finish_row_split adds them; without tensor
  /// parallelism linear() with the residual (one fused GEMM where it can).
  Tensor row_split(const Tensor& x, const DeviceParam& w, const DeviceParam& b, int in, int out,
                   const Tensor& residual) {
    if (!tp_) return linear(x, w, b, in, out, &residual);
    Tensor partial = uninitialized(std::size_t(n_) * std::size_t(out), dtype());
    matmul(gemm(), x.data(), w.compute(dtype()), partial.data(), n_, in, out, {dtype(), dtype()}, false, stream());
    Tensor y = summed(std::move(partial));
    if (b.count() > 0) bias_add(y.data(), b.weight.get(), rows(), out, dtype(), stream());
    add(y.data(), residual.data(), y.data(), y.count(), dtype(), stream());
    return y;
  }

  /// y = x·W + b (+ residual), keeping x (the layer's cache holds it) and returning y: one GEMM with
  /// the bias and the residual in its epilogue where cuBLASLt has one, else the GEMM and two kernels.
  /// An empty b (Llama's layers have no biases) adds nothing.
  Tensor linear(const Tensor& x, const DeviceParam& w, const DeviceParam& b, int in, int out,
                const Tensor* residual = nullptr) {
    Tensor y = uninitialized(std::size_t(n_) * std::size_t(out), dtype());
    const bool has_bias = b.count() > 0;
    if (has_bias && linear_bias(gemm(), x.data(), w.compute(dtype()), b.weight.get(),
                                residual ? residual->data() : nullptr, y.data(), n_, in, out, dtype(), stream()))
      return y;
    matmul(gemm(), x.data(), w.compute(dtype()), y.data(), n_, in, out, {dtype(), dtype()}, false, stream());
    if (has_bias) bias_add(y.data(), b.weight.get(), n_, out, dtype(), stream());
    if (residual) add(y.data(), residual->data(), y.data(), y.count(), dtype(), stream());
    return y;
  }
  /// dW += xᵀ·dy and db += Σ dy, accumulated in fp32. The GEMM's BGRADA epilogue sums dy while it
  /// reads it (a deterministic reduction, as every cuBLAS result is run to run on one GPU), into a
  /// vector that is then added: cuBLASLt overwrites a bias gradient, and gradients accumulate over
  /// microbatches.
  void linear_weight_grad(const Tensor& x, const Tensor& dy, DeviceParam& w, DeviceParam& b, int in, int out) {
    if (b.count() == 0) {  // no bias (Llama): the weight gradient alone
      matmul_at(gemm(), x.data(), dy.data(), w.grad.get(), n_, in, out, {dtype(), DType::F32}, true, stream());
      return;
    }
    Tensor db = uninitialized(std::size_t(out), DType::F32);
    if (matmul_at_bgrad(gemm(), x.data(), dy.data(), w.grad.get(), f32(db), n_, in, out, {dtype(), DType::F32}, true,
                        stream())) {
      add(b.grad.get(), db.data(), b.grad.get(), std::size_t(out), DType::F32, stream());
      return;
    }
    matmul_at(gemm(), x.data(), dy.data(), w.grad.get(), n_, in, out, {dtype(), DType::F32}, true, stream());
    bias_grad(dy.data(), b.grad.get(), n_, out, dtype(), stream());
  }
  /// dx = dy·Wᵀ (dx is overwritten) and the weight gradients now, unless a W pass will compute them
  /// from the kept dy.
  void linear_backward(const Tensor& x, DeviceParam& w, DeviceParam& b, const Tensor& dy, Tensor& dx, int in, int out,
                       bool defer) {
    if (!defer) linear_weight_grad(x, dy, w, b, in, out);
    matmul_bt(gemm(), dy.data(), w.compute(dtype()), dx.data(), n_, out, in, {dtype(), dtype()}, false, stream());
  }

  /// Causal attention of c.qkv into c.attention, keeping the logsumexp in c.lse. bf16 runs use the
  /// tensor cores: cuDNN, else cuBLASLt (multi-head attention only), else the flash kernels, which
  /// also stay the fp32 (checked) path. All three keep the same logsumexp, so any forward pairs with
  /// any backward.
  /// This rank's heads: attention of its query heads (width part_.attention) over its key/value heads.
  void attention_forward_pass(CudaLayerActivations& c) {
    const int heads = part_.heads, kv = part_.kv_heads, d = shape_.head_width(), width = part_.attention;
    c.attention = scratch(std::size_t(n_) * std::size_t(width), dtype());
    c.lse = scratch(std::size_t(shape_.batch) * std::size_t(heads) * std::size_t(shape_.seq), DType::F32);
    if (dtype() == DType::BF16) {
      if (use_cudnn_attention() && attention_forward_cudnn(c.qkv.data(), c.attention.data(), f32(c.lse), shape_.batch,
                                                           shape_.seq, heads, kv, d, stream()))
        return;
      if (kv == heads)
        return attention_forward_gemm(gemm(), c.qkv.data(), c.attention.data(), f32(c.lse), shape_.batch, shape_.seq,
                                      width, heads, stream());
    }
    attention_forward({.qkv = c.qkv.data(), .out = c.attention.data(), .lse = f32(c.lse)},
                      {.batch = shape_.batch, .seq = shape_.seq, .h = width, .heads = heads, .kv_heads = kv}, dtype(),
                      stream());
  }
  /// dqkv (fresh zeros, n × qkv_width) = the gradient of attention_forward_pass: cuDNN writes it,
  /// the others add to it, the same on zeros.
  void attention_backward_pass(const CudaLayerActivations& c, const Tensor& dattention, Tensor& dqkv) {
    const int heads = part_.heads, kv = part_.kv_heads, d = shape_.head_width(), width = part_.attention;
    if (dtype() == DType::BF16) {
      if (use_cudnn_attention() && attention_backward_cudnn(c.qkv.data(), c.attention.data(), f32(c.lse),
                                                            dattention.data(), dqkv.data(), shape_.batch, shape_.seq,
                                                            heads, kv, d, stream()))
        return;
      if (kv == heads)
        return attention_backward_gemm(gemm(), c.qkv.data(), c.attention.data(), f32(c.lse), dattention.data(),
                                       dqkv.data(), shape_.batch, shape_.seq, width, heads, stream());
    }
    attention_backward({.qkv = c.qkv.data(), .out = c.attention.data(), .lse = f32(c.lse), .dout = dattention.data(),
                        .dqkv = dqkv.data()},
                       {.batch = shape_.batch, .seq = shape_.seq, .h = width, .heads = heads, .kv_heads = kv}, dtype(),
                       stream());
  }

  /// Under tensor parallelism the QKV map and fc1 are split by output columns (this rank's heads and
  /// FFN slice; their biases too), proj and fc2 by input rows (row_split sums them over the group).
  void forward(DeviceLayer& w, Tensor& x, CudaLayerActivations& c) {
    const int f = part_.ffn;
    c.input = std::move(x);
    norm_forward(w.ln1_gain, w.ln1_bias, c.input, c.ln1, c.mean1, c.rstd1, rows());
    if (sequence_parallel()) c.ln1 = gathered(c.ln1);  // the column-split map reads every row
    c.qkv = linear(c.ln1, w.qkv_weight, w.qkv_bias, h_, part_.qkv);
    rotate_qk(c.qkv, false);  // the cache keeps the rotated q and k, which attention reads
    attention_forward_pass(c);
    c.middle = row_split(c.attention, w.proj_weight, w.proj_bias, part_.attention, h_, c.input);  // + residual
    norm_forward(w.ln2_gain, w.ln2_bias, c.middle, c.ln2, c.mean2, c.rstd2, rows());
    if (sequence_parallel()) c.ln2 = gathered(c.ln2);
    // fc1 keeps its pre-activation (c.fc1) for the activation's backward.
    const std::size_t nf = std::size_t(n_) * std::size_t(f);
    c.gelu = uninitialized(nf, dtype());
    if (llama()) {
      c.fc1 = linear(c.ln2, w.fc1_weight, w.fc1_bias, h_, part_.fc1);  // [gate | up], n × 2f
      swiglu_forward(c.fc1.data(), c.gelu.data(), n_, f, dtype(), stream());
    } else {
      c.fc1 = uninitialized(nf, dtype());
      if (!fused_gelu() || !linear_bias_gelu(gemm(), c.ln2.data(), w.fc1_weight.compute(dtype()),
                                             w.fc1_bias.weight.get(), c.fc1.data(), c.gelu.data(), n_, h_, f, dtype(),
                                             stream())) {
        matmul(gemm(), c.ln2.data(), w.fc1_weight.compute(dtype()), c.fc1.data(), n_, h_, f, {dtype(), dtype()}, false,
               stream());
        bias_add(c.fc1.data(), w.fc1_bias.weight.get(), n_, f, dtype(), stream());
        gelu_forward(c.fc1.data(), c.gelu.data(), nf, dtype(), stream());
      }
    }
    x = row_split(c.gelu, w.fc2_weight, w.fc2_bias, f, h_, c.middle);  // with the residual
  }

  /// The MLP activation's input gradient dfc1 (n × fc1 width) from fc2's output gradient dy: GELU's
  /// backward, fused into fc2's input-gradient GEMM where cuBLASLt can, or SwiGLU's.
  Tensor activation_backward(DeviceLayer& w, const CudaLayerActivations& c, const Tensor& dy) {
    const int f = part_.ffn;
    const std::size_t nf = std::size_t(n_) * std::size_t(f);
    Tensor dfc1 = uninitialized(std::size_t(n_) * std::size_t(part_.fc1), dtype());
    if (fused_gelu() && matmul_bt_dgelu(gemm(), dy.data(), w.fc2_weight.compute(dtype()), c.fc1.data(), dfc1.data(), n_,
                                        h_, f, dtype(), stream()))
      return dfc1;
    Tensor dgelu = uninitialized(nf, dtype());
    matmul_bt(gemm(), dy.data(), w.fc2_weight.compute(dtype()), dgelu.data(), n_, h_, f, {dtype(), dtype()}, false,
              stream());
    CUDA_CHECK(cudaMemsetAsync(dfc1.data(), 0, dfc1.bytes(), stream()));  // both backwards add
    if (llama())
      swiglu_backward(c.fc1.data(), dgelu.data(), dfc1.data(), n_, f, dtype(), stream());
    else
      gelu_backward(c.fc1.data(), dgelu.data(), dfc1.data(), nf, dtype(), stream());
    return dfc1;
  }

  /// With `defer` (a W pass split off), the four output gradients move into c.deferred instead of
  /// feeding weight GEMMs now; only proj's, which the first residual's gradient goes on adding to, is
  /// copied. Under tensor parallelism the column-split maps' input gradients (dln2, dln1) are this rank's
  /// partial sums, summed over the group before the norms' backward (this rank's rows of the sums
  /// under sequence parallelism, where dy and dx are its rows too).
  void backward(DeviceLayer& w, CudaLayerActivations& c, Tensor& dy, bool defer) {
    const int f = part_.ffn;
    CudaLayerActivations::Deferred* keep = defer ? &c.deferred : nullptr;
    Tensor dmiddle = uninitialized(layer_activation_count(), dtype());  // through the second residual
    copy(dy, 0, dmiddle, 0, dy.count());
    // A row-split map reads the whole output gradient: under sequence parallelism every rank's rows.
    if (sequence_parallel()) dy = gathered(dy);
    if (!defer) linear_weight_grad(c.gelu, dy, w.fc2_weight, w.fc2_bias, f, h_);
    Tensor dfc1 = activation_backward(w, c, dy);
    if (defer) keep->fc2_dy = std::move(dy);
    Tensor dln2 = uninitialized(activation_size(), dtype());
    linear_backward(c.ln2, w.fc1_weight, w.fc1_bias, dfc1, dln2, h_, part_.fc1, defer);
    if (defer) keep->fc1_dy = std::move(dfc1);
    dln2 = summed(std::move(dln2));  // each rank's FFN slice contributes
    norm_backward(w.ln2_gain, w.ln2_bias, c.middle, c.mean2, c.rstd2, dln2, dmiddle, rows());
    Tensor dmiddle_gathered = sequence_parallel() ? gathered(dmiddle) : Tensor();
    const Tensor& dmiddle_whole = sequence_parallel() ? dmiddle_gathered : dmiddle;
    Tensor dattention = uninitialized(std::size_t(n_) * std::size_t(part_.attention), dtype());
    Tensor dqkv = scratch(std::size_t(n_) * std::size_t(part_.qkv), dtype());
    linear_backward(c.attention, w.proj_weight, w.proj_bias, dmiddle_whole, dattention, part_.attention, h_, defer);
    if (defer && sequence_parallel()) {
      keep->proj_dy = std::move(dmiddle_gathered);  // read for the last time above
    } else if (defer) {
      keep->proj_dy = uninitialized(dmiddle.count(), dtype());
      copy(dmiddle, 0, keep->proj_dy, 0, dmiddle.count());
    }
    attention_backward_pass(c, dattention, dqkv);
    rotate_qk(dqkv, true);  // back to the projection's output: what qkv's weight gradient reads
    Tensor dln1 = uninitialized(activation_size(), dtype());
    linear_backward(c.ln1, w.qkv_weight, w.qkv_bias, dqkv, dln1, h_, part_.qkv, defer);
    if (defer) keep->qkv_dy = std::move(dqkv);
    dln1 = summed(std::move(dln1));  // likewise each rank's heads
    // dx: through the first residual, plus the first norm's backward.
    norm_backward(w.ln1_gain, w.ln1_bias, c.input, c.mean1, c.rstd1, dln1, dmiddle, rows());
    dy = std::move(dmiddle);
  }


  Tensor uninitialized(std::size_t count, DType dtype) { return op_.uninitialized(count, dtype); }
  Tensor scratch(std::size_t count, DType dtype) { return op_.scratch(count, dtype); }
  DType dtype() const { return options_.dtype; }
  std::size_t activation_size() const { return std::size_t(n_) * std::size_t(h_); }
  Tensor activation() { return scratch(activation_size(), dtype()); }
  Tensor stats() { return scratch(std::size_t(n_), DType::F32); }
  const int* tokens(int mb) const { return tokens_.get() + std::size_t(mb) * std::size_t(n_); }
  const int* targets(int mb) const { return targets_.get() + std::size_t(mb) * std::size_t(n_); }
  /// This rank's rows of the vocabulary (RankModel::shard), as the vocabulary launchers take them.
  using Shard = VocabShard;
  Shard shard() const { return host_.shard; }
  double download_scalar(const Tensor& value) { return op_.download_scalar(value); }

  ModelShape shape_;
  BackendOptions options_;
  int n_, h_;
  TensorParallel* tp_;  ///< this rank's tensor-parallel group; null when its layers are whole
  LayerPart part_;             ///< the widths of its part of each layer
  bool partial_gradients_ = false;  ///< a backward under sequence parallelism since sum_partial_gradients
  RankModel host_;  ///< the CPU copy: the weights uploaded, and where gradients land for the check
  SmShare share_;
  DeviceModel model_;
  DeviceBuffer<int> tokens_, targets_;  ///< this step's, microbatch after microbatch
  // Declared after what they use, so destroyed first: the streams and GEMM handles go before the
  // buffers, the model and the SM share.
  ThreadContexts threads_;
  OpContext op_;  ///< this rank's ops' view of the above
};

}  // namespace

int device_count() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess ? count : 0;
}

std::string unavailable_reason() {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status == cudaErrorNoDevice || (status == cudaSuccess && count == 0))
    return "no CUDA device: this machine has no GPU the CUDA runtime can see (check nvidia-smi and "
           "CUDA_VISIBLE_DEVICES), or run with --backend cpu";
  if (status != cudaSuccess)
    return fmt::format("no CUDA device: the CUDA runtime reports {} ({}); check the driver, or run with --backend cpu",
                       cudaGetErrorName(status), cudaGetErrorString(status));
  return "";
}

std::unique_ptr<Backend> make_backend(const ModelShape& shape, const Layout& layout, int pipeline_device,
                                      std::uint64_t seed, const BackendOptions& options) {
  return std::make_unique<CudaBackend>(shape, layout, pipeline_device, seed, options);
}

}  // namespace pipesim::runtime::cuda
