// gpu-bench: GEMM throughput through the CUDA runtime's cuBLASLt wrapper (runtime/cuda/gemm.h), the
// number to set beside a peak when reading MFU; with --layer, one transformer layer's forward and
// backward through the CUDA backend; with --attention, bf16 attention alone. Exits 77 when no CUDA device is present.
#include <CLI/CLI.hpp>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "cuda/device_buffer.h"
#include "cuda/gemm.h"
#include "bench_util.h"
#include "gpu_attention_bench.h"
#include "gpu_layer_bench.h"

namespace {

namespace gpu = pipesim::runtime::cuda;

constexpr int kNoDevice = 77;  // Meson's SKIP

/// Milliseconds per n×n×n GEMM, C = A·B, over `iterations` (bench_util.h); the untimed calls
/// before them make the plan and, with autotuning, time the candidates.
double time_gemm(int n, int iterations, gpu::DType dtype) {
  const std::size_t count = std::size_t(n) * std::size_t(n);
  gpu::DeviceBuffer<std::byte> a(pipesim::bench_values(count, dtype, 1)), b(pipesim::bench_values(count, dtype, 2));
  gpu::DeviceBuffer<std::byte> c(count * gpu::element_size(dtype));
  gpu::GemmHandle gemm;
  cudaStream_t stream = nullptr;
  CUDA_CHECK(cudaStreamCreate(&stream));
  const gpu::GemmTypes types{dtype, dtype};
  const double ms = pipesim::mean_gpu_ms(stream, iterations, [&] {
    gpu::matmul(gemm, {.a = a.get(), .b = b.get(), .c = c.get()}, {.n = n, .k = n, .m = n}, types, false, stream);
  });
  static_cast<void>(cudaStreamDestroy(stream));
  return ms;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"GEMM throughput of the CUDA runtime's cuBLASLt wrapper (square C = A·B)"};
  int size = 8192, iterations = 20;
  std::string dtype_name = "bf16";
  app.add_option("--size", size, "matrix dimension n of the n×n×n GEMM")->check(CLI::PositiveNumber);
  app.add_option("--iterations", iterations, "timed GEMMs, after 3 untimed ones")->check(CLI::PositiveNumber);
  app.add_option("--dtype", dtype_name, "bf16 (fp32 accumulate) or fp32 (no TF32)")
      ->check(CLI::IsMember({"bf16", "fp32"}));
  bool layer = false;
  pipesim::LayerBenchShape shape;
  app.add_flag("--layer", layer, "time one transformer layer through the CUDA backend instead of a GEMM");
  app.add_option("--hidden", shape.hidden, "--layer: hidden size (default 4096)")->check(CLI::PositiveNumber);
  app.add_option("--heads", shape.heads, "--layer: attention heads (default 32)")->check(CLI::PositiveNumber);
  app.add_option("--ffn", shape.ffn, "--layer: FFN hidden size (default 16384)")->check(CLI::PositiveNumber);
  app.add_option("--seq", shape.seq, "--layer: sequence length (default 2048)")->check(CLI::PositiveNumber);
  app.add_option("--micro-batch", shape.micro_batch, "--layer: sequences per microbatch (default 1)")
      ->check(CLI::PositiveNumber);
  bool attention = false;
  pipesim::AttentionBenchShape attention_shape;
  app.add_flag("--attention", attention, "time bf16 causal attention alone (grouped-query shapes too)");
  app.add_option("--query-heads", attention_shape.heads, "--attention: query heads (default 32)")
      ->check(CLI::PositiveNumber);
  app.add_option("--kv-heads", attention_shape.kv_heads, "--attention: key/value heads (default 8)")
      ->check(CLI::PositiveNumber);
  app.add_option("--head-dim", attention_shape.head_dim, "--attention: head width (default 128)")
      ->check(CLI::PositiveNumber);
  app.add_option("--attention-seq", attention_shape.seq, "--attention: sequence length (default 2048)")
      ->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);
  if (attention && attention_shape.heads % attention_shape.kv_heads != 0) {
    std::fprintf(stderr, "gpu-bench: --query-heads %d is not a multiple of --kv-heads %d\n", attention_shape.heads,
                 attention_shape.kv_heads);
    return 1;
  }

  int devices = 0;
  if (const cudaError_t status = cudaGetDeviceCount(&devices); status != cudaSuccess || devices == 0) {
    std::fprintf(stderr, "gpu-bench: no CUDA device (%s)\n",
                 status != cudaSuccess ? cudaGetErrorString(status) : "cudaGetDeviceCount found 0");
    return kNoDevice;
  }
  if (layer) return pipesim::bench_layer(shape, dtype_name, iterations);
  if (attention) return pipesim::bench_attention(attention_shape, iterations);
  const gpu::DType dtype = dtype_name == "fp32" ? gpu::DType::F32 : gpu::DType::BF16;
  try {
    cudaDeviceProp properties{};
    CUDA_CHECK(cudaGetDeviceProperties(&properties, 0));
    const double ms = time_gemm(size, iterations, dtype);
    const double tflops = 2.0 * double(size) * double(size) * double(size) / (ms * 1e-3) / 1e12;
    std::printf("%s: %s GEMM %dx%dx%d: %.3f ms, %.1f TFLOP/s (mean of %d; %s)\n", properties.name,
                dtype_name.c_str(), size, size, size, ms, tflops, iterations, pipesim::gemm_choice());
  } catch (const gpu::CudaError& e) {
    std::fprintf(stderr, "gpu-bench: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
