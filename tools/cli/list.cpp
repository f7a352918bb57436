// `pipesim list`: the schedules, vocabulary modes and hardware presets pipesim knows.
#include <fmt/format.h>

#include "commands.h"
#include "config.h"
#include "plan.h"
#include "schedule.h"

namespace pipesim {
namespace {

ExitStatus run_list() {
  fmt::print("schedules:\n");
  for (const ScheduleInfo& s : schedules()) fmt::print("  {:<18} {}\n", s.name, s.description);
  fmt::print("\nvocabulary modes:\n");
  for (const VocabModeInfo& m : vocab_modes()) fmt::print("  {:<18} {}\n", vocab_mode_name(m.mode), m.description);
  fmt::print("\nhardware presets:\n");
  for (const std::string& name : hardware_preset_names()) {
    const HardwareConfig h = *hardware_preset(name);
    const std::string fp8 = h.peak_fp8_tflops > 0 ? fmt::format(" ({:.0f} FP8)", h.peak_fp8_tflops) : "";
    fmt::print("  {:<18} {:.0f} TFLOP/s{}, {:.0f} GB/s HBM, {:.1f} GiB, {:.0f} GB/s intra-node ({:.0f} as NCCL carries it), "
               "{:.0f} GB/s inter-node, {} SMs to resident collectives, sustained {:.2f}\n",
               name, h.peak_tflops, fp8, h.hbm_gbps, h.memory_gib, h.intra_node_gbps, nvlink_gbps(h), h.inter_node_gbps,
               h.comm_sms, h.sustained_compute_fraction);
  }
  return ExitStatus::Success;
}

}  // namespace

void define_list(CLI::App& list, ExitStatus& status) {
  list.callback([&status] { status = run_list(); });
}

}  // namespace pipesim
