// The CPU's mixture-of-experts MLP (runtime/cpu/moe.h) against finite differences and against the
// definitions it implements -- the routing rule, the dense mixture it equals when every expert is
// chosen, the load-balancing loss -- then a whole MoE layer, and expert parallelism over threads
// against the whole layer. Every expected value is computed here.
//
// Tolerances as in llama_kernels_test: fp32 forwards, central differences of step 1e-2, each error
// relative to the largest gradient entry, within 2e-2 where a wrong term is off by O(1). Top-k
// routing is piecewise: a difference whose step changes any token's experts is not a derivative,
// so those are skipped (and counted: most are not).
#include <catch2/catch.hpp>
#include <algorithm>
#include <barrier>
#include <cmath>
#include <functional>
#include <numeric>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "gradient_check.h"
#include "model.h"
#include "moe.h"

using namespace pipesim::cpu;
using pipesim::test::dot;
using pipesim::test::random_values;

namespace {

/// 2 sequences of 5 tokens, width 8, 4 experts of width 6 (top-2), a shared expert of width 5.
ModelShape moe_shape(int topk = 2, int shared = 5, float coeff = 0.1f) {
  return ModelShape{.layers = 2, .hidden = 8, .heads = 2, .ffn = 12, .vocab = 11, .batch = 2, .seq = 5, .kv_heads = 0,
                    .family = LayerFamily::Llama, .rope_theta = 100, .tied_embeddings = false, .experts = 4,
                    .router_topk = topk, .expert_ffn = 6, .shared_expert_ffn = shared, .moe_layers = {false, true},
                    .moe_aux_loss_coeff = coeff};
}

/// The MoE MLP's weights as make_layer's layer 1 holds them, replaced by random ones of O(1) spread
/// (the router larger, so that routing margins exceed the differences' steps for most tokens).
Layer random_moe_layer(const ModelShape& s, unsigned seed) {
  Layer w = make_layer(s, 1, 1);
  REQUIRE(w.moe());
  const std::vector<std::string> names = layer_tensor_names();
  auto tensors = w.tensors();
  for (std::size_t t = 0; t < tensors.size(); ++t) {
    std::vector<float> values = random_values(tensors[t]->size(), seed + unsigned(t), names[t] == "router.weight" ? 1.0f : 0.4f);
    if (names[t].ends_with(".gain"))
      for (float& v : values) v += 1;
    *tensors[t] = std::move(values);
  }
  return w;
}

MoeWeights weights_of(const Layer& w) {
  return {w.router_weight, w.expert_fc1_weight, w.expert_fc2_weight, w.shared_fc1_weight, w.shared_fc2_weight};
}
MoeGradients gradients_of(Layer& g) {
  return {g.router_weight, g.expert_fc1_weight, g.expert_fc2_weight, g.shared_fc1_weight, g.shared_fc2_weight};
}

/// Central differences of `loss` at x against `analytic`, skipping elements whose step changes the
/// routing (`routing` returns it after the last loss); the worst error relative to the largest
/// analytic entry, and how many elements were compared.
std::pair<double, int> routed_gradient_error(std::vector<float>& x, const std::function<double()>& loss,
                                             const std::function<std::vector<int>()>& routing,
                                             const std::vector<float>& analytic, float step = 1e-2f) {
  loss();
  const std::vector<int> base = routing();
  double scale = 1e-6, worst = 0;
  for (float g : analytic) scale = std::max(scale, double(std::abs(g)));
  int compared = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const float saved = x[i];
    x[i] = saved + step;
    const double up = loss();
    const bool same_up = routing() == base;
    x[i] = saved - step;
    const double down = loss();
    const bool same_down = routing() == base;
    x[i] = saved;
    if (!same_up || !same_down) continue;
    ++compared;
    worst = std::max(worst, std::abs((up - down) / (2 * step) - analytic[i]) / scale);
  }
  return {worst, compared};
}

