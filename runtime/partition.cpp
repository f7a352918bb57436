#include "partition.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "model_math.h"

namespace pipesim::runtime {
std::vector<std::vector<float>*> tensors_of(RankParams& p) {
  std::vector<std::vector<float>*> all;
  for (auto& [index, layer] : p.layers)
    for (std::vector<float>* t : layer.tensors()) all.push_back(t);
  for (std::vector<float>* t : {&p.embedding, &p.head, &p.final_gain, &p.final_bias}) all.push_back(t);
  return all;
}

std::vector<int> tensor_stages(const Layout& layout, int device) {
  std::map<int, int> stage_of_layer;  // by global layer index, as RankParams::layers is ordered
  int embedding = -1, head = -1;
  for (int s = 0; s < layout.stage_count(); ++s) {
    const VirtualStage& stage = layout.stages[std::size_t(s)];
    if (stage.device != device) continue;
    for (int l = stage.first_layer; l < stage.first_layer + stage.layers; ++l) stage_of_layer[l] = s;
    if (stage.has_embedding) embedding = s;
    if (stage.has_head) head = s;
  }
  const std::size_t per_layer = cpu::Layer{}.tensors().size();
  std::vector<int> stages;
  for (const auto& [layer, stage] : stage_of_layer) stages.insert(stages.end(), per_layer, stage);
  const int last = layout.stage_count() - 1;
  for (const int stage : {embedding, head, last, last}) stages.push_back(stage);  // embedding, head, final norm
  return stages;
}

std::vector<bool> routed_expert_tensors(const Layout& layout, int device) {
  const std::vector<int> stages = tensor_stages(layout, device);
  // Every layer's tensors, then the embedding's, the LM head's and the final norm's two.
  const std::size_t per_layer = cpu::Layer{}.tensors().size(), layer_tensors = stages.size() - 4;
  std::vector<bool> routed(stages.size(), false);
  for (std::size_t i = 0; i < layer_tensors; ++i) routed[i] = cpu::routed_expert_tensor(i % per_layer);
  return routed;
}

std::size_t RankParams::count() const {
  std::size_t count = embedding.size() + head.size() + final_gain.size() + final_bias.size();
  for (const auto& [index, layer] : layers)
    for (const std::vector<float>* t : layer.tensors()) count += t->size();
  return count;
}

namespace {

std::vector<float> zeros_like(const std::vector<float>& v) { return std::vector<float>(v.size(), 0.0f); }

/// Zeros the size of the owned part of each of p's tensors (`owned`: tensors_of's order).
RankParams owned_zeros(RankParams p, const std::vector<OwnedPart>& owned) {
  const std::vector<std::vector<float>*> tensors = tensors_of(p);
  for (std::size_t i = 0; i < tensors.size(); ++i)
    tensors[i]->assign(owned[i].end(tensors[i]->size()) - owned[i].begin(tensors[i]->size()), 0.0f);
  return p;
}

/// Which layers are mixture-of-experts layers, as the simulator reads moe_layer_freq and
/// moe_layer_pattern (layer_kind): one rule for both.
std::vector<bool> moe_layers(const ModelConfig& m) {
  std::vector<bool> moe(std::size_t(m.layers), false);
  for (int l = 0; l < m.layers; ++l) moe[std::size_t(l)] = layer_kind(m, l) == LayerKind::Moe;
  return moe;
}
}  // namespace

ModelShape model_shape(const Config& c) {
  // The simulator's model as the runtime runs it: a SwiGLU MLP means a Llama-family layer (RMSNorm,
  // rotary embeddings, no biases), GELU a GPT one; both take grouped-query attention.
  return {.layers = c.model.layers, .hidden = c.model.hidden, .heads = c.model.heads, .ffn = c.model.ffn_hidden,
          .vocab = c.model.vocab, .batch = c.model.micro_batch_size, .seq = c.model.seq_len,
          .kv_heads = c.model.key_value_heads(),
          .family = c.model.mlp == MlpKind::SwiGlu ? LayerFamily::Llama : LayerFamily::Gpt,
          .tied_embeddings = c.model.tied_embeddings, .experts = c.model.num_experts,
          .router_topk = c.model.has_experts() ? c.model.moe_router_topk : 0,
          .expert_ffn = c.model.has_experts() ? c.model.expert_ffn_hidden() : 0,
          .shared_expert_ffn = c.model.has_experts() ? c.model.moe_shared_expert_intermediate_size : 0,
          .moe_layers = moe_layers(c.model)};
}

RankModel make_rank_model(const ModelShape& shape, const Layout& layout, const RankPart& part, std::uint64_t seed) {
  const int rank = part.device;
  RankModel m{.shape = shape, .shard = {0, shape.vocab}, .owned = part.owned, .tp_rank = part.tp_rank, .tp = part.tp,
              .ep_rank = part.ep_rank, .ep = part.ep, .etp_rank = part.etp_rank, .etp = part.etp,
              .expert_owned = part.expert_owned, .tied = false, .params = {}, .grads = {}, .moment1 = {}, .moment2 = {},
              .has_moments = false};
  const bool split_vocab = layout.vocab != VocabPlacement::OnStages;
  if (split_vocab) {
    const int per_device = layout.padded_vocab / layout.devices;
    const int first = rank * per_device;
    m.shard = {first, std::max(0, std::min(first + per_device, shape.vocab) - first)};
  }
  for (const VirtualStage& stage : layout.stages) {
    if (stage.device != rank) continue;
    for (int l = stage.first_layer; l < stage.first_layer + stage.layers; ++l)
      m.params.layers.emplace(
          l, cpu::expert_part(shape, cpu::split_layer(shape, cpu::make_layer(shape, seed, l), part.tp_rank, part.tp),
                              part.ep_rank, part.ep, part.etp_rank, part.etp));
    if (stage.has_embedding) m.params.embedding = cpu::embedding_rows(shape, seed, 0, shape.vocab);
    if (stage.has_head) m.params.head = cpu::head_rows(shape, seed, 0, shape.vocab);
  }
  if (split_vocab) {
    m.params.embedding = cpu::embedding_rows(shape, seed, m.shard.first, m.shard.rows);
    m.params.head = cpu::head_rows(shape, seed, m.shard.first, m.shard.rows);
  }
  // Tied, with both on this rank (a vocabulary shard, or the first and last stage on one device): one
  // matrix, the embedding's, which the head reads and adds its gradient to.
  m.tied = shape.tied_embeddings && !m.params.embedding.empty() && !m.params.head.empty();
  if (m.tied) m.params.head.clear();
  if (layout.stages.back().device == rank) {
    m.params.final_gain.assign(std::size_t(shape.hidden), 1.0f);
    if (shape.family == LayerFamily::Gpt) m.params.final_bias.assign(std::size_t(shape.hidden), 0.0f);  // RMSNorm has none
  }
  for (const auto& [index, layer] : m.params.layers) {
    cpu::Layer zeros = layer;
    for (std::vector<float>* t : zeros.tensors()) std::fill(t->begin(), t->end(), 0.0f);
    m.grads.layers.emplace(index, std::move(zeros));
  }
  m.grads.embedding = zeros_like(m.params.embedding), m.grads.head = zeros_like(m.params.head);
  m.grads.final_gain = zeros_like(m.params.final_gain), m.grads.final_bias = zeros_like(m.params.final_bias);
  return m;
}

std::size_t RankModel::state_bytes() const {
  return (params.count() + grads.count() + moment1.count() + moment2.count()) * sizeof(float);
}

std::vector<OwnedPart> RankModel::owned_parts() const {
  std::vector<OwnedPart> parts;
  for (const auto& [index, layer] : params.layers)
    for (std::size_t t = 0; t < layer.tensors().size(); ++t) parts.push_back(cpu::routed_expert_tensor(t) ? expert_owned : owned);
  parts.insert(parts.end(), 4, owned);  // the embedding, the LM head, the final norm's two
  return parts;
}

void RankModel::optimizer_step(const OptimizerSettings& o, int step) {
  const std::vector<std::vector<float>*> w = tensors_of(params), g = tensors_of(grads);
  const std::vector<OwnedPart> parts = owned_parts();
  const auto zero_gradients = [&] {
    for (std::vector<float>* t : g) std::fill(t->begin(), t->end(), 0.0f);
  };
  if (o.kind == OptimizerKind::Sgd) {
    for (std::size_t t = 0; t < w.size(); ++t)
      for (std::size_t i = parts[t].begin(w[t]->size()); i < parts[t].end(w[t]->size()); ++i)
        (*w[t])[i] -= o.learning_rate * (*g[t])[i];
    return zero_gradients();
  }
  if (!has_moments) moment1 = owned_zeros(params, parts), moment2 = owned_zeros(params, parts), has_moments = true;
  const std::vector<std::vector<float>*> m = tensors_of(moment1), v = tensors_of(moment2);
  // Bias corrections in double, once per step (the CUDA kernel gets the same numbers).
  const auto correction1 = float(1 - std::pow(double(o.beta1), step)), correction2 = float(1 - std::pow(double(o.beta2), step));
  for (std::size_t t = 0; t < w.size(); ++t) {
    const std::size_t first = parts[t].begin(w[t]->size());
    for (std::size_t i = first; i < parts[t].end(w[t]->size()); ++i) {
      const float grad = (*g[t])[i];
      float& m1 = (*m[t])[i - first];
      float& m2 = (*v[t])[i - first];
      m1 = o.beta1 * m1 + (1 - o.beta1) * grad;
      m2 = o.beta2 * m2 + (1 - o.beta2) * grad * grad;
      (*w[t])[i] -= o.learning_rate * ((m1 / correction1) / (std::sqrt(m2 / correction2) + o.epsilon));
    }
  }
  zero_gradients();
}

namespace {
/// Tensors per layer, and where each part of the model starts in tensor_names.
std::size_t layer_tensor_count() { return cpu::Layer{}.tensors().size(); }
constexpr std::size_t kEmbedding = 0, kHead = 1, kFinalGain = 2, kFinalBias = 3, kFirstLayer = 4;
std::size_t layer_tensor(int layer, std::size_t t) { return kFirstLayer + layer_tensor_count() * std::size_t(layer) + t; }
}  // namespace

bool routed_expert_model_tensor(std::size_t index) {
  return index >= kFirstLayer && cpu::routed_expert_tensor((index - kFirstLayer) % layer_tensor_count());
}

std::vector<std::string> tensor_names(const ModelShape& shape) {
  std::vector<std::string> names{"embedding", "head", "final_norm.gain", "final_norm.bias"};
  const std::vector<std::string> layer = cpu::layer_tensor_names();
  for (int l = 0; l < shape.layers; ++l)
    for (const std::string& t : layer) names.push_back(fmt::format("layers[{}].{}", l, t));
  return names;
}

std::span<const float> model_tensor(const cpu::Model& model, std::size_t index) {
  switch (index) {
    case kEmbedding: return model.embedding;
    case kHead: return model.head;
    case kFinalGain: return model.final_gain;
    case kFinalBias: return model.final_bias;
    default: {
      const std::size_t at = index - kFirstLayer;
      return *model.layers.at(at / layer_tensor_count()).tensors()[at % layer_tensor_count()];
    }
  }
}

std::vector<HostGradient> host_gradients(const RankModel& m) {
  std::vector<HostGradient> grads;
  // Elements [first, last) of what the rank holds: a range of the tensor, or of `elements` of it.
  // What every tensor-parallel rank holds whole, rank 0 reports; a routed experts' slice, the first
  // rank that holds it (under ep·etp < tp the ranks past ep·etp hold the same slices again).
  const auto add = [&](std::size_t tensor, std::size_t offset, const std::vector<float>& values,
                       const std::vector<std::size_t>& elements, const OwnedPart& owned, bool routed = false) {
    if ((routed || elements.empty()) && m.tp_rank >= (routed ? m.ep * m.etp : 1)) return;
    const std::size_t first = owned.begin(values.size()), last = owned.end(values.size());
    if (first >= last) return;
    const auto range = [&](const auto& v) { return std::vector(v.begin() + std::ptrdiff_t(first), v.begin() + std::ptrdiff_t(last)); };
    if (elements.empty())
      grads.push_back({.tensor = tensor, .offset = offset + first, .values = range(values), .elements = {}});
    else
      grads.push_back({.tensor = tensor, .offset = offset, .values = range(values), .elements = range(elements)});
  };
  const std::size_t shard_offset = std::size_t(m.shard.first) * std::size_t(m.shape.hidden);
  add(kEmbedding, shard_offset, m.grads.embedding, {}, m.owned), add(kHead, shard_offset, m.grads.head, {}, m.owned);
  add(kFinalGain, 0, m.grads.final_gain, {}, m.owned), add(kFinalBias, 0, m.grads.final_bias, {}, m.owned);
  const std::vector<std::vector<std::size_t>> split = cpu::split_elements(m.shape, m.tp_rank, m.tp);
  // This rank's routed experts are one block of each stacked map, the ep_rank-th; under expert tensor
  // parallelism, of each expert in it its slice's elements.
  const std::size_t local = m.shape.experts > 0 ? std::size_t(m.shape.experts / m.ep) : 0;
  std::vector<std::vector<std::size_t>> sliced;
  if (m.etp > 1)
    for (const std::vector<std::size_t>& one : cpu::expert_slice_elements(m.shape, m.etp_rank, m.etp)) {
      const std::size_t per_expert = one.size() * std::size_t(m.etp);
      std::vector<std::size_t> all;
      for (std::size_t e = 0; e < local; ++e)
        for (const std::size_t i : one) all.push_back(e * per_expert + i);
      sliced.push_back(std::move(all));
    }
  for (const auto& [index, layer] : m.grads.layers) {
    const auto tensors = layer.tensors();
    std::size_t routed_maps = 0;
    for (std::size_t t = 0; t < tensors.size(); ++t) {
      const bool routed = cpu::routed_expert_tensor(t);
      const std::vector<std::size_t> none;
      const std::vector<std::size_t>& elements = routed ? (m.etp > 1 ? sliced.at(routed_maps++) : none)
                                                        : (m.tp > 1 ? split[t] : none);
      // The rank's experts' whole maps are etp times its slices.
      const std::size_t offset = routed ? std::size_t(m.ep_rank) * tensors[t]->size() * std::size_t(m.etp) : 0;
      add(layer_tensor(index, t), offset, *tensors[t], elements, routed ? m.expert_owned : m.owned, routed);
    }
  }
  return grads;
}

}  // namespace pipesim::runtime
