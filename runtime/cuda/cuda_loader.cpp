// The cuda_backend.h functions as the rest of pipesim calls them: each loads the CUDA plugin on
// first use (plugin.h says why it is one) and forwards to it. A build without CUDA has no plugin
// and says so; PIPESIM_CUDA_PLUGIN names another plugin file (an installed copy, say).
#include <dlfcn.h>
#include <fmt/format.h>

#include <cstdlib>
#include <stdexcept>

#include "plugin.h"

namespace pipesim::runtime::cuda {
namespace {

struct Loaded {
  const PluginApi* api = nullptr;
  std::string error;  ///< why api is null
};

Loaded load() {
  const char* from_env = std::getenv("PIPESIM_CUDA_PLUGIN");
  const std::string path = from_env && *from_env ? from_env : PIPESIM_CUDA_PLUGIN_PATH;
  if (path.empty())
    return {nullptr, "this pipesim was built without CUDA (no nvcc found, or -Dcuda=disabled); install the CUDA "
                     "toolkit and NCCL and rebuild with -Dcuda=enabled, or run with --backend cpu"};
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle)
    return {nullptr, fmt::format("cannot load the CUDA backend {}: {}; rebuild pipesim (ninja -C build), set "
                                 "PIPESIM_CUDA_PLUGIN to its libpipesim_cuda.so, or run with --backend cpu",
                                 path, dlerror())};
  const auto entry = reinterpret_cast<decltype(&pipesim_cuda_plugin)>(dlsym(handle, kPluginEntry));
  const PluginApi* api = entry ? entry() : nullptr;
  if (!api || api->version != kPluginVersion)
    return {nullptr, fmt::format("{} is not this pipesim's CUDA backend (no {} of version {}); rebuild pipesim "
                                 "(ninja -C build) or point PIPESIM_CUDA_PLUGIN at the matching file",
                                 path, kPluginEntry, kPluginVersion)};
  return {api, ""};
}

/// Loaded once per process; dlopen's handle stays open for the process's life.
const Loaded& plugin() {
  static const Loaded loaded = load();
  return loaded;
}

const PluginApi& api() {
  if (!plugin().api) throw std::runtime_error(plugin().error);
  return *plugin().api;
}

}  // namespace

std::string unavailable_reason() { return plugin().api ? plugin().api->unavailable_reason() : plugin().error; }
int device_count() { return plugin().api ? plugin().api->device_count() : 0; }

std::unique_ptr<Backend> make_backend(const cpu::ModelShape& shape, const Layout& layout, int rank, std::uint64_t seed,
                                      const BackendOptions& options) {
  return api().make_backend(shape, layout, rank, seed, options);
}

Memory& device_memory() { return api().device_memory(); }

int local_device(int rank) { return plugin().api ? plugin().api->local_device(rank) : 0; }

std::unique_ptr<Transport> make_nccl_transport(std::unique_ptr<Transport> control, const TaskGraph& graph, int device) {
  return api().make_nccl_transport(std::move(control), graph, device);
}

}  // namespace pipesim::runtime::cuda