/// A SwiGLU MLP of width f on one row, from the definition: down(silu(x·G) ⊙ (x·U)), with fc1's rows
/// [gate | up] (h × 2f) and fc2 (f × h), in double.
std::vector<double> swiglu_mlp(std::span<const float> x, std::span<const float> fc1, std::span<const float> fc2, int h,
                               int f) {
  std::vector<double> out(std::size_t(h), 0.0);
  for (int j = 0; j < f; ++j) {
    double gate = 0, up = 0;
    for (int i = 0; i < h; ++i) {
      gate += double(x[std::size_t(i)]) * fc1[std::size_t(i) * 2 * f + j];
      up += double(x[std::size_t(i)]) * fc1[std::size_t(i) * 2 * f + f + j];
    }
    const double a = gate / (1 + std::exp(-gate)) * up;
    for (int o = 0; o < h; ++o) out[std::size_t(o)] += a * fc2[std::size_t(j) * h + o];
  }
  return out;
}

}  // namespace

/// An expert-parallel group of threads: each all_to_all posts its blocks, waits for every rank's,
/// takes the ones addressed to it, and waits again before the slots are reused.
class ThreadGroup {
 public:
  explicit ThreadGroup(int size) : size_(size), sent_(std::size_t(size)), counts_(std::size_t(size)), barrier_(size) {}
  class Rank final : public ExpertParallel {
   public:
    Rank(ThreadGroup& group, int rank) : group_(group), rank_(rank) {}
    int rank() const override { return rank_; }
    int size() const override { return group_.size_; }
    std::vector<float> all_to_all(std::span<const float> send, std::span<const std::size_t> counts,
                                  std::vector<std::size_t>& received) override {
      group_.sent_[std::size_t(rank_)].assign(send.begin(), send.end());
      group_.counts_[std::size_t(rank_)].assign(counts.begin(), counts.end());
      group_.barrier_.arrive_and_wait();
      std::vector<float> out;
      received.clear();
      for (int r = 0; r < group_.size_; ++r) {
        const std::vector<std::size_t>& theirs = group_.counts_[std::size_t(r)];
        const std::size_t offset = std::accumulate(theirs.begin(), theirs.begin() + rank_, std::size_t(0));
        const auto from = group_.sent_[std::size_t(r)].begin() + std::ptrdiff_t(offset);
        out.insert(out.end(), from, from + std::ptrdiff_t(theirs[std::size_t(rank_)]));
        received.push_back(theirs[std::size_t(rank_)]);
      }
      group_.barrier_.arrive_and_wait();
      return out;
    }

   private:
    ThreadGroup& group_;
    int rank_;
  };

 private:
  int size_;
  std::vector<std::vector<float>> sent_;
  std::vector<std::vector<std::size_t>> counts_;
  std::barrier<> barrier_;
};

/// The largest |a − b| over the largest |b|.
double relative_error(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  double worst = 0, scale = 1e-30;
  for (std::size_t i = 0; i < a.size(); ++i)
    worst = std::max(worst, double(std::abs(a[i] - b[i]))), scale = std::max(scale, double(std::abs(b[i])));
  return worst / scale;
}

TEST_CASE("MoE routing: each token's k largest logits best first, ties to the lower expert, gates renormalised") {
  // The router is the identity, so each token's logits are its row of x.
  ModelShape s = moe_shape(2, 0);
  s.hidden = s.experts = 4, s.batch = 1, s.seq = 4;
  std::vector<float> router(16, 0.0f);
  for (int e = 0; e < 4; ++e) router[std::size_t(e) * 4 + e] = 1;
  const std::vector<float> x{1, 3, 3, 0,   // a tie for first: expert 1, then 2
                             2, 0, 2, 2,   // a three-way tie: 0 then 2
                             0, 0, 0, 0,   // all equal: 0 then 1
                             -1, 5, 0.5f, 4};
  const std::vector<float> fc1(std::size_t(s.experts) * 4 * 2 * 6, 0.1f), fc2(std::size_t(s.experts) * 6 * 4, 0.1f);
  std::vector<float> y(x.size());
  MoeCache c;
  moe_forward(s, {router, fc1, fc2, {}, {}}, x, y, c);
  CHECK(c.chosen == std::vector<int>{1, 2, 0, 2, 0, 1, 1, 3});
  for (int t = 0; t < 4; ++t) {
    const int a = c.chosen[std::size_t(2 * t)], b = c.chosen[std::size_t(2 * t) + 1];
    const double pa = c.probs[std::size_t(4 * t + a)], pb = c.probs[std::size_t(4 * t + b)];
    CHECK(c.gates[std::size_t(2 * t)] == Approx(pa / (pa + pb)).epsilon(1e-6));
    CHECK(c.gates[std::size_t(2 * t) + 1] == Approx(pb / (pa + pb)).epsilon(1e-6));
    CHECK(std::accumulate(c.probs.begin() + 4 * t, c.probs.begin() + 4 * t + 4, 0.0) == Approx(1).epsilon(1e-6));
  }
  // Expert order: expert 0 takes tokens 1 and 2, expert 1 tokens 0, 2 and 3, expert 2 tokens 0 and 1,
  // expert 3 token 3 -- as copies t·k + j, tokens in order within an expert.
  CHECK(c.first_row == std::vector<int>{0, 2, 5, 7, 8});
  CHECK(c.rows == std::vector<int>{2, 4, 0, 5, 6, 1, 3, 7});
  // The load-balancing loss from its definition: coeff · E · Σ_i f_i · P_i.
  const std::vector<double> f{2 / 8.0, 3 / 8.0, 2 / 8.0, 1 / 8.0};
  double expected = 0;
  for (int e = 0; e < 4; ++e) {
    double p = 0;
    for (int t = 0; t < 4; ++t) p += c.probs[std::size_t(4 * t + e)];
    expected += f[std::size_t(e)] * p / 4;
  }
  CHECK(c.aux_loss == Approx(0.1 * 4 * expected).epsilon(1e-6));
}

