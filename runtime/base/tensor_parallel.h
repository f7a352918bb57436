#pragma once
/// A tensor-parallel group as a layer's math sees it: the one interface both backends' layers call,
/// the CPU model's (cpu/model.h) on host buffers and the CUDA backend's on device buffers. The
/// executor implements it over the group's transport (executor.cpp).
#include <cstddef>
#include <span>
#include <vector>

#include "buffer.h"

namespace pipesim::runtime {

/// A layer split over a tensor-parallel group as Megatron splits it: the QKV map and the MLP's first
/// map by output columns (each rank its query and key/value heads, its slice of the FFN), the
/// attention projection and the MLP's second map by input rows. The row-split maps' partial outputs,
/// and the input gradients of the column-split ones, are summed over the group; the norms and the
/// row-split maps' biases stay whole on every rank.
///
/// With sequence parallelism the layer's input and output, and its norms, are split by rows (each
/// rank n / size tokens): the norms' outputs are all-gathered before the column-split maps and the
/// row-split maps' outputs reduce-scattered, in place of the all-reduces; the norms' parameter
/// gradients are then partial sums over each rank's rows, until they are summed once a step.
///
/// Buffers are the backend's own memory (host for the CPU, device for CUDA), in its activation type
/// (or fp32 for gradients). Each call is blocking (it returns when its result is in place), held to
/// the run's timeout and recorded for the trace; only the rank's compute thread calls them, in the
/// same order on every rank of the group.
class TensorParallel {
 public:
  virtual ~TensorParallel() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  /// Whether layers' inputs and outputs, and their norms, are split by rows over the group.
  virtual bool sequence_parallel() const = 0;
  /// Sums `data` over the group, in place.
  virtual void all_reduce(Buffer data) = 0;
  /// whole (size() × part.count) = every rank's part, in rank order.
  virtual void all_gather(Buffer part, Buffer whole) = 0;
  /// part = block rank() of `whole` summed over the group.
  virtual void reduce_scatter(Buffer whole, Buffer part) = 0;
};

/// An expert-parallel group as a mixture-of-experts layer sees it (cpu/moe.h): the ranks that split
/// the layer's routed experts, each holding size() consecutive experts' share (rank r the r-th). Each
/// rank routes its own tokens; the layer sends each routed copy to the rank that holds its expert
/// and the expert's output back (dispatch and combine), in its forward and backward, through
/// all_to_all. The executor implements it over the group's transport (executor.cpp). Host fp32
/// buffers (the CPU backend's layers); blocking, held to the run's timeout; only the rank's compute
/// thread calls it, in the same order on every rank of the group (they are data-parallel replicas
/// of one stage, which run the same ops in the same order).
class ExpertParallel {
 public:
  virtual ~ExpertParallel() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  /// Variable all-to-all: `send` holds size() blocks one after the other, block d (counts[d] values)
  /// for rank d. Returns the blocks every rank sent this one, in rank order; `received` gets their sizes.
  virtual std::vector<float> all_to_all(std::span<const float> send, std::span<const std::size_t> counts,
                                        std::vector<std::size_t>& received) = 0;
};

}  // namespace pipesim::runtime
