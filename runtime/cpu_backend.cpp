// The CPU backend: each op's math on host fp32 tensors, with the model's rank part in a RankModel.
#include "cpu_backend.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <mutex>
#include <new>
#include <utility>
#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include "cpu/kernels.h"
#include "cpu/vocab.h"
#include "partition.h"

namespace pipesim::runtime {
namespace {

/// What a layer keeps from F to B (and to W when it is split off).
struct CpuLayerActivations final : Activations {
  cpu::LayerCache cache;
  cpu::DeferredWeightGrad deferred;

  Bytes bytes() const override {
    std::size_t floats = 0;
    for (const auto* v : {&cache.input, &cache.ln1, &cache.mean1, &cache.rstd1, &cache.qkv, &cache.probs,
                          &cache.attention, &cache.middle, &cache.ln2, &cache.mean2, &cache.rstd2, &cache.fc1,
                          &cache.gelu, &deferred.fc2_dy, &deferred.fc1_dy, &deferred.proj_dy, &deferred.qkv_dy})
      floats += v->size();
    return Bytes(floats * sizeof(float) + cache.moe.bytes() + deferred.moe.bytes());
  }
};

/// The final norm's input and output, and the baseline LM head's logit gradients (last stage).
struct CpuHeadActivations final : Activations {
  std::vector<float> input, mean, rstd, normed, dlogits;
  Bytes bytes() const override {
    return Bytes((input.size() + mean.size() + rstd.size() + normed.size() + dlogits.size()) * sizeof(float));
  }
};

CpuLayerActivations& layer_cache(Activations& cache) { return static_cast<CpuLayerActivations&>(cache); }
CpuHeadActivations& head_cache(Activations& cache) { return static_cast<CpuHeadActivations&>(cache); }
const CpuHeadActivations& head_cache(const Activations& cache) { return static_cast<const CpuHeadActivations&>(cache); }

std::span<const float> f32(const Tensor& t) { return t.as<const float>(); }
std::span<float> f32(Tensor& t) { return t.as<float>(); }

class CpuBackend final : public Backend {
 public:
  CpuBackend(const ModelShape& shape, const Layout& layout, const RankPart& part, std::uint64_t seed,
             TensorParallel* tp, float microbatch_weight, ExpertParallel* ep)
      : shape_(shape), model_(make_rank_model(shape, layout, part, seed)), tp_(tp), ep_(ep), n_(shape.tokens()),
        h_(shape.hidden), microbatch_weight_(microbatch_weight) {}

  std::string_view name() const override { return "cpu"; }

  Tensor allocate(std::size_t count, DType dtype) override {
    const std::size_t bytes = count * size_of(dtype);
    void* data = ::operator new(std::max<std::size_t>(bytes, 1));
    std::memset(data, 0, bytes);
    return Tensor(data, count, dtype, this);
  }
  void free(void* data, std::size_t) noexcept override { ::operator delete(data); }
  DType activation_dtype() const override { return DType::F32; }
  void copy(const Tensor& src, std::size_t src_at, Tensor& dst, std::size_t dst_at, std::size_t count) override {
    const std::size_t element = size_of(src.dtype());
    std::memcpy(static_cast<std::byte*>(dst.data()) + dst_at * element,
                static_cast<const std::byte*>(src.data()) + src_at * element, count * element);
  }
  void synchronize() override {}  // every op has finished when its call returns
  void set_batches(std::span<const Batch> batches) override { batches_.assign(batches.begin(), batches.end()); }

  Tensor embed(int mb) override {
    Tensor x = activation();
    cpu::embedding_forward(model_.params.embedding, tokens(mb), f32(x), h_, model_.shard.first, model_.shard.rows);
    return x;
  }
  void embed_backward(int mb, const Tensor& dy) override {
    cpu::embedding_backward(tokens(mb), f32(dy), model_.grads.embedding, h_, model_.shard.first, model_.shard.rows);
  }

  std::size_t layer_activation_count() const override {
    return std::size_t(cpu::layer_rows(shape_, tp_)) * std::size_t(h_);
  }
  std::unique_ptr<Activations> layer_forward(int layer, Tensor& x) override {
    auto cache = std::make_unique<CpuLayerActivations>();
    Tensor y = allocate(layer_activation_count(), DType::F32);
    cpu::layer_forward(shape_, model_.params.layers.at(layer), f32(x), f32(y), cache->cache, tp_, ep_, etp());
    x = std::move(y);
    return cache;
  }
  void layer_backward(int layer, Activations& base, Tensor& dy, bool defer_weights) override {
    CpuLayerActivations& c = layer_cache(base);
    Tensor dx = allocate(layer_activation_count(), DType::F32);
    partial_gradients_ = sequence_parallel();
    cpu::layer_backward(shape_, model_.params.layers.at(layer), c.cache, f32(dy), f32(dx), model_.grads.layers.at(layer),
                        defer_weights ? &c.deferred : nullptr, tp_, microbatch_weight_, ep_, etp());
    dy = std::move(dx);
  }
  void layer_weight(int layer, Activations& base) override {
    CpuLayerActivations& c = layer_cache(base);
    cpu::layer_weight_backward(shape_, c.cache, c.deferred, model_.grads.layers.at(layer), model_.tp, model_.tp_rank);
  }

