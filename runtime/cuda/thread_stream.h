#pragma once
/// The stream the CUDA backend gave the calling thread, for the in-process communicator: a rank's
/// copies and reductions then run on that rank's stream (in its share of the SMs, in order with its
/// own work) instead of on the device's per-thread default stream, which lies outside every share.
#include <cstdint>

#include <cuda_runtime_api.h>

namespace pipesim::runtime::cuda {

struct ThreadStream {
  cudaStream_t stream = nullptr;  ///< null: none, use cudaStreamPerThread
  int device = -1;                ///< the stream's device
  std::uint64_t generation = 0;   ///< stream_generation() when it was set
};

/// The calling thread's (thread-local). The backend sets it whenever the thread calls it.
ThreadStream& thread_stream();
/// Advanced when a backend destroys its streams: a ThreadStream set before then is stale.
std::uint64_t stream_generation();
void retire_streams();
/// The calling thread's backend stream if it is live and on `device` (any device when < 0), else
/// cudaStreamPerThread.
cudaStream_t stream_for(int device);

}  // namespace pipesim::runtime::cuda
