#include "options.h"

#include <map>

#include "commands.h"

namespace pipesim {

ExitStatus fail(const std::string& message) {
  fmt::print(stderr, "pipesim: error: {}\n", message);
  return ExitStatus::Failure;
}

void add_format_option(CLI::App& command, Format& format, const std::vector<std::string>& names) {
  static const std::map<std::string, Format> kFormats = {
      {"text", Format::Text}, {"json", Format::Json}, {"csv", Format::Csv}, {"markdown", Format::Markdown}};
  command
      .add_option_function<std::string>(
          "--format", [&format](const std::string& name) { format = kFormats.at(name); },
          "output format: " + CLI::detail::join(names, ", "))
      ->check(CLI::IsMember(names));
}

void add_selection_options(CLI::App& command, std::string& config, std::string& schedule, std::string& vocab,
                           std::vector<std::string>& overrides) {
  command.add_option("config", config, "JSON config file")->required()->check(kNonEmpty);
  command.add_option("--schedule", schedule, "schedule name (default: the config's schedule.name)")->check(kNonEmpty);
  command.add_option("--vocab", vocab, "vocabulary mode (default: the config's schedule.vocab)")->check(kNonEmpty);
  command.add_option("--set", overrides, "override a config field: key.path=value (repeatable)");
}

}  // namespace pipesim