  std::unique_ptr<Activations> final_norm(Tensor x) override {
    auto cache = std::make_unique<CpuHeadActivations>();
    const auto floats = f32(x);
    cache->input.assign(floats.begin(), floats.end());
    cache->normed.resize(activation_size()), cache->rstd.resize(std::size_t(n_));
    if (shape_.family == LayerFamily::Gpt) cache->mean.resize(std::size_t(n_));  // RMSNorm keeps no mean
    cpu::norm_forward(shape_, model_.params.final_gain, model_.params.final_bias, cache->input, cache->normed, cache->mean,
                      cache->rstd, n_);
    return cache;
  }
  Tensor final_output(const Activations& base) override {
    const CpuHeadActivations& cache = head_cache(base);
    Tensor x = activation();
    std::copy(cache.normed.begin(), cache.normed.end(), f32(x).begin());
    return x;
  }
  Tensor final_norm_backward(Activations& base, const Tensor& dnormed) override {
    CpuHeadActivations& cache = head_cache(base);
    Tensor dy = activation();
    cpu::norm_backward(shape_, model_.params.final_gain, cache.input, cache.mean, cache.rstd, f32(dnormed), f32(dy),
                       model_.grads.final_gain, model_.grads.final_bias, n_);
    return dy;
  }

  double head_forward(Activations& base, int mb, float scale) override {
    CpuHeadActivations& cache = head_cache(base);
    std::vector<float> logits(std::size_t(n_) * std::size_t(shape_.vocab), 0.0f);
    cpu::matmul_bt(cache.normed, head_weights(), logits, n_, h_, shape_.vocab);
    cache.dlogits.resize(logits.size());
    const double loss = cpu::cross_entropy(logits, targets(mb), cache.dlogits, n_, shape_.vocab);
    for (float& g : cache.dlogits) g *= scale;
    return loss * scale;
  }
  Tensor head_backward(Activations& base) override {
    CpuHeadActivations& cache = head_cache(base);
    Tensor dnormed = activation();
    cpu::matmul_at(cache.dlogits, cache.normed, head_gradients(), n_, shape_.vocab, h_);
    cpu::matmul(cache.dlogits, head_weights(), f32(dnormed), n_, shape_.vocab, h_, true);
    return dnormed;
  }

  OutputShard output_forward(int mb, const Tensor& x, bool algorithm2) override {
    const std::size_t n = std::size_t(n_);
    OutputShard out{.logits = allocate(n * std::size_t(model_.shard.rows), DType::F32), .local = allocate(3 * n, DType::F32),
                    .terms = {}};
    const std::span<float> l = f32(out.local);
    cpu::output_logits(f32(x), head_weights(), targets(mb), model_.shard, n_, h_, f32(out.logits), l.subspan(0, n),
                       l.subspan(n, n), l.subspan(2 * n, n));
    if (algorithm2) {
      out.terms = allocate(2 * activation_size(), DType::F32);
      const std::span<float> a = f32(out.terms);
      cpu::output_input_grad_terms(f32(out.logits), l.subspan(0, n), l.subspan(n, n), head_weights(), targets(mb),
                                   model_.shard, n_, h_, a.subspan(0, activation_size()), a.subspan(activation_size()));
    }
    return out;
  }
  Tensor softmax_sums(const Tensor& local, const Tensor& global_max) override {
    const std::size_t n = std::size_t(n_);
    Tensor sums = allocate(2 * n, DType::F32);
    const std::span<const float> l = f32(local);
    cpu::rescale_sum_exp(l.subspan(0, n), l.subspan(n, n), f32(global_max), f32(sums).subspan(0, n));
    std::copy(l.begin() + std::ptrdiff_t(2 * n), l.end(), f32(sums).begin() + std::ptrdiff_t(n));
    return sums;
  }
  double loss_sum(const Tensor& global_max, const Tensor& sums) override {
    const std::span<const float> s = f32(sums);
    return cpu::loss_sum(f32(global_max), s.subspan(0, std::size_t(n_)), s.subspan(std::size_t(n_)));
  }
  Tensor input_grad_share(const Tensor& local, const Tensor& global_max, const Tensor& sums, const Tensor& terms,
                          float g) override {
    const std::size_t n = std::size_t(n_);
    const std::span<const float> l = f32(local), ay = f32(terms);
    std::vector<float> scaled(n);
    cpu::rescale_sum_exp(l.subspan(0, n), l.subspan(n, n), f32(global_max), scaled);
    Tensor dx = activation();
    cpu::input_grad_share(scaled, f32(sums).subspan(0, n), ay.subspan(0, activation_size()), ay.subspan(activation_size()),
                          g, n_, h_, f32(dx));
    return dx;
  }
  Tensor output_backward(int mb, const Tensor& logits, const Tensor& stats, const Tensor& x, float g,
                         bool input_grad) override {
    const std::span<const float> s = f32(stats);
    Tensor dx = input_grad ? activation() : Tensor();
    cpu::output_backward(f32(logits), s.subspan(0, std::size_t(n_)), s.subspan(std::size_t(n_)), targets(mb), model_.shard,
                         g, f32(x), head_weights(), n_, h_, head_gradients(),
                         input_grad ? f32(dx) : std::span<float>());
    return dx;
  }

