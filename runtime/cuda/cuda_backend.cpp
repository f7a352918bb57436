// The CUDA backend: each op's math as cuBLASLt GEMMs and the kernels of cuda/kernels.h on this
// rank's GPU, in fp32 (TF32 off: the correctness check) or bf16 with fp32 accumulation. The
// transformer layers: layer.h, on layer_ops.h. Each calling thread's stream, GEMM handle and memory:
// op_context.h.
#include "cuda/cuda_backend.h"

#include <fmt/format.h>

#include <utility>

#include "cuda/check.h"
#include "cuda/device_model.h"
#include "cuda/event_clock.h"
#include "cuda/gemm.h"
#include "cuda/kernels.h"
#include "cuda/layer.h"
#include "cuda/layer_ops.h"
#include "cuda/op_context.h"
#include "cuda/reduce.h"
#include "cuda/sm_share.h"
#include "cuda/vocab.h"

namespace pipesim::runtime::cuda {
namespace {

/// The final norm's input and output (mean empty for RMSNorm), and the baseline LM head's logit
/// gradients (last stage).
struct CudaHeadActivations final : Activations {
  Tensor input, mean, rstd, normed, dlogits;
  Bytes bytes() const override {
    return Bytes(input.bytes() + mean.bytes() + rstd.bytes() + normed.bytes() + dlogits.bytes());
  }
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
        host_(make_rank_model(shape, layout,
                              {.device = pipeline_device, .tp_rank = o.tp_rank, .tp = group_size(o), .owned = o.owned},
                              seed)),
        share_(bind_device(o)), model_(host_, o.dtype), threads_(o.device, share_),
        op_{.threads = threads_, .owner = *this, .dtype = o.dtype, .n = shape.tokens(), .h = shape.hidden},
        layer_ops_(op_, shape_, LayerPart(shape, group_size(o)), o.tensor_parallel), layers_(op_, layer_ops_) {
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

  std::size_t layer_activation_count() const override { return layer_ops_.layer_activation_count(); }
  std::unique_ptr<Activations> layer_forward(int layer, Tensor& x) override {
    auto cache = std::make_unique<CudaLayerActivations>();
    layers_.forward(model_.layers.at(layer), x, *cache);
    return cache;
  }
  void layer_backward(int layer, Activations& cache, Tensor& dy, bool defer_weights) override {
    partial_gradients_ = partial_gradients_ || layer_ops_.sequence_parallel();
    layers_.backward(model_.layers.at(layer), layer_cache(cache), dy, defer_weights);
  }
  void layer_weight(int layer, Activations& base) override {
    layers_.weight(model_.layers.at(layer), layer_cache(base));
  }

  std::unique_ptr<Activations> final_norm(Tensor x) override {
    auto cache = std::make_unique<CudaHeadActivations>();
    cache->input = std::move(x);
    layer_ops_.norm_forward(model_.final_gain, model_.final_bias, cache->input, cache->normed, cache->mean,
                            cache->rstd, n_);
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
    layer_ops_.norm_backward(model_.final_gain, model_.final_bias, cache.input, cache.mean, cache.rstd, dnormed, dy,
                             n_);
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

  /// Under sequence parallelism, once a step before the gradients are read: the norms' parameter
  /// gradients, partial sums over each rank's rows, summed over the group (cpu::sum_partial_gradients).
  void sum_partial_gradients() {
    if (!std::exchange(partial_gradients_, false)) return;
    synchronize();
    for (auto& [index, layer] : model_.layers)
      for (DeviceParam* p : {&layer.ln1_gain, &layer.ln1_bias, &layer.ln2_gain, &layer.ln2_bias})
        if (p->count() > 0) tp_->all_reduce({p->grad.get(), p->count(), DType::F32});
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
  bool partial_gradients_ = false;  ///< a backward under sequence parallelism since sum_partial_gradients
  RankModel host_;  ///< the CPU copy: the weights uploaded, and where gradients land for the check
  SmShare share_;
  DeviceModel model_;
  DeviceBuffer<int> tokens_, targets_;  ///< this step's, microbatch after microbatch
  // Declared after what they use, so destroyed first: the streams and GEMM handles go before the
  // buffers, the model and the SM share.
  ThreadContexts threads_;
  OpContext op_;        ///< this rank's ops' view of the above
  LayerOps layer_ops_;  ///< the layers' building blocks, on this rank's part of each layer
  LayerPasses layers_;  ///< the layers' F, B and W
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
