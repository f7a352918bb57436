// The CUDA backend: each op of the IR on this rank's GPU, in fp32 (TF32 off: the correctness check)
// or bf16 with fp32 accumulation. This file is the seam: the Backend overrides, which hand each op to
// the math that computes it -- the transformer layers (layer.h, on layer_ops.h), the embedding, the
// head and the vocabulary passes (vocab_passes.h) -- and keep what is the backend's own: this step's
// tokens and targets, the device model's parameters and optimizer (device_model.h), and the calling
// thread's stream, GEMM handle and memory (op_context.h).
#include "cuda/cuda_backend.h"

#include <fmt/format.h>

#include <utility>

#include "cuda/attention_cudnn.h"
#include "cuda/check.h"
#include "cuda/device_model.h"
#include "cuda/event_clock.h"
#include "cuda/layer.h"
#include "cuda/layer_ops.h"
#include "cuda/op_context.h"
#include "cuda/sm_share.h"
#include "cuda/vocab_passes.h"

namespace pipesim::runtime::cuda {
namespace {

int group_size(const BackendOptions& o) { return o.tensor_parallel ? o.tensor_parallel->size() : 1; }

CudaLayerActivations& layer_cache(Activations& cache) { return static_cast<CudaLayerActivations&>(cache); }
CudaHeadActivations& head_cache(Activations& cache) { return static_cast<CudaHeadActivations&>(cache); }
const CudaHeadActivations& head_cache(const Activations& cache) { return static_cast<const CudaHeadActivations&>(cache); }

class CudaBackend final : public Backend {
 public:
  CudaBackend(const ModelShape& shape, const Layout& layout, int pipeline_device, std::uint64_t seed,
              const BackendOptions& o)
      : shape_(shape), options_(o), tp_(o.tensor_parallel),
        host_(make_rank_model(shape, layout,
                              {.device = pipeline_device, .tp_rank = o.tp_rank, .tp = group_size(o), .owned = o.owned},
                              seed)),
        share_(bind_device(o)), model_(host_, o.dtype), threads_(o.device, share_),
        op_{.threads = threads_, .owner = *this, .dtype = o.dtype, .n = shape.tokens(), .h = shape.hidden},
        layer_ops_(op_, shape_, LayerPart(shape, group_size(o)), o.tensor_parallel), layers_(op_, layer_ops_),
        vocab_(op_, shape_, model_, host_.shard, layer_ops_) {
    // Freed blocks stay in the pool for the next step instead of going back to the driver.
    cudaMemPool_t pool = nullptr;
    CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, o.device));
    std::uint64_t keep = UINT64_MAX;
    CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep));
  }

  std::string_view name() const override { return "cuda"; }
  std::unique_ptr<DeviceClock> device_clock() override { return std::make_unique<EventClock>(op_.stream()); }

  void release_thread() override { threads_.release_thread(); }

  /// One layer's F, B (with and without a split-off W) and W on zeros, on this thread's stream, with
  /// the tensor-parallel collectives left out (a group of the same size that moves nothing): every
  /// GEMM shape and epilogue of the rank's layers gets its cuBLASLt plan, cuDNN builds (and
  /// compiles) its attention engines, and the cuBLASLt handle and workspace are made, before any
  /// NCCL kernel can be waiting on the GPU. The gradients it added are zeroed again. The embedding,
  /// the LM head and the vocabulary passes are not run.
  void warm_up() override {
    if (model_.layers.empty()) return;
    struct Local final : TensorParallel {
      const TensorParallel& group;
      explicit Local(const TensorParallel& g) : group(g) {}
      int rank() const override { return group.rank(); }
      int size() const override { return group.size(); }
      bool sequence_parallel() const override { return group.sequence_parallel(); }
      void all_reduce(Buffer) override {}
      void all_gather(Buffer, Buffer) override {}
      void reduce_scatter(Buffer, Buffer) override {}
    };
    std::optional<Local> local;
    if (tp_) local.emplace(*tp_);
    LayerOps ops(op_, shape_, LayerPart(shape_, group_size(options_)), local ? &*local : nullptr);
    LayerPasses passes(op_, ops);
    DeviceLayer& layer = model_.layers.begin()->second;
    for (const bool defer : {false, true}) {
      Tensor x = op_.scratch(ops.layer_activation_count(), options_.dtype);
      CudaLayerActivations cache;
      passes.forward(layer, x, cache);
      Tensor dy = op_.scratch(ops.layer_activation_count(), options_.dtype);
      passes.backward(layer, cache, dy, defer);
      if (defer) passes.weight(layer, cache);
    }
    for (const Buffer& g : model_.buffers(true))
      if (g.count) CUDA_CHECK(cudaMemsetAsync(g.data, 0, g.count * size_of(g.dtype), op_.stream()));
    synchronize();
  }

  // ---- memory ----
  /// Ready for any thread when it returns (the executor hands these between threads).
  Tensor allocate(std::size_t count, DType dtype) override {
    Tensor t = op_.scratch(count, dtype);
    synchronize();
    return t;
  }
  /// On the calling thread's stream, after the work it queued; a thread that never ran an op (one
  /// that drops tensors after the run) gets no stream made for it: cudaFree waits for the device.
  void free(void* data, std::size_t) noexcept override {
    if (cudaStream_t stream = threads_.existing_stream()) {
      static_cast<void>(cudaFreeAsync(data, stream));
      return;
    }
    if (cudaSetDevice(options_.device) == cudaSuccess) static_cast<void>(cudaFree(data));
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
  Tensor embed(int mb) override { return vocab_.embed(tokens(mb)); }
  void embed_backward(int mb, const Tensor& dy) override { vocab_.embed_backward(tokens(mb), dy); }

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

  std::unique_ptr<Activations> final_norm(Tensor x) override { return vocab_.final_norm(std::move(x)); }
  Tensor final_output(const Activations& base) override { return vocab_.final_output(head_cache(base)); }
  Tensor final_norm_backward(Activations& base, const Tensor& dnormed) override {
    return vocab_.final_norm_backward(head_cache(base), dnormed);
  }
  double head_forward(Activations& base, int mb, float scale) override {
    return vocab_.head_forward(head_cache(base), targets(mb), scale);
  }
  Tensor head_backward(Activations& base) override { return vocab_.head_backward(head_cache(base)); }

  // ---- vocabulary passes ----
  OutputShard output_forward(int mb, const Tensor& x, bool algorithm2) override {
    return vocab_.output_forward(targets(mb), x, algorithm2);
  }
  Tensor softmax_sums(const Tensor& local, const Tensor& global_max) override {
    return vocab_.softmax_sums(local, global_max);
  }
  double loss_sum(const Tensor& global_max, const Tensor& sums) override { return vocab_.loss_sum(global_max, sums); }
  Tensor input_grad_share(const Tensor& local, const Tensor& global_max, const Tensor& sums, const Tensor& terms,
                          float g) override {
    return vocab_.input_grad_share(local, global_max, sums, terms, g);
  }
  Tensor output_backward(int mb, const Tensor& logits, const Tensor& stats, const Tensor& x, float g,
                         bool input_grad) override {
    return vocab_.output_backward(targets(mb), logits, stats, x, g, input_grad);
  }

  // ---- per iteration ----
  std::vector<Buffer> parameter_buffers(bool gradients) override { return model_.buffers(gradients); }
  void optimizer_step(const OptimizerSettings& settings, int step) override {
    sum_partial_gradients();
    model_.optimizer_step(settings, step, op_.stream());
  }
  void weights_written() override { model_.refresh_compute_copies(op_.stream()); }
  std::vector<HostGradient> gradients() override {
    sum_partial_gradients();
    model_.download_grads(host_);
    return host_gradients(host_);
  }
  /// The model's memory and the workspaces the libraries hold beside it: a cuBLASLt workspace per
  /// thread that runs GEMMs (the compute thread at least), and cuDNN's attention backward, whose
  /// workspace holds dP in bf16 (batch · heads · seq² · 2 bytes: 256 MiB at 32 heads and seq 2048)
  /// for as long as the op runs.
  Bytes static_bytes() const override {
    const std::size_t gemm = std::size_t(std::max(1, threads_.gemm_handles())) * ThreadContexts::gemm_workspace_bytes();
    std::size_t attention = 0;
    if (options_.dtype == DType::BF16 && use_cudnn_attention() && shape_.layers > 0)
      attention = std::size_t(shape_.batch) * std::size_t(shape_.heads / group_size(options_)) * std::size_t(shape_.seq) *
                  std::size_t(shape_.seq) * 2;
    return Bytes(model_.bytes() + gemm + attention);
  }

 private:
  static SmShare bind_device(const BackendOptions& o) {
    CUDA_CHECK(cudaSetDevice(o.device));
    return SmShare(o.device, o.ranks_on_device, o.index_on_device);
  }

  /// Microbatch `mb`'s n tokens and targets on the device.
  const int* tokens(int mb) const { return tokens_.get() + std::size_t(mb) * std::size_t(op_.n); }
  const int* targets(int mb) const { return targets_.get() + std::size_t(mb) * std::size_t(op_.n); }

  /// Under sequence parallelism, once a step before the gradients are read: the norms' parameter
  /// gradients, partial sums over each rank's rows, summed over the group (cpu::sum_partial_gradients).
  void sum_partial_gradients() {
    if (!std::exchange(partial_gradients_, false)) return;
    synchronize();
    for (auto& [index, layer] : model_.layers)
      for (DeviceParam* p : {&layer.ln1_gain, &layer.ln1_bias, &layer.ln2_gain, &layer.ln2_bias})
        if (p->count() > 0) tp_->all_reduce({p->grad.get(), p->count(), DType::F32});
  }

  ModelShape shape_;
  BackendOptions options_;
  TensorParallel* tp_;  ///< this rank's tensor-parallel group; null when its layers are whole
  bool partial_gradients_ = false;  ///< a backward under sequence parallelism since sum_partial_gradients
  RankModel host_;  ///< the CPU copy: the weights uploaded, and where gradients land for the check
  SmShare share_;
  DeviceModel model_;
  DeviceBuffer<int> tokens_, targets_;  ///< this step's, microbatch after microbatch
  // Declared after what they use, so destroyed first: the streams and GEMM handles go before the
  // buffers, the model and the SM share (as they did when the backend destroyed them itself).
  ThreadContexts threads_;
  OpContext op_;           ///< this rank's ops' view of the above
  LayerOps layer_ops_;     ///< the layers' building blocks, on this rank's part of each layer
  LayerPasses layers_;     ///< the layers' F, B and W
  VocabPasses vocab_;      ///< the embedding, the head and the vocabulary passes
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
