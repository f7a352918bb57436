#include "v_block.h"
#include "v_squeeze.h"

namespace pipesim {

/// V-Half (Qi et al., "Pipeline Parallelism with Controllable Memory", 2024): two chunks per device
/// in V placement, B and W split, built from the paper's V-Half block -- about half of 1F1B's
/// activation memory ((p + 2) / 2 microbatches of a 1F1B stage) and about half its bubble. The
/// reference generator's squeezed pattern and the greedy scheduler, under the same memory, replace
/// the block where they run faster. With vocabulary passes the pattern's backwards come one period
/// later for each microbatch the last stage's backward waits (vocab_delay), as the vocabulary paper
/// authors' V-Half does (`stable_pattern_v_half`, `interval += 6` per all-reduce barrier: sail-sg's
/// zero-bubble repository, branch v-half-vocab): each device holds that many more microbatches.
Result<DeviceOrders> generate_v_half(const ScheduleContext& context) {
  const VPattern pattern = v_half_pattern(context.layout.devices, context.vocab_delay);
  return v_schedule(context, paper_v_half_block(pattern), {.forward_down = 1, .backward_up = 1}, &pattern);
}

}  // namespace pipesim
