#pragma once
/// From per-device compute orders to the one task graph that the simulator and the runtime run.
#include <vector>

#include "cost_model.h"
#include "parallel_shape.h"
#include "custom_schedule.h"
#include "layout.h"
#include "schedule.h"
#include "task_graph.h"

namespace pipesim {

/// Adds to the per-device compute orders the P2P transfers between stages on different devices,
/// an R before each B of a stage that recomputes, the dependencies, the memory effects, the
/// data-parallel collectives and the optimizer step.
/// `boundary_bytes` is the size of one activation (or its gradient) crossing a stage boundary.
/// Vocabulary passes (S/T/IF/IB steps in `orders`) get the work in `vocab` and their collectives.
/// With `comms` (complete: a SEND and a RECV for every boundary between devices), the transfers
/// are issued in that order instead, each after the compute op it follows.
/// The data-parallel side of an iteration (Megatron-LM's distributed optimizer, ZeRO, FSDP): how many
/// replicas, what ZeRO shards, and what is overlapped with compute.
struct DataParallelWork {
  ZeroSharding zero;  ///< the replicas, and what ZeRO shards over them
  double grad_bytes = 4, param_bytes = 2;  ///< per parameter, as the collectives carry them
  double shard_params = 0;  ///< parameters a device holds outside its stages: its vocabulary shards
  /// A tied embedding whose two uses sit on two devices (the first stage's and the last's), each
  /// holding a copy: its parameters, whose gradient the two devices sum before either reads it.
  double tied_params = 0;
  bool overlap_grad_reduce = false, overlap_param_gather = false;
  /// gradient_bucket_params: the first stage's collectives go in buckets of this many parameters
  /// beside its last backward and its first forward; 0: none do.
  double bucket_params = 0;
};

/// How point-to-point transfers meet compute: overlapped (a RECV posted ahead, the sender free to go
/// on: PyTorch's pipelining, Megatron-LM's `overlap_p2p_comm`), or synchronous (Megatron-LM's default:
/// the sender's next compute op waits for the transfer; assemble.cpp, synchronize_transfers). A
/// schedule file that orders its transfers itself keeps its order either way.
enum class P2pMode { Overlapped, Synchronous };

/// How a MoE stage's expert-parallel all-to-alls (the ALLTOALL after its F and its B) meet compute:
/// blocking (the device's next compute op waits for them: Megatron-Core's default), or overlapped with
/// the next compute op (DualPipeV's paired forward and backward, Megatron-Core's
/// overlap_moe_expert_parallel_comm). Either way what uses a stage's output waits for its ALLTOALL.
enum class ExpertComm { Blocking, Overlapped };
TaskGraph assemble(const Layout& layout, const DeviceOrders& orders, const std::vector<StageWork>& work,
                   const VocabWork& vocab, int microbatches, Bytes boundary_bytes,
                   const DataParallelWork& data_parallel = {}, P2pMode p2p = P2pMode::Overlapped,
                   const DeviceComms& comms = {}, ExpertComm expert_comm = ExpertComm::Blocking);

}  // namespace pipesim
