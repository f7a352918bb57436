// This process as one rank of an MPI job, through the MPI plugin (mpi/mpi_plugin.h says why it is
// one). A build without MPI has no plugin and says so; PIPESIM_MPI_PLUGIN names another plugin file.
#include <fmt/format.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <thread>

#include "cuda/cuda_backend.h"
#include "launch.h"
#include "mpi/mpi_plugin.h"
#include "plugin_loader.h"

namespace pipesim::runtime {
namespace {

const mpi::PluginApi* load(std::string& error) {
  return static_cast<const mpi::PluginApi*>(load_plugin(Plugin::Mpi, error));
}

/// --inject-fault RANK:setup[:hang|:kill]: this rank fails after MPI is up, before it connects over
/// NCCL, so that the other ranks' communicator creation must time out (hang) or see it die (kill).
void setup_fault(const RunOptions& options, int rank) {
  if (!options.fault || !options.fault->at_setup || options.fault->rank != rank) return;
  if (options.fault->kill) {
    std::fflush(nullptr);
    std::raise(SIGKILL);
  }
  if (!options.fault->hang) throw std::runtime_error("injected fault while connecting to the other ranks");
  for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));  // until the others end the job
}

/// The transport of this process: MPI alone, or NCCL over MPI for the CUDA backend.
std::unique_ptr<Transport> make_transport(const mpi::PluginApi& api, const Job& job, RunOptions& options) {
  std::unique_ptr<Transport> transport = api.make_transport();
  setup_fault(options, transport->rank());
  if (options.backend != BackendKind::Cuda) return transport;
  options.device = cuda::local_device(transport->rank());
  options.ordered_issue = true;  // an NCCL kernel holds the GPU while it waits for its peers (issue_order.h)
  return cuda::make_nccl_transport(std::move(transport), job.graph, options.device,
                                   {.share_gpu = options.ranks_share_gpu, .timeout_s = options.timeout_s});
}

}  // namespace

MpiRun run_mpi(const std::function<Result<Job>(int ranks)>& job_for, const RunOptions& options) {
  MpiRun run;
  std::string error;
  const mpi::PluginApi* api = load(error);
  if (!api) {
    run.result = Error{error};
    return run;
  }
  try {
    api->init(&run.rank, &run.size);
  } catch (const std::exception& e) {  // an MPI call failed: every rank fails alike
    run.result = Error{e.what()};
    return run;
  }
  if (Result<Job> job = job_for(run.size); !job.ok()) {
    run.result = job.error();  // every rank builds the same job, so every rank fails alike
    run.failed_alike = true;
  } else {
    RunOptions mine = options;
    std::unique_ptr<Transport> comm;
    try {
      comm = make_transport(*api, job.value(), mine);
    } catch (const std::exception& e) {  // e.g. two ranks on one GPU: every rank must end
      api->abort(fmt::format("rank {}: {}", run.rank, e.what()).c_str());
      std::abort();  // not reached (abort ends the job); never go on without a transport
    }
    if (Result<RunResult> result = run_rank(*comm, job.value(), mine); !result.ok())
      comm->abort(result.error().message);
    else
      run.result = std::move(result).value();
  }
  api->finalize();
  return run;
}

}  // namespace pipesim::runtime
