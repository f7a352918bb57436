#pragma once
/// MPI is a plugin too (libpipesim_mpi.so, see plugin_loader.h): linked into pipesim, Open MPI's
/// eight libraries added half again to every command's start-up (`pipesim list`: 12 ms, not 8).
/// The plugin owns everything that touches <mpi.h>; the launcher (mpi_launch.cpp) reaches it
/// through this table.
#include <memory>

#include "comm.h"

namespace pipesim::runtime::mpi {

struct PluginApi {
  int version;  ///< kPluginVersion of the plugin's build: a stale plugin is refused, not called
  /// MPI_Init_thread (only the thread that calls these calls MPI); this process's rank, the job's size.
  /// These and the transport's calls throw std::runtime_error naming the MPI call that failed.
  void (*init)(int* rank, int* size);
  /// One duplicate of MPI_COMM_WORLD per lane.
  std::unique_ptr<Transport> (*make_transport)();
  /// Prints "pipesim: error: `why`" and ends every rank of the job; never returns. (Not [[noreturn]]:
  /// the attribute applies to functions, not to pointers to them, and clang refuses it here.)
  void (*abort)(const char* why);
  void (*finalize)();
};
/// 4: Communicator gained all_to_all; 3: Transport::subgroup takes the group's use; 2: gained subgroup,
/// all_gather, reduce_scatter.
constexpr int kPluginVersion = 4;

}  // namespace pipesim::runtime::mpi

/// The plugin's one exported symbol.
extern "C" const pipesim::runtime::mpi::PluginApi* pipesim_mpi_plugin();
constexpr const char* kMpiPluginEntry = "pipesim_mpi_plugin";
