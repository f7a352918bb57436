#pragma once
/// The CUDA backend as the rest of the runtime sees it: no CUDA type crosses this header, so the
/// executor, the launcher and the CLI build the same with or without CUDA (cuda_loader.cpp forwards
/// these calls to the CUDA plugin, and says why when the build has none).
#include <cstdint>
#include <memory>
#include <string>

#include "backend.h"
#include "model_shape.h"
#include "inprocess_comm.h"
#include "layout.h"
#include "status.h"
#include "task_graph.h"

namespace pipesim::runtime::cuda {

/// Why no CUDA backend can run in this process ("no CUDA device", a build without CUDA, a driver
/// error); empty when one can.
std::string unavailable_reason();
int device_count();

struct BackendOptions {
  int device = 0;             ///< CUDA device ordinal
  DType dtype = DType::F32;   ///< of weights and activations; fp32 runs with TF32 off (the check)
  int ranks_on_device = 1;    ///< ranks sharing this GPU; each gets an equal share of its SMs
  int index_on_device = 0;    ///< which share is this rank's
  /// What this rank's optimizer updates and keeps Adam's moments of: all of every tensor, or under
  /// ZeRO 1 and 2 its data-parallel replica's block of each.
  OwnedPart owned;
  /// Its tensor-parallel rank and group (null without tensor parallelism, then the layers are
  /// whole): the rank holds cpu::split_layer's part of each layer, as the CPU's does, and sums the
  /// row-split maps' outputs and the column-split maps' input gradients over the group.
  int tp_rank = 0;
  TensorParallel* tensor_parallel = nullptr;
};

/// One rank's part of the model on a GPU, seeded as the CPU model is (the same numbers):
/// `pipeline_device` is the graph's device whose stages it holds (the rank in a run of one replica).
std::unique_ptr<Backend> make_backend(const ModelShape& shape, const Layout& layout, int pipeline_device,
                                      std::uint64_t seed, const BackendOptions& options);

/// Device memory for an in-process World: copies with cudaMemcpy, reductions on the device.
Memory& device_memory();

/// The GPU of an MPI rank: its rank among the processes on its node (as the launcher says), modulo
/// the GPUs there.
int local_device(int rank);

struct NcclOptions {
  /// Let several processes use one GPU: each rank its own NCCL host identity, NCCL over TCP on the
  /// loopback interface (no CUDA IPC, no shared memory). For testing the NCCL path on one GPU; slow.
  bool share_gpu = false;
  double timeout_s = 60;  ///< creating a communicator: longer than this fails the rank (a peer died or hangs)
};

/// One MPI process's transport on GPU `device`: NCCL communicators for the IR's lanes (one per
/// collective lane, and one 2-rank communicator per point-to-point channel that `graph` uses, so
/// channels never queue behind each other as the IR's separate streams never do), and `control`
/// (MPI, host memory) for the control lane and for handing out NCCL's unique ids. Refuses, naming
/// both ranks, two ranks on one GPU, which NCCL does not allow, unless `options.share_gpu`.
std::unique_ptr<Transport> make_nccl_transport(std::unique_ptr<Transport> control, const TaskGraph& graph, int device,
                                               const NcclOptions& options);

}  // namespace pipesim::runtime::cuda
