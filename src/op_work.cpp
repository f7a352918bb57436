#include "op_work.h"

#include <cmath>

#include "kernels.h"
#include "model_math.h"
#include "parallel_shape.h"

namespace pipesim {

double explicit_share(const Config& c, const VirtualStage& stage) {
  return double(stage.layers) * c.parallel.pp / c.model.layers;
}

std::vector<StageWork> stage_work(const Config& config, const Layout& layout) {
  const ModelConfig& m = config.model;
  // W needs the inputs of the four GEMMs of each layer: b·s·(3h + f) elements.
  const double weight_held_fraction = rank_tokens(config) * (3.0 * m.hidden + m.ffn_hidden) *
                                      config.precision.activation_bytes / config.parallel.tp /
                                      std::max(1.0, layer_activation_bytes(config));
  std::vector<StageWork> work;
  for (const VirtualStage& stage : layout.stages) {
    const StageKernels kernels = stage_kernels(config, stage);
    StageWork w;
    w.forward_flops = total(kernels.forward, &Kernel::flops);
    w.backward_flops = total(kernels.backward, &Kernel::flops);
    w.weight_flops = total(kernels.weight, &Kernel::flops);
    w.forward_bytes = total(kernels.forward, &Kernel::bytes);
    w.backward_bytes = total(kernels.backward, &Kernel::bytes);
    w.weight_bytes = total(kernels.weight, &Kernel::bytes);
    w.recompute_flops = total(kernels.recompute, &Kernel::flops);
    w.recompute_bytes = total(kernels.recompute, &Kernel::bytes);
    const ActivationsKept kept = activations_kept(config, stage.first_layer, stage.layers);
    double layer_bytes = kept.from_forward;
    w.recomputed_bytes = static_cast<Bytes>(std::llround(kept.rebuilt));
    if (config.costs && config.costs->activation_bytes)
      layer_bytes = *config.costs->activation_bytes * explicit_share(config, stage);
    double head_bytes = 0;
    if (stage.has_head)  // fp32 logits kept for the softmax gradient, plus its input
      head_bytes = config.costs ? config.costs->output_activation_bytes
                                : rank_tokens(config) * (4.0 * m.vocab + config.precision.activation_bytes * m.hidden) /
                                      config.parallel.tp;
    w.activation_bytes = static_cast<Bytes>(std::llround(layer_bytes + head_bytes));
    // W needs what the backward had, recomputed or not.
    const double full_layers = config.costs && config.costs->activation_bytes ? layer_bytes : kept.without_recompute;
    w.weight_held_bytes = static_cast<Bytes>(std::llround(full_layers * std::min(1.0, weight_held_fraction)));
    w.params = stage_params(config, stage);
    w.expert_params = stage_expert_params(config, stage);
    if (stage.has_embedding) w.embedding_params = stage_params(config, {.has_embedding = true});
    if (stage.has_head) w.head_params = stage_params(config, {.has_head = true});
    if (exchanges_experts(config)) {
      w.expert_exchanges = moe_layer_count(m, stage.first_layer, stage.layers);
      w.exchange_bytes = expert_exchange_bytes(config);
      w.exchange_ranks = config.parallel.ep;
    }
    work.push_back(w);
  }
  return work;
}

VocabWork vocab_work(const Config& config, const Layout& layout) {
  const ModelConfig& m = config.model;
  const PrecisionConfig& p = config.precision;
  const double tokens = rank_tokens(config), h = m.hidden, t = config.parallel.tp;
  const double rows = double(layout.padded_vocab) / layout.devices / t;  // vocabulary rows per device
  const bool two_barriers = layout.vocab != VocabPlacement::Vocab2;
  VocabWork w;
  const double gemm = 2 * tokens * h * rows, logits = tokens * rows;  // FLOPs; elements of the logits shard
  const double act = p.activation_bytes;
  // The memory-bound kernels between the GEMMs, as the reference implementation runs them (the
  // authors' Megatron-LM: VocabParallelCrossEntropy and vocab_output.py), a logit each. S: the
  // logits cast to fp32 (act + 4), their max (4), the max subtracted in place (8), exp in place (8),
  // its sum (4) and the division by it (8); Algorithm 2 casts the local softmax back for its GEMM
  // (4 + act). T: the softmax rescaled by the global statistics (8), multiplied by the loss gradient
  // (8) and cast for the GEMMs (4 + act).
  w.s_flops = gemm * (two_barriers ? 1 : 2);  // Algorithm 2 also forms softmax_local·W_i
  w.s_bytes = logits * (act + 36 + (two_barriers ? 0 : 4 + act)) + rows * h * p.param_bytes;
  w.t_flops = gemm * (two_barriers ? 2 : 1);  // dW, and dX for Algorithm 1
  w.t_bytes = logits * (20 + act);
  w.input_forward_bytes = 2 * tokens * h / t * p.param_bytes;
  w.input_backward_bytes = embedding_backward_bytes(config, rows);
  w.s_activation_bytes = config.costs ? Bytes(config.costs->output_activation_bytes / layout.devices)
                                      : Bytes(logits + tokens * h * p.activation_bytes / t);
  // vocab-1 and vocab-2 broadcast the last stage's output in fp32 with the loss gradient of the
  // microbatch before beside it, a column of fp32 (the authors' vocab_parallel_schedule.py,
  // broadcast_lm_head_input); interlaced broadcasts the output alone, in the pipeline's type.
  w.output_broadcast_bytes = layout.vocab == VocabPlacement::Interlaced ? tokens * h * act / t : tokens * (4 * h / t + 4);
  w.barrier0_bytes = 3 * 4 * tokens + (two_barriers ? 0 : 4 * tokens * h / t);
  w.barrier1_bytes = two_barriers ? 4 * tokens * h / t : 0;
  w.input_reduce_bytes = tokens * h * p.activation_bytes / t;
  w.grad_broadcast_bytes = tokens * h * p.activation_bytes / t;
  return w;
}

}  // namespace pipesim
