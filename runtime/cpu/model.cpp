#include "model.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <type_traits>
#include <utility>

#include "hash.h"
#include "kernels.h"
#include "llama_kernels.h"

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

struct NamedTensor {
  const char* name;
  std::vector<float> Layer::*member;
};
/// A layer's tensors and their names, in Layer::tensors() order: the one list both come from.
constexpr NamedTensor kNamedTensors[] = {
    {"ln1.gain", &Layer::ln1_gain},     {"ln1.bias", &Layer::ln1_bias},
    {"qkv.weight", &Layer::qkv_weight}, {"qkv.bias", &Layer::qkv_bias},
    {"proj.weight", &Layer::proj_weight}, {"proj.bias", &Layer::proj_bias},
    {"ln2.gain", &Layer::ln2_gain},     {"ln2.bias", &Layer::ln2_bias},
    {"fc1.weight", &Layer::fc1_weight}, {"fc1.bias", &Layer::fc1_bias},
    {"fc2.weight", &Layer::fc2_weight}, {"fc2.bias", &Layer::fc2_bias},
    {"router.weight", &Layer::router_weight}, {"experts.fc1.weight", &Layer::expert_fc1_weight},
    {"experts.fc2.weight", &Layer::expert_fc2_weight}, {"shared_expert.fc1.weight", &Layer::shared_fc1_weight},
    {"shared_expert.fc2.weight", &Layer::shared_fc2_weight}};

/// Both tensors() overloads.
template <class L>
auto tensors_of(L& layer) {
  using Tensor = std::conditional_t<std::is_const_v<L>, const std::vector<float>, std::vector<float>>;
  std::vector<Tensor*> tensors;
  for (const NamedTensor& t : kNamedTensors) tensors.push_back(&(layer.*t.member));
  return tensors;
}

}  // namespace

std::vector<std::vector<float>*> Layer::tensors() { return tensors_of(*this); }
std::vector<const std::vector<float>*> Layer::tensors() const { return tensors_of(*this); }

std::vector<std::string> layer_tensor_names() {
  std::vector<std::string> names;
  for (const NamedTensor& t : kNamedTensors) names.emplace_back(t.name);
  return names;
}

Layer make_layer(const ModelShape& s, std::uint64_t seed, int index) {
  const std::size_t h = std::size_t(s.hidden), f = std::size_t(s.ffn), qkv = std::size_t(s.qkv_width()),
                    fc1 = std::size_t(s.fc1_width());
  const std::uint64_t base = 3 + kLayerTensors * std::uint64_t(index);
  const float scale = 0.02f, residual_scale = 0.02f / std::sqrt(2.0f * float(s.layers));  // GPT-2 style
  // Zero biases for GPT; Llama has none, and its bias tensors stay empty.
  const auto bias = [&s](std::size_t n) { return s.family == LayerFamily::Gpt ? constant(n, 0) : std::vector<float>{}; };
  const bool moe = s.moe_layer(index);
  if (moe && s.family != LayerFamily::Llama)
    throw std::invalid_argument("mixture-of-experts layers run in the Llama family only (SwiGLU experts)");
  open_gemm_library();  // the layer's GEMMs follow: open their library now, outside any op's measured time
  Layer w;
  w.ln1_gain = constant(h, 1), w.ln1_bias = bias(h);
  w.qkv_weight = normal_tensor(h * qkv, seed, base + 0, scale), w.qkv_bias = bias(qkv);
  w.proj_weight = normal_tensor(h * h, seed, base + 1, residual_scale), w.proj_bias = bias(h);
  w.ln2_gain = constant(h, 1), w.ln2_bias = bias(h);
  if (!moe) {
    w.fc1_weight = normal_tensor(h * fc1, seed, base + 2, scale), w.fc1_bias = bias(fc1);
    w.fc2_weight = normal_tensor(f * h, seed, base + 3, residual_scale), w.fc2_bias = bias(h);
    return w;
  }
  // The router and every expert drawn as the dense maps are (Megatron-Core initialises them alike),
  // the maps into the residual stream scaled down as fc2 is.
  const std::size_t e = std::size_t(s.experts), fe = std::size_t(s.expert_ffn), fs = std::size_t(s.shared_expert_ffn);
  w.router_weight = normal_tensor(h * e, seed, base + 4, scale);
  w.expert_fc1_weight = normal_tensor(e * h * 2 * fe, seed, base + 5, scale);
  w.expert_fc2_weight = normal_tensor(e * fe * h, seed, base + 6, residual_scale);
  w.shared_fc1_weight = normal_tensor(h * 2 * fs, seed, base + 7, scale);
  w.shared_fc2_weight = normal_tensor(fs * h, seed, base + 8, residual_scale);
  return w;
}

