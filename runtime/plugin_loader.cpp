#include "plugin_loader.h"

#include <dlfcn.h>
#include <fmt/format.h>

#include <cstdlib>

#include "cuda/plugin.h"
#include "mpi/mpi_plugin.h"

namespace pipesim::runtime {
namespace {

// The build names the plugin files it made (runtime/meson.build); empty when it made none.
constexpr PluginSpec kCuda{
    .what = "the CUDA backend",
    .env = "PIPESIM_CUDA_PLUGIN",
    .built_path = PIPESIM_CUDA_PLUGIN_PATH,
    .not_built = "this pipesim was built without CUDA (no nvcc found, or -Dcuda=disabled); install the CUDA toolkit "
                 "and NCCL and rebuild with -Dcuda=enabled, or run with --backend cpu",
    .instead = "run with --backend cpu",
    .entry = kPluginEntry,
    .version = cuda::kPluginVersion,
    .global = false,
};

constexpr PluginSpec kMpi{
    .what = "the MPI launcher",
    .env = "PIPESIM_MPI_PLUGIN",
    .built_path = PIPESIM_MPI_PLUGIN_PATH,
    .not_built = "this pipesim was built without MPI; install libopenmpi-dev and rebuild, or run without mpirun "
                 "(pipesim run --ranks N)",
    .instead = "run without mpirun (pipesim run --ranks N)",
    .entry = kMpiPluginEntry,
    .version = mpi::kPluginVersion,
    // Open MPI dlopens components of its own that expect its libraries' symbols to be global.
    .global = true,
};

}  // namespace

const void* load_plugin(Plugin plugin, std::string& error) {
  const PluginSpec& spec = plugin == Plugin::Cuda ? kCuda : kMpi;
  const char* from_env = std::getenv(spec.env);
  const std::string path = from_env && *from_env ? from_env : spec.built_path;
  if (path.empty()) {
    error = spec.not_built;
    return nullptr;
  }
  void* handle = dlopen(path.c_str(), RTLD_NOW | (spec.global ? RTLD_GLOBAL : RTLD_LOCAL));
  if (!handle) {
    error = fmt::format("cannot load {} {}: {}; rebuild pipesim (ninja -C build), set {} to the plugin file, or {}",
                        spec.what, path, dlerror(), spec.env, spec.instead);
    return nullptr;
  }
  // The handle stays open for the process's life: the plugin's code is in use until exit.
  const auto entry = reinterpret_cast<const void* (*)()>(dlsym(handle, spec.entry));
  const void* table = entry ? entry() : nullptr;
  if (!table || *static_cast<const int*>(table) != spec.version) {
    error = fmt::format("{} is not this pipesim's {} (no {} of version {}); rebuild pipesim (ninja -C build) or point "
                        "{} at the matching file",
                        path, spec.what, spec.entry, spec.version, spec.env);
    return nullptr;
  }
  return table;
}

}  // namespace pipesim::runtime
