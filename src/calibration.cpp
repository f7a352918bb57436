#include "calibration.h"

namespace pipesim {

std::vector<OpWork> analytic_op_work(const Config& config) {
  const auto kernels_of = [&](int layers, bool head, bool embedding) {
    return stage_kernels(config, {.device = 0, .chunk = 0, .first_layer = 0, .layers = layers,
                               .has_embedding = embedding, .has_head = head});
  };
  const StageKernels layer = kernels_of(1, false, false), head = kernels_of(0, true, false),
                     embedding = kernels_of(0, false, true);
  return {{"layer_forward", layer.forward},   {"layer_backward", layer.backward},
          {"layer_weight", layer.weight},     {"output_forward", head.forward},
          {"output_backward", head.backward}, {"output_weight", head.weight},
          {"input_forward", embedding.forward}, {"input_backward", embedding.weight}};
}

double analytic_seconds(const OpWork& work, const HardwareConfig& h) {
  // Measured ops are timed alone, a few milliseconds at a time: the clocks of a short benchmark, not
  // those a training run sustains (HardwareConfig::sustained_compute_fraction).
  HardwareConfig alone = h;
  alone.sustained_compute_fraction = 1;
  return seconds(work.kernels, alone);
}

}  // namespace pipesim