Layer zero_layer(const ModelShape& s, int index) {
  Layer w = make_layer(s, 0, index);
  for (std::vector<float>* t : w.tensors()) std::fill(t->begin(), t->end(), 0.0f);
  return w;
}

namespace {

/// y = x·W + bias (bias broadcast over rows); y = x·W when the bias is empty (Llama).
void linear(std::span<const float> x, const std::vector<float>& weight, const std::vector<float>& bias, std::span<float> y,
            int n, int in, int out) {
  if (bias.empty()) return matmul(x, weight, y, n, in, out);
  for (int i = 0; i < n; ++i) std::copy(bias.begin(), bias.end(), y.begin() + std::ptrdiff_t(i) * out);
  matmul(x, weight, y, n, in, out, true);
}

/// Weight gradients of y = x·W + b: dW += xᵀ·dy, db += Σ dy (none when there is no bias).
void linear_weight_backward(std::span<const float> x, std::span<const float> dy, std::vector<float>& dweight,
                            std::vector<float>& dbias, int n, int in, int out) {
  matmul_at(x, dy, dweight, n, in, out);
  if (dbias.empty()) return;
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

/// Per-row means a norm of `rows` rows keeps: LayerNorm's; RMSNorm keeps none.
std::size_t mean_count(const ModelShape& s, int rows) { return s.family == LayerFamily::Gpt ? std::size_t(rows) : 0; }

int ranks_of(const TensorParallel* tp) { return tp ? tp->size() : 1; }

/// A mixture-of-experts layer's router and routed experts, as moe.h takes them; its shared expert
/// runs as a dense MLP does (MlpMaps).
MoeWeights routed_weights(const Layer& w) { return {w.router_weight, w.expert_fc1_weight, w.expert_fc2_weight, {}, {}}; }
MoeGradients routed_gradients(Layer& g) { return {g.router_weight, g.expert_fc1_weight, g.expert_fc2_weight, {}, {}}; }

/// The maps of an MLP that splits over the tensor-parallel ranks as Megatron splits the dense one
/// (its first by columns, its second by rows): the dense MLP's, or a mixture-of-experts layer's shared
/// expert's. A MoE layer is Llama's, whose biases are empty: the shared expert reads the dense ones.
struct MlpMaps {
  std::vector<float> Layer::*fc1_weight;
  std::vector<float> Layer::*fc1_bias;
  std::vector<float> Layer::*fc2_weight;
  std::vector<float> Layer::*fc2_bias;
  int ffn;  ///< its whole width
};
MlpMaps mlp_of(const ModelShape& s, const Layer& w) {
  if (!w.moe()) return {&Layer::fc1_weight, &Layer::fc1_bias, &Layer::fc2_weight, &Layer::fc2_bias, s.ffn};
  return {&Layer::shared_fc1_weight, &Layer::fc1_bias, &Layer::shared_fc2_weight, &Layer::fc2_bias, s.shared_expert_ffn};
}
/// Whether a layer runs such an MLP: a dense one always, a MoE one with a shared expert.
bool has_mlp(const ModelShape& s, const Layer& w) { return !w.moe() || s.shared_expert_ffn > 0; }

/// This rank's rows of a layer's second norm output, which the routed experts read: the cache keeps
/// them gathered when the shared expert needs the whole.
std::span<const float> own_rows(std::span<const float> ln2, std::size_t mine, int rank) {
  return ln2.size() == mine ? ln2 : ln2.subspan(std::size_t(rank) * mine, mine);
}

/// Under tensor parallelism the routed experts take each rank's own tokens, its sequence-parallel
/// share: without that split every rank would route all of them.
void require_sequence_parallel_moe(const TensorParallel* tp) {
  if (tp && !tp->sequence_parallel())
    throw std::invalid_argument("a mixture-of-experts layer runs under tensor parallelism with sequence parallelism");
}

/// Llama's rotary embedding of the q and k heads of a fused QKV (n × part.qkv), in place; GPT has
/// none. `backward` rotates a gradient back.
void rotate_qk(const ModelShape& s, const LayerPart& part, std::span<float> qkv, bool backward) {
  if (s.family != LayerFamily::Llama) return;
  const auto rope = backward ? rope_backward : rope_forward;
  rope(qkv, s.tokens(), s.seq, part.qkv, part.heads + part.kv_heads, s.head_width(), s.rope_theta);
}

/// The MLP's activation: gelu(fc1) (n × ffn) for GPT, silu(gate)·up of fc1 = [gate | up] for Llama
/// (ffn: this rank's width).
void activation_forward(const ModelShape& s, int ffn, std::span<const float> fc1, std::span<float> out) {
  switch (s.family) {
    case LayerFamily::Gpt: return gelu_forward(fc1, out);
    case LayerFamily::Llama: return swiglu_forward(fc1, out, s.tokens(), ffn);
  }
}

void activation_backward(const ModelShape& s, int ffn, std::span<const float> fc1, std::span<const float> dout,
                         std::span<float> dfc1) {
  switch (s.family) {
    case LayerFamily::Gpt: return gelu_backward(fc1, dout, dfc1);
    case LayerFamily::Llama: return swiglu_backward(fc1, dout, dfc1, s.tokens(), ffn);
  }
}

/// fc1's output width of an MLP of this rank's width `ffn`: the fused [gate | up] for Llama.
int fc1_width(const ModelShape& s, int ffn) { return s.family == LayerFamily::Llama ? 2 * ffn : ffn; }

/// The output columns of the fused QKV that rank `rank` of `ranks` computes: its query heads, then
/// its key and value heads.
std::vector<std::size_t> qkv_columns(const ModelShape& s, int rank, int ranks) {
  const std::size_t h = std::size_t(s.hidden), kv = std::size_t(s.key_value_heads() * s.head_width());
  std::vector<std::size_t> columns;
  for (const auto& [first, width] : {std::pair{std::size_t(0), h}, {h, kv}, {h + kv, kv}}) {
    const std::size_t part = width / std::size_t(ranks);
    for (std::size_t c = 0; c < part; ++c) columns.push_back(first + std::size_t(rank) * part + c);
  }
  return columns;
}

/// An MLP's first map's output columns of rank `rank`: its slice of the width f (for Llama, of the
/// gate and of the up projection).
std::vector<std::size_t> fc1_columns(const ModelShape& s, int ffn, int rank, int ranks) {
  const std::size_t f = std::size_t(ffn), part = f / std::size_t(ranks);
  std::vector<std::size_t> columns;
  for (std::size_t block = 0; block < (s.family == LayerFamily::Llama ? 2u : 1u); ++block)
    for (std::size_t c = 0; c < part; ++c) columns.push_back(block * f + std::size_t(rank) * part + c);
  return columns;
}

/// Elements (row-major, rows × width) of the given columns of every row.
std::vector<std::size_t> column_elements(std::size_t rows, std::size_t width, const std::vector<std::size_t>& columns) {
  std::vector<std::size_t> elements;
  for (std::size_t r = 0; r < rows; ++r)
    for (const std::size_t c : columns) elements.push_back(r * width + c);
  return elements;
}

/// Elements of rows [first, first + count) of a rows × width tensor.
std::vector<std::size_t> row_elements(std::size_t first, std::size_t count, std::size_t width) {
  std::vector<std::size_t> elements(count * width);
  for (std::size_t i = 0; i < elements.size(); ++i) elements[i] = first * width + i;
  return elements;
}

}  // namespace

void norm_forward(const ModelShape& s, std::span<const float> gain, std::span<const float> bias,
                  std::span<const float> x, std::span<float> y, std::span<float> mean, std::span<float> rstd, int n) {
  switch (s.family) {
    case LayerFamily::Gpt: return layernorm_forward(x, gain, bias, y, mean, rstd, n, s.hidden);
    case LayerFamily::Llama: return rmsnorm_forward(x, gain, y, rstd, n, s.hidden);
  }
}

void norm_backward(const ModelShape& s, std::span<const float> gain, std::span<const float> x,
                   std::span<const float> mean, std::span<const float> rstd, std::span<const float> dy,
                   std::span<float> dx, std::span<float> dgain, std::span<float> dbias, int n) {
  switch (s.family) {
    case LayerFamily::Gpt: return layernorm_backward(x, gain, mean, rstd, dy, dx, dgain, dbias, n, s.hidden);
    case LayerFamily::Llama: return rmsnorm_backward(x, gain, rstd, dy, dx, dgain, n, s.hidden);
  }
}

int layer_rows(const ModelShape& s, const TensorParallel* tp) {
  return tp && tp->sequence_parallel() ? s.tokens() / tp->size() : s.tokens();
}

namespace {

/// The whole rows a column-split map reads: this rank's rows gathered from every rank under sequence
/// parallelism, else `rows` itself (moved, not copied).
std::vector<float> whole_rows(TensorParallel* tp, std::vector<float> rows, std::size_t whole) {
  if (!tp || !tp->sequence_parallel()) return rows;
  std::vector<float> all(whole);
  tp->all_gather(runtime::host_floats(rows), runtime::host_floats(all));
  return all;
}

/// The same of rows the caller keeps: a view of them, or of `gathered`, which it fills.
std::span<const float> whole_rows(TensorParallel* tp, std::span<const float> rows, std::vector<float>& gathered,
                                  std::size_t whole) {
  if (!tp || !tp->sequence_parallel()) return rows;
  gathered.resize(whole);
  tp->all_gather(runtime::host_floats(rows), runtime::host_floats(gathered));
  return gathered;
}

/// Where a row-split map writes its output: into `out` when it is whole on one rank, else into
/// `partial` (n × h), for finish_row_split to sum over the ranks.
std::span<float> row_split_output(const TensorParallel* tp, std::vector<float>& partial, std::span<float> out) {
  return tp ? std::span<float>(partial) : out;
}

/// A row-split map's output: the ranks' partial sums added up (this rank's rows of them under
/// sequence parallelism), then its bias, then the residual.
void finish_row_split(TensorParallel* tp, std::vector<float>& partial, const std::vector<float>& bias,
                      std::span<const float> residual, std::span<float> out) {
  if (tp && tp->sequence_parallel())
    tp->reduce_scatter(runtime::host_floats(partial), runtime::host_floats(out));
  else if (tp)
    tp->all_reduce(runtime::host_floats(partial)), std::copy(partial.begin(), partial.end(), out.begin());
  for (std::size_t i = 0; i < out.size(); ++i) out[i] += residual[i] + (bias.empty() ? 0.0f : bias[i % bias.size()]);
}

/// The gradient of a column-split map's input: the ranks' partial sums added up (this rank's rows
/// under sequence parallelism).
std::vector<float> sum_input_gradient(TensorParallel* tp, std::vector<float>& partial, std::size_t rows_size) {
  if (!tp) return std::move(partial);
  if (!tp->sequence_parallel()) {
    tp->all_reduce(runtime::host_floats(partial));
    return std::move(partial);
  }
  std::vector<float> mine(rows_size);
  tp->reduce_scatter(runtime::host_floats(partial), runtime::host_floats(mine));
  return mine;
}

/// y (this rank's rows) = the MLP `m` of the whole rows c.ln2 plus `residual`: this rank's columns of
/// its first map, its rows of the second, whose partial outputs are summed over the ranks.
void mlp_forward(const ModelShape& s, const Layer& w, const MlpMaps& m, LayerCache& c, std::span<const float> residual,
                 std::span<float> y, TensorParallel* tp) {
  const int n = s.tokens(), h = s.hidden, ffn = m.ffn / ranks_of(tp), fc1 = fc1_width(s, ffn);
  c.fc1.resize(std::size_t(n) * fc1), c.gelu.resize(std::size_t(n) * ffn);
  linear(c.ln2, w.*m.fc1_weight, w.*m.fc1_bias, c.fc1, n, h, fc1);
  activation_forward(s, ffn, c.fc1, c.gelu);
  std::vector<float> partial(tp ? std::size_t(n) * h : 0);
  linear(c.gelu, w.*m.fc2_weight, {}, row_split_output(tp, partial, y), n, ffn, h);
  finish_row_split(tp, partial, w.*m.fc2_bias, residual, y);
}

/// dx_partial (whole rows: this rank's columns' part of the sum) += the gradient of the MLP `m`'s
/// input given dy_whole; its weight gradients into `g`, or kept in `deferred`.
void mlp_backward(const ModelShape& s, const Layer& w, const MlpMaps& m, const LayerCache& c,
                  std::span<const float> dy_whole, std::span<float> dx_partial, Layer& g, DeferredWeightGrad* deferred,
                  int ranks) {
  const int n = s.tokens(), h = s.hidden, ffn = m.ffn / ranks, fc1 = fc1_width(s, ffn);
  std::vector<float> dgelu(std::size_t(n) * ffn, 0.0f), dfc1(std::size_t(n) * fc1, 0.0f);
  linear_backward(c.gelu, w.*m.fc2_weight, dy_whole, dgelu, g.*m.fc2_weight, g.*m.fc2_bias, n, ffn, h,
                  deferred ? &deferred->fc2_dy : nullptr);
  activation_backward(s, ffn, c.fc1, dgelu, dfc1);
  linear_backward(c.ln2, w.*m.fc1_weight, dfc1, dx_partial, g.*m.fc1_weight, g.*m.fc1_bias, n, h, fc1,
                  deferred ? &deferred->fc1_dy : nullptr);
}

}  // namespace

void layer_forward(const ModelShape& s, const Layer& w, std::span<const float> x, std::span<float> y, LayerCache& c,
                   TensorParallel* tp, ExpertParallel* ep, TensorParallel* etp) {
  const int n = s.tokens(), h = s.hidden, rows = layer_rows(s, tp);
  const std::size_t whole = std::size_t(n) * h, mine = std::size_t(rows) * h;
  const LayerPart part(s, ranks_of(tp));
  c.input.assign(x.begin(), x.end());
  std::vector<float> ln1(mine);
  c.mean1.resize(mean_count(s, rows)), c.rstd1.resize(std::size_t(rows));
  norm_forward(s, w.ln1_gain, w.ln1_bias, x, ln1, c.mean1, c.rstd1, rows);
  c.ln1 = whole_rows(tp, std::move(ln1), whole);
  c.qkv.resize(std::size_t(n) * part.qkv);
  linear(c.ln1, w.qkv_weight, w.qkv_bias, c.qkv, n, h, part.qkv);
  rotate_qk(s, part, c.qkv, false);
  c.probs.resize(std::size_t(s.batch) * part.heads * s.seq * s.seq), c.attention.resize(std::size_t(n) * part.attention);
  attention_forward(c.qkv, c.attention, c.probs, s.batch, s.seq, part.attention, part.heads, part.kv_heads);
  std::vector<float> partial(tp ? whole : 0);
  c.middle.resize(mine);
  linear(c.attention, w.proj_weight, {}, row_split_output(tp, partial, c.middle), n, part.attention, h);
  finish_row_split(tp, partial, w.proj_bias, x, c.middle);
  std::vector<float> ln2(mine);
  c.mean2.resize(c.mean1.size()), c.rstd2.resize(std::size_t(rows));
  norm_forward(s, w.ln2_gain, w.ln2_bias, c.middle, ln2, c.mean2, c.rstd2, rows);
  c.ln2 = has_mlp(s, w) ? whole_rows(tp, std::move(ln2), whole) : std::move(ln2);
  if (!w.moe()) return mlp_forward(s, w, mlp_of(s, w), c, c.middle, y, tp);
  // The routed experts on this rank's own rows, the second residual added; then the shared expert,
  // whose output adds to that as the dense MLP's does to the residual.
  require_sequence_parallel_moe(tp);
  std::vector<float> routed(mine);
  moe_forward(s, routed_weights(w), own_rows(c.ln2, mine, tp ? tp->rank() : 0), routed, c.moe, ep, tp, etp);
  for (std::size_t i = 0; i < mine; ++i) routed[i] += c.middle[i];
  c.fc1.clear(), c.gelu.clear();
  if (has_mlp(s, w)) return mlp_forward(s, w, mlp_of(s, w), c, routed, y, tp);
  std::copy(routed.begin(), routed.end(), y.begin());
}

void layer_backward(const ModelShape& s, const Layer& w, const LayerCache& c, std::span<const float> dy,
                    std::span<float> dx, Layer& g, DeferredWeightGrad* deferred, TensorParallel* tp,
                    float aux_loss_weight, ExpertParallel* ep, TensorParallel* etp) {
  const int n = s.tokens(), h = s.hidden, rows = layer_rows(s, tp);
  const std::size_t whole = std::size_t(n) * h, mine = std::size_t(rows) * h;
  const LayerPart part(s, ranks_of(tp));
  const auto keep = [deferred](std::vector<float> DeferredWeightGrad::*field) {
    return deferred ? &(deferred->*field) : nullptr;
  };
  std::vector<float> dln2_partial(has_mlp(s, w) ? whole : mine, 0.0f);
  if (has_mlp(s, w)) {
    // A row-split map reads the whole output gradient: its rows are the same on every rank (and its
    // bias gradient, from all of them, is whole).
    std::vector<float> gathered;
    mlp_backward(s, w, mlp_of(s, w), c, whole_rows(tp, dy, gathered, whole), dln2_partial, g, deferred, ranks_of(tp));
  }
  // Each rank's FFN slice contributes to the norm's output gradient.
  std::vector<float> dln2 = has_mlp(s, w) ? sum_input_gradient(tp, dln2_partial, mine) : std::move(dln2_partial);
  if (w.moe()) {  // the routed experts of this rank's own rows
    require_sequence_parallel_moe(tp);
    moe_backward(s, routed_weights(w), own_rows(c.ln2, mine, tp ? tp->rank() : 0), c.moe, dy, dln2, routed_gradients(g),
                 deferred ? &deferred->moe : nullptr, aux_loss_weight, ep, etp);
  }
  std::vector<float> dmiddle(dy.begin(), dy.end());  // through the second residual
  norm_backward(s, w.ln2_gain, c.middle, c.mean2, c.rstd2, dln2, dmiddle, g.ln2_gain, g.ln2_bias, rows);
  std::vector<float> dmiddle_gathered;
  const std::span<const float> dmiddle_whole = whole_rows(tp, dmiddle, dmiddle_gathered, whole);
  std::vector<float> dattention(std::size_t(n) * part.attention, 0.0f), dqkv(std::size_t(n) * part.qkv, 0.0f);
  linear_backward(c.attention, w.proj_weight, dmiddle_whole, dattention, g.proj_weight, g.proj_bias, n, part.attention,
                  h, keep(&DeferredWeightGrad::proj_dy));
  attention_backward(c.qkv, c.probs, dattention, dqkv, s.batch, s.seq, part.attention, part.heads, part.kv_heads);
  rotate_qk(s, part, dqkv, true);  // dqkv is fresh: rotating it in place is the backward's +=
  std::vector<float> dln1_partial(whole, 0.0f);
  linear_backward(c.ln1, w.qkv_weight, dqkv, dln1_partial, g.qkv_weight, g.qkv_bias, n, h, part.qkv,
                  keep(&DeferredWeightGrad::qkv_dy));
  const std::vector<float> dln1 = sum_input_gradient(tp, dln1_partial, mine);  // likewise each rank's heads
  std::copy(dmiddle.begin(), dmiddle.end(), dx.begin());  // through the first residual
  norm_backward(s, w.ln1_gain, c.input, c.mean1, c.rstd1, dln1, dx, g.ln1_gain, g.ln1_bias, rows);
}

void sum_partial_gradients(Layer& g, TensorParallel& tp, int slice, int slices) {
  // The router, whole on every rank, routed each rank's own rows.
  for (std::vector<float>* t : {&g.ln1_gain, &g.ln1_bias, &g.ln2_gain, &g.ln2_bias, &g.router_weight})
    if (!t->empty()) tp.all_reduce(runtime::host_floats(*t));
  // The routed experts ran each rank's own rows too: the ranks that hold the same slice of the same
  // experts (slices < tp: those of one slice index) sum them, each adding its block into a tensor of
  // all `slices` blocks.
  if (!g.moe() || slices >= tp.size()) return;
  for (std::vector<float>* t : {&g.expert_fc1_weight, &g.expert_fc2_weight}) {
    std::vector<float> blocks(t->size() * std::size_t(slices), 0.0f);
    const auto at = blocks.begin() + std::ptrdiff_t(t->size() * std::size_t(slice));
    std::copy(t->begin(), t->end(), at);
    tp.all_reduce(runtime::host_floats(blocks));
    std::copy_n(at, t->size(), t->begin());
  }
}

void layer_weight_backward(const ModelShape& s, const LayerCache& c, const DeferredWeightGrad& d, Layer& g, int ranks,
                           int rank) {
  const int n = s.tokens(), h = s.hidden;
  const LayerPart part(s, ranks);
  if (g.moe())
    moe_weight_backward(s, own_rows(c.ln2, c.middle.size(), rank), c.moe, d.moe, routed_gradients(g));
  if (has_mlp(s, g)) {
    const MlpMaps m = mlp_of(s, g);
    const int ffn = m.ffn / ranks;
    linear_weight_backward(c.gelu, d.fc2_dy, g.*m.fc2_weight, g.*m.fc2_bias, n, ffn, h);
    linear_weight_backward(c.ln2, d.fc1_dy, g.*m.fc1_weight, g.*m.fc1_bias, n, h, fc1_width(s, ffn));
  }
  linear_weight_backward(c.attention, d.proj_dy, g.proj_weight, g.proj_bias, n, part.attention, h);
  linear_weight_backward(c.ln1, d.qkv_dy, g.qkv_weight, g.qkv_bias, n, h, part.qkv);
}

std::vector<std::vector<std::size_t>> split_elements(const ModelShape& s, int rank, int ranks) {
  const std::size_t h = std::size_t(s.hidden), n_qkv = std::size_t(s.qkv_width()), n_fc1 = std::size_t(s.fc1_width());
  const std::vector<std::size_t> qkv = qkv_columns(s, rank, ranks), fc1 = fc1_columns(s, s.ffn, rank, ranks);
  const std::size_t fs = std::size_t(s.shared_expert_ffn), fs_part = fs / std::size_t(ranks);
  const LayerPart part(s, ranks);
  const bool gpt = s.family == LayerFamily::Gpt;  // Llama's biases are empty: nothing to split
  // Layer::tensors() order: ln1 gain, bias; qkv weight, bias; proj weight, bias; ln2 gain, bias; fc1
  // weight, bias; fc2 weight, bias; then a mixture-of-experts layer's router and routed experts, whole
  // (each rank routes its own tokens; the experts are split by expert_part), and its shared expert,
  // split as fc1 and fc2 are.
  return {{},
          {},
          column_elements(h, n_qkv, qkv),
          gpt ? qkv : std::vector<std::size_t>{},
          row_elements(std::size_t(rank) * std::size_t(part.attention), std::size_t(part.attention), h),
          {},
          {},
          {},
          column_elements(h, n_fc1, fc1),
          gpt ? fc1 : std::vector<std::size_t>{},
          row_elements(std::size_t(rank) * std::size_t(part.ffn), std::size_t(part.ffn), h),
          {},
          {},
          {},
          {},
          column_elements(h, 2 * fs, fc1_columns(s, s.shared_expert_ffn, rank, ranks)),
          row_elements(std::size_t(rank) * fs_part, fs_part, h)};
}

Layer split_layer(const ModelShape& s, const Layer& whole, int rank, int ranks) {
  if (ranks == 1) return whole;
  const std::vector<std::vector<std::size_t>> elements = split_elements(s, rank, ranks);
  Layer part;
  const auto from = whole.tensors();
  const auto to = part.tensors();
  for (std::size_t t = 0; t < from.size(); ++t) {
    if (elements[t].empty() || from[t]->empty()) {  // whole on every rank, or not in this kind of layer
      *to[t] = *from[t];
      continue;
    }
    for (const std::size_t e : elements[t]) to[t]->push_back((*from[t])[e]);
  }
  return part;
}

Layer expert_part(const ModelShape& s, const Layer& whole, int rank, int ranks, int etp_rank, int etp) {
  if ((ranks == 1 && etp == 1) || !whole.moe()) return whole;
  if (s.experts % ranks != 0 || rank < 0 || rank >= ranks)
    throw std::invalid_argument("an expert-parallel group must split the experts evenly (parallel.ep)");
  if (s.expert_ffn % etp != 0 || etp_rank < 0 || etp_rank >= etp)
    throw std::invalid_argument("an expert-tensor-parallel group must split the expert width evenly (parallel.etp)");
  Layer part = whole;
  const std::size_t local = std::size_t(s.experts / ranks);
  // Stacked expert by expert: this rank's experts are one block of each map.
  for (std::vector<float>* t : {&part.expert_fc1_weight, &part.expert_fc2_weight}) {
    const std::size_t block = t->size() / std::size_t(s.experts) * local;
    *t = std::vector<float>(t->begin() + std::ptrdiff_t(std::size_t(rank) * block),
                            t->begin() + std::ptrdiff_t(std::size_t(rank + 1) * block));
  }
  if (etp == 1) return part;
  // Then each expert's slice: columns of its fused [gate | up], rows of its down projection.
  const std::vector<std::vector<std::size_t>> slice = expert_slice_elements(s, etp_rank, etp);
  for (const auto& [t, elements] :
       {std::pair{&part.expert_fc1_weight, &slice[0]}, {&part.expert_fc2_weight, &slice[1]}}) {
    const std::size_t per_expert = t->size() / local;
    std::vector<float> sliced;
    for (std::size_t e = 0; e < local; ++e)
      for (const std::size_t i : *elements) sliced.push_back((*t)[e * per_expert + i]);
    *t = std::move(sliced);
  }
  return part;
}

std::vector<std::vector<std::size_t>> expert_slice_elements(const ModelShape& s, int rank, int ranks) {
  const std::size_t h = std::size_t(s.hidden), f = std::size_t(s.expert_ffn), part = f / std::size_t(ranks);
  return {column_elements(h, 2 * f, fc1_columns(s, s.expert_ffn, rank, ranks)),
          row_elements(std::size_t(rank) * part, part, h)};
}

bool routed_expert_tensor(std::size_t index) {
  if (index >= std::size(kNamedTensors)) return false;
  const std::vector<float> Layer::*member = kNamedTensors[index].member;
  return member == &Layer::expert_fc1_weight || member == &Layer::expert_fc2_weight;
}

Model make_model(const ModelShape& s, std::uint64_t seed) {
  Model m;
  m.embedding = embedding_rows(s, seed, 0, s.vocab);
  for (int l = 0; l < s.layers; ++l) m.layers.push_back(make_layer(s, seed, l));
  m.final_gain = constant(std::size_t(s.hidden), 1);
  if (s.family == LayerFamily::Gpt) m.final_bias = constant(std::size_t(s.hidden), 0);  // RMSNorm has no bias
  m.head = head_rows(s, seed, 0, s.vocab);
  return m;
}

std::vector<float> embedding_rows(const ModelShape& s, std::uint64_t seed, int first, int rows) {
  return normal_tensor(std::size_t(rows) * s.hidden, seed, 0, 0.02f, std::size_t(first) * s.hidden);
}

std::vector<float> head_rows(const ModelShape& s, std::uint64_t seed, int first, int rows) {
  if (s.tied_embeddings) return embedding_rows(s, seed, first, rows);
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
  norm_forward(s, m.final_gain, m.final_bias, activations.back(), normed, mean, rstd, n);
  std::vector<float> logits(std::size_t(n) * s.vocab, 0.0f), dlogits(logits.size());
  matmul_bt(normed, m.head, logits, n, h, s.vocab);
  const double loss = cross_entropy(logits, targets, dlogits, n, s.vocab);

  std::vector<float> dnormed(std::size_t(n) * h, 0.0f), dx(std::size_t(n) * h, 0.0f);
  matmul_at(dlogits, normed, grad.head, n, s.vocab, h);  // dHead = dlogitsᵀ · normed
  matmul(dlogits, m.head, dnormed, n, s.vocab, h, true);  // dNormed = dlogits · Head
  norm_backward(s, m.final_gain, activations.back(), mean, rstd, dnormed, dx, grad.final_gain, grad.final_bias, n);
  for (int l = s.layers - 1; l >= 0; --l) {
    std::vector<float> below(std::size_t(n) * h, 0.0f);
    layer_backward(s, m.layers[std::size_t(l)], caches[std::size_t(l)], dx, below, grad.layers[std::size_t(l)]);
    dx = std::move(below);
  }
  embedding_backward(tokens, dx, grad.embedding, h, 0, s.vocab);
  return loss;
}

}  // namespace pipesim::cpu