TEST_CASE("MoE with every expert chosen (k = E) is the dense mixture Σ softmax(x·R)_e · expert_e(x) + shared(x)") {
  const ModelShape s = moe_shape(4, 5);
  const Layer w = random_moe_layer(s, 10);
  const int n = s.tokens(), h = s.hidden, E = s.experts, f = s.expert_ffn, fs = s.shared_expert_ffn;
  const std::vector<float> x = random_values(std::size_t(n) * h, 11);
  std::vector<float> y(x.size());
  MoeCache c;
  moe_forward(s, weights_of(w), x, y, c);
  double worst = 0, largest = 0;
  for (int t = 0; t < n; ++t) {
    const std::span<const float> row(x.data() + std::size_t(t) * h, std::size_t(h));
    std::vector<double> logits(std::size_t(E), 0.0);
    for (int e = 0; e < E; ++e)
      for (int i = 0; i < h; ++i) logits[std::size_t(e)] += double(row[std::size_t(i)]) * w.router_weight[std::size_t(i) * E + e];
    const double top = *std::max_element(logits.begin(), logits.end());
    double sum = 0;
    for (double& l : logits) sum += l = std::exp(l - top);
    std::vector<double> expected = swiglu_mlp(row, w.shared_fc1_weight, w.shared_fc2_weight, h, fs);
    for (int e = 0; e < E; ++e) {
      const std::size_t fc1 = std::size_t(h) * 2 * f, fc2 = std::size_t(f) * h;
      const std::vector<double> out =
          swiglu_mlp(row, std::span(w.expert_fc1_weight).subspan(std::size_t(e) * fc1, fc1),
                     std::span(w.expert_fc2_weight).subspan(std::size_t(e) * fc2, fc2), h, f);
      for (int o = 0; o < h; ++o) expected[std::size_t(o)] += logits[std::size_t(e)] / sum * out[std::size_t(o)];
    }
    for (int o = 0; o < h; ++o) {
      worst = std::max(worst, std::abs(double(y[std::size_t(t) * h + o]) - expected[std::size_t(o)]));
      largest = std::max(largest, std::abs(expected[std::size_t(o)]));
    }
  }
  CHECK(worst <= 1e-5 * largest);
  CHECK(largest > 0.1);  // a mixture of O(1) outputs, not a vanishing one
  // Every expert takes every token: f_i = 1/E, so the loss is coeff · Σ_i P_i = coeff.
  CHECK(c.aux_loss == Approx(s.moe_aux_loss_coeff).epsilon(1e-6));
}

