#include "config_files.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

#include "config_json.h"
#include "files.h"
#include "plan.h"
#include "schedule_csv.h"
#include "spellcheck.h"

namespace pipesim {

Result<Config> load_config(const std::string& path, const std::vector<std::string>& overrides) {
  Result<std::string> text = read_text_file(path);
  if (!text.ok()) return text.error();
  return parse_config(text.value(), path, overrides);
}

Status check_names(const std::string& flag, const std::vector<std::string>& names, const std::vector<std::string>& known,
                   const std::function<std::string(const std::string&)>& suggest) {
  for (const std::string& name : names)
    if (std::find(known.begin(), known.end(), name) == known.end())
      return Error{fmt::format("{}: unknown name '{}'{} Known names: {} (`pipesim list` describes them)", flag,
                               abbreviate(name), suggest ? suggest(name) : did_you_mean(name, known),
                               fmt::join(known, ", "))};
  return Status::Ok();
}

Result<Config> load_selected_config(const std::string& path, const std::vector<std::string>& overrides,
                                    const std::string& schedule, const std::string& vocab) {
  const auto given = [](const std::string& name) { return name.empty() ? std::vector<std::string>{} : std::vector{name}; };
  if (Status s = check_names("--schedule", given(schedule), schedule_names(), schedule_did_you_mean); !s.ok()) return s.error();
  if (Status s = check_names("--vocab", given(vocab), vocab_mode_names()); !s.ok()) return s.error();
  // As overrides, after the user's: the config is checked as the selection runs it (a schedule's own chunk count).
  std::vector<std::string> selected = overrides;
  if (!schedule.empty()) selected.push_back("schedule.name=" + schedule);
  if (!vocab.empty()) selected.push_back("schedule.vocab=" + vocab);
  return load_config(path, selected);
}

Result<std::optional<CustomSchedule>> load_schedule_file(const std::string& path, const Config& config) {
  if (path.empty()) return std::optional<CustomSchedule>{};
  Result<std::string> text = read_text_file(path);
  if (!text.ok()) return text.error();
  Result<CustomSchedule> parsed = parse_schedule_csv(text.value(), path, config.parallel.pp, config.parallel.microbatches);
  if (!parsed.ok()) return parsed.error();
  for (const std::string& note : parsed.value().notes) fmt::print(stderr, "pipesim: note: {}\n", note);
  if (config.schedule.vocab != VocabMode::Baseline)
    fmt::print(stderr, "pipesim: note: {}: the file's order is the transformer stages'; the vocabulary passes are "
                       "placed by mode {} (PyTorch's format has none)\n", path, vocab_mode_name(config.schedule.vocab));
  return std::optional<CustomSchedule>(std::move(parsed).value());
}

}  // namespace pipesim
