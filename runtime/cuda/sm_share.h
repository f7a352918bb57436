#pragma once
/// An equal share of one GPU's streaming multiprocessors for each rank that runs on it, through CUDA
/// green contexts, so that p ranks sharing one GPU each compute like a GPU of 1/p the size instead
/// of stealing each other's SMs: what lets one GPU stand in for p pipeline devices (docs/runtime.md,
/// "The CUDA backend": ranks sharing a GPU).
#include <string>

#include <cuda_runtime_api.h>

namespace pipesim::runtime::cuda {

class SmShare {
 public:
  /// Share `index` of `ranks` equal shares of `device`. One rank gets the whole GPU. Where the
  /// driver has no green contexts (before CUDA 12.5) every rank gets the whole GPU and describe()
  /// says so.
  SmShare(int device, int ranks, int index);
  ~SmShare();
  SmShare(SmShare&& other) noexcept;
  SmShare(const SmShare&) = delete;
  SmShare& operator=(const SmShare&) = delete;
  SmShare& operator=(SmShare&&) = delete;

  /// A non-blocking stream whose kernels run on this share's SMs.
  cudaStream_t make_stream();
  /// e.g. "32 of 132 SMs (green context 1 of 4)" or "132 SMs (whole GPU)".
  const std::string& describe() const { return description_; }
  /// The SMs this share's streams run on when it is a green context, else 0 (the whole GPU): what
  /// cuBLASLt's heuristics should plan for (GemmHandle's sm_count).
  int sm_count() const { return sm_count_; }

 private:
  void* context_ = nullptr;  ///< the green context (CUgreenCtx), or null for the whole GPU
  int sm_count_ = 0;
  std::string description_;
};

}  // namespace pipesim::runtime::cuda
