// cpu-gemm-bench: GFLOP/s of the CPU runtime's three GEMMs (kernels.h), the built-in loops against
// what matmul, matmul_bt and matmul_at run on (OpenBLAS, one thread per call), at 512³, 1024³, a
// transformer layer's MLP GEMMs (h 1024, FFN 4096, 1024 tokens: configs/examples/gpt-small-gpu.json's
// widths) and configs/tiny.json's. The two run alternately, `--rounds` times each, so that a slow
// spell of the machine falls on both; each prints its median and the ratio of the medians.
//
// usage: cpu-gemm-bench [--rounds R] [--quick]   (--quick: small sizes, one round, a smoke run)
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <span>
#include <vector>

#include "kernels.h"

namespace {

using namespace pipesim::cpu;

enum class Product { AB, ABt, AtB };

struct Case {
  const char* name;
  Product product;
  int n, k, m;  // as kernels.h names them for the product
};

/// Stored sizes: A, B and C of each product as kernels.h stores them.
std::size_t a_size(const Case& c) { return std::size_t(c.n) * std::size_t(c.k); }
std::size_t b_size(const Case& c) {
  return c.product == Product::AtB ? std::size_t(c.n) * std::size_t(c.m) : std::size_t(c.k) * std::size_t(c.m);
}
std::size_t c_size(const Case& c) {
  return c.product == Product::AtB ? std::size_t(c.k) * std::size_t(c.m) : std::size_t(c.n) * std::size_t(c.m);
}

void run(const Case& c, bool blas, std::span<const float> a, std::span<const float> b, std::span<float> out) {
  switch (c.product) {
    case Product::AB: blas ? matmul(a, b, out, c.n, c.k, c.m) : loops::matmul(a, b, out, c.n, c.k, c.m); return;
    case Product::ABt: blas ? matmul_bt(a, b, out, c.n, c.k, c.m) : loops::matmul_bt(a, b, out, c.n, c.k, c.m); return;
    case Product::AtB: blas ? matmul_at(a, b, out, c.n, c.k, c.m) : loops::matmul_at(a, b, out, c.n, c.k, c.m); return;
  }
}

/// GFLOP/s of one implementation: calls repeated until they take `min_seconds` (at least one).
double gflops(const Case& c, bool blas, std::span<const float> a, std::span<const float> b, std::span<float> out,
              double min_seconds) {
  using Clock = std::chrono::steady_clock;
  run(c, blas, a, b, out);  // warm: caches, OpenBLAS's buffers
  long calls = 0;
  const auto start = Clock::now();
  double seconds = 0;
  do {
    run(c, blas, a, b, out);
    ++calls;
    seconds = std::chrono::duration<double>(Clock::now() - start).count();
  } while (seconds < min_seconds);
  return 2.0 * c.n * c.k * c.m * double(calls) / seconds / 1e9;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

/// max |loops − library| over max |loops|, from one call of each on zeroed outputs.
double relative_difference(const Case& c, std::span<const float> a, std::span<const float> b) {
  std::vector<float> want(c_size(c), 0.0f), got(c_size(c), 0.0f);
  run(c, false, a, b, want);
  run(c, true, a, b, got);
  double diff = 0, scale = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    diff = std::max(diff, double(std::abs(want[i] - got[i])));
    scale = std::max(scale, double(std::abs(want[i])));
  }
  return scale > 0 ? diff / scale : diff;
}

}  // namespace

int main(int argc, char** argv) {
  int rounds = 3;
  bool quick = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--quick") == 0) {
      quick = true;
    } else if (std::strcmp(argv[i], "--rounds") == 0 && i + 1 < argc) {
      rounds = std::atoi(argv[++i]);
      if (rounds < 1 || rounds > 100) {
        std::fprintf(stderr, "cpu-gemm-bench: --rounds must be 1 to 100\n");
        return 2;
      }
    } else {
      std::fprintf(stderr, "usage: cpu-gemm-bench [--rounds R] [--quick]\n");
      return 2;
    }
  }
  if (quick) rounds = 1;
  const double min_seconds = quick ? 0.01 : 0.3;

  // A layer's MLP up-projection, x (tokens × h) · W (h × FFN): forward y = x·W (matmul), input
  // gradient dx = dy·Wᵀ (matmul_bt), weight gradient dW = xᵀ·dy (matmul_at); "layer" at 1024 tokens,
  // h 1024, FFN 4096, "tiny" at configs/tiny.json's 32 tokens, h 32, FFN 128.
  const std::vector<Case> full = {
      {"512^3", Product::AB, 512, 512, 512},
      {"1024^3", Product::AB, 1024, 1024, 1024},
      {"layer fwd: 1024x1024 * 1024x4096", Product::AB, 1024, 1024, 4096},
      {"layer dx: 1024x4096 * (1024x4096)^T", Product::ABt, 1024, 4096, 1024},
      {"layer dW: (1024x1024)^T * 1024x4096", Product::AtB, 1024, 1024, 4096},
      {"tiny fwd: 32x32 * 32x128", Product::AB, 32, 32, 128},
      {"tiny dW: (32x32)^T * 32x128", Product::AtB, 32, 32, 128},
  };
  const std::vector<Case> small = {
      {"64^3", Product::AB, 64, 64, 64},
      {"64x96 * (80x96)^T", Product::ABt, 64, 96, 80},
      {"(64x96)^T * 64x80", Product::AtB, 64, 96, 80},
  };
  const std::vector<Case>& cases = quick ? small : full;

  std::printf("GEMM library: %s\n", gemm_library().c_str());
  std::printf("fp32, one thread; median of %d round%s, the two alternating\n\n", rounds, rounds == 1 ? "" : "s");
  std::printf("%-38s %12s %12s %8s %10s\n", "GEMM", "loops GF/s", "library GF/s", "ratio", "max diff");
  for (const Case& c : cases) {
    std::vector<float> a(a_size(c)), b(b_size(c)), out(c_size(c), 0.0f);
    unsigned state = 12345;
    const auto next = [&state] {  // a small LCG: values in [-1, 1)
      state = state * 1664525u + 1013904223u;
      return float(state >> 8) / float(1u << 23) - 1.0f;
    };
    for (float& x : a) x = next();
    for (float& x : b) x = next();
    std::vector<double> by_loops, by_library;
    for (int r = 0; r < rounds; ++r) {
      by_loops.push_back(gflops(c, false, a, b, out, min_seconds));
      by_library.push_back(gflops(c, true, a, b, out, min_seconds));
    }
    const double loops_median = median(by_loops), library_median = median(by_library);
    std::printf("%-38s %12.2f %12.2f %7.1fx %10.1e\n", c.name, loops_median, library_median,
                library_median / loops_median, relative_difference(c, a, b));
  }
  return 0;
}
