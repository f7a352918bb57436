#include "launch.h"

#include <cstdlib>
#include <thread>

#include "cuda/cuda_backend.h"
#include "inprocess_comm.h"

namespace pipesim::runtime {

Result<RunResult> run_in_process(const Job& job, const RunOptions& options, const BackendFactory& backend_for) {
  const int ranks = job.ranks();
  World world(ranks, options.backend == BackendKind::Cuda ? cuda::device_memory() : host_memory());
  std::vector<std::optional<Result<RunResult>>> results(static_cast<std::size_t>(ranks));
  {
    std::vector<std::jthread> threads;
    for (int r = 0; r < ranks; ++r)
      threads.emplace_back([&, r] { results[std::size_t(r)] = run_rank(world.rank(r), job, options, backend_for); });
  }
  // The first rank to fail names the cause; the others say where they stood when it ended the run.
  if (std::optional<std::string> why = world.abort_reason()) {
    std::string message = *why;
    for (const auto& r : results)
      if (!r->ok() && r->error().message != *why) message += "\n  " + r->error().message;
    return Error{message};
  }
  for (const auto& r : results)
    if (!r->ok()) return r->error();
  return std::move(*results[0]);
}

bool launched_by_mpi() {
  for (const char* variable : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MPI_LOCALNRANKS"})
    if (std::getenv(variable)) return true;
  return false;
}

}  // namespace pipesim::runtime
