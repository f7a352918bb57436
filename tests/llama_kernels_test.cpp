// The Llama family on the CPU: RMSNorm, rotary embeddings, SwiGLU and grouped-query attention
// against finite differences and against properties that follow from their definitions, then a whole
// Llama layer. Every expected value is computed here from the definition.
//
// Tolerances: the kernels are fp32, so the finite differences are too. With step 1e-2 a central
// difference is off by O(step²)·f''' (about 1e-4 for these smooth functions of O(1) inputs) plus
// the loss's rounding, ~1e-7·|loss| / step (about 1e-5 here); against the largest gradient entry
// (O(1)) both are well under the 2e-2 the checks allow, while a wrong term (a missing factor or a
// sign) is off by O(1).
#include <catch2/catch.hpp>
#include <cmath>
#include <string>

#include "gradient_check.h"
#include "kernels.h"
#include "llama_kernels.h"
#include "model.h"

using namespace pipesim::cpu;
using pipesim::test::dot;
using pipesim::test::random_values;
using pipesim::test::worst_gradient_error;

TEST_CASE("RMSNorm: rows of unit gain have the RMS the definition gives; the backward matches finite differences") {
  const int n = 3, h = 8;
  std::vector<float> x = random_values(n * h, 1, 2.0f), gain(h, 1.0f);
  std::vector<float> y(n * h), rstd(n);
  rmsnorm_forward(x, gain, y, rstd, n, h);
  for (int i = 0; i < n; ++i) {  // mean(y²) = mean(x²) / (mean(x²) + ε)
    double xx = 0, yy = 0;
    for (int j = 0; j < h; ++j) xx += double(x[i * h + j]) * x[i * h + j], yy += double(y[i * h + j]) * y[i * h + j];
    CHECK(yy / h == Approx(xx / h / (xx / h + kRmsNormEpsilon)).epsilon(1e-6));
  }
  gain = random_values(h, 2);
  const std::vector<float> weights = random_values(n * h, 3);
  const auto loss = [&] {
    rmsnorm_forward(x, gain, y, rstd, n, h);
    return dot(y, weights);
  };
  loss();
  std::vector<float> dx(n * h, 0.0f), dgain(h, 0.0f);
  rmsnorm_backward(x, gain, rstd, weights, dx, dgain, n, h);
  CHECK(worst_gradient_error(x, loss, dx) < 2e-2);
  CHECK(worst_gradient_error(gain, loss, dgain) < 2e-2);
}

namespace {

/// One RoPE layout: n = batch·seq rows of `width` columns, the first `heads` heads of width d rotated.
struct RopeCase {
  int batch, seq, width, heads, d;
  float theta;
  int rows() const { return batch * seq; }
};

}  // namespace

