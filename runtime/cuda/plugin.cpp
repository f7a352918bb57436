// The entry point of libpipesim_cuda.so: the table of the backend's functions (plugin.h).
#include "plugin.h"

extern "C" __attribute__((visibility("default"))) const pipesim::runtime::cuda::PluginApi* pipesim_cuda_plugin() {
  namespace cuda = pipesim::runtime::cuda;
  static const cuda::PluginApi api{cuda::kPluginVersion, cuda::unavailable_reason, cuda::device_count,
                                   cuda::make_backend,   cuda::device_memory,       cuda::local_device,
                                   cuda::make_nccl_transport};
  return &api;
}
