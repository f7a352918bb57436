#pragma once
/// The vocabulary-parallel output layer's math (docs/runtime.md, "The vocabulary passes"), one
/// device's shard at a time. Device i holds rows [first, first + rows) of the LM head W; X (n × h) is
/// the last stage's output, broadcast to every device. The cross-shard reductions (max, sums) are the
/// caller's collectives; these functions are what each device computes between them.
#include <span>
#include <vector>

namespace pipesim::cpu {

struct VocabShard {
  int first = 0;  ///< first vocabulary row held
  int rows = 0;   ///< may be 0 when padding leaves a device no real rows
  bool holds(int token) const { return token >= first && token < first + rows; }
};

/// S pass: logits L_i = X·W_iᵀ (n × rows); per token the local max m_i, the local sum
/// s_i = Σ exp(L_i − m_i) and the target logit z_i (0 when the target is in another shard). An empty
/// shard gives m_i = −∞ and s_i = 0, the identities of the reductions.
void output_logits(std::span<const float> x, std::span<const float> w, std::span<const int> targets, VocabShard shard,
                   int n, int h, std::span<float> logits, std::span<float> max, std::span<float> sum_exp,
                   std::span<float> target_logit);

/// Algorithm 2's extra S work: A_i = softmax_local(L_i)·W_i and Y_i = W_i[target] (0 when absent),
/// both n × h, from which dX follows after the barrier without a second pass.
void output_input_grad_terms(std::span<const float> logits, std::span<const float> max, std::span<const float> sum_exp,
                             std::span<const float> w, std::span<const int> targets, VocabShard shard, int n, int h,
                             std::span<float> a, std::span<float> y);

/// After the max all-reduce: s_i·exp(m_i − M), the shard's share of the global sum-exp S.
void rescale_sum_exp(std::span<const float> max, std::span<const float> sum_exp, std::span<const float> global_max,
                     std::span<float> scaled);

/// Algorithm 2 after C0: this shard's term of dX = g·(Σ_i (s_i·exp(m_i − M)/S)·A_i − Σ_i Y_i).
void input_grad_share(std::span<const float> scaled_sum_exp, std::span<const float> global_sum_exp,
                      std::span<const float> a, std::span<const float> y, float g, int n, int h, std::span<float> dx);

/// Σ over tokens of the loss M + log S − z.
double loss_sum(std::span<const float> global_max, std::span<const float> global_sum_exp,
                std::span<const float> target_logit);

/// T pass: G_i = (exp(L_i − M)/S − onehot_i)·g; adds dW_i += G_iᵀ·X; with a non-empty `dx`
/// (Algorithm 1) also writes dX_i = G_i·W_i.
void output_backward(std::span<const float> logits, std::span<const float> global_max,
                     std::span<const float> global_sum_exp, std::span<const int> targets, VocabShard shard, float g,
                     std::span<const float> x, std::span<const float> w, int n, int h, std::span<float> dw,
                     std::span<float> dx);

}  // namespace pipesim::cpu