TEST_CASE("MoE backward matches finite differences: input, router, experts, shared expert, load-balancing loss") {
  const float coeff = GENERATE(0.0f, 0.5f);
  const int shared = GENERATE(0, 5);
  CAPTURE(coeff, shared);
  const ModelShape s = moe_shape(2, shared, coeff);
  Layer w = random_moe_layer(s, 20);
  const std::size_t size = std::size_t(s.tokens()) * s.hidden;
  std::vector<float> x = random_values(size, 21), y(size);
  const std::vector<float> dy = random_values(size, 22);
  const float aux_weight = 0.75f;  // the microbatch's weight: the aux loss's gradient scales with it
  MoeCache last;
  const auto loss = [&] {
    moe_forward(s, weights_of(w), x, y, last);
    return dot(y, dy) + aux_weight * last.aux_loss;
  };
  const auto routing = [&] { return last.chosen; };
  MoeCache c;
  moe_forward(s, weights_of(w), x, y, c);
  std::vector<float> dx(size, 0.0f);
  Layer grad = zero_layer(s, 1);
  moe_backward(s, weights_of(w), x, c, dy, dx, gradients_of(grad), nullptr, aux_weight);
  const auto [x_error, x_compared] = routed_gradient_error(x, loss, routing, dx);
  CHECK(x_error < 2e-2);
  CHECK(x_compared > int(size) / 2);
  const std::vector<std::string> names = layer_tensor_names();
  auto params = w.tensors(), grads = grad.tensors();
  for (std::size_t t = 0; t < params.size(); ++t) {
    if (!names[t].starts_with("router") && !names[t].starts_with("expert") && !names[t].starts_with("shared")) continue;
    CAPTURE(names[t]);
    REQUIRE(grads[t]->size() == params[t]->size());
    if (params[t]->empty()) continue;  // no shared expert
    const auto [error, compared] = routed_gradient_error(*params[t], loss, routing, *grads[t]);
    CHECK(error < 2e-2);
    CHECK(compared > int(params[t]->size()) / 2);
  }
}

TEST_CASE("the load-balancing loss reaches the router only, scaled by its coefficient and the microbatch's weight") {
  const ModelShape without = moe_shape(2, 5, 0.0f), with = moe_shape(2, 5, 0.5f);
  const Layer w = random_moe_layer(with, 30);
  const std::size_t size = std::size_t(with.tokens()) * with.hidden;
  const std::vector<float> x = random_values(size, 31), dy = random_values(size, 32);
  const auto gradients = [&](const ModelShape& s, float weight) {
    std::vector<float> y(size), dx(size, 0.0f);
    MoeCache c;
    moe_forward(s, weights_of(w), x, y, c);
    Layer grad = zero_layer(s, 1);
    moe_backward(s, weights_of(w), x, c, dy, dx, gradients_of(grad), nullptr, weight);
    return std::pair{grad, dx};
  };
  const auto [plain, plain_dx] = gradients(without, 1.0f);
  const auto [balanced, balanced_dx] = gradients(with, 1.0f);
  const auto [half, half_dx] = gradients(with, 0.5f);
  CHECK(balanced.expert_fc1_weight == plain.expert_fc1_weight);  // the routing counts are constants
  CHECK(balanced.shared_fc2_weight == plain.shared_fc2_weight);
  double moved = 0, halved = 0, norm = 0;
  for (std::size_t i = 0; i < plain.router_weight.size(); ++i) {
    moved += std::abs(balanced.router_weight[i] - plain.router_weight[i]);
    halved = std::max(halved, double(std::abs((half.router_weight[i] - plain.router_weight[i]) -
                                              0.5f * (balanced.router_weight[i] - plain.router_weight[i]))));
    norm += std::abs(plain.router_weight[i]);
  }
  CHECK(moved > 1e-3 * norm);
  CHECK(halved < 1e-5 * norm);
  CHECK(balanced_dx != plain_dx);  // through the router's input
}