  std::vector<Buffer> parameter_buffers(bool gradients) override {
    std::vector<Buffer> all;
    for (std::vector<float>* t : tensors_of(gradients ? model_.grads : model_.params))
      all.push_back({t->data(), t->size(), DType::F32});
    return all;
  }
  void optimizer_step(const OptimizerSettings& settings, int step) override {
    sum_partial_gradients();
    model_.optimizer_step(settings, step);
  }
  std::vector<HostGradient> gradients() override {
    sum_partial_gradients();
    return host_gradients(model_);
  }
  Bytes static_bytes() const override { return Bytes(model_.state_bytes()); }

 private:
  /// The LM head's weights and their gradient: the embedding's, when tied on this rank.
  std::vector<float>& head_weights() { return model_.tied ? model_.params.embedding : model_.params.head; }
  std::vector<float>& head_gradients() { return model_.tied ? model_.grads.embedding : model_.grads.head; }
  std::size_t activation_size() const { return std::size_t(n_) * std::size_t(h_); }
  /// A whole activation: n × h.
  Tensor activation() { return allocate(activation_size(), DType::F32); }
  bool sequence_parallel() const { return tp_ && tp_->sequence_parallel(); }
  /// The expert-tensor-parallel group: the runtime splits the experts over the tensor-parallel group
  /// (etp = tp) or not at all.
  TensorParallel* etp() const { return model_.etp > 1 ? tp_ : nullptr; }
  /// Under sequence parallelism, once per step before the gradients are read: the norms' and the
  /// routers' gradients summed over the ranks' rows, the routed experts' over the ranks that hold them.
  void sum_partial_gradients() {
    if (!std::exchange(partial_gradients_, false)) return;
    const int slice = model_.ep_rank * model_.etp + model_.etp_rank, slices = model_.ep * model_.etp;
    for (auto& [index, layer] : model_.grads.layers) cpu::sum_partial_gradients(layer, *tp_, slice, slices);
  }
  const std::vector<int>& tokens(int mb) const { return batches_.at(std::size_t(mb)).tokens; }
  const std::vector<int>& targets(int mb) const { return batches_.at(std::size_t(mb)).targets; }

  ModelShape shape_;
  RankModel model_;
  TensorParallel* tp_;  ///< this rank's tensor-parallel group; null when the layers are whole
  ExpertParallel* ep_;  ///< its expert-parallel group; null when each MoE layer holds every expert
  int n_, h_;
  float microbatch_weight_;  ///< a microbatch's share of the step's loss: its load-balancing losses' weight
  bool partial_gradients_ = false;  ///< a backward since the last sum_partial_gradients
  std::vector<Batch> batches_;
};

}  // namespace

void keep_freed_host_memory() {
#if defined(__GLIBC__)
  static std::once_flag once;
  std::call_once(once, [] {
    mallopt(M_MMAP_THRESHOLD, 32 << 20);  // the largest glibc takes; it also stops the threshold moving
    mallopt(M_TRIM_THRESHOLD, std::numeric_limits<int>::max());
  });
#endif
}

std::unique_ptr<Backend> make_cpu_backend(const ModelShape& shape, const Layout& layout, const RankPart& part,
                                          std::uint64_t seed, TensorParallel* tp, float microbatch_weight,
                                          ExpertParallel* ep) {
  keep_freed_host_memory();
  return std::make_unique<CpuBackend>(shape, layout, part, seed, tp, microbatch_weight, ep);
}

}  // namespace pipesim::runtime
