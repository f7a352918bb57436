#pragma once
/// Starting the ranks of a run: threads of this process, or (under mpirun/srun) this process as one
/// MPI rank among many.
#include <functional>

#include "executor.h"

namespace pipesim::runtime {

/// One thread per rank (pipeline devices × tensor-parallel × data-parallel ranks), talking through an
/// in-process communicator. A failure on any
/// rank ends all of them; the error is the failing rank's (rank and op).
Result<RunResult> run_in_process(const Job& job, const RunOptions& options, const BackendFactory& backend_for = {});

/// Whether this process was started by an MPI launcher (mpirun, srun with PMI/PMIx).
bool launched_by_mpi();

/// This process as one rank of an MPI job (MPI_Init .. MPI_Finalize inside). `job_for` is given the
/// MPI job's size and returns the job to run, with one rank per process; what it borrows
/// must live until run_mpi returns.
/// A failure on any rank aborts the job (MPI_Abort) after printing the failing rank's message.
struct MpiRun {
  int rank = 0, size = 1;
  Result<RunResult> result = Error{"not run"};
  /// The job could not be made (its config, the process count): every rank failed alike, rank 0
  /// says why, and the others end quietly so that mpirun does not end rank 0 before it has said it.
  bool failed_alike = false;
};
MpiRun run_mpi(const std::function<Result<Job>(int ranks)>& job_for, const RunOptions& options);

}  // namespace pipesim::runtime
