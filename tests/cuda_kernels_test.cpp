// GPU kernel checks: each CUDA kernel against the CPU runtime's kernel on random inputs. Exits 77
// (Meson's SKIP) before anything else when there is no CUDA device, 1 when any element is wrong.
#include <cuda_runtime_api.h>

#include <cstdio>
#include <exception>

#include "gpu/harness.h"

namespace {

constexpr pipesim::cuda_test::CheckGroup kGroups[] = {
    {"gemm", pipesim::cuda_test::check_gemm},
    {"gemm autotuning", pipesim::cuda_test::check_gemm_autotune},
    {"gemm epilogues", pipesim::cuda_test::check_gemm_epilogues},
    {"layer kernels", pipesim::cuda_test::check_layer_kernels},
    {"llama kernels", pipesim::cuda_test::check_llama_kernels},
    {"attention", pipesim::cuda_test::check_attention},
    {"cudnn attention", pipesim::cuda_test::check_attention_cudnn},
    {"vocabulary", pipesim::cuda_test::check_vocab},
    {"embedding", pipesim::cuda_test::check_embedding},
};

}  // namespace

int main() {
  int devices = 0;
  if (const cudaError_t status = cudaGetDeviceCount(&devices); status != cudaSuccess || devices == 0) {
    std::printf("SKIP: no CUDA device (%s)\n",
                status != cudaSuccess ? cudaGetErrorString(status) : "cudaGetDeviceCount found 0");
    return 77;
  }
  cudaDeviceProp properties{};
  if (cudaGetDeviceProperties(&properties, 0) == cudaSuccess)
    std::printf("device 0: %s (sm_%d%d)\n", properties.name, properties.major, properties.minor);
  std::printf("%-26s %-30s %-5s %-12s %10s %8s %9s\n", "kernel", "shape", "type", "tensor", "max error", "#wrong",
              "elements");
  pipesim::cuda_test::Report report;
  for (const auto& group : kGroups) {
    try {
      group.run(report);
    } catch (const std::exception& e) {
      std::printf("%s: error: %s\n", group.name, e.what());
      return 1;
    }
  }
  const std::size_t wrong = report.total_wrong();
  std::printf("%zu checks, %zu wrong elements\n", report.checks(), wrong);
  return wrong == 0 ? 0 : 1;
}
