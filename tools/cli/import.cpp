// `pipesim import`: a pipesim config from Megatron-LM's arguments or a torchtitan job file, the
// inverse of `export --format megatron|torchtitan`.
#include <fmt/format.h>

#include "commands.h"
#include "config_files.h"
#include "config_json.h"
#include "config_writer.h"
#include "files.h"
#include "megatron_args.h"
#include "options.h"
#include "torchtitan_toml.h"

namespace pipesim {
namespace {

struct ImportOptions {
  std::string format;  ///< megatron or torchtitan
  std::string input;
  std::string output;
  std::vector<std::string> overrides;
  int gpus = 0;        ///< megatron: the world size; 0: from the file's comment
  std::string model;   ///< torchtitan: a config whose model block is used for an unknown flavor
};

/// What starts a config this command wrote (config_json puts the description first).
constexpr std::string_view kMarker = "{\n  \"description\": \"imported from";

ExitStatus run_import(const ImportOptions& o) {
  Result<std::string> text = read_text_file(o.input);
  if (!text.ok()) return fail(text.error().message);
  Result<ImportedConfig> imported = Error{""};
  if (o.format == "megatron") {
    imported = config_from_megatron(text.value(), o.input, o.gpus > 0 ? std::optional(o.gpus) : std::nullopt);
  } else {
    std::optional<ModelConfig> model;
    if (!o.model.empty()) {
      Result<Config> given = load_config(o.model, {});
      if (!given.ok()) return fail(given.error().message);
      model = given.value().model;
    }
    imported = config_from_torchtitan(text.value(), o.input, model);
  }
  if (!imported.ok()) return fail(imported.error().message);
  if (!imported.value().ignored.empty()) {
    std::string ignored;
    for (const std::string& name : imported.value().ignored) ignored += (ignored.empty() ? "" : ", ") + name;
    fmt::print(stderr, "pipesim: note: import: not part of pipesim's model, left out: {}\n", ignored);
  }
  // Through the config reader, so that what is written is a config pipesim accepts, with --set applied.
  const std::string description = imported.value().config.at("description").get<std::string>();
  Result<Config> config = parse_config(imported.value().config.dump(), o.input, o.overrides);
  if (!config.ok()) return fail(config.error().message);
  const std::string json = config_json(config.value(), description).dump(2) + "\n";
  if (Status s = write_output_file(o.output, json, std::string(kMarker)); !s.ok()) return fail(s.error().message);
  note_written(o.output, "use: pipesim simulate " + o.output);
  return ExitStatus::Success;
}

}  // namespace

void define_import(CLI::App& command, ExitStatus& status) {
  auto o = std::make_shared<ImportOptions>();
  command.add_option("format", o->format, "megatron (pretrain_gpt.py arguments) or torchtitan (a job TOML)")
      ->required()
      ->check(one_of({"megatron", "torchtitan"}));
  command.add_option("file", o->input, "the arguments file or the job TOML")->required()->check(kNonEmpty);
  command.add_option("-o,--output", o->output, "the pipesim config to write (a new file)")->required()->check(kNonEmpty);
  command.add_option("--gpus", o->gpus, "megatron: the world size, which the arguments do not carry (default: the "
                                        "\"launch on N GPUs\" comment export writes)")
      ->check(CLI::PositiveNumber);
  command.add_option("--model", o->model, "torchtitan: a pipesim config whose model is the job's (for a flavor pipesim "
                                          "does not know)");
  command.add_option("--set", o->overrides, "KEY=VALUE applied to the imported config, e.g. hardware.preset=h200");
  command.callback([o, &status] { status = run_import(*o); });
}

}  // namespace pipesim
