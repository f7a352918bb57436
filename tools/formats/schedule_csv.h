#pragma once
/// Per-device op orders in the CSV format of PyTorch's torch.distributed.pipelining (compute only):
/// one row per rank, one action per cell, `{stage}{F|I|B|W}{microbatch}` -- F forward, I input
/// gradient, W weight gradient, B full backward -- e.g. `0F0,0F1,0I0,0W0`. Empty cells are idle.
#include <string>
#include <string_view>

#include "custom_schedule.h"
#include "status.h"

namespace pipesim {

/// Reads a schedule for `devices` ranks and `microbatches` microbatches. The stages in the file set
/// the chunks per device (stages / devices) and the placement (loop or V). Errors name the file,
/// line and column, or the field to change.
Result<CustomSchedule> parse_schedule_csv(std::string_view text, const std::string& source, int devices,
                                          int microbatches);

/// The compute ops of `graph` in that format: B is written as I when the graph has W ops.
std::string schedule_csv(const TaskGraph& graph);

}  // namespace pipesim
