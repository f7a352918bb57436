#include "gpu_attention_bench.h"

#include <fmt/format.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "cuda/attention_cudnn.h"
#include "cuda/attention_gemm.h"
#include "cuda/check.h"
#include "cuda/device_buffer.h"
#include "cuda/dtype.h"

namespace pipesim {
namespace {

namespace gpu = runtime::cuda;

/// bf16 values in [-0.5, 0.5) from a multiplicative hash (non-zero data: zeros flatter the clock).
gpu::DeviceBuffer<std::uint16_t> random_bf16(std::size_t count, std::uint32_t seed) {
  std::vector<std::uint16_t> host(count);
  for (std::size_t i = 0; i < count; ++i)
    host[i] = gpu::float_to_bf16_bits(float((std::uint32_t(i) * 2654435761u + seed) >> 8 & 0xffff) / 65536.0f - 0.5f);
  return gpu::DeviceBuffer<std::uint16_t>(std::span<const std::uint16_t>(host));
}

}  // namespace

int bench_attention(const AttentionBenchShape& s, int iterations) {
  try {
    const bool cudnn = gpu::use_cudnn_attention();
    if (!cudnn && s.kv_heads != s.heads) {
      fmt::print(stderr, "gpu-bench: the unfused attention has no grouped-query form; drop PIPESIM_ATTENTION=gemm\n");
      return 1;
    }
    const std::size_t rows = std::size_t(s.micro_batch) * std::size_t(s.seq);
    const std::size_t width = std::size_t(s.heads + 2 * s.kv_heads) * std::size_t(s.head_dim);
    const std::size_t out_width = std::size_t(s.heads) * std::size_t(s.head_dim);
    gpu::DeviceBuffer<std::uint16_t> qkv = random_bf16(rows * width, 1), dout = random_bf16(rows * out_width, 2);
    gpu::DeviceBuffer<std::uint16_t> out(rows * out_width), dqkv(rows * width);
    gpu::DeviceBuffer<float> lse(std::size_t(s.micro_batch) * std::size_t(s.heads) * std::size_t(s.seq));
    cudaStream_t stream = nullptr;
    CUDA_CHECK(cudaStreamCreate(&stream));
    gpu::GemmHandle gemm;
    const auto forward = [&] {
      if (cudnn) {
        if (!gpu::attention_forward_cudnn(qkv.get(), out.get(), lse.get(), s.micro_batch, s.seq, s.heads, s.kv_heads,
                                          s.head_dim, stream))
          throw gpu::CudaError("cuDNN refused the shape: " + gpu::cudnn_attention_last_problem());
      } else {
        gpu::attention_forward_gemm(gemm, qkv.get(), out.get(), lse.get(), s.micro_batch, s.seq, s.heads * s.head_dim,
                                    s.heads, stream);
      }
    };
    const auto backward = [&] {
      if (cudnn) {
        if (!gpu::attention_backward_cudnn(qkv.get(), out.get(), lse.get(), dout.get(), dqkv.get(), s.micro_batch,
                                           s.seq, s.heads, s.kv_heads, s.head_dim, stream))
          throw gpu::CudaError("cuDNN refused the shape: " + gpu::cudnn_attention_last_problem());
      } else {
        CUDA_CHECK(cudaMemsetAsync(dqkv.get(), 0, rows * width * 2, stream));  // the unfused backward adds
        gpu::attention_backward_gemm(gemm, qkv.get(), out.get(), lse.get(), dout.get(), dqkv.get(), s.micro_batch,
                                     s.seq, s.heads * s.head_dim, s.heads, stream);
      }
    };
    // Milliseconds per call of `work`, by CUDA events around `iterations` calls after three untimed
    // ones (the first of a shape compiles cuDNN's engines).
    const auto time_ms = [&](const auto& work) {
      for (int i = 0; i < 3; ++i) work();
      cudaEvent_t start = nullptr, stop = nullptr;
      CUDA_CHECK(cudaEventCreate(&start));
      CUDA_CHECK(cudaEventCreate(&stop));
      CUDA_CHECK(cudaEventRecord(start, stream));
      for (int i = 0; i < iterations; ++i) work();
      CUDA_CHECK(cudaEventRecord(stop, stream));
      CUDA_CHECK(cudaEventSynchronize(stop));
      float ms = 0;
      CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
      static_cast<void>(cudaEventDestroy(start));
      static_cast<void>(cudaEventDestroy(stop));
      return double(ms) / iterations;
    };
    const double f = time_ms(forward);
    const double fb = time_ms([&] { forward(), backward(); });
    // Causal: half of the 4·b·s²·h_q·d multiply-adds of the two forward products (×2.5 backward).
    const double forward_flops = 2.0 * s.micro_batch * double(s.seq) * s.seq * s.heads * s.head_dim;
    fmt::print("attention ({}) bf16 causal, batch {} seq {} heads {} kv_heads {} head_dim {}: forward {:.3f} ms "
               "({:.0f} TFLOP/s), forward + backward {:.3f} ms ({:.0f} TFLOP/s) (mean of {})\n",
               cudnn ? "cuDNN fused" : "cuBLASLt unfused", s.micro_batch, s.seq, s.heads, s.kv_heads, s.head_dim, f,
               forward_flops / (f * 1e-3) / 1e12, fb, 3.5 * forward_flops / (fb * 1e-3) / 1e12, iterations);
    static_cast<void>(cudaStreamDestroy(stream));
  } catch (const gpu::CudaError& e) {
    fmt::print(stderr, "gpu-bench: error: {}\n", e.what());
    return 1;
  }
  return 0;
}

}  // namespace pipesim
