// The knobs of tune's search by name: the table's columns and `--fix`.
#include "tune_knobs.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <charconv>
#include <set>

#include "files.h"
#include "schedule.h"
#include "spellcheck.h"
#include "tune.h"

namespace pipesim {
namespace {

struct KnobInfo {
  Knob knob;
  bool numeric;
  /// The column name first, then the other names --fix takes: the config's own field name, its dotted key.
  std::vector<std::string> names;
};

const std::array<KnobInfo, 14>& knob_table() {
  static const std::array<KnobInfo, 14> table{{
      {Knob::Pp, true, {"pp", "parallel.pp"}},
      {Knob::Tp, true, {"tp", "parallel.tp"}},
      {Knob::Dp, true, {"dp", "parallel.dp"}},
      {Knob::Cp, true, {"cp", "parallel.cp"}},
      {Knob::Ep, true, {"ep", "parallel.ep"}},
      {Knob::SequenceParallel, false, {"sp", "sequence_parallel", "parallel.sequence_parallel"}},
      {Knob::Microbatches, true, {"m", "microbatches", "parallel.microbatches"}},
      {Knob::MicroBatchSize, true, {"mbs", "micro_batch_size", "model.micro_batch_size"}},
      {Knob::Chunks, true, {"chunks", "parallel.chunks"}},
      {Knob::Schedule, false, {"schedule", "schedule.name"}},
      {Knob::Vocab, false, {"vocab", "schedule.vocab"}},
      {Knob::Recompute, false, {"recompute", "recompute_granularity", "training.recompute_granularity"}},
      {Knob::ZeroStage, true, {"zero", "zero_stage", "training.zero_stage"}},
      {Knob::Fp8, false, {"fp8", "precision.fp8"}},
  }};
  return table;
}

/// User text as a message quotes it: short, and every byte printable.
std::string shown_text(std::string_view text) { return visible(abbreviate(text)); }

const KnobInfo& info(Knob knob) {
  return *std::find_if(knob_table().begin(), knob_table().end(), [&](const KnobInfo& k) { return k.knob == knob; });
}

/// "pp (parallel.pp), tp (parallel.tp), ..., zero (zero_stage, training.zero_stage)".
std::string accepted_keys() {
  std::string out;
  for (const KnobInfo& k : knob_table()) {
    out += fmt::format("{}{} ({})", out.empty() ? "" : ", ", k.names.front(),
                       fmt::join(k.names.begin() + 1, k.names.end(), ", "));
  }
  return out;
}

/// The values a knob takes over the space: numbers in increasing order, names in the space's order.
std::vector<std::string> values_taken(const std::vector<std::vector<std::string>>& values, std::size_t pin, bool numeric) {
  std::vector<std::string> taken;
  std::set<std::string> seen;
  for (const std::vector<std::string>& candidate : values)
    if (seen.insert(candidate[pin]).second) taken.push_back(candidate[pin]);
  if (numeric)
    std::sort(taken.begin(), taken.end(),
              [](const std::string& a, const std::string& b) { return std::stoll(a) < std::stoll(b); });
  return taken;
}

}  // namespace

std::string_view knob_name(Knob knob) { return info(knob).names.front(); }

int chunks_run(const Config& config) {
  const ScheduleInfo* schedule = find_schedule(config.schedule.name);
  return schedule && schedule->chunks > 0 ? schedule->chunks : config.parallel.chunks;
}

std::string knob_value(const Config& config, Knob knob) {
  const ParallelConfig& p = config.parallel;
  switch (knob) {
    case Knob::Pp: return std::to_string(p.pp);
    case Knob::Tp: return std::to_string(p.tp);
    case Knob::Dp: return std::to_string(p.dp);
    case Knob::Cp: return std::to_string(p.cp);
    case Knob::Ep: return std::to_string(p.ep);
    case Knob::SequenceParallel: return p.sequence_parallel ? "on" : "off";
    case Knob::Microbatches: return std::to_string(p.microbatches);
    case Knob::MicroBatchSize: return std::to_string(config.model.micro_batch_size);
    case Knob::Chunks: return std::to_string(chunks_run(config));
    case Knob::Schedule: return config.schedule.name;
    case Knob::Vocab: return std::string(vocab_mode_name(config.schedule.vocab));
    case Knob::Recompute: return std::string(recompute_name(config.training.recompute_granularity));
    case Knob::ZeroStage: return std::to_string(config.training.zero_stage);
    case Knob::Fp8: return std::string(fp8_format_name(config.precision.fp8));
  }
  return "?";
}

std::string recompute_text(const TrainingConfig& t) {
  std::string text(recompute_name(t.recompute_granularity));
  // Method and layer count decide what full recomputation costs; the other granularities have none.
  if (t.recompute_granularity == Recompute::Full)
    text += fmt::format("/{}/{}", t.recompute_method == RecomputeMethod::Block ? "block" : "uniform",
                        t.recompute_num_layers);
  return text;
}

std::vector<Knob> shown_knobs(bool experts) {
  std::vector<Knob> knobs{Knob::Pp, Knob::Tp, Knob::Dp, Knob::Cp};
  if (experts) knobs.push_back(Knob::Ep);
  knobs.insert(knobs.end(), {Knob::SequenceParallel, Knob::Microbatches, Knob::MicroBatchSize, Knob::Chunks,
                             Knob::Recompute, Knob::ZeroStage, Knob::Fp8});
  return knobs;
}

std::vector<std::string> knob_cells(const Config& config) {
  std::vector<std::string> cells;
  for (const Knob knob : shown_knobs(config.model.has_experts())) {
    if (knob == Knob::Recompute) cells.push_back(recompute_text(config.training));
    else if (knob == Knob::Ep) cells.push_back(fmt::format("{}/{}", config.parallel.ep, config.parallel.expert_tp()));
    else cells.push_back(knob_value(config, knob));
  }
  return cells;
}

namespace {

/// One value of a --fix as knob_value writes it, or an error for a knob that takes numbers.
Result<std::string> pin_value(const KnobInfo& k, const std::string& value, const std::string& shown) {
  // Sequence parallelism is on or off in the table; the config's true and false mean the same.
  if (k.knob == Knob::SequenceParallel && (value == "true" || value == "false")) return std::string(value == "true" ? "on" : "off");
  if (!k.numeric) return value;
  long long number = 0;
  const auto [end, error] = std::from_chars(value.data(), value.data() + value.size(), number);
  if (error != std::errc() || end != value.data() + value.size() || number < 0)
    return Error{fmt::format("--fix '{}': {} takes a whole number, got '{}'", shown, k.names.front(), shown_text(value))};
  return std::to_string(number);
}

}  // namespace

Result<Pin> parse_pin(const std::string& fix) {
  const std::size_t eq = fix.find('=');
  const std::string shown = shown_text(fix);
  if (eq == std::string::npos || eq == 0 || eq + 1 == fix.size())
    return Error{fmt::format("--fix '{}': expected key=value, e.g. --fix pp=8 (or values, --fix pp=4,8); keys: {}",
                             shown, accepted_keys())};
  const std::string key = fix.substr(0, eq);
  std::vector<std::string> names;
  for (const KnobInfo& k : knob_table()) {
    names.insert(names.end(), k.names.begin(), k.names.end());
    if (std::find(k.names.begin(), k.names.end(), key) == k.names.end()) continue;
    // No value of any knob holds a comma (numbers, schedule and mode names), so a comma separates values.
    Pin pin{k.knob, {}, fix};
    for (std::size_t begin = eq + 1;;) {
      const std::size_t comma = std::min(fix.find(',', begin), fix.size());
      const std::string value = fix.substr(begin, comma - begin);
      if (value.empty())
        return Error{fmt::format("--fix '{}': an empty value; give values between the commas, e.g. --fix pp=4,8", shown)};
      Result<std::string> v = pin_value(k, value, shown);
      if (!v.ok()) return v.error();
      if (std::find(pin.values.begin(), pin.values.end(), v.value()) == pin.values.end()) pin.values.push_back(v.value());
      if (comma == fix.size()) return pin;
      begin = comma + 1;
    }
  }
  return Error{fmt::format("--fix '{}': unknown key '{}'{} Keys: {}", shown, shown_text(key),
                           did_you_mean(key, names), accepted_keys())};
}

Result<std::vector<Candidate>> pin_space(const Config& config, std::vector<Candidate> space,
                                         const std::vector<Pin>& pins, int gpus) {
  if (pins.empty()) return space;
  for (std::size_t i = 0; i < pins.size(); ++i)
    for (std::size_t j = 0; j < i; ++j)
      if (pins[j].knob == pins[i].knob)
        return Error{fmt::format("--fix '{}': {} is already fixed by --fix '{}'; give each key once",
                                 shown_text(pins[i].given), knob_name(pins[i].knob), shown_text(pins[j].given))};
  // Each candidate's value of every pinned knob, read off the config it runs: one definition with the table's.
  std::vector<std::vector<std::string>> values;
  for (const Candidate& candidate : space) {
    const Config applied = apply_candidate(config, candidate);
    std::vector<std::string>& row = values.emplace_back();
    for (const Pin& pin : pins) row.push_back(knob_value(applied, pin.knob));
  }
  for (std::size_t p = 0; p < pins.size(); ++p) {
    const std::vector<std::string> taken = values_taken(values, p, info(pins[p].knob).numeric);
    for (const std::string& value : pins[p].values) {
      if (std::find(taken.begin(), taken.end(), value) != taken.end()) continue;
      return Error{fmt::format("--fix '{}': the search on {} GPUs never takes {} {}{} It takes {}",
                               shown_text(pins[p].given), gpus, knob_name(pins[p].knob), shown_text(value),
                               info(pins[p].knob).numeric ? "." : did_you_mean(value, taken), fmt::join(taken, ", "))};
    }
  }
  std::vector<Candidate> kept;
  for (std::size_t i = 0; i < space.size(); ++i) {
    bool all = true;
    for (std::size_t p = 0; p < pins.size(); ++p) {
      const std::vector<std::string>& allowed = pins[p].values;
      all = all && std::find(allowed.begin(), allowed.end(), values[i][p]) != allowed.end();
    }
    if (all) kept.push_back(std::move(space[i]));
  }
  if (kept.empty()) {
    std::vector<std::string> given;
    for (const Pin& pin : pins) given.push_back("--fix " + shown_text(pin.given));
    return Error{fmt::format("{}: no candidate on {} GPUs has all of {} (each on its own does); drop or change one",
                             config.source, gpus, fmt::join(given, ", "))};
  }
  return kept;
}

}  // namespace pipesim
