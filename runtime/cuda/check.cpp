#include "check.h"

namespace pipesim::runtime::cuda {

void throw_cuda_error(const char* file, int line, const char* call, const std::string& detail) {
  throw CudaError(std::string(file) + ":" + std::to_string(line) + ": " + call + " failed: " + detail);
}

}  // namespace pipesim::runtime::cuda
