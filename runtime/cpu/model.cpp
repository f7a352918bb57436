#include "model.h"

#include <cmath>
#include <type_traits>

#include "hash.h"
#include "kernels.h"

namespace pipesim::cpu {
namespace {


/// Normal(0, scale) by Box-Muller from two hashed uniforms.
/// Elements [first, first + n) of the tensor.
std::vector<float> normal_tensor(std::size_t n, std::uint64_t seed, std::uint64_t tensor, float scale,
                                 std::size_t first = 0) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint64_t key = splitmix64(splitmix64(seed ^ (tensor << 40)) + first + i);
    const double u1 = (double(key >> 11) + 0.5) / 9007199254740992.0, u2 = (double(splitmix64(key) >> 11) + 0.5) / 9007199254740992.0;
    v[i] = float(scale * std::sqrt(-2 * std::log(u1)) * std::cos(2 * M_PI * u2));
  }
  return v;
}

std::vector<float> constant(std::size_t n, float value) { return std::vector<float>(n, value); }

// Tensor ids: 0 embedding, 1 head, 2 final LN, then 16 per layer.
constexpr std::uint64_t kLayerTensors = 16;

}  // namespace

/// Both tensors() overloads: the list of a layer's tensors, in one place.
template <class L>
auto tensors_of(L& layer) {
  using Tensor = std::conditional_t<std::is_const_v<L>, const std::vector<float>, std::vector<float>>;
  return std::vector<Tensor*>{&layer.ln1_gain, &layer.ln1_bias, &layer.qkv_weight, &layer.qkv_bias,
                              &layer.proj_weight, &layer.proj_bias, &layer.ln2_gain, &layer.ln2_bias,
                              &layer.fc1_weight, &layer.fc1_bias, &layer.fc2_weight, &layer.fc2_bias};
}

std::vector<std::vector<float>*> Layer::tensors() { return tensors_of(*this); }
std::vector<const std::vector<float>*> Layer::tensors() const { return tensors_of(*this); }

Layer make_layer(const ModelShape& s, std::uint64_t seed, int index) {
  const std::size_t h = std::size_t(s.hidden), f = std::size_t(s.ffn);
  const std::uint64_t base = 3 + kLayerTensors * std::uint64_t(index);
  const float scale = 0.02f, residual_scale = 0.02f / std::sqrt(2.0f * float(s.layers));  // GPT-2 style
  open_gemm_library();  // the layer's GEMMs follow: open their library now, outside any op's measured time
  Layer w;
  w.ln1_gain = constant(h, 1), w.ln1_bias = constant(h, 0);
  w.qkv_weight = normal_tensor(h * 3 * h, seed, base + 0, scale), w.qkv_bias = constant(3 * h, 0);
  w.proj_weight = normal_tensor(h * h, seed, base + 1, residual_scale), w.proj_bias = constant(h, 0);
  w.ln2_gain = constant(h, 1), w.ln2_bias = constant(h, 0);
  w.fc1_weight = normal_tensor(h * f, seed, base + 2, scale), w.fc1_bias = constant(f, 0);
  w.fc2_weight = normal_tensor(f * h, seed, base + 3, residual_scale), w.fc2_bias = constant(h, 0);
  return w;
}

Layer zero_layer(const ModelShape& s) {
  Layer w = make_layer(s, 0, 0);
  for (std::vector<float>* t : w.tensors()) std::fill(t->begin(), t->end(), 0.0f);
  return w;
}

namespace {

/// y = x·W + bias (bias broadcast over rows).
void linear(std::span<const float> x, const std::vector<float>& weight, const std::vector<float>& bias, std::span<float> y,
            int n, int in, int out) {
  for (int i = 0; i < n; ++i) std::copy(bias.begin(), bias.end(), y.begin() + std::ptrdiff_t(i) * out);
  matmul(x, weight, y, n, in, out, true);
}

/// Weight gradients of y = x·W + b: dW += xᵀ·dy, db += Σ dy.
void linear_weight_backward(std::span<const float> x, std::span<const float> dy, std::vector<float>& dweight,
                            std::vector<float>& dbias, int n, int in, int out) {
  matmul_at(x, dy, dweight, n, in, out);
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < out; ++j) dbias[std::size_t(j)] += dy[std::size_t(i) * out + j];
}

