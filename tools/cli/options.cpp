#include "options.h"

#include <filesystem>
#include <map>
#include <system_error>

#include "commands.h"

namespace pipesim {

ExitStatus fail(const std::string& message) {
  fmt::print(stderr, "pipesim: error: {}\n", message);
  return ExitStatus::Failure;
}

void note_written(const std::string& path, const std::string& use) {
  fmt::print(stderr, "pipesim: wrote {}{}\n", path, use.empty() ? "" : " (" + use + ")");
}

namespace {

/// The file a path names, as far as it can be told before it exists: "x", "./x" and "d/../x" are one.
std::filesystem::path file_of(const std::string& path) {
  std::error_code error;
  const std::filesystem::path absolute = std::filesystem::absolute(path, error).lexically_normal();
  if (error) return std::filesystem::path(path).lexically_normal();
  std::filesystem::path canonical = std::filesystem::weakly_canonical(absolute, error);  // through links
  return error ? absolute : canonical;
}

}  // namespace

Status check_distinct_outputs(const std::vector<std::pair<std::string, std::string>>& outputs) {
  for (std::size_t i = 0; i < outputs.size(); ++i)
    for (std::size_t j = 0; j < i; ++j) {
      const auto& [option, path] = outputs[i];
      const auto& [earlier, earlier_path] = outputs[j];
      if (!path.empty() && !earlier_path.empty() && file_of(path) == file_of(earlier_path))
        return Error{fmt::format("{} {}: the same file as {} {}; give each output a file of its own", option, path,
                                 earlier, earlier_path)};
    }
  return Status::Ok();
}

void add_format_option(CLI::App& command, Format& format, const std::vector<std::string>& names) {
  static const std::map<std::string, Format> kFormats = {
      {"text", Format::Text}, {"json", Format::Json}, {"csv", Format::Csv}, {"markdown", Format::Markdown}};
  command
      .add_option_function<std::string>(
          "--format", [&format](const std::string& name) { format = kFormats.at(name); },
          "output format: " + CLI::detail::join(names, ", "))
      ->check(one_of(names));
}

void add_selection_options(CLI::App& command, std::string& config, std::string& schedule, std::string& vocab,
                           std::vector<std::string>& overrides) {
  command.add_option("config", config, "JSON config file")->required()->check(kNonEmpty);
  command.add_option("--schedule", schedule, "schedule name (default: the config's schedule.name)")->check(kNonEmpty);
  command.add_option("--vocab", vocab, "vocabulary mode (default: the config's schedule.vocab)")->check(kNonEmpty);
  command.add_option("--set", overrides, "override a config field: key.path=value (repeatable)");
}

}  // namespace pipesim
