#include "moe.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <utility>

#include "kernels.h"
#include "llama_kernels.h"

namespace pipesim::cpu {
namespace {

using runtime::ModelShape;

/// The sizes of one MoE MLP, checked once: n of the tokens (rows of x), `ranks` of an
/// expert-parallel group, each `local` experts, of which it holds a slice of width f (the expert
/// width over `slices`, the expert-tensor-parallel ranks); fs 0 when no shared expert is given.
struct Sizes {
  int n, h, experts, k, f, fs, ranks, local;
  Sizes(const ModelShape& s, std::size_t x_size, bool shared, int ranks = 1, int slices = 1)
      : n(int(x_size / std::size_t(s.hidden))), h(s.hidden), experts(s.experts), k(s.router_topk),
        f(slices > 0 ? s.expert_ffn / slices : 0), fs(shared ? s.shared_expert_ffn : 0), ranks(ranks),
        local(ranks > 0 ? s.experts / ranks : 0) {
    if (experts < 1 || k < 1 || k > experts || f < 1)
      throw std::invalid_argument("a mixture-of-experts layer needs 1 <= router top-k <= experts and an expert width");
    if (ranks < 1 || experts % ranks != 0)
      throw std::invalid_argument("an expert-parallel group must split the experts evenly (parallel.ep)");
    if (s.expert_ffn % slices != 0)
      throw std::invalid_argument("an expert-tensor-parallel group must split the expert width evenly (parallel.etp)");
  }
  std::size_t copies() const { return std::size_t(n) * std::size_t(k); }
  int rows_in(const MoeCache& c, int e) const { return c.first_row[std::size_t(e) + 1] - c.first_row[std::size_t(e)]; }
  /// This rank's expert e's block of a tensor of `width` floats per row its experts ran.
  template <class T>
  std::span<T> expert_rows(std::span<T> all, const MoeCache& c, int e, int width) const {
    const std::size_t first = std::size_t(c.expert_first_row[std::size_t(e)]), count = std::size_t(expert_rows_in(c, e));
    return all.subspan(first * std::size_t(width), count * std::size_t(width));
  }
  int expert_rows_in(const MoeCache& c, int e) const {
    return c.expert_first_row[std::size_t(e) + 1] - c.expert_first_row[std::size_t(e)];
  }
  /// Expert e's block of the stacked weights of one map (in × out each).
  template <class T>
  std::span<T> weights_of(std::span<T> all, int e, int in, int out) const {
    const std::size_t size = std::size_t(in) * std::size_t(out);
    return all.subspan(std::size_t(e) * size, size);
  }
};

template <class T>
std::span<const T> view(const std::vector<T>& v) { return v; }
template <class T>
std::span<T> view(std::vector<T>& v) { return v; }

/// Softmax over each row of `width` logits, in fp32, from the row's largest.
void softmax_rows(std::span<const float> logits, std::span<float> probs, int rows, int width) {
  for (int t = 0; t < rows; ++t) {
    const std::span<const float> l = logits.subspan(std::size_t(t) * width, std::size_t(width));
    const std::span<float> p = probs.subspan(std::size_t(t) * width, std::size_t(width));
    const float top = *std::max_element(l.begin(), l.end());
    float sum = 0;
    for (int e = 0; e < width; ++e) sum += p[std::size_t(e)] = std::exp(l[std::size_t(e)] - top);
    for (float& v : p) v /= sum;
  }
}

/// Each token's k experts, best first (ties to the lower index: a later expert must be strictly
/// larger to win), and their gate weights, the softmax over the chosen logits.
void route(const Sizes& z, std::span<const float> logits, MoeCache& c) {
  c.chosen.assign(z.copies(), 0), c.gates.assign(z.copies(), 0.0f);
  std::vector<bool> taken(std::size_t(z.experts));
  for (int t = 0; t < z.n; ++t) {
    const std::span<const float> l = logits.subspan(std::size_t(t) * z.experts, std::size_t(z.experts));
    std::fill(taken.begin(), taken.end(), false);
    const std::size_t at = std::size_t(t) * std::size_t(z.k);
    for (int j = 0; j < z.k; ++j) {
      int best = -1;
      for (int e = 0; e < z.experts; ++e)
        if (!taken[std::size_t(e)] && (best < 0 || l[std::size_t(e)] > l[std::size_t(best)])) best = e;
      taken[std::size_t(best)] = true;
      c.chosen[at + std::size_t(j)] = best;
    }
    // The first choice holds the largest logit: the softmax's shift.
    const float top = l[std::size_t(c.chosen[at])];
    float sum = 0;
    for (int j = 0; j < z.k; ++j) sum += c.gates[at + std::size_t(j)] = std::exp(l[std::size_t(c.chosen[at + std::size_t(j)])] - top);
    for (int j = 0; j < z.k; ++j) c.gates[at + std::size_t(j)] /= sum;
  }
}

/// The routed copies in expert order (a counting sort, so tokens stay in order within an expert).
void permute(const Sizes& z, MoeCache& c) {
  c.first_row.assign(std::size_t(z.experts) + 1, 0);
  for (const int e : c.chosen) ++c.first_row[std::size_t(e) + 1];
  for (int e = 0; e < z.experts; ++e) c.first_row[std::size_t(e) + 1] += c.first_row[std::size_t(e)];
  std::vector<int> next(c.first_row.begin(), c.first_row.end() - 1);
  c.rows.assign(z.copies(), 0);
  for (std::size_t copy = 0; copy < z.copies(); ++copy) c.rows[std::size_t(next[std::size_t(c.chosen[copy])]++)] = int(copy);
}

/// Where each routed copy t·k + j sits in expert order: the inverse of `rows`.
std::vector<int> positions(const MoeCache& c) {
  std::vector<int> at(c.rows.size());
  for (std::size_t r = 0; r < c.rows.size(); ++r) at[std::size_t(c.rows[r])] = int(r);
  return at;
}

/// Each expert's routed copies of the whole microbatch, and its tokens: under sequence parallelism
/// (`tp`) summed over the ranks, each of which routed its share of them.
void count_microbatch(const Sizes& z, TensorParallel* tp, MoeCache& c) {
  std::vector<float> counts;  // exact: far below 2^24
  for (int e = 0; e < z.experts; ++e) counts.push_back(float(z.rows_in(c, e)));
  counts.push_back(float(z.n));
  if (tp) tp->all_reduce(runtime::host_floats(counts));
  c.microbatch_tokens = int(counts.back());
  c.microbatch_routed.assign(counts.begin(), counts.end() - 1);
}

/// Expert e's share f_e of the microbatch's routed copies.
double routed_share(const Sizes& z, const MoeCache& c, int e) {
  return double(c.microbatch_routed[std::size_t(e)]) / (double(c.microbatch_tokens) * z.k);
}

/// aux = coeff · E · Σ_i f_i·P_i (f_i: expert i's share of the microbatch's routed copies; P_i: its
/// mean probability over the microbatch's tokens), summed in double; of P_i, this rank's tokens'
/// terms only: the ranks of a sequence-parallel group add up to the microbatch's.
double load_balancing_loss(const ModelShape& s, const Sizes& z, const MoeCache& c) {
  double sum = 0;
  for (int e = 0; e < z.experts; ++e) {
    double p = 0;
    for (int t = 0; t < z.n; ++t) p += c.probs[std::size_t(t) * z.experts + e];
    sum += routed_share(z, c, e) * (p / c.microbatch_tokens);
  }
  return double(s.moe_aux_loss_coeff) * z.experts * sum;
}

/// The router logits' gradient: through the gates' softmax over the chosen experts, and through the
/// full softmax from the load-balancing loss (weighted `aux_weight`).
std::vector<float> router_gradient(const ModelShape& s, const Sizes& z, const MoeCache& c, std::span<const float> dgates,
                                   float aux_weight) {
  std::vector<float> dlogits(std::size_t(z.n) * z.experts, 0.0f);
  for (int t = 0; t < z.n; ++t) {
    const std::size_t at = std::size_t(t) * std::size_t(z.k);
    float dot = 0;
    for (int j = 0; j < z.k; ++j) dot += c.gates[at + std::size_t(j)] * dgates[at + std::size_t(j)];
    for (int j = 0; j < z.k; ++j)
      dlogits[std::size_t(t) * z.experts + std::size_t(c.chosen[at + std::size_t(j)])] +=
          c.gates[at + std::size_t(j)] * (dgates[at + std::size_t(j)] - dot);
  }
  const float coeff = aux_weight * s.moe_aux_loss_coeff;
  if (coeff == 0) return dlogits;
  // d aux / d p_ti = coeff · E · f_i / n (n: the microbatch's tokens), the same for every token.
  std::vector<float> dp(std::size_t(z.experts));
  for (int e = 0; e < z.experts; ++e)
    dp[std::size_t(e)] = coeff * float(z.experts) * float(routed_share(z, c, e)) / float(c.microbatch_tokens);
  for (int t = 0; t < z.n; ++t) {
    const std::span<const float> p(c.probs.data() + std::size_t(t) * z.experts, std::size_t(z.experts));
    float dot = 0;
    for (int e = 0; e < z.experts; ++e) dot += p[std::size_t(e)] * dp[std::size_t(e)];
    for (int e = 0; e < z.experts; ++e) dlogits[std::size_t(t) * z.experts + e] += p[std::size_t(e)] * (dp[std::size_t(e)] - dot);
  }
  return dlogits;
}

/// Rows dispatch sends each rank of the group: its experts' blocks of the routed copies (consecutive
/// in expert order, as its experts are).
std::vector<int> dispatch_rows(const Sizes& z, const MoeCache& c) {
  std::vector<int> rows;
  for (int r = 0; r < z.ranks; ++r)
    rows.push_back(c.first_row[std::size_t((r + 1) * z.local)] - c.first_row[std::size_t(r * z.local)]);
  return rows;
}

/// Rows combine sends each rank back: what it dispatched here.
std::vector<int> combine_rows(const Sizes& z, const MoeCache& c) {
  std::vector<int> rows(std::size_t(z.ranks), 0);
  for (int r = 0; r < z.ranks; ++r)
    for (int e = 0; e < z.local; ++e) rows[std::size_t(r)] += c.received[std::size_t(r * z.local + e)];
  return rows;
}

/// Sends block r of `data` (rows[r] rows of `width` floats) to rank r of the group and returns what
/// every rank sent this one, in rank order; without a group, `data` itself.
std::vector<float> exchange(ExpertParallel* ep, std::vector<float> data, const std::vector<int>& rows, int width) {
  if (!ep) return data;
  std::vector<std::size_t> counts, received;
  for (const int r : rows) counts.push_back(std::size_t(r) * std::size_t(width));
  return ep->all_to_all(data, counts, received);
}

/// The rows of this rank's experts in the order an exchange delivers them (by source rank, each
/// source's rows expert by expert) or in expert order (by expert, sources in rank order: one block
/// per expert for its GEMMs); `to_experts` says which way. The identity with one source.
std::vector<float> regroup(const Sizes& z, const MoeCache& c, std::span<const float> in, int width, bool to_experts) {
  const std::size_t blocks = c.received.size(), w = std::size_t(width);
  std::vector<std::size_t> by_source(blocks), by_expert(blocks);
  std::size_t at = 0;
  for (std::size_t b = 0; b < blocks; ++b) by_source[b] = at, at += std::size_t(c.received[b]);
  at = 0;
  for (int e = 0; e < z.local; ++e)
    for (int r = 0; r < z.ranks; ++r) {
      const std::size_t b = std::size_t(r * z.local + e);
      by_expert[b] = at, at += std::size_t(c.received[b]);
    }
  std::vector<float> out(in.size());
  for (std::size_t b = 0; b < blocks; ++b) {
    const std::size_t from = to_experts ? by_source[b] : by_expert[b], to = to_experts ? by_expert[b] : by_source[b];
    std::copy_n(in.begin() + std::ptrdiff_t(from * w), std::size_t(c.received[b]) * w, out.begin() + std::ptrdiff_t(to * w));
  }
  return out;
}

/// How many rows each rank sends each of this rank's experts (the counts go first, so that the rows'
/// exchange knows its sizes), and where each expert's block starts.
void exchange_counts(const Sizes& z, ExpertParallel* ep, MoeCache& c) {
  std::vector<float> counts;  // exact: a block's rows are far below 2^24
  for (int e = 0; e < z.experts; ++e) counts.push_back(float(z.rows_in(c, e)));
  if (ep) {
    std::vector<std::size_t> sizes(std::size_t(z.ranks), std::size_t(z.local)), received;
    counts = ep->all_to_all(counts, sizes, received);
  }
  c.received.assign(counts.size(), 0);
  for (std::size_t b = 0; b < counts.size(); ++b) c.received[b] = int(counts[b]);
  c.expert_first_row.assign(std::size_t(z.local) + 1, 0);
  for (int e = 0; e < z.local; ++e) {
    int rows = 0;
    for (int r = 0; r < z.ranks; ++r) rows += c.received[std::size_t(r * z.local + e)];
    c.expert_first_row[std::size_t(e) + 1] = c.expert_first_row[std::size_t(e)] + rows;
  }
}

/// Each rank of the expert-tensor-parallel group's rows of each of this rank's experts (the group's
/// ranks hold the same experts), and where each expert's block of the rows they all run starts: by
/// expert, the group's ranks in order within one. Without a group, this rank's rows alone.
void gather_counts(const Sizes& z, TensorParallel* etp, MoeCache& c) {
  const int ranks = etp ? etp->size() : 1, me = etp ? etp->rank() : 0;
  std::vector<float> counts(std::size_t(ranks * z.local), 0.0f);  // exact: far below 2^24
  for (int e = 0; e < z.local; ++e) counts[std::size_t(me * z.local + e)] = float(z.expert_rows_in(c, e));
  if (etp) etp->all_reduce(runtime::host_floats(counts));  // one rank's counts, zeros elsewhere: exact
  c.etp_rows.assign(counts.begin(), counts.end());
  for (int e = 0; e < z.local; ++e) {
    int rows = 0;
    for (int r = 0; r < ranks; ++r) rows += c.etp_rows[std::size_t(r * z.local + e)];
    c.expert_first_row[std::size_t(e) + 1] = c.expert_first_row[std::size_t(e)] + rows;
  }
}

/// Copies this rank's rows of each of its experts between `own` (its rows, expert order) and `group`
/// (the group's, gather_counts' order), into `group` or out of it.
void copy_own_rows(const Sizes& z, const MoeCache& c, int me, std::span<float> own, std::span<float> group, int width,
                   bool into_group) {
  const std::size_t w = std::size_t(width);
  std::size_t in_own = 0;
  for (int e = 0; e < z.local; ++e) {
    std::size_t in_group = std::size_t(c.expert_first_row[std::size_t(e)]);
    for (int r = 0; r < me; ++r) in_group += std::size_t(c.etp_rows[std::size_t(r * z.local + e)]);
    const std::size_t rows = std::size_t(c.etp_rows[std::size_t(me * z.local + e)]);
    const std::span<float> a = own.subspan(in_own * w, rows * w), b = group.subspan(in_group * w, rows * w);
    std::copy(into_group ? a.begin() : b.begin(), into_group ? a.end() : b.end(), into_group ? b.begin() : a.begin());
    in_own += rows;
  }
}

/// The expert-tensor-parallel group's all-gather of the rows this rank received (`own`, expert
/// order): every rank of the group then runs its slice of each expert on all of them. The ranks'
/// blocks differ in size, so it is an all-reduce of this rank's rows and zeros elsewhere (exact).
std::vector<float> gather_rows(const Sizes& z, TensorParallel* etp, const MoeCache& c, std::vector<float> own,
                               int width) {
  if (!etp) return own;
  std::vector<float> group(std::size_t(c.expert_first_row.back()) * std::size_t(width), 0.0f);
  copy_own_rows(z, c, etp->rank(), own, group, width, true);
  etp->all_reduce(runtime::host_floats(group));
  return group;
}

/// Its reverse, the reduce-scatter (an all-reduce likewise): the group's partial sums over the expert
/// width (row-parallel fc2's outputs, column-parallel fc1's input gradients) added up, and this
/// rank's rows kept.
std::vector<float> scatter_rows(const Sizes& z, TensorParallel* etp, const MoeCache& c, std::vector<float> group,
                                int width) {
  if (!etp) return group;
  etp->all_reduce(runtime::host_floats(group));
  int rows = 0;
  for (int e = 0; e < z.local; ++e) rows += c.etp_rows[std::size_t(etp->rank() * z.local + e)];
  std::vector<float> own(std::size_t(rows) * std::size_t(width));
  copy_own_rows(z, c, etp->rank(), own, group, width, false);
  return own;
}

/// How many expert-tensor-parallel ranks split the experts, from what the forward kept.
int slices_of(const MoeCache& c) {
  const std::size_t local = c.expert_first_row.size() - 1;
  return local > 0 ? int(c.etp_rows.size() / local) : 1;
}

}  // namespace

std::size_t MoeCache::bytes() const {
  std::size_t floats = probs.size() + gates.size() + permuted.size() + fc1.size() + act.size() + out.size() +
                       shared_fc1.size() + shared_act.size();
  return floats * sizeof(float) +
         (chosen.size() + rows.size() + first_row.size() + received.size() + expert_first_row.size() +
          etp_rows.size() + microbatch_routed.size()) *
             sizeof(int);
}

std::size_t MoeDeferred::bytes() const {
  return (router_dy.size() + expert_fc1_dy.size() + expert_fc2_dy.size() + shared_fc1_dy.size() + shared_fc2_dy.size()) *
         sizeof(float);
}

void moe_forward(const ModelShape& s, const MoeWeights& w, std::span<const float> x, std::span<float> y, MoeCache& c,
                 ExpertParallel* ep, TensorParallel* tp, TensorParallel* etp) {
  const Sizes z(s, x.size(), !w.shared_fc1.empty(), ep ? ep->size() : 1, etp ? etp->size() : 1);
  const std::size_t h = std::size_t(z.h);
  std::vector<float> logits(std::size_t(z.n) * z.experts);
  matmul(x, w.router, logits, z.n, z.h, z.experts);
  c.probs.resize(logits.size());
  softmax_rows(logits, c.probs, z.n, z.experts);
  route(z, logits, c);
  permute(z, c);
  count_microbatch(z, tp, c);
  c.aux_loss = load_balancing_loss(s, z, c);

  std::vector<float> routed(z.copies() * h);  // x's row of each routed copy, in expert order
  for (std::size_t r = 0; r < z.copies(); ++r) {
    const std::size_t token = std::size_t(c.rows[r]) / std::size_t(z.k);
    std::copy_n(x.begin() + std::ptrdiff_t(token * h), h, routed.begin() + std::ptrdiff_t(r * h));
  }
  // Dispatch: each routed copy to its expert's rank.
  exchange_counts(z, ep, c);
  std::vector<float> own = regroup(z, c, exchange(ep, std::move(routed), dispatch_rows(z, c), z.h), z.h, true);
  // Each rank of an expert-tensor-parallel group runs its slice of the experts on every row the group
  // received.
  gather_counts(z, etp, c);
  c.permuted = gather_rows(z, etp, c, std::move(own), z.h);
  const std::size_t mine = std::size_t(c.expert_first_row.back());
  c.fc1.resize(mine * 2 * std::size_t(z.f)), c.act.resize(mine * std::size_t(z.f));
  std::vector<float> out(mine * h);
  for (int e = 0; e < z.local; ++e) {
    const int m = z.expert_rows_in(c, e);
    if (m == 0) continue;  // no tokens: nothing to run
    const std::span<float> fc1 = z.expert_rows(view(c.fc1), c, e, 2 * z.f), act = z.expert_rows(view(c.act), c, e, z.f);
    matmul(z.expert_rows(view(std::as_const(c.permuted)), c, e, z.h), z.weights_of(w.expert_fc1, e, z.h, 2 * z.f), fc1, m,
           z.h, 2 * z.f);
    swiglu_forward(fc1, act, m, z.f);
    matmul(act, z.weights_of(w.expert_fc2, e, z.f, z.h), z.expert_rows(view(out), c, e, z.h), m, z.f, z.h);
  }
  // Combine: the slices' partial outputs summed, then each back to the rank of its token, which holds
  // them in expert order.
  c.out = exchange(ep, regroup(z, c, scatter_rows(z, etp, c, std::move(out), z.h), z.h, false), combine_rows(z, c),
                   z.h);
  // Each token's copies summed in its own order (best first), whatever expert order put them in.
  const std::vector<int> at = positions(c);
  std::fill(y.begin(), y.end(), 0.0f);
  for (std::size_t copy = 0; copy < z.copies(); ++copy) {
    const std::size_t token = copy / std::size_t(z.k), r = std::size_t(at[copy]);
    const float gate = c.gates[copy];
    for (std::size_t i = 0; i < h; ++i) y[token * h + i] += gate * c.out[r * h + i];
  }
  c.shared_fc1.clear(), c.shared_act.clear();
  if (z.fs == 0) return;
  c.shared_fc1.resize(std::size_t(z.n) * 2 * std::size_t(z.fs)), c.shared_act.resize(std::size_t(z.n) * std::size_t(z.fs));
  matmul(x, w.shared_fc1, c.shared_fc1, z.n, z.h, 2 * z.fs);
  swiglu_forward(c.shared_fc1, c.shared_act, z.n, z.fs);
  matmul(c.shared_act, w.shared_fc2, y, z.n, z.fs, z.h, true);
}

void moe_backward(const ModelShape& s, const MoeWeights& w, std::span<const float> x, const MoeCache& c,
                  std::span<const float> dy, std::span<float> dx, const MoeGradients& g, MoeDeferred* deferred,
                  float aux_loss_weight, ExpertParallel* ep, TensorParallel* etp) {
  const Sizes z(s, x.size(), !w.shared_fc1.empty(), ep ? ep->size() : 1, slices_of(c));
  const std::size_t h = std::size_t(z.h);
  // Combine's backward: each copy's output gradient is its gate times its token's, and each gate's
  // gradient the dot product of its token's output gradient with the copy's output.
  const std::vector<int> at = positions(c);
  std::vector<float> dout(z.copies() * h), dgates(z.copies());
  for (std::size_t copy = 0; copy < z.copies(); ++copy) {
    const std::size_t token = copy / std::size_t(z.k), r = std::size_t(at[copy]);
    const float gate = c.gates[copy];
    float dot = 0;
    for (std::size_t i = 0; i < h; ++i) {
      dout[r * h + i] = gate * dy[token * h + i];
      dot += dy[token * h + i] * c.out[r * h + i];
    }
    dgates[copy] = dot;
  }
  // The output gradients to the experts' ranks, as dispatch sent the rows, and gathered as they were.
  std::vector<float> dout_mine = gather_rows(
      z, etp, c, regroup(z, c, exchange(ep, std::move(dout), dispatch_rows(z, c), z.h), z.h, true), z.h);
  const std::size_t mine = std::size_t(c.expert_first_row.back());
  std::vector<float> dact(mine * std::size_t(z.f), 0.0f), dfc1(mine * 2 * std::size_t(z.f), 0.0f),
      dpermuted_mine(mine * h, 0.0f);
  for (int e = 0; e < z.local; ++e) {
    const int m = z.expert_rows_in(c, e);
    if (m == 0) continue;
    const std::span<const float> dout_e = z.expert_rows(view(std::as_const(dout_mine)), c, e, z.h);
    const std::span<float> dact_e = z.expert_rows(view(dact), c, e, z.f), dfc1_e = z.expert_rows(view(dfc1), c, e, 2 * z.f);
    matmul_bt(dout_e, z.weights_of(w.expert_fc2, e, z.f, z.h), dact_e, m, z.h, z.f);
    swiglu_backward(z.expert_rows(view(c.fc1), c, e, 2 * z.f), dact_e, dfc1_e, m, z.f);
    matmul_bt(dfc1_e, z.weights_of(w.expert_fc1, e, z.h, 2 * z.f), z.expert_rows(view(dpermuted_mine), c, e, z.h), m,
              2 * z.f, z.h);
  }
  // The input gradients summed over the slices and back to the tokens' ranks, in expert order there.
  const std::vector<float> dpermuted = exchange(
      ep, regroup(z, c, scatter_rows(z, etp, c, std::move(dpermuted_mine), z.h), z.h, false), combine_rows(z, c), z.h);
  // Un-permute: each token's copies added in its own order.
  for (std::size_t copy = 0; copy < z.copies(); ++copy) {
    const std::size_t token = copy / std::size_t(z.k), r = std::size_t(at[copy]);
    for (std::size_t i = 0; i < h; ++i) dx[token * h + i] += dpermuted[r * h + i];
  }
  const std::vector<float> dlogits = router_gradient(s, z, c, dgates, aux_loss_weight);
  matmul_bt(dlogits, w.router, dx, z.n, z.experts, z.h);
  std::vector<float> dshared_fc1;
  if (z.fs > 0) {
    std::vector<float> dshared_act(std::size_t(z.n) * std::size_t(z.fs), 0.0f);
    dshared_fc1.assign(std::size_t(z.n) * 2 * std::size_t(z.fs), 0.0f);
    matmul_bt(dy, w.shared_fc2, dshared_act, z.n, z.h, z.fs);
    swiglu_backward(c.shared_fc1, dshared_act, dshared_fc1, z.n, z.fs);
    matmul_bt(dshared_fc1, w.shared_fc1, dx, z.n, 2 * z.fs, z.h);
  }
  MoeDeferred now;
  MoeDeferred& d = deferred ? *deferred : now;
  d.router_dy = dlogits, d.expert_fc1_dy = std::move(dfc1), d.expert_fc2_dy = std::move(dout_mine);
  d.shared_fc1_dy = std::move(dshared_fc1);
  if (z.fs > 0)
    d.shared_fc2_dy.assign(dy.begin(), dy.end());
  else
    d.shared_fc2_dy.clear();
  if (!deferred) moe_weight_backward(s, x, c, d, g);
}

void moe_weight_backward(const ModelShape& s, std::span<const float> x, const MoeCache& c, const MoeDeferred& d,
                         const MoeGradients& g) {
  // The forward's exchange left how many ranks sent this one rows: the group's size.
  const int local = int(c.expert_first_row.size()) - 1;
  const Sizes z(s, x.size(), !g.shared_fc1.empty(), local > 0 ? s.experts / local : 1, slices_of(c));
  matmul_at(x, d.router_dy, g.router, z.n, z.h, z.experts);
  for (int e = 0; e < z.local; ++e) {
    const int m = z.expert_rows_in(c, e);
    if (m == 0) continue;
    matmul_at(z.expert_rows(view(c.permuted), c, e, z.h), z.expert_rows(view(d.expert_fc1_dy), c, e, 2 * z.f),
              z.weights_of(g.expert_fc1, e, z.h, 2 * z.f), m, z.h, 2 * z.f);
    matmul_at(z.expert_rows(view(c.act), c, e, z.f), z.expert_rows(view(d.expert_fc2_dy), c, e, z.h),
              z.weights_of(g.expert_fc2, e, z.f, z.h), m, z.f, z.h);
  }
  if (z.fs == 0) return;
  matmul_at(x, d.shared_fc1_dy, g.shared_fc1, z.n, z.h, 2 * z.fs);
  matmul_at(c.shared_act, d.shared_fc2_dy, g.shared_fc2, z.n, z.fs, z.h);
}

}  // namespace pipesim::cpu