TEST_CASE("RoPE: the backward undoes the forward, and rotates as the definition says") {
  const auto c = GENERATE(RopeCase{2, 5, 24, 2, 8, 10000}, RopeCase{1, 64, 12, 3, 4, 500000}, RopeCase{3, 2, 6, 1, 6, 10});
  CAPTURE(c.batch, c.seq, c.width, c.heads, c.d, c.theta);
  const std::size_t size = std::size_t(c.rows()) * c.width;
  const std::vector<float> x = random_values(size, 11);
  std::vector<float> y = x;
  rope_forward(y, c.rows(), c.seq, c.width, c.heads, c.d, c.theta);

  SECTION("backward ∘ forward is the identity") {
    std::vector<float> back = y;
    rope_backward(back, c.rows(), c.seq, c.width, c.heads, c.d, c.theta);
    for (std::size_t i = 0; i < size; ++i) CHECK(back[i] == Approx(x[i]).margin(1e-5));
  }
  SECTION("each pair turns by position · theta^(-2i/d); columns past the rotated heads stay; positions restart per sequence") {
    const int half = c.d / 2;
    for (int row = 0; row < c.rows(); ++row)
      for (int column = 0; column < c.width; ++column) {
        const std::size_t at = std::size_t(row) * c.width + column;
        if (column >= c.heads * c.d) {
          CHECK(y[at] == x[at]);
          continue;
        }
        const int head = column / c.d, e = column % c.d, i = e % half;
        const double angle = (row % c.seq) * std::pow(double(c.theta), -2.0 * i / c.d);
        const std::size_t first = std::size_t(row) * c.width + std::size_t(head) * c.d + i;
        const double a = x[first], b = x[first + half];
        const double want = e < half ? a * std::cos(angle) - b * std::sin(angle) : b * std::cos(angle) + a * std::sin(angle);
        CHECK(y[at] == Approx(want).margin(1e-5));
      }
  }
  SECTION("the backward matches finite differences") {
    std::vector<float> input = x;
    const std::vector<float> weights = random_values(size, 12);
    const auto loss = [&] {
      std::vector<float> rotated = input;
      rope_forward(rotated, c.rows(), c.seq, c.width, c.heads, c.d, c.theta);
      return dot(rotated, weights);
    };
    std::vector<float> dx = weights;
    rope_backward(dx, c.rows(), c.seq, c.width, c.heads, c.d, c.theta);
    CHECK(worst_gradient_error(input, loss, dx) < 2e-2);
  }
}

TEST_CASE("RoPE: the score of a rotated query and key depends only on how far apart they are") {
  // ⟨R(p)q, R(p + Δ)k⟩ = ⟨q, R(Δ)k⟩: the same q and k at positions (0, 3) and (5, 8) score the same.
  const int seq = 9, d = 8, width = 2 * d;
  const std::vector<float> q = random_values(d, 21), k = random_values(d, 22);
  std::vector<float> rows(std::size_t(seq) * width, 0.0f);
  for (int p = 0; p < seq; ++p)
    std::copy(q.begin(), q.end(), rows.begin() + p * width), std::copy(k.begin(), k.end(), rows.begin() + p * width + d);
  rope_forward(rows, seq, seq, width, 2, d, 10000);
  const auto score = [&](int query_position, int key_position) {
    double sum = 0;
    for (int e = 0; e < d; ++e) sum += double(rows[query_position * width + e]) * rows[key_position * width + d + e];
    return sum;
  };
  CHECK(score(0, 3) == Approx(score(5, 8)).epsilon(1e-5));
  CHECK(score(2, 2) == Approx(dot(q, k)).epsilon(1e-5));  // Δ = 0: no rotation between them
}

TEST_CASE("SwiGLU: a zero gate gives zero; the backward matches finite differences") {
  const int n = 3, f = 5;
  std::vector<float> gate_up = random_values(std::size_t(n) * 2 * f, 31, 2.0f), out(std::size_t(n) * f);
  gate_up[0] = 0;  // row 0, column 0: silu(0) · up = 0
  swiglu_forward(gate_up, out, n, f);
  CHECK(out[0] == 0.0f);
  const double g = gate_up[1], u = gate_up[f + 1];
  CHECK(out[1] == Approx(g / (1 + std::exp(-g)) * u).epsilon(1e-6));
  const std::vector<float> weights = random_values(out.size(), 32);
  const auto loss = [&] {
    swiglu_forward(gate_up, out, n, f);
    return dot(out, weights);
  };
  std::vector<float> dgate_up(gate_up.size(), 0.0f);
  swiglu_backward(gate_up, weights, dgate_up, n, f);
  CHECK(worst_gradient_error(gate_up, loss, dgate_up) < 2e-2);
}

