#pragma once
/// One rank's part of the model on a GPU: every tensor of its RankModel (partition.h) uploaded as fp32
/// weights and fp32 gradients, plus, in bf16 runs, a bf16 copy of each weight a GEMM reads,
/// refreshed after every optimizer step and whenever the weights are written from outside (a
/// data-parallel gather). Built from the CPU RankModel, so the GPU starts from exactly the CPU's
/// numbers; its optimizer updates the RankModel's owned part of each tensor (all of it, or under
/// ZeRO this replica's block) as RankModel::optimizer_step does.
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
  /// Adam's, of the owned part of the tensor (OwnedPart's block of it), made (zeros) by its first step.
  DeviceBuffer<float> moment1, moment2;
  std::size_t count() const { return weight.size(); }
  /// The weights as the GEMMs of a run in `dtype` read them.
  const void* compute(DType dtype) const {
    return dtype == DType::BF16 ? static_cast<const void*>(weight_bf16.get()) : weight.get();
  }
};

/// The tensors of cpu::Layer, in its order. The last five, a mixture-of-experts layer's, stay empty
/// (the CUDA backend runs dense layers only); they are here so that parameter_buffers lists a
/// layer's tensors as the CPU's RankParams does (tensor_stages, the data-parallel collectives).
struct DeviceLayer {
  DeviceParam ln1_gain, ln1_bias, qkv_weight, qkv_bias, proj_weight, proj_bias;
  DeviceParam ln2_gain, ln2_bias, fc1_weight, fc1_bias, fc2_weight, fc2_bias;
  DeviceParam router_weight, expert_fc1_weight, expert_fc2_weight, shared_fc1_weight, shared_fc2_weight;
  std::array<DeviceParam*, 17> params() {
    return {&ln1_gain,      &ln1_bias,          &qkv_weight,        &qkv_bias,          &proj_weight,
            &proj_bias,     &ln2_gain,          &ln2_bias,          &fc1_weight,        &fc1_bias,
            &fc2_weight,    &fc2_bias,          &router_weight,     &expert_fc1_weight, &expert_fc2_weight,
            &shared_fc1_weight, &shared_fc2_weight};
  }
};

class DeviceModel {
 public:
  /// Uploads `host`'s weights (and zero gradients); synchronous.
  DeviceModel(const RankModel& host, DType dtype);

  std::map<int, DeviceLayer> layers;  ///< by global layer index, as RankParams
  DeviceParam embedding, head, final_gain, final_bias;

  /// Update `step` (1 on the first) of the owned part of every fp32 weight, then every gradient
  /// zeroed (owned or not, as the CPU's) and the bf16 copies refreshed.
  void optimizer_step(const OptimizerSettings& settings, int step, cudaStream_t stream);
  /// The bf16 copies made again from the fp32 weights (bf16 runs; nothing in fp32 runs).
  void refresh_compute_copies(cudaStream_t stream);
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
  OwnedPart owned_;  ///< what this rank's optimizer updates
};

}  // namespace pipesim::runtime::cuda
