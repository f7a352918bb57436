#pragma once
/// What the benches share: their data and their clock.
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "cuda/check.h"
#include "cuda/dtype.h"
#include "cuda/gemm.h"

namespace pipesim {

/// `count` values in [-0.5, 0.5) of `dtype` (F32 or BF16), as bytes, from a multiplicative hash:
/// non-zero data (zeros would flatter the clock) at no cost worth measuring.
inline std::vector<std::byte> bench_values(std::size_t count, runtime::cuda::DType dtype, std::uint32_t seed) {
  std::vector<std::byte> bytes(count * runtime::cuda::element_size(dtype));
  for (std::size_t i = 0; i < count; ++i) {
    const float value = float((std::uint32_t(i) * 2654435761u + seed) >> 8 & 0xffff) / 65536.0f - 0.5f;
    if (dtype == runtime::cuda::DType::F32) {
      std::memcpy(bytes.data() + 4 * i, &value, 4);
    } else {
      const std::uint16_t bits = runtime::cuda::float_to_bf16_bits(value);
      std::memcpy(bytes.data() + 2 * i, &bits, 2);
    }
  }
  return bytes;
}

/// How the GEMMs choose their cuBLASLt algorithm in this process (PIPESIM_GEMM_AUTOTUNE), for the
/// benches' lines.
inline const char* gemm_choice() {
  return runtime::cuda::GemmHandle::autotune_by_default() ? "GEMMs autotuned" : "GEMMs on the heuristic's first";
}

/// Milliseconds per call of `work`, by CUDA events around `iterations` calls on `stream` after
/// three untimed ones (the first call of a shape may plan or compile).

template <class Work>
double mean_gpu_ms(cudaStream_t stream, int iterations, const Work& work) {
  for (int i = 0; i < 3; ++i) work();
  cudaEvent_t start = nullptr, stop = nullptr;
  CUDA_CHECK(cudaEventCreate(&start));
  CUDA_CHECK(cudaEventCreate(&stop));
  CUDA_CHECK(cudaEventRecord(start, stream));
  for (int i = 0; i < iterations; ++i) work();
  CUDA_CHECK(cudaEventRecord(stop, stream));
  CUDA_CHECK(cudaEventSynchronize(stop));
  float elapsed_ms = 0;
  CUDA_CHECK(cudaEventElapsedTime(&elapsed_ms, start, stop));
  static_cast<void>(cudaEventDestroy(start));
  static_cast<void>(cudaEventDestroy(stop));
  return double(elapsed_ms) / iterations;
}

}  // namespace pipesim
