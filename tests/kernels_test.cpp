// The CPU runtime's kernels: every backward matches central finite differences of its forward, and
// the forwards match values worked out by hand.
#include <catch2/catch.hpp>
#include <cmath>
#include <thread>

#include "gradient_check.h"
#include "kernels.h"
#include "vocab.h"

using namespace pipesim::cpu;

using pipesim::test::dot;
using pipesim::test::random_values;
using pipesim::test::worst_gradient_error;

TEST_CASE("matmul and its transposed forms agree with the definition") {
  const std::vector<float> a = {1, 2, 3, 4, 5, 6};        // 2×3
  const std::vector<float> b = {7, 8, 9, 10, 11, 12};     // 3×2
  std::vector<float> c(4);
  matmul(a, b, c, 2, 3, 2);
  CHECK(c == std::vector<float>{58, 64, 139, 154});
  std::vector<float> bt = {7, 9, 11, 8, 10, 12};          // Bᵀ stored 2×3
  std::vector<float> c2(4, 0.0f);
  matmul_bt(a, bt, c2, 2, 3, 2);
  CHECK(c2 == c);
  std::vector<float> at = {1, 4, 2, 5, 3, 6};             // Aᵀ stored 3×2
  std::vector<float> c3(4, 0.0f);
  matmul_at(at, b, c3, 3, 2, 2);                          // (Aᵀ)ᵀ·B with n=3 rows, k=2, m=2
  CHECK(c3 == c);
}

TEST_CASE("the GEMMs agree with the loops, accumulating and overwriting, at odd and empty sizes") {
  INFO("GEMM library: " << gemm_library());
  // n, k, m: odd sizes cross OpenBLAS's blocking edges; zeros are empty products.
  const int sizes[][3] = {{1, 1, 1}, {3, 5, 7}, {17, 33, 65}, {64, 1, 9}, {0, 4, 5}, {4, 0, 5}, {4, 5, 0}, {130, 70, 33}};
  for (const auto& size : sizes) {
    const int n = size[0], k = size[1], m = size[2];
    CAPTURE(n, k, m);
    const auto nk = std::size_t(n) * std::size_t(k), km = std::size_t(k) * std::size_t(m),
               nm = std::size_t(n) * std::size_t(m);
    const std::vector<float> a = random_values(nk, 11), b = random_values(km, 12), bt = random_values(km, 13),
                             b_rows = random_values(nm, 14), start = random_values(nm, 15),
                             start_km = random_values(km, 16);
    const auto close = [](const std::vector<float>& got, const std::vector<float>& want) {
      REQUIRE(got.size() == want.size());
      double worst = 0, scale = 1e-30;
      for (std::size_t i = 0; i < got.size(); ++i) {
        worst = std::max(worst, double(std::abs(got[i] - want[i])));
        scale = std::max(scale, double(std::abs(want[i])));
      }
      return worst / scale < 1e-5;
    };
    for (const bool accumulate : {false, true}) {
      std::vector<float> got = start, want = start;
      matmul(a, b, got, n, k, m, accumulate);
      loops::matmul(a, b, want, n, k, m, accumulate);
      CHECK(close(got, want));
    }
    std::vector<float> got = start, want = start;
    matmul_bt(a, bt, got, n, k, m);  // B stored m×k
    loops::matmul_bt(a, bt, want, n, k, m);
    CHECK(close(got, want));
    got = start_km, want = start_km;
    matmul_at(a, b_rows, got, n, k, m);  // A n×k, B n×m, C k×m
    loops::matmul_at(a, b_rows, want, n, k, m);
    CHECK(close(got, want));
  }
}

TEST_CASE("a GEMM gives the same bits on every thread, however many run at once") {
  const int n = 96, k = 80, m = 112;
  const std::vector<float> a = random_values(std::size_t(n) * k, 21), b = random_values(std::size_t(k) * m, 22);
  std::vector<float> alone(std::size_t(n) * m);
  matmul(a, b, alone, n, k, m);
  std::vector<std::vector<float>> results(4, std::vector<float>(std::size_t(n) * m));
  std::vector<std::thread> threads;
  for (auto& result : results) threads.emplace_back([&] { matmul(a, b, result, n, k, m); });
  for (auto& thread : threads) thread.join();
  for (const auto& result : results) CHECK(result == alone);
}

