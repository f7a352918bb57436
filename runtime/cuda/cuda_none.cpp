// Built without CUDA: the CUDA backend says so instead of running.
#include <stdexcept>

#include "cuda_backend.h"

namespace pipesim::runtime::cuda {

std::string unavailable_reason() {
  return "this pipesim was built without CUDA (no nvcc found, or -Dcuda=disabled); install the CUDA toolkit and "
         "NCCL and rebuild with -Dcuda=enabled, or run with --backend cpu";
}
int device_count() { return 0; }

std::unique_ptr<Backend> make_backend(const cpu::ModelShape&, const Layout&, int, std::uint64_t, const BackendOptions&) {
  throw std::runtime_error(unavailable_reason());
}

Memory& device_memory() { throw std::runtime_error(unavailable_reason()); }

int local_device(int) { return 0; }

std::unique_ptr<Transport> make_nccl_transport(std::unique_ptr<Transport>, const TaskGraph&, int) {
  throw std::runtime_error(unavailable_reason());
}

}  // namespace pipesim::runtime::cuda
