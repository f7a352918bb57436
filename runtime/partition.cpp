#include "partition.h"

#include <fmt/format.h>

namespace pipesim::runtime {
namespace {

/// Every tensor of a rank, paired with the same tensor of another RankParams of the same shape.
template <class F>
void for_each_tensor(RankParams& a, RankParams& b, F&& f) {
  for (auto& [index, layer] : a.layers) {
    auto ta = layer.tensors(), tb = b.layers.at(index).tensors();
    for (std::size_t i = 0; i < ta.size(); ++i) f(*ta[i], *tb[i]);
  }
  f(a.embedding, b.embedding), f(a.head, b.head), f(a.final_gain, b.final_gain), f(a.final_bias, b.final_bias);
}

std::vector<float> zeros_like(const std::vector<float>& v) { return std::vector<float>(v.size(), 0.0f); }

void add_terms(std::span<const float> grad, std::span<const float> reference, float* terms) {
  double diff = 0, ref = 0;
  for (std::size_t i = 0; i < grad.size(); ++i) {
    diff += double(grad[i] - reference[i]) * (grad[i] - reference[i]);
    ref += double(reference[i]) * reference[i];
  }
  terms[0] += float(diff), terms[1] += float(ref);
}

}  // namespace

cpu::ModelShape model_shape(const Config& c) {
  return {.layers = c.model.layers, .hidden = c.model.hidden, .heads = c.model.heads, .ffn = c.model.ffn_hidden,
          .vocab = c.model.vocab, .batch = c.model.micro_batch_size, .seq = c.model.seq_len};
}

RankModel make_rank_model(const cpu::ModelShape& shape, const Layout& layout, int rank, std::uint64_t seed) {
  RankModel m{.shape = shape, .shard = {0, shape.vocab}, .params = {}, .grads = {}};
  const bool split_vocab = layout.vocab != VocabPlacement::OnStages;
  if (split_vocab) {
    const int per_device = layout.padded_vocab / layout.devices;
    const int first = rank * per_device;
    m.shard = {first, std::max(0, std::min(first + per_device, shape.vocab) - first)};
  }
  for (const VirtualStage& stage : layout.stages) {
    if (stage.device != rank) continue;
    for (int l = stage.first_layer; l < stage.first_layer + stage.layers; ++l)
      m.params.layers.emplace(l, cpu::make_layer(shape, seed, l));
    if (stage.has_embedding) m.params.embedding = cpu::embedding_rows(shape, seed, 0, shape.vocab);
    if (stage.has_head) m.params.head = cpu::head_rows(shape, seed, 0, shape.vocab);
  }
  if (split_vocab) {
    m.params.embedding = cpu::embedding_rows(shape, seed, m.shard.first, m.shard.rows);
    m.params.head = cpu::head_rows(shape, seed, m.shard.first, m.shard.rows);
  }
  if (layout.stages.back().device == rank) {
    m.params.final_gain.assign(std::size_t(shape.hidden), 1.0f);
    m.params.final_bias.assign(std::size_t(shape.hidden), 0.0f);
  }
  for (const auto& [index, layer] : m.params.layers) m.grads.layers.emplace(index, cpu::zero_layer(shape));
  m.grads.embedding = zeros_like(m.params.embedding), m.grads.head = zeros_like(m.params.head);
  m.grads.final_gain = zeros_like(m.params.final_gain), m.grads.final_bias = zeros_like(m.params.final_bias);
  return m;
}

std::size_t RankModel::parameter_count() const {
  std::size_t count = params.embedding.size() + params.head.size() + params.final_gain.size() + params.final_bias.size();
  for (const auto& [index, layer] : params.layers)
    for (const std::vector<float>* t : layer.tensors()) count += t->size();
  return count;
}

void RankModel::sgd_step(float learning_rate) {
  for_each_tensor(params, grads, [&](std::vector<float>& w, std::vector<float>& g) {
    for (std::size_t i = 0; i < w.size(); ++i) w[i] -= learning_rate * g[i], g[i] = 0;
  });
}

std::vector<std::string> tensor_names(const cpu::ModelShape& shape) {
  std::vector<std::string> names{"embedding", "head", "final_ln.gain", "final_ln.bias"};
  static const char* const kLayerTensors[] = {"ln1.gain", "ln1.bias", "qkv.weight", "qkv.bias", "proj.weight", "proj.bias",
                                              "ln2.gain", "ln2.bias", "fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"};
  for (int l = 0; l < shape.layers; ++l)
    for (const char* t : kLayerTensors) names.push_back(fmt::format("layers[{}].{}", l, t));
  return names;
}

std::vector<float> grad_error_terms(const RankModel& m, const cpu::Model& reference) {
  std::vector<float> terms(2 * tensor_names(m.shape).size(), 0.0f);
  const std::size_t h = std::size_t(m.shape.hidden), rows_from = std::size_t(m.shard.first) * h;
  const auto rows = [&](const std::vector<float>& full, std::size_t size) {
    return std::span<const float>(full).subspan(rows_from, size);
  };
  if (!m.grads.embedding.empty()) add_terms(m.grads.embedding, rows(reference.embedding, m.grads.embedding.size()), &terms[0]);
  if (!m.grads.head.empty()) add_terms(m.grads.head, rows(reference.head, m.grads.head.size()), &terms[2]);
  if (!m.grads.final_gain.empty()) {
    add_terms(m.grads.final_gain, reference.final_gain, &terms[4]);
    add_terms(m.grads.final_bias, reference.final_bias, &terms[6]);
  }
  for (const auto& [index, layer] : m.grads.layers) {
    const auto mine = layer.tensors(), ref = reference.layers[std::size_t(index)].tensors();
    for (std::size_t t = 0; t < mine.size(); ++t) add_terms(*mine[t], *ref[t], &terms[2 * (4 + 12 * std::size_t(index) + t)]);
  }
  return terms;
}

}  // namespace pipesim::runtime
