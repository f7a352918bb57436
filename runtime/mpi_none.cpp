// Built without MPI: `pipesim run` works in one process only.
#include "launch.h"

namespace pipesim::runtime {

MpiRun run_mpi(const std::function<Result<Plan>(int ranks)>&, const RunOptions&) {
  return {.rank = 0, .size = 1,
          .result = Error{"this pipesim was built without MPI; install libopenmpi-dev and rebuild, or run without mpirun "
                          "(pipesim run --ranks N)"}};
}

}  // namespace pipesim::runtime
