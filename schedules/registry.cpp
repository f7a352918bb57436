#include <algorithm>
#include <array>
#include <cctype>

#include "schedule.h"
#include "spellcheck.h"

namespace pipesim {
namespace {

const std::array<ScheduleInfo, 12> kSchedules = {{
    {"gpipe", "all forwards, then all backwards; activations of every microbatch stay alive", Placement::Loop, 1,
     generate_gpipe},
    {"1f1b", "PipeDream-flush: warm-up forwards, then one forward one backward; p-i microbatches alive",
     Placement::Loop, 1, generate_1f1b},
    {"interleaved-1f1b", "Megatron interleaved 1F1B: parallel.chunks (>= 2) chunks per device, loop placement",
     Placement::Loop, 0, generate_interleaved_1f1b},
    {"zb-h1", "zero bubble H1: 1F1B with B and W split, W deferred into bubbles; 1F1B memory", Placement::Loop, 1,
     generate_zb_h1},
    {"zb-h2", "zero bubble H2: ZB-H1 with twice the warm-up forwards; bubble-free at F = B = W, 2p-1 microbatches alive",
     Placement::Loop, 1, generate_zb_h2},
    {"zb-1p", "zero-bubble paper's automatic scheduler within 1F1B's peak activation memory (ZB-1p)", Placement::Loop, 1,
     generate_zb_1p},
    {"zb-2p", "the same within twice 1F1B's peak activation memory (ZB-2p): almost no bubble", Placement::Loop, 1,
     generate_zb_2p},
    {"zb-auto", "the same within schedule.memory_limit (x 1F1B's peak, \"N GiB\", or \"fit\": all the device has)",
     Placement::Loop, 1, generate_zb_auto},
    {"v-half", "V placement, 2 chunks per device, half of 1F1B's activation memory, about half its bubble",
     Placement::V, 2, generate_v_half},
    {"v-min", "V placement, 2 chunks per device, about a third of 1F1B's activation memory", Placement::V, 2,
     generate_v_min},
    {"zb-v", "zero bubble V: 2 chunks per device, B and W split, 1F1B memory, almost no bubble", Placement::V, 2,
     generate_zb_v},
    {"dualpipe-v", "DeepSeek DualPipeV: V placement, overlapped F and B pairs, zero-bubble tail; m >= 2p",
     Placement::V, 2, generate_dualpipe_v},
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

namespace {

/// The lowercase words of `text` (letters and digits; anything else separates them).
std::vector<std::string> words(std::string_view text) {
  std::vector<std::string> out(1);
  for (const char c : text)
    if (std::isalnum(static_cast<unsigned char>(c)))
      out.back() += char(std::tolower(static_cast<unsigned char>(c)));
    else if (!out.back().empty())
      out.emplace_back();
  if (out.back().empty()) out.pop_back();
  return out;
}

}  // namespace

std::string schedule_did_you_mean(std::string_view name) {
  const std::vector<std::string> names = schedule_names();
  if (!closest_matches(name, names).empty()) return did_you_mean(name, names);
  const std::vector<std::string> asked = words(name);
  std::vector<std::string> described;
  for (const ScheduleInfo& s : kSchedules) {
    const std::vector<std::string> description = words(s.description);
    const auto in_description = [&](const std::string& w) {
      return std::find(description.begin(), description.end(), w) != description.end();
    };
    if (!asked.empty() && std::all_of(asked.begin(), asked.end(), in_description)) described.push_back(s.name);
  }
  return did_you_mean_names(described);
}

}  // namespace pipesim