TEST_CASE("a MoE layer: its tensors, a dense layer beside it, and the same numbers from any partition") {
  const ModelShape s = moe_shape();
  const Layer dense = make_layer(s, 5, 0), moe = make_layer(s, 5, 1);
  CHECK_FALSE(dense.moe());
  CHECK(moe.moe());
  const std::vector<std::string> names = layer_tensor_names();
  const std::size_t h = 8, E = 4, f = 6, fs = 5;
  for (std::size_t t = 0; t < names.size(); ++t) {
    CAPTURE(names[t]);
    const std::size_t want = names[t] == "router.weight"              ? h * E
                             : names[t] == "experts.fc1.weight"       ? E * h * 2 * f
                             : names[t] == "experts.fc2.weight"       ? E * f * h
                             : names[t] == "shared_expert.fc1.weight" ? h * 2 * fs
                             : names[t] == "shared_expert.fc2.weight" ? fs * h
                             : names[t] == "fc1.weight" || names[t] == "fc2.weight" || names[t].ends_with(".bias") ? 0
                                                                                     : dense.tensors()[t]->size();
    CHECK(moe.tensors()[t]->size() == want);
    if (names[t].starts_with("router") || names[t].starts_with("expert") || names[t].starts_with("shared"))
      CHECK(dense.tensors()[t]->empty());
  }
  CHECK(make_model(s, 5).layers[1].router_weight == moe.router_weight);  // by (seed, tensor, index)
  CHECK(make_layer(s, 5, 1).expert_fc2_weight == moe.expert_fc2_weight);
  // Over tensor-parallel ranks the router and routed experts stay whole (each rank routes its own
  // tokens); the shared expert splits as the dense MLP does: its gate and up columns, its down rows.
  const ModelShape even = moe_shape(2, 6);
  const Layer whole = make_layer(even, 5, 1), half = split_layer(even, whole, 1, 2);
  CHECK(half.router_weight == whole.router_weight);
  CHECK(half.expert_fc1_weight == whole.expert_fc1_weight);
  CHECK(half.expert_fc2_weight == whole.expert_fc2_weight);
  REQUIRE(half.shared_fc1_weight.size() == whole.shared_fc1_weight.size() / 2);
  CHECK(half.shared_fc1_weight[0] == whole.shared_fc1_weight[3]);  // row 0: [gate 0..5 | up 6..11], rank 1's 3..5, 9..11
  CHECK(half.shared_fc1_weight[3] == whole.shared_fc1_weight[9]);
  CHECK(half.shared_fc2_weight == std::vector<float>(whole.shared_fc2_weight.begin() + 3 * 8, whole.shared_fc2_weight.end()));
}

TEST_CASE("a whole MoE layer's backward matches finite differences, and W apart from B gives the same bits") {
  const ModelShape s = moe_shape();
  Layer w = random_moe_layer(s, 40);
  const std::size_t size = std::size_t(s.tokens()) * s.hidden;
  std::vector<float> x = random_values(size, 41), y(size);
  const std::vector<float> dy = random_values(size, 42);
  LayerCache last;
  const auto loss = [&] {
    layer_forward(s, w, x, y, last);
    return dot(y, dy) + last.moe.aux_loss;
  };
  const auto routing = [&] { return last.moe.chosen; };
  LayerCache cache;
  layer_forward(s, w, x, y, cache);
  std::vector<float> fused_dx(size, 0.0f), split_dx(size, 0.0f);
  Layer fused = zero_layer(s, 1), split = zero_layer(s, 1);
  layer_backward(s, w, cache, dy, fused_dx, fused);
  DeferredWeightGrad deferred;
  layer_backward(s, w, cache, dy, split_dx, split, &deferred);
  CHECK(split.router_weight == std::vector<float>(split.router_weight.size(), 0.0f));  // deferred: not yet added
  CHECK(split.expert_fc1_weight == std::vector<float>(split.expert_fc1_weight.size(), 0.0f));
  layer_weight_backward(s, cache, deferred, split);
  CHECK(split_dx == fused_dx);
  const std::vector<std::string> names = layer_tensor_names();
  auto params = w.tensors(), grads = fused.tensors();
  for (std::size_t t = 0; t < names.size(); ++t) {
    CAPTURE(names[t]);
    CHECK(*split.tensors()[t] == *grads[t]);
    if (params[t]->empty()) continue;
    const auto [error, compared] = routed_gradient_error(*params[t], loss, routing, *grads[t]);
    CHECK(error < 2e-2);
    CHECK(compared > int(params[t]->size()) / 2);
  }
  const auto [x_error, x_compared] = routed_gradient_error(x, loss, routing, fused_dx);
  CHECK(x_error < 2e-2);
  CHECK(x_compared > int(size) / 2);
}

