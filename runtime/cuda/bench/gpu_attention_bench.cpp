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
#include "bench_util.h"

namespace pipesim {
namespace {

namespace gpu = runtime::cuda;

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
    gpu::DeviceBuffer<std::byte> qkv(bench_values(rows * width, gpu::DType::BF16, 1)),
        dout(bench_values(rows * out_width, gpu::DType::BF16, 2));
    gpu::DeviceBuffer<std::uint16_t> out(rows * out_width), dqkv(rows * width);
    gpu::DeviceBuffer<float> lse(std::size_t(s.micro_batch) * std::size_t(s.heads) * std::size_t(s.seq));
    cudaStream_t stream = nullptr;
    CUDA_CHECK(cudaStreamCreate(&stream));
    gpu::GemmHandle gemm;
    const gpu::AttentionShape shape{.batch = s.micro_batch, .seq = s.seq, .h = s.heads * s.head_dim, .heads = s.heads,
                                    .kv_heads = s.kv_heads};
    const gpu::AttentionBackwardTensors backward_tensors{
        .qkv = qkv.get(), .out = out.get(), .lse = lse.get(), .dout = dout.get(), .dqkv = dqkv.get()};
    const auto forward = [&] {
      if (cudnn) {
        if (!gpu::attention_forward_cudnn({.qkv = qkv.get(), .out = out.get(), .lse = lse.get()}, shape, stream))
          throw gpu::CudaError("cuDNN refused the shape: " + gpu::cudnn_attention_last_problem());
      } else {
        gpu::attention_forward_gemm(gemm, {.qkv = qkv.get(), .out = out.get(), .lse = lse.get()}, shape, stream);
      }
    };
    const auto backward = [&] {
      if (cudnn) {
        if (!gpu::attention_backward_cudnn(backward_tensors, shape, stream))
          throw gpu::CudaError("cuDNN refused the shape: " + gpu::cudnn_attention_last_problem());
      } else {
        CUDA_CHECK(cudaMemsetAsync(dqkv.get(), 0, rows * width * 2, stream));  // the unfused backward adds
        gpu::attention_backward_gemm(gemm, backward_tensors, shape, stream);
      }
    };
    const double f = mean_gpu_ms(stream, iterations, forward);
    const double fb = mean_gpu_ms(stream, iterations, [&] { forward(), backward(); });
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
