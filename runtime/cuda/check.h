#pragma once
/// Every CUDA runtime, cuBLAS(Lt), cuDNN and NCCL call in runtime/ goes through one of these macros. They
/// throw CudaError rather than exit, so that an executor can catch it and report a rank error naming
/// the op that failed (docs/runtime.md, "Failures"); the message holds file:line, the call's text
/// and the library's own error string.
///
/// NCCL_CHECK names ncclResult_t and ncclGetErrorString only when it expands: include <nccl.h> where
/// it is used. This header itself needs no NCCL, so the kernel library does not depend on it. The same
/// holds for CUDNN_CHECK and <cudnn.h> (cuDNN is optional: attention_cudnn.h).
#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <stdexcept>
#include <string>

namespace pipesim::runtime::cuda {

class CudaError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// "file:line: call failed: detail" -- out of line so that each check site stays small.
[[noreturn]] void throw_cuda_error(const char* file, int line, const char* call, const std::string& detail);

}  // namespace pipesim::runtime::cuda

#define CUDA_CHECK(call)                                                                                 \
  do {                                                                                                   \
    const cudaError_t pipesim_status_ = (call);                                                          \
    if (pipesim_status_ != cudaSuccess)                                                                  \
      ::pipesim::runtime::cuda::throw_cuda_error(__FILE__, __LINE__, #call,                              \
                                                 std::string(cudaGetErrorName(pipesim_status_)) + " (" + \
                                                     cudaGetErrorString(pipesim_status_) + ")");         \
  } while (0)

#define CUBLAS_CHECK(call)                                                                      \
  do {                                                                                          \
    const cublasStatus_t pipesim_status_ = (call);                                              \
    if (pipesim_status_ != CUBLAS_STATUS_SUCCESS)                                               \
      ::pipesim::runtime::cuda::throw_cuda_error(__FILE__, __LINE__, #call,                     \
                                                 std::string(cublasGetStatusName(pipesim_status_)) + \
                                                     " (" + cublasGetStatusString(pipesim_status_) + ")"); \
  } while (0)

#define NCCL_CHECK(call)                                                                                   \
  do {                                                                                                     \
    const ncclResult_t pipesim_status_ = (call);                                                           \
    if (pipesim_status_ != ncclSuccess)                                                                    \
      ::pipesim::runtime::cuda::throw_cuda_error(__FILE__, __LINE__, #call,                                \
                                                 std::string("NCCL error ") +                              \
                                                     std::to_string(int(pipesim_status_)) + " (" +         \
                                                     ncclGetErrorString(pipesim_status_) + ")");           \
  } while (0)

/// cuDNN's status string is generic ("CUDNN_STATUS_NOT_SUPPORTED"); cudnnGetLastErrorString adds
/// which attribute or engine constraint failed, which is what tells a graph's author what to change.
#define CUDNN_CHECK(call)                                                                                      \
  do {                                                                                                         \
    const cudnnStatus_t pipesim_status_ = (call);                                                              \
    if (pipesim_status_ != CUDNN_STATUS_SUCCESS) {                                                             \
      char pipesim_detail_[1024] = "";                                                                         \
      cudnnGetLastErrorString(pipesim_detail_, sizeof pipesim_detail_);                                        \
      ::pipesim::runtime::cuda::throw_cuda_error(__FILE__, __LINE__, #call,                                    \
                                                 std::string(cudnnGetErrorString(pipesim_status_)) + " (" +    \
                                                     pipesim_detail_ + ")");                                   \
    }                                                                                                          \
  } while (0)

/// After a kernel launch: launch-configuration errors surface here, at the launch site, rather than at
/// the next unrelated call. Faults inside the kernel still surface at the next synchronising call.
#define CUDA_CHECK_LAUNCH() CUDA_CHECK(cudaGetLastError())