TEST_CASE("LayerNorm's backward matches finite differences") {
  const int n = 3, h = 8;
  std::vector<float> x = random_values(n * h, 1), gamma = random_values(h, 2), beta = random_values(h, 3);
  const std::vector<float> weights = random_values(n * h, 4);
  std::vector<float> y(n * h), mean(n), rstd(n);
  const auto loss = [&] {
    layernorm_forward(x, gamma, beta, y, mean, rstd, n, h);
    return dot(y, weights);
  };
  loss();
  std::vector<float> dx(n * h, 0.0f), dgamma(h, 0.0f), dbeta(h, 0.0f);
  layernorm_backward(x, gamma, mean, rstd, weights, dx, dgamma, dbeta, n, h);
  CHECK(worst_gradient_error(x, loss, dx) < 2e-2);
  CHECK(worst_gradient_error(gamma, loss, dgamma) < 2e-2);
  CHECK(worst_gradient_error(beta, loss, dbeta) < 2e-2);
}

TEST_CASE("GELU's backward matches finite differences, and GELU(0) = 0") {
  std::vector<float> x = random_values(16, 5, 2.0f);
  const std::vector<float> weights = random_values(16, 6);
  std::vector<float> y(16);
  const auto loss = [&] {
    gelu_forward(x, y);
    return dot(y, weights);
  };
  std::vector<float> dx(16, 0.0f);
  gelu_backward(x, weights, dx);
  CHECK(worst_gradient_error(x, loss, dx) < 2e-2);
  std::vector<float> zero = {0.0f}, out = {1.0f};
  gelu_forward(zero, out);
  CHECK(out[0] == 0.0f);
}

TEST_CASE("causal attention: the first query sees only itself; the backward matches finite differences") {
  const int batch = 2, seq = 4, h = 8, heads = 2, n = batch * seq;
  std::vector<float> qkv = random_values(std::size_t(n) * 3 * h, 7, 0.5f);
  const std::vector<float> weights = random_values(std::size_t(n) * h, 8);
  std::vector<float> out(std::size_t(n) * h), probs(std::size_t(batch) * heads * seq * seq);
  const auto loss = [&] {
    attention_forward(qkv, out, probs, batch, seq, h, heads);
    return dot(out, weights);
  };
  loss();
  for (int e = 0; e < h; ++e) CHECK(out[std::size_t(e)] == Approx(qkv[2 * h + std::size_t(e)]));  // row 0 = its own V
  std::vector<float> dqkv(qkv.size(), 0.0f);
  attention_backward(qkv, probs, weights, dqkv, batch, seq, h, heads);
  CHECK(worst_gradient_error(qkv, loss, dqkv) < 2e-2);
}

TEST_CASE("cross-entropy: log V for uniform logits; its gradient matches finite differences") {
  const int n = 3, vocab = 5;
  std::vector<float> logits(n * vocab, 0.0f), dlogits(n * vocab);
  const std::vector<int> targets = {0, 3, 4};
  CHECK(cross_entropy(logits, targets, dlogits, n, vocab) == Approx(std::log(5.0)));
  logits = random_values(n * vocab, 9);
  const auto loss = [&] {
    std::vector<float> scratch(n * vocab);
    return cross_entropy(logits, targets, scratch, n, vocab);
  };
  cross_entropy(logits, targets, dlogits, n, vocab);
  CHECK(worst_gradient_error(logits, loss, dlogits) < 2e-2);
}

TEST_CASE("a sharded embedding gives its own rows and zeros elsewhere; shards sum to the full lookup") {
  const int vocab = 6, h = 3;
  const std::vector<float> table = random_values(vocab * h, 10);
  const std::vector<int> tokens = {5, 0, 2, 3};
  std::vector<float> full(tokens.size() * h), sum(tokens.size() * h, 0.0f), part(tokens.size() * h);
  embedding_forward(table, tokens, full, h, 0, vocab);
  for (int shard = 0; shard < 3; ++shard) {  // 3 devices, 2 rows each
    const std::span<const float> rows(table.data() + shard * 2 * h, 2 * h);
    embedding_forward(rows, tokens, part, h, 2 * shard, 2);
    for (std::size_t i = 0; i < sum.size(); ++i) sum[i] += part[i];
  }
  CHECK(sum == full);
  std::vector<float> dtable(2 * h, 0.0f);
  const std::vector<float> dout(tokens.size() * h, 1.0f);
  embedding_backward(tokens, dout, dtable, h, 2, 2);  // shard 1: rows 2 and 3, each hit once
  CHECK(dtable == std::vector<float>(2 * h, 1.0f));
}