TEST_CASE("grouped-query attention equals multi-head attention on repeated key/value heads, gradients summed") {
  const int batch = 2, seq = 4, heads = 4, d = 3, h = heads * d, n = batch * seq;
  const int kv_heads = GENERATE(1, 2, 4);
  CAPTURE(kv_heads);
  const int group = heads / kv_heads, width = h + 2 * kv_heads * d;
  std::vector<float> qkv = random_values(std::size_t(n) * width, 41, 0.7f);
  // The same attention as multi-head: each query head gets its own copy of its key/value head.
  const auto kv_column = [&](int part, int head, int e) { return h + part * kv_heads * d + head / group * d + e; };
  const auto expand = [&](const std::vector<float>& grouped) {
    std::vector<float> full(std::size_t(n) * 3 * h);
    for (int row = 0; row < n; ++row)
      for (int head = 0; head < heads; ++head)
        for (int e = 0; e < d; ++e) {
          const std::size_t to = std::size_t(row) * 3 * h + std::size_t(head) * d + e, from = std::size_t(row) * width;
          full[to] = grouped[from + std::size_t(head) * d + e];
          full[to + h] = grouped[from + kv_column(0, head, e)];
          full[to + 2 * h] = grouped[from + kv_column(1, head, e)];
        }
    return full;
  };
  const std::vector<float> full = expand(qkv), weights = random_values(std::size_t(n) * h, 42);
  std::vector<float> out(std::size_t(n) * h), probs(std::size_t(batch) * heads * seq * seq);
  std::vector<float> full_out(out.size()), full_probs(probs.size());
  attention_forward(qkv, out, probs, batch, seq, h, heads, kv_heads);
  attention_forward(full, full_out, full_probs, batch, seq, h, heads);
  CHECK(out == full_out);  // the same sums in the same order
  CHECK(probs == full_probs);

  std::vector<float> dqkv(qkv.size(), 0.0f), dfull(full.size(), 0.0f);
  attention_backward(qkv, probs, weights, dqkv, batch, seq, h, heads, kv_heads);
  attention_backward(full, full_probs, weights, dfull, batch, seq, h, heads);
  std::vector<float> summed(qkv.size(), 0.0f);  // expand's transpose: the copies' gradients added back
  for (int row = 0; row < n; ++row)
    for (int head = 0; head < heads; ++head)
      for (int e = 0; e < d; ++e) {
        const std::size_t from = std::size_t(row) * 3 * h + std::size_t(head) * d + e, to = std::size_t(row) * width;
        summed[to + std::size_t(head) * d + e] += dfull[from];
        summed[to + kv_column(0, head, e)] += dfull[from + h];
        summed[to + kv_column(1, head, e)] += dfull[from + 2 * h];
      }
  for (std::size_t i = 0; i < qkv.size(); ++i) CHECK(dqkv[i] == Approx(summed[i]).margin(1e-6));

  const auto loss = [&] {
    attention_forward(qkv, out, probs, batch, seq, h, heads, kv_heads);
    return dot(out, weights);
  };
  CHECK(worst_gradient_error(qkv, loss, dqkv) < 2e-2);
}

namespace {

ModelShape llama_shape(int kv_heads) {
  return ModelShape{.layers = 2, .hidden = 16, .heads = 4, .ffn = 12, .vocab = 11, .batch = 2, .seq = 3,
                    .kv_heads = kv_heads, .family = LayerFamily::Llama, .rope_theta = 100};
}

/// make_layer's tensors replaced by random ones of O(1) spread (gains around 1), so that every
/// nonlinearity of the layer is exercised away from its near-linear start.
Layer random_layer(const ModelShape& shape, unsigned seed) {
  Layer w = make_layer(shape, 1, 0);
  const std::vector<std::string> names = layer_tensor_names();
  auto tensors = w.tensors();
  for (std::size_t t = 0; t < tensors.size(); ++t) {
    std::vector<float> values = random_values(tensors[t]->size(), seed + unsigned(t), 0.4f);
    if (names[t].ends_with(".gain"))
      for (float& v : values) v += 1;
    *tensors[t] = std::move(values);
  }
  return w;
}

}  // namespace

