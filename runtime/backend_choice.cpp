// Which backend a rank computes on, and whether it can run here.
#include <fmt/format.h>

#include <cstdlib>

#include "cpu_backend.h"
#include "cuda/cuda_backend.h"
#include "executor.h"
#include "launch.h"
#include "partition.h"

namespace pipesim::runtime {

Status check_backend(const RunOptions& options) {
  if (options.backend == BackendKind::Cpu) {
    if (options.dtype != DType::F32)
      return Error{fmt::format("--dtype {}: the CPU backend computes in fp32; use --dtype fp32 or --backend cuda",
                               dtype_name(options.dtype))};
    return Status::Ok();
  }
  // Under MPI the ranks' NCCL kernels wait on each other on the GPU while each process goes on
  // launching its own kernels. With CUDA's lazy module loading (the default) the first launch of a
  // kernel loads its module, which waits for the GPU's queue to drain -- NCCL's waiting kernels
  // included -- and the ranks deadlock. Loading every module when CUDA starts avoids that; CUDA reads
  // the setting when it starts, which is the call below. A value the user set is kept.
  if (launched_by_mpi()) setenv("CUDA_MODULE_LOADING", "EAGER", 0);
  if (std::string why = cuda::unavailable_reason(); !why.empty()) return Error{"--backend cuda: " + why};
  return Status::Ok();
}

std::unique_ptr<Backend> make_backend(const RunOptions& options, const Job& job, int rank, TensorParallel* tp,
                                      ExpertParallel* ep) {
  const ModelShape& shape = job.shape;
  const RankPlace place = job.place(rank);
  const OwnedPart owned = job.owned_part(place);
  if (options.backend == BackendKind::Cpu)
    return make_cpu_backend(shape, job.layout,
                            {.device = place.device, .tp_rank = place.tp_rank, .tp = job.tp, .owned = owned,
                             .ep_rank = job.expert_rank(place), .ep = job.ep,
                             .etp_rank = job.expert_tp_rank(place), .etp = job.etp,
                             .expert_owned = job.expert_owned_part(place)},
                            options.seed, tp, 1.0f / float(job.microbatches * job.dp), ep);
  // On the GPU a rank holds its pipeline device's stages, its tensor-parallel part of each layer
  // and, under ZeRO, updates its replica's block.
  if (options.device >= 0)  // one process per GPU (MPI)
    return cuda::make_backend(shape, job.layout, place.device, options.seed,
                              {.device = options.device, .dtype = options.dtype, .ranks_on_device = 1,
                               .index_on_device = 0, .owned = owned, .tp_rank = place.tp_rank,
                               .tensor_parallel = tp});
  // Ranks of one process go round-robin over the GPUs; those that share one split its SMs equally.
  const int gpus = cuda::device_count(), ranks = job.ranks();
  const cuda::BackendOptions gpu{.device = rank % gpus, .dtype = options.dtype,
                                 .ranks_on_device = ranks / gpus + (rank % gpus < ranks % gpus ? 1 : 0),
                                 .index_on_device = rank / gpus, .owned = owned, .tp_rank = place.tp_rank,
                                 .tensor_parallel = tp};
  return cuda::make_backend(shape, job.layout, place.device, options.seed, gpu);
}

}  // namespace pipesim::runtime