TEST_CASE("expert parallelism: each rank's output and input gradient are the whole layer's, its experts' the sum") {
  // 2 or 4 ranks, each its own tokens and its share of the 4 experts, exchanging their routed copies;
  // the reference runs each rank's tokens through the whole layer.
  const int ranks = GENERATE(2, 4);
  CAPTURE(ranks);
  const ModelShape s = moe_shape(2, 5, 0.5f);
  const Layer w = random_moe_layer(s, 40);
  const std::size_t size = std::size_t(s.tokens()) * s.hidden;
  std::vector<std::vector<float>> x, dy, y_ref, dx_ref;
  std::vector<Layer> grad_ref;
  Layer expert_grads = zero_layer(s, 1);  // the whole layer's routed experts' gradients, summed over the ranks
  for (int r = 0; r < ranks; ++r) {
    x.push_back(random_values(size, 41 + unsigned(r))), dy.push_back(random_values(size, 51 + unsigned(r)));
    y_ref.emplace_back(size), dx_ref.emplace_back(size, 0.0f), grad_ref.push_back(zero_layer(s, 1));
    MoeCache c;
    moe_forward(s, weights_of(w), x.back(), y_ref.back(), c);
    moe_backward(s, weights_of(w), x.back(), c, dy.back(), dx_ref.back(), gradients_of(grad_ref.back()), nullptr, 0.75f);
    std::vector<float> scratch(size, 0.0f);
    moe_backward(s, weights_of(w), x.back(), c, dy.back(), scratch, gradients_of(expert_grads), nullptr, 0.75f);
  }
  ThreadGroup group(ranks);
  const std::size_t count = std::size_t(ranks);
  std::vector<std::vector<float>> y(count, std::vector<float>(size)), dx(count, std::vector<float>(size, 0.0f));
  std::vector<std::vector<float>> dx_split = dx;
  std::vector<Layer> parts, grads, split_grads;
  for (int r = 0; r < ranks; ++r) {
    parts.push_back(expert_part(s, w, r, ranks));
    grads.push_back(zero_layer(s, 1)), split_grads.push_back(zero_layer(s, 1));
    for (Layer* g : {&grads.back(), &split_grads.back()})
      g->expert_fc1_weight.resize(parts.back().expert_fc1_weight.size()),
          g->expert_fc2_weight.resize(parts.back().expert_fc2_weight.size());
  }
  {
    std::vector<std::jthread> threads;
    for (int r = 0; r < ranks; ++r)
      threads.emplace_back([&, r] {
        ThreadGroup::Rank ep(group, r);
        const std::size_t i = std::size_t(r);
        MoeCache c;
        moe_forward(s, weights_of(parts[i]), x[i], y[i], c, &ep);
        moe_backward(s, weights_of(parts[i]), x[i], c, dy[i], dx[i], gradients_of(grads[i]), nullptr, 0.75f, &ep);
        // W apart from B: the same sums, no exchange in W.
        MoeDeferred d;
        moe_backward(s, weights_of(parts[i]), x[i], c, dy[i], dx_split[i], gradients_of(split_grads[i]), &d, 0.75f, &ep);
        moe_weight_backward(s, x[i], c, d, gradients_of(split_grads[i]));
      });
  }
  for (int r = 0; r < ranks; ++r) {
    CAPTURE(r);
    const std::size_t i = std::size_t(r);
    CHECK(relative_error(y[i], y_ref[i]) < 1e-5);
    CHECK(relative_error(dx[i], dx_ref[i]) < 1e-5);
    CHECK(dx_split[i] == dx[i]);
    // Routing is each rank's own: its router and shared expert gradients are its tokens' alone.
    CHECK(relative_error(grads[i].router_weight, grad_ref[i].router_weight) < 1e-5);
    CHECK(relative_error(grads[i].shared_fc1_weight, grad_ref[i].shared_fc1_weight) < 1e-5);
    // Its experts' gradients: every rank's tokens that chose them, this rank's block of the whole.
    for (const auto& [mine, whole] : {std::pair{&grads[i].expert_fc1_weight, &expert_grads.expert_fc1_weight},
                                      {&grads[i].expert_fc2_weight, &expert_grads.expert_fc2_weight}}) {
      const std::vector<float> block(whole->begin() + std::ptrdiff_t(i * mine->size()),
                                     whole->begin() + std::ptrdiff_t((i + 1) * mine->size()));
      CHECK(relative_error(*mine, block) < 1e-5);
    }
    CHECK(split_grads[i].expert_fc1_weight == grads[i].expert_fc1_weight);
    CHECK(split_grads[i].router_weight == grads[i].router_weight);
  }
}
