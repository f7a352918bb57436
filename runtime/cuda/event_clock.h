#pragma once
/// The CUDA backend's DeviceClock: a CUDA event per mark, recorded on the calling thread's stream, so
/// an op's span is the GPU's from its first kernel to its last (resolution about 0.5 µs).
#include <cuda_runtime_api.h>

#include <vector>

#include "backend.h"
#include "cuda/check.h"

namespace pipesim::runtime::cuda {

class EventClock final : public DeviceClock {
 public:
  explicit EventClock(cudaStream_t stream) : stream_(stream) {}
  ~EventClock() override {
    for (cudaEvent_t e : events_) static_cast<void>(cudaEventDestroy(e));
  }
  EventClock(const EventClock&) = delete;
  EventClock& operator=(const EventClock&) = delete;

  Mark mark() override {
    cudaEvent_t event = nullptr;
    CUDA_CHECK(cudaEventCreate(&event));
    events_.push_back(event);
    CUDA_CHECK(cudaEventRecord(event, stream_));
    return events_.size() - 1;
  }
  TimeNs elapsed(Mark from, Mark to) override {
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, events_.at(from), events_.at(to)));
    return TimeNs(double(ms) * 1e6);
  }

 private:
  cudaStream_t stream_;
  std::vector<cudaEvent_t> events_;
};

}  // namespace pipesim::runtime::cuda
