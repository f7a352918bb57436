// The CPU runtime's kernels: every backward matches central finite differences of its forward, and
// the forwards match values worked out by hand.
#include <catch2/catch.hpp>
#include <cmath>
#include <functional>
#include <numeric>
#include <random>

#include "kernels.h"

using namespace pipesim::cpu;

namespace {

std::vector<float> random_values(std::size_t n, unsigned seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = normal(rng);
  return v;
}

/// Compares `analytic` with central differences of `loss` at `x`; reports the worst relative error
/// against the largest gradient entry (fp32 forwards: differences of step 1e-2 are good to ~1e-3).
double worst_gradient_error(std::vector<float>& x, const std::function<double()>& loss, const std::vector<float>& analytic) {
  const float step = 1e-2f;
  double scale = 1e-6, worst = 0;
  for (float g : analytic) scale = std::max(scale, double(std::abs(g)));
  for (std::size_t i = 0; i < x.size(); ++i) {
    const float saved = x[i];
    x[i] = saved + step;
    const double up = loss();
    x[i] = saved - step;
    const double down = loss();
    x[i] = saved;
    worst = std::max(worst, std::abs((up - down) / (2 * step) - analytic[i]) / scale);
  }
  return worst;
}

double dot(const std::vector<float>& a, const std::vector<float>& b) {
  return std::inner_product(a.begin(), a.end(), b.begin(), 0.0);
}

}  // namespace

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
