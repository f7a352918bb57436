#pragma once
/// The CUDA backend is a plugin (libpipesim_cuda.so), loaded only when a run asks for it: linked
/// into pipesim, the CUDA, cuBLAS and NCCL libraries cost every command, `pipesim list` included,
/// about 0.4 s and 200 MiB at start-up. The plugin hands the loader (cuda_loader.cpp) this table of
/// the cuda_backend.h functions; nothing else crosses the boundary.
#include "cuda_backend.h"

namespace pipesim::runtime::cuda {

struct PluginApi {
  int version;  ///< kPluginVersion of the plugin's build: a stale plugin is refused, not called
  std::string (*unavailable_reason)();
  int (*device_count)();
  std::unique_ptr<Backend> (*make_backend)(const ModelShape&, const Layout&, int, std::uint64_t,
                                           const BackendOptions&);
  Memory& (*device_memory)();
  int (*local_device)(int);
  std::unique_ptr<Transport> (*make_nccl_transport)(std::unique_ptr<Transport>, const TaskGraph&, int, const NcclOptions&);
};
/// 11: Communicator gained all_to_all;
/// 10: Memory (device_memory) is an Allocator: free takes the bytes; 9: Backend lost sequence_part
/// and sequence_whole (the executor splits and gathers the rows); 8: BackendOptions::tensor_parallel
/// is the runtime's one TensorParallel (base/tensor_parallel.h), which replaced TensorParallelBuffers
/// (the same calls); DType and Buffer moved to base/buffer.h; 7: make_backend takes the runtime's
/// ModelShape (base/model_shape.h) in place of cpu::ModelShape; 6: TensorParallelBuffers gained
/// sequence_parallel, all_gather and reduce_scatter, cpu::ModelShape tied_embeddings, CollectiveData
/// TiedEmbedding; 5: BackendOptions gained the tensor-parallel rank and group; 4: `owned`,
/// Transport::subgroup the group's use, Backend weights_written; 3: Transport gained subgroup,
/// all_gather and reduce_scatter.
constexpr int kPluginVersion = 11;

}  // namespace pipesim::runtime::cuda

/// The plugin's one exported symbol.
extern "C" const pipesim::runtime::cuda::PluginApi* pipesim_cuda_plugin();
constexpr const char* kPluginEntry = "pipesim_cuda_plugin";
