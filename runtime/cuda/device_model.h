#pragma once
/// One rank's part of the model on a GPU: every tensor of its RankModel (partition.h) uploaded as fp32
/// weights and fp32 gradients, plus, in bf16 runs, a bf16 copy of each weight a GEMM reads,
/// refreshed after every optimizer step. Built from the CPU RankModel, so the GPU starts from exactly
/// the CPU's numbers.
#include <array>
#include <cstdint>
#include <map>
#include <vector>

#include <cuda_runtime_api.h>

#include "cuda/device_buffer.h"
#include "partition.h"
#include "tensor.h"

namespace pipesim::runtime::cuda {

struct DeviceParam {
  DeviceBuffer<float> weight, grad;
  DeviceBuffer<std::uint16_t> weight_bf16;  ///< bf16 runs only
  DeviceBuffer<float> moment1, moment2;     ///< Adam's, made (zeros) by its first step
  std::size_t count() const { return weight.size(); }
  /// The weights as the GEMMs of a run in `dtype` read them.
  const void* compute(DType dtype) const {
    return dtype == DType::BF16 ? static_cast<const void*>(weight_bf16.get()) : weight.get();
  }
};

/// The tensors of cpu::Layer, in its order.
struct DeviceLayer {
  DeviceParam ln1_gain, ln1_bias, qkv_weight, qkv_bias, proj_weight, proj_bias;
  DeviceParam ln2_gain, ln2_bias, fc1_weight, fc1_bias, fc2_weight, fc2_bias;
  std::array<DeviceParam*, 12> params() {
    return {&ln1_gain, &ln1_bias, &qkv_weight, &qkv_bias, &proj_weight, &proj_bias,
            &ln2_gain, &ln2_bias, &fc1_weight, &fc1_bias, &fc2_weight, &fc2_bias};
  }
};

class DeviceModel {
 public:
  /// Uploads `host`'s weights (and zero gradients); synchronous.
  DeviceModel(const RankModel& host, DType dtype);

  std::map<int, DeviceLayer> layers;  ///< by global layer index, as RankParams
  DeviceParam embedding, head, final_gain, final_bias;

  /// Update `step` (1 on the first) of the fp32 weights, gradients zeroed, bf16 copies refreshed.
  void optimizer_step(const OptimizerSettings& settings, int step, cudaStream_t stream);
  /// The fp32 weights (or gradients) of every tensor, in RankParams' order (Backend::parameter_buffers).
  std::vector<Buffer> buffers(bool gradients);
  /// Copies the gradients into `host`'s (synchronous), for the gradient check.
  void download_grads(RankModel& host);
  std::size_t parameter_count() const;
  /// Weights, gradients, bf16 copies and Adam's moments.
  std::size_t bytes() const;

 private:
  template <class F>
  void for_each(F&& f);
};

}  // namespace pipesim::runtime::cuda