#include "model.h"

TEST_CASE("the reference model's gradients match directional finite differences of its loss") {
  // Per tensor, a random direction d: (L(w + εd) - L(w - εd)) / 2ε must equal g·d. A whole-tensor
  // direction moves the fp32 loss far more than one entry would, above its rounding noise. Both
  // layer families, with multi-head and grouped-query attention (4 query heads on 2 or 1 key/value heads).
  const auto [family, kv_heads] = GENERATE(std::pair{LayerFamily::Gpt, 0}, std::pair{LayerFamily::Gpt, 2},
                                           std::pair{LayerFamily::Llama, 0}, std::pair{LayerFamily::Llama, 1});
  CAPTURE(family == LayerFamily::Llama ? "llama" : "gpt", kv_heads);
  const int heads = family == LayerFamily::Gpt && kv_heads == 0 ? 2 : 4;  // the first: the test as it was
  const ModelShape shape{.layers = 2, .hidden = 8, .heads = heads, .ffn = 16, .vocab = 11, .batch = 2, .seq = 3,
                         .kv_heads = kv_heads, .family = family};
  Model model = make_model(shape, 7);
  // SwiGLU multiplies two projections: at the 0.02 initialisation a Llama layer's norm gains move the
  // loss by ~5e-5 per unit direction, below what the fp32 loss resolves over 2ε. Larger matrices
  // lift every gradient above it.
  if (family == LayerFamily::Llama)
    for (Layer& layer : model.layers)
      for (std::vector<float>* t : {&layer.qkv_weight, &layer.proj_weight, &layer.fc1_weight, &layer.fc2_weight})
        for (float& v : *t) v *= 8;
  const std::vector<int> tokens = {1, 4, 9, 4, 0, 10}, targets = {4, 9, 2, 0, 10, 3};
  Model grad = zero_model(shape);
  reference_step(shape, model, tokens, targets, grad);
  std::vector<std::pair<std::vector<float>*, std::vector<float>*>> checked = {
      {&model.head, &grad.head}, {&model.final_gain, &grad.final_gain}, {&model.embedding, &grad.embedding}};
  for (int l = 0; l < shape.layers; ++l) {
    auto weights = model.layers[std::size_t(l)].tensors(), grads = grad.layers[std::size_t(l)].tensors();
    for (std::size_t t = 0; t < weights.size(); ++t)
      if (!weights[t]->empty()) checked.emplace_back(weights[t], grads[t]);  // Llama has no biases
  }
  for (std::size_t i = 0; i < checked.size(); ++i) {
    CAPTURE(i);
    std::vector<float>& w = *checked[i].first;
    const std::vector<float> direction = random_values(w.size(), 100 + unsigned(i)), saved = w;
    const double expected = dot(*checked[i].second, direction);
    const auto loss_at = [&](float epsilon) {
      for (std::size_t k = 0; k < w.size(); ++k) w[k] = saved[k] + epsilon * direction[k];
      Model scratch = zero_model(shape);
      return reference_step(shape, model, tokens, targets, scratch);
    };
    const float epsilon = 1e-3f;
    const double measured = (loss_at(epsilon) - loss_at(-epsilon)) / (2 * epsilon);
    w = saved;
    CHECK(measured == Approx(expected).epsilon(5e-2).margin(2e-5));
    CHECK(std::abs(expected) > 1e-4);  // the check is not vacuous
  }
}

TEST_CASE("a layer's weights depend only on the seed and its index, so any partition builds the same model") {
  const ModelShape shape{.layers = 4, .hidden = 8, .heads = 2, .ffn = 16, .vocab = 11, .batch = 1, .seq = 3};
  const Model model = make_model(shape, 42);
  Layer alone = make_layer(shape, 42, 2);
  Layer from_model = model.layers[2];
  CHECK(*alone.tensors()[2] == *from_model.tensors()[2]);
  CHECK(*alone.tensors()[8] == *from_model.tensors()[8]);
  CHECK(*make_layer(shape, 42, 1).tensors()[2] != *alone.tensors()[2]);
}

