#include "kernels.h"

#include <algorithm>
#include <cmath>
#include <vector>

#ifdef PIPESIM_OPENBLAS
#include <cblas.h>
#include <dlfcn.h>

#include <cstdio>
#endif

namespace pipesim::cpu {
namespace {
constexpr float kLayerNormEpsilon = 1e-5f;
constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kGeluCubic = 0.044715f;
}  // namespace

namespace loops {

void matmul(std::span<const float> a, std::span<const float> b, std::span<float> c, int n, int k, int m,
            bool accumulate) {
  if (!accumulate) std::fill(c.begin(), c.begin() + std::ptrdiff_t(n) * m, 0.0f);
  for (int i = 0; i < n; ++i)
    for (int p = 0; p < k; ++p) {
      const float x = a[std::size_t(i) * k + p];
      // Pointers, not &b[...]: with m = 0 the spans may be empty (no element to refer to).
      const float* row = b.data() + std::size_t(p) * m;
      float* out = c.data() + std::size_t(i) * m;
      for (int j = 0; j < m; ++j) out[j] += x * row[j];  // i-p-j order: contiguous inner loop
    }
}

void matmul_bt(std::span<const float> a, std::span<const float> b, std::span<float> c, int n, int k, int m) {
  // Transposing B once lets the product run as matmul's contiguous, vectorisable inner loop.
  std::vector<float> bt(std::size_t(k) * std::size_t(m));
  for (int j = 0; j < m; ++j)
    for (int p = 0; p < k; ++p) bt[std::size_t(p) * m + j] = b[std::size_t(j) * k + p];
  matmul(a, bt, c, n, k, m, true);
}

void matmul_at(std::span<const float> a, std::span<const float> b, std::span<float> c, int n, int k, int m) {
  for (int i = 0; i < n; ++i)
    for (int p = 0; p < k; ++p) {
      const float x = a[std::size_t(i) * k + p];
      for (int j = 0; j < m; ++j) c[std::size_t(p) * m + j] += x * b[std::size_t(i) * m + j];
    }
}

}  // namespace loops

#ifdef PIPESIM_OPENBLAS
namespace {

/// OpenBLAS, opened when first needed (open_gemm_library, or the first GEMM) rather than linked. Linked, it (with libgfortran) loaded and
/// started with every pipesim command, `pipesim list` included: 3.5 ms more CPU per command, more than
/// the whole of `pipesim list` before (2.6 ms), though only the runtime's GEMMs use it.
struct OpenBlas {
  decltype(&cblas_sgemm) sgemm = nullptr;
  decltype(&openblas_get_config) config = nullptr;
  decltype(&openblas_get_corename) corename = nullptr;
  std::string error;  // why it is not there: the GEMMs then run on the loops
};

template <class Function>
Function symbol(void* library, const char* name) {
  return reinterpret_cast<Function>(dlsym(library, name));
}

const OpenBlas& openblas() {
  static const OpenBlas blas = [] {
    OpenBlas b;
    void* library = dlopen(PIPESIM_OPENBLAS_LIBRARY, RTLD_NOW | RTLD_LOCAL);
    if (!library) {
      b.error = dlerror();
    } else {
      const auto set_num_threads = symbol<decltype(&openblas_set_num_threads)>(library, "openblas_set_num_threads");
      b.sgemm = symbol<decltype(&cblas_sgemm)>(library, "cblas_sgemm");
      b.config = symbol<decltype(&openblas_get_config)>(library, "openblas_get_config");
      b.corename = symbol<decltype(&openblas_get_corename)>(library, "openblas_get_corename");
      if (!set_num_threads || !b.sgemm || !b.config || !b.corename) {
        b = OpenBlas{};
        b.error = std::string(PIPESIM_OPENBLAS_LIBRARY) + " is not OpenBLAS: it lacks cblas_sgemm or openblas_*";
      } else {
        // One thread per GEMM. The runtime already runs one rank per thread (and --check's
        // reference beside them): a multithreaded GEMM per rank would oversubscribe the cores the
        // ranks share (2 on the build machine), adding waits to every measured op time, and would
        // make a result depend on how OpenBLAS splits the work between its threads. On the caller's
        // thread alone a GEMM gives the same bits whatever the number of ranks, threads or cores.
        // (OPENBLAS_NUM_THREADS=1 would do the same, but only if every user set it.)
        set_num_threads(1);
      }
    }
    if (!b.error.empty())
      std::fprintf(stderr, "pipesim: OpenBLAS could not be loaded (%s); the CPU GEMMs run on the built-in loops, about 10x slower\n",
                   b.error.c_str());
    return b;
  }();
  return blas;
}

/// C (rows×cols) = op(A)·op(B), or C += op(A)·op(B) with `accumulate`, row-major, op = transpose when
/// asked; `a_cols` and `b_cols` are the stored widths. Empty products only clear or keep C:
/// cblas_sgemm rejects a leading dimension of 0.
void sgemm(const OpenBlas& blas, bool transpose_a, bool transpose_b, int rows, int cols, int inner, const float* a,
           int a_cols, const float* b, int b_cols, float* c, bool accumulate) {
  if (rows == 0 || cols == 0) return;
  if (inner == 0) {
    if (!accumulate) std::fill(c, c + std::ptrdiff_t(rows) * cols, 0.0f);
    return;
  }
  blas.sgemm(CblasRowMajor, transpose_a ? CblasTrans : CblasNoTrans, transpose_b ? CblasTrans : CblasNoTrans, rows, cols,
             inner, 1.0f, a, a_cols, b, b_cols, accumulate ? 1.0f : 0.0f, c, cols);
}

}  // namespace

void matmul(std::span<const float> a, std::span<const float> b, std::span<float> c, int n, int k, int m,
            bool accumulate) {
  if (const OpenBlas& blas = openblas(); blas.sgemm)
    sgemm(blas, false, false, n, m, k, a.data(), k, b.data(), m, c.data(), accumulate);
  else
    loops::matmul(a, b, c, n, k, m, accumulate);
}

void matmul_bt(std::span<const float> a, std::span<const float> b, std::span<float> c, int n, int k, int m) {
  if (const OpenBlas& blas = openblas(); blas.sgemm)
    sgemm(blas, false, true, n, m, k, a.data(), k, b.data(), k, c.data(), true);  // B stored m×k
  else
    loops::matmul_bt(a, b, c, n, k, m);
}

void matmul_at(std::span<const float> a, std::span<const float> b, std::span<float> c, int n, int k, int m) {
  if (const OpenBlas& blas = openblas(); blas.sgemm)
    sgemm(blas, true, false, k, m, n, a.data(), k, b.data(), m, c.data(), true);  // A n×k: the sum over its n rows
  else
    loops::matmul_at(a, b, c, n, k, m);
}

void open_gemm_library() { openblas(); }

std::string gemm_library() {
  const OpenBlas& blas = openblas();
  if (!blas.sgemm) return "built-in loops (OpenBLAS could not be loaded: " + blas.error + ")";
  return std::string(blas.config()) + ", core " + blas.corename() + " (" + PIPESIM_OPENBLAS_LIBRARY + ")";
}
#else
void matmul(std::span<const float> a, std::span<const float> b, std::span<float> c, int n, int k, int m,
            bool accumulate) {
  loops::matmul(a, b, c, n, k, m, accumulate);
}

void matmul_bt(std::span<const float> a, std::span<const float> b, std::span<float> c, int n, int k, int m) {
  loops::matmul_bt(a, b, c, n, k, m);
}

void matmul_at(std::span<const float> a, std::span<const float> b, std::span<float> c, int n, int k, int m) {
  loops::matmul_at(a, b, c, n, k, m);
}

void open_gemm_library() {}

std::string gemm_library() { return "built-in loops"; }
#endif

void layernorm_forward(std::span<const float> x, std::span<const float> gamma, std::span<const float> beta,
                       std::span<float> y, std::span<float> mean, std::span<float> rstd, int n, int h) {
  for (int i = 0; i < n; ++i) {
    const float* row = &x[std::size_t(i) * h];
    double sum = 0, squares = 0;
    for (int j = 0; j < h; ++j) sum += row[j];
    const double mu = sum / h;
    for (int j = 0; j < h; ++j) squares += (row[j] - mu) * (row[j] - mu);
    const float r = float(1.0 / std::sqrt(squares / h + kLayerNormEpsilon));
    mean[std::size_t(i)] = float(mu), rstd[std::size_t(i)] = r;
    for (int j = 0; j < h; ++j) y[std::size_t(i) * h + j] = (row[j] - float(mu)) * r * gamma[std::size_t(j)] + beta[std::size_t(j)];
  }
}

void layernorm_backward(std::span<const float> x, std::span<const float> gamma, std::span<const float> mean,
                        std::span<const float> rstd, std::span<const float> dy, std::span<float> dx,
                        std::span<float> dgamma, std::span<float> dbeta, int n, int h) {
  for (int i = 0; i < n; ++i) {
    const float mu = mean[std::size_t(i)], r = rstd[std::size_t(i)];
    // With xhat = (x - mu) r and g = dy · gamma: dx = r (g - mean(g) - xhat · mean(g · xhat)).
    double g_mean = 0, gx_mean = 0;
    for (int j = 0; j < h; ++j) {
      const std::size_t at = std::size_t(i) * h + j;
      const float xhat = (x[at] - mu) * r, g = dy[at] * gamma[std::size_t(j)];
      g_mean += g, gx_mean += g * xhat;
      dgamma[std::size_t(j)] += dy[at] * xhat;
      dbeta[std::size_t(j)] += dy[at];
    }
    g_mean /= h, gx_mean /= h;
    for (int j = 0; j < h; ++j) {
      const std::size_t at = std::size_t(i) * h + j;
      const float xhat = (x[at] - mu) * r, g = dy[at] * gamma[std::size_t(j)];
      dx[at] += r * (g - float(g_mean) - xhat * float(gx_mean));
    }
  }
}

void gelu_forward(std::span<const float> x, std::span<float> y) {
  for (std::size_t i = 0; i < x.size(); ++i) {
    const float v = x[i];
    y[i] = 0.5f * v * (1 + std::tanh(kSqrt2OverPi * (v + kGeluCubic * v * v * v)));
  }
}

void gelu_backward(std::span<const float> x, std::span<const float> dy, std::span<float> dx) {
  for (std::size_t i = 0; i < x.size(); ++i) {
    const float v = x[i], inner = kSqrt2OverPi * (v + kGeluCubic * v * v * v), t = std::tanh(inner);
    const float d_inner = kSqrt2OverPi * (1 + 3 * kGeluCubic * v * v);
    dx[i] += dy[i] * (0.5f * (1 + t) + 0.5f * v * (1 - t * t) * d_inner);
  }
}

namespace {

/// Column offsets in a fused QKV row (kernels.h): query head `head` and the key/value head it reads.
struct QkvLayout {
  int d = 0, width = 0;  ///< head width; row width h + 2·kv_heads·d
  int group = 1;         ///< query heads per key/value head
  int kv_columns = 0;    ///< kv_heads·d
  int h = 0;
  std::size_t q(int head) const { return std::size_t(head) * d; }
  std::size_t k(int head) const { return std::size_t(h) + std::size_t(head / group) * d; }
  std::size_t v(int head) const { return std::size_t(h) + std::size_t(kv_columns) + std::size_t(head / group) * d; }
};

QkvLayout qkv_layout(int h, int heads, int kv_heads) {
  const int kv = kv_heads == 0 ? heads : kv_heads, d = h / heads;
  return QkvLayout{d, h + 2 * kv * d, heads / kv, kv * d, h};
}

}  // namespace

void attention_forward(std::span<const float> qkv, std::span<float> out, std::span<float> probs, int batch, int seq,
                       int h, int heads, int kv_heads) {
  const QkvLayout at = qkv_layout(h, heads, kv_heads);
  const int d = at.d;
  const std::size_t width = std::size_t(at.width);
  const float scale = 1.0f / std::sqrt(float(d));
  for (int b = 0; b < batch; ++b)
    for (int hd = 0; hd < heads; ++hd)
      for (int i = 0; i < seq; ++i) {
        const float* q = &qkv[(std::size_t(b) * seq + i) * width + at.q(hd)];
        float* p = &probs[((std::size_t(b) * heads + hd) * seq + i) * seq];
        float max = -INFINITY;
        for (int j = 0; j <= i; ++j) {  // causal: only keys up to the query
          const float* k = &qkv[(std::size_t(b) * seq + j) * width + at.k(hd)];
          float dot = 0;
          for (int e = 0; e < d; ++e) dot += q[e] * k[e];
          p[j] = dot * scale;
          max = std::max(max, p[j]);
        }
        float sum = 0;
        for (int j = 0; j <= i; ++j) sum += (p[j] = std::exp(p[j] - max));
        for (int j = 0; j <= i; ++j) p[j] /= sum;
        for (int j = i + 1; j < seq; ++j) p[j] = 0;
        float* o = &out[(std::size_t(b) * seq + i) * h + std::size_t(hd) * d];
        std::fill(o, o + d, 0.0f);
        for (int j = 0; j <= i; ++j) {
          const float* v = &qkv[(std::size_t(b) * seq + j) * width + at.v(hd)];
          for (int e = 0; e < d; ++e) o[e] += p[j] * v[e];
        }
      }
}

void attention_backward(std::span<const float> qkv, std::span<const float> probs, std::span<const float> dout,
                        std::span<float> dqkv, int batch, int seq, int h, int heads, int kv_heads) {
  const QkvLayout at = qkv_layout(h, heads, kv_heads);
  const int d = at.d;
  const std::size_t width = std::size_t(at.width);
  const float scale = 1.0f / std::sqrt(float(d));
  std::vector<float> dp(static_cast<std::size_t>(seq));
  for (int b = 0; b < batch; ++b)
    for (int hd = 0; hd < heads; ++hd)
      for (int i = 0; i < seq; ++i) {
        const std::size_t qrow = (std::size_t(b) * seq + i) * width + at.q(hd);
        const float* p = &probs[((std::size_t(b) * heads + hd) * seq + i) * seq];
        const float* go = &dout[(std::size_t(b) * seq + i) * h + std::size_t(hd) * d];
        float weighted = 0;  // Σ_j p_j dp_j, for the softmax backward
        for (int j = 0; j <= i; ++j) {
          const std::size_t vrow = (std::size_t(b) * seq + j) * width + at.v(hd);
          float dot = 0;
          for (int e = 0; e < d; ++e) {
            dot += go[e] * qkv[vrow + e];
            dqkv[vrow + e] += p[j] * go[e];  // dV
          }
          dp[std::size_t(j)] = dot;
          weighted += p[j] * dot;
        }
        for (int j = 0; j <= i; ++j) {
          const float ds = p[j] * (dp[std::size_t(j)] - weighted) * scale;  // through softmax and scale
          const std::size_t krow = (std::size_t(b) * seq + j) * width + at.k(hd);
          for (int e = 0; e < d; ++e) {
            dqkv[qrow + e] += ds * qkv[krow + e];  // dQ
            dqkv[krow + e] += ds * qkv[qrow + e];  // dK
          }
        }
      }
}

double cross_entropy(std::span<const float> logits, std::span<const int> targets, std::span<float> dlogits, int n,
                     int vocab) {
  double loss = 0;
  for (int i = 0; i < n; ++i) {
    const float* row = &logits[std::size_t(i) * vocab];
    const float max = *std::max_element(row, row + vocab);
    double sum = 0;
    for (int j = 0; j < vocab; ++j) sum += std::exp(double(row[j] - max));
    const int target = targets[std::size_t(i)];
    loss += max + std::log(sum) - row[target];
    for (int j = 0; j < vocab; ++j)
      dlogits[std::size_t(i) * vocab + j] = float((std::exp(double(row[j] - max)) / sum - (j == target)) / n);
  }
  return loss / n;
}

void embedding_forward(std::span<const float> table, std::span<const int> tokens, std::span<float> out, int h,
                       int first_row, int rows) {
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    const int row = tokens[i] - first_row;
    float* o = &out[i * std::size_t(h)];
    if (row < 0 || row >= rows) std::fill(o, o + h, 0.0f);
    else std::copy_n(&table[std::size_t(row) * h], h, o);
  }
}

void embedding_backward(std::span<const int> tokens, std::span<const float> dout, std::span<float> dtable, int h,
                        int first_row, int rows) {
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    const int row = tokens[i] - first_row;
    if (row < 0 || row >= rows) continue;
    for (int j = 0; j < h; ++j) dtable[std::size_t(row) * h + j] += dout[i * std::size_t(h) + j];
  }
}

}  // namespace pipesim::cpu