/// Gradients of y = x·W + b: dx += dy·Wᵀ, and the weight gradients now or, with `keep`, later (the
/// output gradient is copied into `keep`).
void linear_backward(std::span<const float> x, const std::vector<float>& weight, std::span<const float> dy,
                     std::span<float> dx, std::vector<float>& dweight, std::vector<float>& dbias, int n, int in, int out,
                     std::vector<float>* keep) {
  if (keep)
    keep->assign(dy.begin(), dy.end());
  else
    linear_weight_backward(x, dy, dweight, dbias, n, in, out);
  matmul_bt(dy, weight, dx, n, out, in);
}

}  // namespace

void layer_forward(const ModelShape& s, const Layer& w, std::span<const float> x, std::span<float> y, LayerCache& c) {
  const int n = s.tokens(), h = s.hidden, f = s.ffn;
  c.input.assign(x.begin(), x.end());
  c.ln1.resize(std::size_t(n) * h), c.mean1.resize(std::size_t(n)), c.rstd1.resize(std::size_t(n));
  layernorm_forward(x, w.ln1_gain, w.ln1_bias, c.ln1, c.mean1, c.rstd1, n, h);
  c.qkv.resize(std::size_t(n) * 3 * h);
  linear(c.ln1, w.qkv_weight, w.qkv_bias, c.qkv, n, h, 3 * h);
  c.probs.resize(std::size_t(s.batch) * s.heads * s.seq * s.seq), c.attention.resize(std::size_t(n) * h);
  attention_forward(c.qkv, c.attention, c.probs, s.batch, s.seq, h, s.heads);
  c.middle.resize(std::size_t(n) * h);
  linear(c.attention, w.proj_weight, w.proj_bias, c.middle, n, h, h);
  for (std::size_t i = 0; i < c.middle.size(); ++i) c.middle[i] += x[i];  // residual
  c.ln2.resize(std::size_t(n) * h), c.mean2.resize(std::size_t(n)), c.rstd2.resize(std::size_t(n));
  layernorm_forward(c.middle, w.ln2_gain, w.ln2_bias, c.ln2, c.mean2, c.rstd2, n, h);
  c.fc1.resize(std::size_t(n) * f), c.gelu.resize(std::size_t(n) * f);
  linear(c.ln2, w.fc1_weight, w.fc1_bias, c.fc1, n, h, f);
  gelu_forward(c.fc1, c.gelu);
  linear(c.gelu, w.fc2_weight, w.fc2_bias, y, n, f, h);
  for (std::size_t i = 0; i < y.size(); ++i) y[i] += c.middle[i];  // residual
}

void layer_backward(const ModelShape& s, const Layer& w, const LayerCache& c, std::span<const float> dy,
                    std::span<float> dx, Layer& g, DeferredWeightGrad* deferred) {
  const int n = s.tokens(), h = s.hidden, f = s.ffn;
  const auto keep = [deferred](std::vector<float> DeferredWeightGrad::*field) {
    return deferred ? &(deferred->*field) : nullptr;
  };
  std::vector<float> dgelu(std::size_t(n) * f, 0.0f), dfc1(std::size_t(n) * f, 0.0f);
  linear_backward(c.gelu, w.fc2_weight, dy, dgelu, g.fc2_weight, g.fc2_bias, n, f, h, keep(&DeferredWeightGrad::fc2_dy));
  gelu_backward(c.fc1, dgelu, dfc1);
  std::vector<float> dln2(std::size_t(n) * h, 0.0f);
  linear_backward(c.ln2, w.fc1_weight, dfc1, dln2, g.fc1_weight, g.fc1_bias, n, h, f, keep(&DeferredWeightGrad::fc1_dy));
  std::vector<float> dmiddle(dy.begin(), dy.end());  // through the second residual
  layernorm_backward(c.middle, w.ln2_gain, c.mean2, c.rstd2, dln2, dmiddle, g.ln2_gain, g.ln2_bias, n, h);
  std::vector<float> dattention(std::size_t(n) * h, 0.0f), dqkv(std::size_t(n) * 3 * h, 0.0f);
  linear_backward(c.attention, w.proj_weight, dmiddle, dattention, g.proj_weight, g.proj_bias, n, h, h,
                  keep(&DeferredWeightGrad::proj_dy));
  attention_backward(c.qkv, c.probs, dattention, dqkv, s.batch, s.seq, h, s.heads);
  std::vector<float> dln1(std::size_t(n) * h, 0.0f);
  linear_backward(c.ln1, w.qkv_weight, dqkv, dln1, g.qkv_weight, g.qkv_bias, n, h, 3 * h,
                  keep(&DeferredWeightGrad::qkv_dy));
  std::copy(dmiddle.begin(), dmiddle.end(), dx.begin());  // through the first residual
  layernorm_backward(c.input, w.ln1_gain, c.mean1, c.rstd1, dln1, dx, g.ln1_gain, g.ln1_bias, n, h);
}

