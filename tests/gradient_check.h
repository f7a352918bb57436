#pragma once
/// Helpers of the CPU kernel tests: random inputs and central finite differences.
#include <algorithm>
#include <cmath>
#include <functional>
#include <numeric>
#include <random>
#include <vector>

namespace pipesim::test {

inline std::vector<float> random_values(std::size_t n, unsigned seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = normal(rng);
  return v;
}

/// Compares `analytic` with central differences of `loss` at `x`; reports the worst relative error
/// against the largest gradient entry (fp32 forwards: differences of step 1e-2 are good to ~1e-3).
inline double worst_gradient_error(std::vector<float>& x, const std::function<double()>& loss,
                                   const std::vector<float>& analytic, float step = 1e-2f) {
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

inline double dot(const std::vector<float>& a, const std::vector<float>& b) {
  return std::inner_product(a.begin(), a.end(), b.begin(), 0.0);
}

}  // namespace pipesim::test
