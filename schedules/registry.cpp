#include <array>

#include "schedule.h"

namespace pipesim {
namespace {

const std::array<ScheduleInfo, 3> kSchedules = {{
    {"gpipe", "all forwards, then all backwards; activations of every microbatch stay alive", Placement::Loop, 1,
     generate_gpipe},
    {"1f1b", "PipeDream-flush: warm-up forwards, then one forward one backward; p-i microbatches alive",
     Placement::Loop, 1, generate_1f1b},
    {"interleaved-1f1b", "Megatron interleaved 1F1B: parallel.chunks (>= 2) chunks per device, loop placement",
     Placement::Loop, 0, generate_interleaved_1f1b},
}};

}  // namespace

std::span<const ScheduleInfo> schedules() { return kSchedules; }

const ScheduleInfo* find_schedule(const std::string& name) {
  for (const ScheduleInfo& s : kSchedules)
    if (s.name == name) return &s;
  return nullptr;
}

std::vector<std::string> schedule_names() {
  std::vector<std::string> names;
  for (const ScheduleInfo& s : kSchedules) names.push_back(s.name);
  return names;
}

}  // namespace pipesim
