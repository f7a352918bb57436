// The cuda_backend.h functions as the rest of pipesim calls them: each loads the CUDA plugin on
// first use (plugin.h says why it is one) and forwards to it. A build without CUDA has no plugin
// and says so; PIPESIM_CUDA_PLUGIN names another plugin file (an installed copy, say).
#include <stdexcept>

#include "plugin.h"
#include "plugin_loader.h"

namespace pipesim::runtime::cuda {
namespace {

struct Loaded {
  const PluginApi* api = nullptr;
  std::string error;  ///< why api is null
};

Loaded load() {
  Loaded loaded;
  loaded.api = static_cast<const PluginApi*>(load_plugin(Plugin::Cuda, loaded.error));
  return loaded;
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

std::unique_ptr<Backend> make_backend(const ModelShape& shape, const Layout& layout, int pipeline_device,
                                      std::uint64_t seed, const BackendOptions& options) {
  return api().make_backend(shape, layout, pipeline_device, seed, options);
}

Memory& device_memory() { return api().device_memory(); }

int local_device(int rank) { return plugin().api ? plugin().api->local_device(rank) : 0; }

std::unique_ptr<Transport> make_nccl_transport(std::unique_ptr<Transport> control, const TaskGraph& graph, int device,
                                               const NcclOptions& options) {
  return api().make_nccl_transport(std::move(control), graph, device, options);
}

}  // namespace pipesim::runtime::cuda
