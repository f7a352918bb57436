#pragma once
/// `pipesim calibrate`'s fit of the analytic cost model's hardware efficiencies to measured op
/// times, so that the simulator predicts a machine it has measured. Four parameters are fitted -- the fraction of
/// peak FLOP/s GEMMs reach, the fraction fused attention reaches, the fraction of HBM bandwidth
/// memory-bound kernels reach, and the fixed overhead of every kernel -- by minimising the squared log
/// error over every measured op, so a 10% miss counts the same on a 50 µs op as on a 50 ms one.
#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "config.h"
#include "calibration.h"
#include "cost_model.h"
#include "status.h"

namespace pipesim {

/// One measured op and the work the analytic model gives it; `group` gathers like ops in the summary.
struct Sample {
  std::string label;
  OpWork work;
  double seconds = 0;
  std::string group;
};

/// The most measured ops one fit takes: it evaluates every op at some 7,000 points (the grid, then the
/// descent), about a second per 10,000 ops; profiles hold tens to hundreds.
constexpr std::size_t kMaxSamples = 100'000;

/// The measured ops of one profile: a `pipesim run --profile` file, tools/measure-ops.py's output,
/// or {"ops": [{name, flops, bytes, ms}]}. Errors name `path`.
Result<std::vector<Sample>> read_samples(std::string_view text, const std::string& path);

/// A coarse grid first (9 values a parameter, log-spaced: efficiencies 1e-6..1, launch 1e-3..1e4 µs),
/// so that a machine far from the preset (a CPU) does not leave the descent in a corner where one
/// roofline explains everything; a parameter that changes no measured op's time (attention, for ops
/// without it) is then put back to the preset's value. Then coordinate descent in log space: each
/// parameter in turn is scaled up or down by the step while that lowers the loss; the step halves
/// when no parameter moves.
HardwareConfig fit(const std::vector<Sample>& samples, const HardwareConfig& preset);

}  // namespace pipesim
