#pragma once
/// The kernels each op runs and the roofline time of one kernel: what the analytic cost model times
/// (cost_model.h), what the ops' work sums (op_work.h) and what calibration fits hardware to
/// (calibration.h). Shapes and byte counts per kernel: docs/cost-model.md.
#include <vector>

#include "config.h"
#include "layout.h"

namespace pipesim {

/// One kernel as the analytic model times it: its FLOPs at peak × compute_efficiency (GEMMs) or ×
/// attention_efficiency (fused attention), or its bytes at HBM bandwidth × hbm_efficiency, whichever
/// is slower, plus one kernel launch. An op's time is the sum over its kernels.
struct Kernel {
  double flops = 0;
  double bytes = 0;
  bool attention = false;
  double rows = 0, cols = 0;  ///< a GEMM's output shape, for its tile fill (0: not a GEMM)
  bool fp8 = false;           ///< a GEMM on FP8 inputs: its FLOPs at peak_fp8_tflops
  /// A forward GEMM whose output a tensor-parallel reduce-scatter overlaps (training.tp_comm_overlap):
  /// the SMs that reduce-scatter keeps from it (Transformer Engine's SM margin), 0 for none.
  int overlap_sms = 0;
  AttentionKernel attention_kernel = AttentionKernel::Cudnn;  ///< whose kernel runs it (precision.attention_kernel)
  double attention_keys = 0;  ///< keys a fused attention kernel's queries see (HardwareConfig::attention_overhead_tokens)
  /// Thread blocks a fused attention kernel launches: one per 128 query rows of each sequence and
  /// head on the rank (0: not counted). Causal blocks differ in length, so a grid of few blocks an SM
  /// leaves SMs idle behind the longest ones.
  double attention_blocks = 0;
};
/// The share of a GEMM's tile work that is useful on `sms` streaming multiprocessors: ragged edges
/// cost whole tiles, and fewer tiles than SMs leave SMs idle. 1 for other kernels and for sms = 0.
double tile_fill(const Kernel& kernel, int sms);
double kernel_seconds(const Kernel& kernel, const HardwareConfig& hardware);
/// Bytes an element of a gradient held in the parameters' type moves to be added into the main
/// gradient: read it, read and write the main gradient; DeepSpeed's accumulation first casts it to an
/// fp32 copy (training.grad_accumulation).
double main_gradient_add_bytes(const Config& c);
/// HBM traffic of an embedding's backward over `rows` vocabulary rows, as nn.Embedding runs it (the
/// frameworks' and the vocabulary-parallel reference implementation's): the gradient is dense — a
/// zeroed rows × h buffer the tokens' output gradients are added into, then added whole to the
/// main gradient (read it and the main gradient, write the main gradient). The authors' measured
/// passes grow by about that much with the vocabulary (docs/vocabulary-parallelism.md).
double embedding_backward_bytes(const Config& c, double rows);
/// The sum of kernel_seconds over `kernels`.
double seconds(const std::vector<Kernel>& kernels, const HardwareConfig& hardware);
/// The sum of one field (&Kernel::flops or &Kernel::bytes) over `kernels`.
double total(const std::vector<Kernel>& kernels, double Kernel::*field);

/// The kernels of one virtual stage's F, B and W for one microbatch, per tensor-parallel rank.
struct StageKernels {
  std::vector<Kernel> forward, backward, weight, recompute;
  /// Tensor-parallel collectives, each an all-reduce of b·s·h activations or, under sequence
  /// parallelism, an all-gather and a reduce-scatter of them (the same ring time).
  int tp_allreduces_forward = 0, tp_allreduces_backward = 0, tp_allreduces_recompute = 0;
  /// MoE layers in F and B (each a dispatch and a combine all-to-all, expert_exchange_bytes), and in R.
  int expert_exchanges = 0, expert_exchanges_recompute = 0;
};

/// The kernels of `stage` under the config's model, parallelism and recomputation.
StageKernels stage_kernels(const Config& c, const VirtualStage& stage);

}  // namespace pipesim
