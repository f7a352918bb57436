#pragma once
/// What calibration fits hardware to: the kernels of one transformer layer's F, B and W and of the
/// whole vocabulary layers, and the seconds the analytic model gives them (docs/cost-model.md, "Calibration").
#include <string>
#include <vector>

#include "config.h"
#include "kernels.h"

namespace pipesim {

/// One op's kernels, for calibration.
struct OpWork {
  std::string name;
  std::vector<Kernel> kernels;
};

/// The work of one transformer layer's F, B and W (`layer_forward`, `layer_backward`, `layer_weight`)
/// and of the whole vocabulary layers (`output_forward`, `output_backward` (dX), `output_weight` (dW),
/// `input_forward`, `input_backward`), one tensor-parallel rank's part of them at the config's tp
/// (its collectives left out): what calibration fits hardware to.
std::vector<OpWork> analytic_op_work(const Config& config);
/// Seconds the analytic model gives `work` on `hardware`, timed alone as an op benchmark times it
/// (sustained_compute_fraction 1).
double analytic_seconds(const OpWork& work, const HardwareConfig& hardware);

}  // namespace pipesim