TEST_CASE("the vocabulary-parallel output layer over shards (one of them empty) equals the full softmax") {
  // V = 5 over p = 4 devices: padded to 8, shards of rows {0,1}, {2,3}, {4}, {} -- the last holds none.
  const int n = 6, h = 4, vocab = 5;
  const std::vector<VocabShard> shards{{0, 2}, {2, 2}, {4, 1}, {6, 0}};
  const std::vector<float> x = random_values(std::size_t(n) * h, 21), w = random_values(std::size_t(vocab) * h, 22);
  const std::vector<int> targets{0, 4, 2, 4, 3, 1};
  const auto rows_of = [&](VocabShard s) {  // the empty shard's rows lie past the table: an empty span
    return s.rows == 0 ? std::span<const float>() : std::span<const float>(w).subspan(std::size_t(s.first) * h, std::size_t(s.rows) * h);
  };
  // The reference: full logits, cross-entropy, dW = dlogitsᵀ·X, dX = dlogits·W.
  std::vector<float> logits(std::size_t(n) * vocab, 0.0f), dlogits(logits.size());
  matmul_bt(x, w, logits, n, h, vocab);
  const double loss = cross_entropy(logits, targets, dlogits, n, vocab);
  std::vector<float> dw(w.size(), 0.0f), dx(x.size(), 0.0f);
  matmul_at(dlogits, x, dw, n, vocab, h);
  matmul(dlogits, w, dx, n, vocab, h);

  // S on every shard, then the barrier's reductions done here by hand.
  const std::size_t t = std::size_t(n);
  struct Local {
    std::vector<float> logits, max, sum, target, a, y;
  };
  std::vector<Local> local(shards.size());
  std::vector<float> global_max(t, -INFINITY), global_sum(t, 0.0f), target(t, 0.0f);
  for (std::size_t i = 0; i < shards.size(); ++i) {
    const VocabShard s = shards[i];
    const std::span<const float> wi = rows_of(s);
    Local& l = local[i];
    l.logits.resize(t * std::size_t(s.rows)), l.max.resize(t), l.sum.resize(t), l.target.resize(t);
    l.a.resize(t * h), l.y.resize(t * h);
    output_logits(x, wi, targets, s, n, h, l.logits, l.max, l.sum, l.target);
    output_input_grad_terms(l.logits, l.max, l.sum, wi, targets, s, n, h, l.a, l.y);
    for (std::size_t k = 0; k < t; ++k) global_max[k] = std::max(global_max[k], l.max[k]), target[k] += l.target[k];
  }
  std::vector<std::vector<float>> scaled(shards.size(), std::vector<float>(t));
  for (std::size_t i = 0; i < shards.size(); ++i) {
    rescale_sum_exp(local[i].max, local[i].sum, global_max, scaled[i]);
    for (std::size_t k = 0; k < t; ++k) global_sum[k] += scaled[i][k];
  }
  CHECK(loss_sum(global_max, global_sum, target) / n == Approx(loss).epsilon(1e-6));

  // T per shard (Algorithm 1's dX_i), and Algorithm 2's dX from S's terms; both sum to the reference.
  const float g = 1.0f / n;
  std::vector<float> dx_alg1(x.size(), 0.0f), dx_alg2(x.size(), 0.0f);
  for (std::size_t i = 0; i < shards.size(); ++i) {
    const VocabShard s = shards[i];
    const std::span<const float> wi = rows_of(s);
    std::vector<float> dwi(wi.size(), 0.0f), dxi(x.size()), share(x.size());
    output_backward(local[i].logits, global_max, global_sum, targets, s, g, x, wi, n, h, dwi, dxi);
    input_grad_share(scaled[i], global_sum, local[i].a, local[i].y, g, n, h, share);
    for (std::size_t k = 0; k < dwi.size(); ++k) CHECK(dwi[k] == Approx(dw[std::size_t(s.first) * h + k]).margin(1e-6));
    for (std::size_t k = 0; k < x.size(); ++k) dx_alg1[k] += dxi[k], dx_alg2[k] += share[k];
  }
  for (std::size_t k = 0; k < x.size(); ++k) {
    CHECK(dx_alg1[k] == Approx(dx[k]).margin(1e-6));
    CHECK(dx_alg2[k] == Approx(dx[k]).margin(1e-6));
  }
}