void layer_weight_backward(const ModelShape& s, const LayerCache& c, const DeferredWeightGrad& d, Layer& g) {
  const int n = s.tokens(), h = s.hidden, f = s.ffn;
  linear_weight_backward(c.gelu, d.fc2_dy, g.fc2_weight, g.fc2_bias, n, f, h);
  linear_weight_backward(c.ln2, d.fc1_dy, g.fc1_weight, g.fc1_bias, n, h, f);
  linear_weight_backward(c.attention, d.proj_dy, g.proj_weight, g.proj_bias, n, h, h);
  linear_weight_backward(c.ln1, d.qkv_dy, g.qkv_weight, g.qkv_bias, n, h, 3 * h);
}

Model make_model(const ModelShape& s, std::uint64_t seed) {
  Model m;
  m.embedding = embedding_rows(s, seed, 0, s.vocab);
  for (int l = 0; l < s.layers; ++l) m.layers.push_back(make_layer(s, seed, l));
  m.final_gain = constant(std::size_t(s.hidden), 1), m.final_bias = constant(std::size_t(s.hidden), 0);
  m.head = head_rows(s, seed, 0, s.vocab);
  return m;
}

std::vector<float> embedding_rows(const ModelShape& s, std::uint64_t seed, int first, int rows) {
  return normal_tensor(std::size_t(rows) * s.hidden, seed, 0, 0.02f, std::size_t(first) * s.hidden);
}

std::vector<float> head_rows(const ModelShape& s, std::uint64_t seed, int first, int rows) {
  return normal_tensor(std::size_t(rows) * s.hidden, seed, 1, 0.02f, std::size_t(first) * s.hidden);
}

Model zero_model(const ModelShape& s) {
  Model m = make_model(s, 0);
  for (std::vector<float>* t : {&m.embedding, &m.final_gain, &m.final_bias, &m.head}) std::fill(t->begin(), t->end(), 0.0f);
  for (Layer& l : m.layers)
    for (std::vector<float>* t : l.tensors()) std::fill(t->begin(), t->end(), 0.0f);
  return m;
}

double reference_step(const ModelShape& s, const Model& m, std::span<const int> tokens, std::span<const int> targets,
                      Model& grad) {
  const int n = s.tokens(), h = s.hidden;
  std::vector<std::vector<float>> activations(std::size_t(s.layers) + 1, std::vector<float>(std::size_t(n) * h));
  embedding_forward(m.embedding, tokens, activations[0], h, 0, s.vocab);
  std::vector<LayerCache> caches(std::size_t(s.layers));
  for (int l = 0; l < s.layers; ++l)
    layer_forward(s, m.layers[std::size_t(l)], activations[std::size_t(l)], activations[std::size_t(l) + 1], caches[std::size_t(l)]);
  std::vector<float> normed(std::size_t(n) * h), mean(static_cast<std::size_t>(n)), rstd(static_cast<std::size_t>(n));
  layernorm_forward(activations.back(), m.final_gain, m.final_bias, normed, mean, rstd, n, h);
  std::vector<float> logits(std::size_t(n) * s.vocab, 0.0f), dlogits(logits.size());
  matmul_bt(normed, m.head, logits, n, h, s.vocab);
  const double loss = cross_entropy(logits, targets, dlogits, n, s.vocab);

  std::vector<float> dnormed(std::size_t(n) * h, 0.0f), dx(std::size_t(n) * h, 0.0f);
  matmul_at(dlogits, normed, grad.head, n, s.vocab, h);  // dHead = dlogitsᵀ · normed
  matmul(dlogits, m.head, dnormed, n, s.vocab, h, true);  // dNormed = dlogits · Head
  layernorm_backward(activations.back(), m.final_gain, mean, rstd, dnormed, dx, grad.final_gain, grad.final_bias, n, h);
  for (int l = s.layers - 1; l >= 0; --l) {
    std::vector<float> below(std::size_t(n) * h, 0.0f);
    layer_backward(s, m.layers[std::size_t(l)], caches[std::size_t(l)], dx, below, grad.layers[std::size_t(l)]);
    dx = std::move(below);
  }
  embedding_backward(tokens, dx, grad.embedding, h, 0, s.vocab);
  return loss;
}

}  // namespace pipesim::cpu