TEST_CASE("a Llama layer has gains, fused QKV, gate-up and down weights, no biases, and names for each tensor") {
  const int kv_heads = GENERATE(0, 2);
  const ModelShape s = llama_shape(kv_heads);
  CAPTURE(kv_heads);
  const Layer w = make_layer(s, 5, 1);
  const std::vector<std::string> names = layer_tensor_names();
  const auto tensors = w.tensors();
  REQUIRE(names.size() == tensors.size());
  const std::size_t h = std::size_t(s.hidden), f = std::size_t(s.ffn), kv = std::size_t(s.key_value_heads());
  const std::size_t d = h / std::size_t(s.heads);
  for (std::size_t t = 0; t < names.size(); ++t) {
    CAPTURE(names[t]);
    const std::size_t want = names[t] == "ln1.gain" || names[t] == "ln2.gain" ? h
                             : names[t] == "qkv.weight"                       ? h * (h + 2 * kv * d)
                             : names[t] == "proj.weight"                      ? h * h
                             : names[t] == "fc1.weight"                       ? h * 2 * f
                             : names[t] == "fc2.weight"                       ? f * h
                                                                              : 0;  // every bias
    CHECK(tensors[t]->size() == want);
  }
  CHECK(*make_model(s, 5).layers[1].tensors()[2] == *tensors[2]);  // by (seed, tensor, index): any partition
  CHECK(make_model(s, 5).final_bias.empty());
}

TEST_CASE("a Llama layer's backward matches finite differences, with multi-head and grouped-query attention") {
  const int kv_heads = GENERATE(0, 2, 1);
  const ModelShape s = llama_shape(kv_heads);
  CAPTURE(kv_heads);
  Layer w = random_layer(s, 50);
  const std::size_t size = std::size_t(s.tokens()) * s.hidden;
  std::vector<float> x = random_values(size, 60), y(size);
  const std::vector<float> weights = random_values(size, 61);
  const auto loss = [&] {
    LayerCache cache;
    layer_forward(s, w, x, y, cache);
    return dot(y, weights);
  };
  LayerCache cache;
  layer_forward(s, w, x, y, cache);
  std::vector<float> dx(size);
  Layer grad = zero_layer(s);
  layer_backward(s, w, cache, weights, dx, grad);
  CHECK(worst_gradient_error(x, loss, dx) < 2e-2);
  const std::vector<std::string> names = layer_tensor_names();
  auto params = w.tensors(), grads = grad.tensors();
  for (std::size_t t = 0; t < params.size(); ++t) {
    CAPTURE(names[t]);
    CHECK(grads[t]->size() == params[t]->size());
    if (!params[t]->empty()) CHECK(worst_gradient_error(*params[t], loss, *grads[t]) < 2e-2);
  }
}

TEST_CASE("a Llama layer's weight gradients are the same bits whether W runs with B or apart from it") {
  const ModelShape s = llama_shape(2);
  const Layer w = random_layer(s, 70);
  const std::size_t size = std::size_t(s.tokens()) * s.hidden;
  const std::vector<float> x = random_values(size, 71), dy = random_values(size, 72);
  std::vector<float> y(size), fused_dx(size), split_dx(size);
  LayerCache cache;
  layer_forward(s, w, x, y, cache);
  Layer fused = zero_layer(s), split = zero_layer(s);
  layer_backward(s, w, cache, dy, fused_dx, fused);
  DeferredWeightGrad deferred;
  layer_backward(s, w, cache, dy, split_dx, split, &deferred);
  CHECK(split.fc1_weight == std::vector<float>(split.fc1_weight.size(), 0.0f));  // deferred: not yet added
  layer_weight_backward(s, cache, deferred, split);
  CHECK(split_dx == fused_dx);
  const std::vector<std::string> names = layer_tensor_names();
  for (std::size_t t = 0; t < names.size(); ++t) {
    CAPTURE(names[t]);
    CHECK(*split.tensors()[t] == *fused.tensors()[t]);
  }
}
