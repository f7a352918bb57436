#include "kernels.h"

#include <algorithm>
#include <cmath>

#include "model_math.h"
#include "parallel_shape.h"

namespace pipesim {
namespace {

/// A GEMM of an M×K by a K×N operand: its FLOPs, and each operand read and the result written once.
Kernel gemm(double m, double n, double k, double a_bytes, double b_bytes, double c_bytes) {
  return {2 * m * n * k, m * k * a_bytes + k * n * b_bytes + m * n * c_bytes, false, m, n};
}
/// The same on FP8 operands (Transformer Engine's FP8 GEMMs: one byte an input element).
Kernel fp8_gemm(double m, double n, double k, double c_bytes) {
  Kernel g = gemm(m, n, k, 1, 1, c_bytes);
  g.fp8 = true;
  return g;
}
/// A memory-bound kernel (norms, activation functions, casts, gathers): bytes moved, no GEMM FLOPs.
Kernel streaming(double bytes) { return {0, bytes, false, 0, 0}; }
/// A GEMM batched over heads and sequences: enough tiles to fill the SMs, so its fill is taken as 1.
Kernel batched_gemm(double flops, double bytes) { return {flops, bytes, false, 0, 0}; }
/// Fused (flash) causal attention: its matrix FLOPs, run at attention_efficiency.
Kernel fused_attention(double flops, double bytes) { return {flops, bytes, true, 0, 0}; }

void append(std::vector<Kernel>& to, const std::vector<Kernel>& kernels) { to.insert(to.end(), kernels.begin(), kernels.end()); }

/// Core attention's shape on one tensor- and context-parallel rank: its queries' tokens against
/// every key of the sequence, over heads/t heads.
struct AttentionShape {
  double tokens, keys, width, kv_width, heads, act;  // width: hidden/t; act: bytes an element
  double products() const { return 2 * tokens * keys * width; }  // FLOPs of QKᵀ (or of P·V), unmasked
  double scores() const { return tokens * keys * heads; }        // elements of the score matrix
  double score_bytes() const { return scores() * act; }
  double qkvo_bytes() const { return tokens * (2 * width + 2 * kv_width) * act; }  // Q, K, V and O once each
  /// One unfused product over the score matrix (QKᵀ, P·V or a gradient's): two of the four
  /// Q/K/V/O-sized operands and the matrix itself.
  Kernel score_product() const { return batched_gemm(products(), qkvo_bytes() / 2 + score_bytes()); }
};

AttentionShape attention_shape(const Config& c) {
  const ModelConfig& m = c.model;
  const double t = c.parallel.tp, g = double(m.key_value_heads()) / m.heads;
  return {rank_tokens(c), double(m.seq_len), m.hidden / t, g * m.hidden / t, m.heads / t, c.precision.activation_bytes};
}

/// Flash attention: one fused causal kernel, half of the unmasked products forward and 2.5× that
/// backward (five matrix products to two); Q, K, V, O (and dO, dQ, dK, dV) read or written once.
/// Without it, as Megatron-LM ran GPT before flash attention: QKᵀ and P·V as batched GEMMs over the
/// whole score matrix (masked, not skipped), and the fused scale-mask-softmax and the attention
/// dropout (a 1-byte mask) each reading and writing that matrix through HBM.
std::vector<Kernel> core_attention_forward(const Config& c) {
  const AttentionShape a = attention_shape(c);
  if (c.precision.flash_attention) return {fused_attention(a.products(), a.qkvo_bytes())};
  return {a.score_product(),                                  // S = QKᵀ
          streaming(2 * a.score_bytes()),                     // P = softmax(mask(S))
          streaming(2 * a.score_bytes() + a.scores()),        // dropout(P) and its mask
          a.score_product()};                                 // O = P·V
}

std::vector<Kernel> core_attention_backward(const Config& c) {
  const AttentionShape a = attention_shape(c);
  if (c.precision.flash_attention) return {fused_attention(2.5 * a.products(), 2 * a.qkvo_bytes())};
  const Kernel product = a.score_product();
  return {product, product,                                   // dP = dO·Vᵀ, dV = Pᵀ·dO
          streaming(2 * a.score_bytes() + a.scores()),        // dropout's backward, through its mask
          streaming(3 * a.score_bytes()),                     // softmax's backward: P, dP in, dS out
          product, product};                                  // dQ = dS·K, dK = dSᵀ·Q
}

/// One decoder layer as a framework runs it (docs/cost-model.md): four GEMMs (QKV, projection, MLP up
/// — gate and up together for SwiGLU — and down) in each of F (Y = XWᵀ), B (dX = dY·W) and W
/// (dW = dYᵀX, accumulated into the fp32 main gradient); fused causal attention; and the
/// memory-bound norms, activation function and residual adds. A context-parallel rank runs s/cp of
/// the tokens, its queries against every key.
void add_layer(const Config& c, StageKernels& out) {
  const ModelConfig& m = c.model;
  const PrecisionConfig& p = c.precision;
  const double t = c.parallel.tp, tokens = rank_tokens(c), h = m.hidden, f = m.ffn_hidden;
  const double g = double(m.key_value_heads()) / m.heads, act = p.activation_bytes;
  const bool swiglu = m.mlp == MlpKind::SwiGlu;
  struct Linear {
    double out, in;  // per tensor-parallel rank: column-parallel split out, row-parallel split in
  };
  const Linear linears[] = {{h * (1 + 2 * g) / t, h}, {h, h / t}, {(swiglu ? 2 : 1) * f / t, h}, {h, f / t}};
  for (const Linear& l : linears) {
    if (p.fp8 != Fp8Format::None) {
      // Transformer Engine: each GEMM input cast to FP8 by one kernel that reads it (bf16) and writes it
      // and its transpose (for the weight gradient), 4 bytes an element; forward the input X, backward
      // the output gradient dY. The FP8 weights are cast once an iteration (optimizer step, cost_model.cpp).
      out.forward.push_back(streaming(4 * tokens * l.in));
      out.forward.push_back(fp8_gemm(tokens, l.out, l.in, act));
      out.backward.push_back(streaming(4 * tokens * l.out));
      out.backward.push_back(fp8_gemm(tokens, l.in, l.out, act));
      out.weight.push_back(fp8_gemm(l.out, l.in, tokens, 2 * p.grad_bytes));
      continue;
    }
    out.forward.push_back(gemm(tokens, l.out, l.in, act, p.param_bytes, act));
    out.backward.push_back(gemm(tokens, l.in, l.out, act, p.param_bytes, act));
    out.weight.push_back(gemm(l.out, l.in, tokens, act, act, 2 * p.grad_bytes));  // read-modify-write
  }
  append(out.forward, core_attention_forward(c));
  append(out.backward, core_attention_backward(c));
  // Memory-bound, in elements per token: F: two norms (read, write) and the activation function
  // (GELU one fused kernel, 2f; SwiGLU as PyTorch runs it unfused, SiLU 2f and the product 3f). B: the
  // norms' backward (read input and gradient, write gradient), the residual gradients' sums,
  // attention's layout copies, and the activation's backward (GELU 3f; SwiGLU 13f: two products,
  // SiLU's backward, the gate and up gradients copied into one). The norms and residuals work on
  // every token of every tensor-parallel rank unless sequence parallelism splits them.
  const double norms = c.parallel.sequence_parallel ? t : 1;
  out.forward.push_back(streaming(tokens * (4 * h / norms + (swiglu ? 5 : 2) * f / t) * act));
  out.backward.push_back(streaming(tokens * (16 * h / norms + (swiglu ? 13 : 3) * f / t) * act));
  if (!swiglu)  // GPT's biases: their gradients read each linear's output gradient
    out.weight.push_back(streaming(tokens * (h * (1 + 2 * g) + 2 * h + f) / t * act));
}

/// The LM head with a PyTorch-style cross-entropy: logits in bf16, cast to fp32, log-softmax (read
/// twice, written once) — 18 bytes a logit forward; backward writes the one-hot gradient, runs the
/// log-softmax backward and casts back — 22 bytes a logit.
void add_head(const Config& c, StageKernels& out) {
  const ModelConfig& m = c.model;
  const PrecisionConfig& p = c.precision;
  const double tokens = rank_tokens(c), h = m.hidden, rows = double(m.vocab) / c.parallel.tp;
  const double act = p.activation_bytes;
  out.forward.push_back(gemm(tokens, rows, h, act, p.param_bytes, act));
  out.forward.push_back(streaming(18 * tokens * rows));
  out.backward.push_back(streaming(22 * tokens * rows));
  out.backward.push_back(gemm(tokens, h, rows, act, p.param_bytes, act));
  out.weight.push_back(gemm(rows, h, tokens, act, act, 2 * p.grad_bytes));
}

/// The input embedding: a gather of b·s rows (read, write); its gradient cast to fp32 (read, write)
/// and scatter-added into the main gradient: read it, then an atomic read-modify-write of each row,
/// counted twice (atomics reach about half the bandwidth of plain stores on the H100 measured).
void add_embedding(const Config& c, StageKernels& out) {
  const ModelConfig& m = c.model;
  const PrecisionConfig& p = c.precision;
  const double elements = rank_tokens(c) * m.hidden / c.parallel.tp;
  out.forward.push_back(streaming(2 * elements * p.param_bytes));
  out.weight.push_back(streaming(elements * (p.activation_bytes + p.grad_bytes)));
  out.weight.push_back(streaming(elements * (p.grad_bytes + 4 * p.grad_bytes)));
  if (c.parallel.tp > 1) ++out.tp_allreduces_forward;  // vocab-parallel embedding sum
}

}  // namespace

StageKernels stage_kernels(const Config& c, const VirtualStage& stage) {
  StageKernels kernels;
  for (int l = 0; l < stage.layers; ++l) add_layer(c, kernels);
  kernels.tp_allreduces_forward = kernels.tp_allreduces_backward = 2 * stage.layers;
  // R: full recomputation runs the recomputed layers' forward again, collectives included; selective
  // recomputation only the score part of attention, which flash attention's backward already redoes.
  const int recomputed = recomputed_layers(c.training, stage.layers);
  if (recomputed > 0) {
    StageKernels layer;
    add_layer(c, layer);
    for (int l = 0; l < recomputed; ++l) append(kernels.recompute, layer.forward);
    kernels.tp_allreduces_recompute = 2 * recomputed;
  } else if (c.training.recompute_granularity == Recompute::Selective && !c.precision.flash_attention) {
    for (int l = 0; l < stage.layers; ++l) append(kernels.recompute, core_attention_forward(c));
  }
  if (stage.has_head) add_head(c, kernels);
  if (stage.has_embedding) add_embedding(c, kernels);
  return kernels;
}

double total(const std::vector<Kernel>& kernels, double Kernel::*field) {
  double sum = 0;
  for (const Kernel& kernel : kernels) sum += kernel.*field;
  return sum;
}

double seconds(const std::vector<Kernel>& kernels, const HardwareConfig& h) {
  double s = 0;
  for (const Kernel& kernel : kernels) s += kernel_seconds(kernel, h);
  return s;
}

// cuBLAS runs a GEMM as output tiles, one per SM at a time; 128×128 is its common bf16 tile on A100
// and H100. Past one wave the tail is balanced (stream-K, split-K), which the H100 measurements in
// docs/data show: over their shapes (all at least one wave) a per-wave model explains nothing.
// Split-K below one wave is not modelled, so the fill there is a lower bound (docs/cost-model.md).
double tile_fill(const Kernel& kernel, int sms) {
  if (kernel.rows <= 0 || kernel.cols <= 0 || sms <= 0) return 1;
  constexpr double kTile = 128;
  const double tiles = std::ceil(kernel.rows / kTile) * std::ceil(kernel.cols / kTile);
  return kernel.rows * kernel.cols / (kTile * kTile * std::max(tiles, double(sms)));
}

double kernel_seconds(const Kernel& kernel, const HardwareConfig& h) {
  const double efficiency = kernel.attention ? h.attention_efficiency
                            : kernel.fp8     ? h.fp8_efficiency * tile_fill(kernel, h.sms)
                                             : h.compute_efficiency * tile_fill(kernel, h.sms);
  const double peak = kernel.fp8 ? h.peak_fp8_tflops : h.peak_tflops;
  return std::max(kernel.flops / (peak * 1e12 * efficiency), kernel.bytes / (h.hbm_gbps * 1e9 * h.hbm_efficiency)) +
         h.kernel_launch_us * 1e-6;
}

}  // namespace pipesim
