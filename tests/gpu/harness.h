#pragma once
/// The GPU kernel checks' harness, in the spirit of nccl-tests: every check compares a CUDA result with
/// the CPU runtime's on the same inputs and reports a #wrong count, not a bare pass or fail.
#include <cstddef>
#include <cstdint>
#include <random>
#include <span>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>

#include "cuda/device_buffer.h"
#include "cuda/dtype.h"

namespace pipesim::cuda_test {

using runtime::cuda::DType;

/// Relative tolerances: an element is wrong when |got − want| > tolerance·(|want| + rms(want)), so
/// that values near zero from cancellation are judged against the tensor's scale.
constexpr double kF32 = 1e-5, kAttentionF32 = 1e-4, kBF16 = 3e-2;

inline double tolerance(DType t, double f32) { return t == DType::BF16 ? kBF16 : f32; }

/// One line of the report.
struct Check {
  std::string kernel, shape, dtype, tensor;
  double max_error = 0;  ///< the largest |got − want| / (|want| + rms(want))
  std::size_t wrong = 0, elements = 0;
};

/// Collects checks and prints them as they come.
class Report {
 public:
  void compare(const std::string& kernel, const std::string& shape, DType dtype, const std::string& tensor,
               std::span<const float> got, std::span<const float> want, double tol);
  /// For results that must repeat exactly (determinism) or match exactly (gathers).
  void compare_bits(const std::string& kernel, const std::string& shape, DType dtype, const std::string& tensor,
                    std::span<const float> got, std::span<const float> want);
  std::size_t total_wrong() const;
  std::size_t checks() const { return checks_.size(); }

 private:
  void add(Check check);
  std::vector<Check> checks_;
};

/// A device tensor of `dtype` built from fp32 host values (rounded to bf16 when dtype is BF16).
class Tensor {
 public:
  Tensor(std::span<const float> host, DType dtype);
  Tensor(std::size_t count, DType dtype) : Tensor(std::vector<float>(count, 0.0f), dtype) {}
  void* get() { return bytes_.get(); }
  const void* get() const { return bytes_.get(); }
  std::vector<float> download() const;

 private:
  runtime::cuda::DeviceBuffer<std::byte> bytes_;
  DType dtype_;
  std::size_t count_;
};

/// A non-blocking stream for the checks' launches; sync() before reading results back.
class Stream {
 public:
  Stream();
  ~Stream();
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  cudaStream_t get() const { return stream_; }
  void sync() const;

 private:
  cudaStream_t stream_ = nullptr;
};

/// The values the device will see: `values` rounded to `dtype`.
std::vector<float> rounded(std::vector<float> values, DType dtype);
std::vector<float> random_values(std::size_t count, std::mt19937& rng, float low = -1, float high = 1);
std::string shape_name(std::initializer_list<std::pair<const char*, int>> dims);

/// A kernel group's checks, run by main in table order.
struct CheckGroup {
  const char* name;
  void (*run)(Report&);
};
void check_layer_kernels(Report& report);
/// RMSNorm, RoPE and SwiGLU (cuda/llama_kernels.h).
void check_llama_kernels(Report& report);
void check_gemm(Report& report);
/// Autotuned GEMMs against the heuristic's first algorithm, and the tuned plan's cache.
void check_gemm_autotune(Report& report);
void check_gemm_epilogues(Report& report);
void check_attention(Report& report);
/// cuDNN's bf16 attention (attention_cudnn.h); says so and checks nothing in builds without cuDNN.
void check_attention_cudnn(Report& report);
void check_vocab(Report& report);
void check_embedding(Report& report);

}  // namespace pipesim::cuda_test
