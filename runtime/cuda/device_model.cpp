#include "cuda/device_model.h"

#include <algorithm>

#include "cuda/check.h"
#include "cuda/kernels.h"

namespace pipesim::runtime::cuda {
namespace {

/// `gemm_operand`: the weights a GEMM reads, which bf16 runs keep a bf16 copy of; the others
/// (LayerNorm parameters, biases, the embedding table) are read as fp32.
DeviceParam upload(const std::vector<float>& weight, DType dtype, bool gemm_operand) {
  DeviceParam p;
  p.weight = DeviceBuffer<float>(std::span<const float>(weight));
  p.grad = DeviceBuffer<float>(weight.size());
  if (p.count() > 0) CUDA_CHECK(cudaMemset(p.grad.get(), 0, p.grad.bytes()));
  if (dtype == DType::BF16 && gemm_operand) {
    p.weight_bf16 = DeviceBuffer<std::uint16_t>(weight.size());
    if (p.count() > 0) {
      convert(p.weight.get(), DType::F32, p.weight_bf16.get(), DType::BF16, p.count(), nullptr);
      CUDA_CHECK(cudaStreamSynchronize(nullptr));
    }
  }
  return p;
}

void download(const DeviceBuffer<float>& from, std::vector<float>& to) {
  if (!to.empty()) CUDA_CHECK(cudaMemcpy(to.data(), from.get(), from.bytes(), cudaMemcpyDeviceToHost));
}

}  // namespace

DeviceModel::DeviceModel(const RankModel& host, DType dtype) : owned_(host.owned) {
  for (const auto& [index, layer] : host.params.layers) {
    DeviceLayer& d = layers[index];
    const auto from = layer.tensors();
    const auto to = d.params();
    const DeviceParam* gemm_weights[] = {&d.qkv_weight, &d.proj_weight, &d.fc1_weight, &d.fc2_weight};
    for (std::size_t t = 0; t < to.size(); ++t)
      *to[t] = upload(*from[t], dtype, std::find(std::begin(gemm_weights), std::end(gemm_weights), to[t]) != std::end(gemm_weights));
  }
  embedding = upload(host.params.embedding, dtype, false), head = upload(host.params.head, dtype, true);
  final_gain = upload(host.params.final_gain, dtype, false), final_bias = upload(host.params.final_bias, dtype, false);
}

template <class F>
void DeviceModel::for_each(F&& f) {
  for (auto& [index, layer] : layers)
    for (DeviceParam* p : layer.params()) f(*p);
  for (DeviceParam* p : {&embedding, &head, &final_gain, &final_bias}) f(*p);
}

std::vector<Buffer> DeviceModel::buffers(bool gradients) {
  std::vector<Buffer> all;
  for_each([&](DeviceParam& p) { all.push_back({(gradients ? p.grad : p.weight).get(), p.count(), DType::F32}); });
  return all;
}

void DeviceModel::optimizer_step(const OptimizerSettings& o, int step, cudaStream_t stream) {
  for_each([&](DeviceParam& p) {
    if (p.count() == 0) return;
    // Elements [first, first + owned) are this rank's: under ZeRO its replica's block of the tensor,
    // which may be empty for a tensor smaller than the replicas (RankModel::optimizer_step's range).
    const std::size_t first = owned_.begin(p.count()), owned = owned_.end(p.count()) - first;
    if (owned > 0 && o.kind == OptimizerKind::Sgd) {
      cuda::sgd_step(p.weight.get() + first, p.grad.get() + first, owned, o.learning_rate, stream);
    } else if (owned > 0) {
      if (p.moment1.size() == 0)
        for (DeviceBuffer<float>* moment : {&p.moment1, &p.moment2}) {
          *moment = DeviceBuffer<float>(owned);
          CUDA_CHECK(cudaMemsetAsync(moment->get(), 0, moment->bytes(), stream));
        }
      cuda::adam_step({.w = p.weight.get() + first, .g = p.grad.get() + first, .m = p.moment1.get(),
                       .v = p.moment2.get()},
                      owned, {o.learning_rate, o.beta1, o.beta2, o.epsilon, 0}, step, stream);
    }
    // The steps zero the owned gradients; the rest (another replica's block) are zeroed too, for the
    // next step's accumulation.
    if (owned < p.count()) CUDA_CHECK(cudaMemsetAsync(p.grad.get(), 0, p.grad.bytes(), stream));
    if (p.weight_bf16.size() > 0) convert(p.weight.get(), DType::F32, p.weight_bf16.get(), DType::BF16, p.count(), stream);
  });
}

void DeviceModel::refresh_compute_copies(cudaStream_t stream) {
  for_each([&](DeviceParam& p) {
    if (p.weight_bf16.size() > 0) convert(p.weight.get(), DType::F32, p.weight_bf16.get(), DType::BF16, p.count(), stream);
  });
}

void DeviceModel::download_grads(RankModel& host) {
  for (auto& [index, layer] : layers) {
    const auto to = host.grads.layers.at(index).tensors();
    const auto from = layer.params();
    for (std::size_t t = 0; t < from.size(); ++t) download(from[t]->grad, *to[t]);
  }
  download(embedding.grad, host.grads.embedding), download(head.grad, host.grads.head);
  download(final_gain.grad, host.grads.final_gain), download(final_bias.grad, host.grads.final_bias);
}

std::size_t DeviceModel::parameter_count() const {
  std::size_t count = embedding.count() + head.count() + final_gain.count() + final_bias.count();
  for (const auto& [index, layer] : layers)
    for (const DeviceParam* p : const_cast<DeviceLayer&>(layer).params()) count += p->count();
  return count;
}

std::size_t DeviceModel::bytes() const {
  std::size_t extra = 0;  // beyond fp32 weights and gradients: bf16 copies, Adam's moments
  const auto add = [&](const DeviceParam& p) { extra += p.weight_bf16.bytes() + p.moment1.bytes() + p.moment2.bytes(); };
  for (const auto& [index, layer] : layers)
    for (const DeviceParam* p : const_cast<DeviceLayer&>(layer).params()) add(*p);
  for (const DeviceParam* p : {&embedding, &head, &final_gain, &final_bias}) add(*p);
  return parameter_count() * 2 * sizeof(float) + extra;
}

}  // namespace pipesim::runtime::cuda
