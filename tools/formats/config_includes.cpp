#include "config_includes.h"

#include <fmt/format.h>

#include <filesystem>
#include <limits>
#include <optional>
#include <fstream>
#include <sstream>

namespace pipesim {
namespace {

using json = nlohmann::json;

/// Large enough for any real config.json or hardware file (a few KiB); a bigger file is not one.
constexpr std::uintmax_t kMaxIncludedBytes = 1 << 20;

/// The JSON object in the file `reference` names (relative to the config `source`); `what` says
/// what the file should be, for the messages.
Result<json> read_included(const json& reference, const std::string& source, std::string_view what,
                           std::filesystem::path& path) {
  if (!reference.is_string()) return Error{fmt::format("expected the path of {}, got {}", what, reference.dump())};
  path = reference.get<std::string>();
  if (path.is_relative()) path = std::filesystem::path(source).parent_path() / path;
  std::error_code error;
  if (!std::filesystem::is_regular_file(path, error))
    return Error{fmt::format("{}: no such file; give the path of {}, relative to this config", path.string(), what)};
  if (std::filesystem::file_size(path, error) > kMaxIncludedBytes)
    return Error{fmt::format("{}: larger than 1 MiB, which no {} is", path.string(), what)};
  std::ifstream file(path);
  std::stringstream text;
  text << file.rdbuf();
  json value = json::parse(text.str(), nullptr, false);
  if (value.is_discarded() || !value.is_object())
    return Error{fmt::format("{}: not a JSON object (expected {})", path.string(), what)};
  return value;
}

/// Puts hf[key] into model[field] unless the config gives the field itself.
Status take_integer(const json& hf, const std::string& key, json& model, const std::string& field, bool required,
                    const std::string& file) {
  if (!hf.contains(key)) {
    if (!required || model.contains(field)) return Status::Ok();
    return Error{fmt::format("{}: {}: missing; pipesim reads Llama/Qwen/Mistral-style config.json files (or give "
                             "model.{} in the config)",
                             file, key, field)};
  }
  const json& v = hf.at(key);
  if (!v.is_number_integer() || v.get<long long>() < 1 || v.get<long long>() > std::numeric_limits<int>::max())
    return Error{fmt::format("{}: {}: expected a positive integer, got {}", file, key, v.dump())};
  if (!model.contains(field)) model[field] = v;
  return Status::Ok();
}

Status take_mlp(const json& hf, json& model, const std::string& file) {
  if (!hf.contains("hidden_act") || model.contains("mlp")) return Status::Ok();
  const json& v = hf.at("hidden_act");
  const std::string act = v.is_string() ? v.get<std::string>() : "";
  if (act == "silu" || act == "swish")
    model["mlp"] = "swiglu";
  else if (act.starts_with("gelu"))
    model["mlp"] = "gelu";
  else
    return Error{fmt::format("{}: hidden_act: {} is not modelled; silu/swish (gated SwiGLU MLP) and gelu variants are "
                             "(or give model.mlp in the config)",
                             file, v.dump())};
  return Status::Ok();
}

/// Removes root[section][key], the reference to an included file, and returns it; nullopt without one.
std::optional<json> take_reference(json& root, const char* section, const char* key) {
  if (!root.is_object() || !root.contains(section) || !root[section].is_object() || !root[section].contains(key))
    return std::nullopt;
  json reference = std::move(root[section][key]);
  root[section].erase(key);
  return reference;
}

}  // namespace

Status expand_hf_config(json& root, const std::string& source) {
  const std::optional<json> reference = take_reference(root, "model", "hf_config");
  if (!reference) return Status::Ok();
  json& model = root["model"];
  std::filesystem::path path;
  Result<json> hf = read_included(*reference, source, "a Hugging Face config.json", path);
  if (!hf.ok()) return hf.error();
  const std::string file = path.string();
  const std::pair<const char*, const char*> required[] = {{"num_hidden_layers", "layers"}, {"hidden_size", "hidden"},
                                                          {"num_attention_heads", "heads"}, {"intermediate_size", "ffn_hidden"},
                                                          {"vocab_size", "vocab"}};
  for (const auto& [key, field] : required)
    if (Status s = take_integer(hf.value(), key, model, field, true, file); !s.ok()) return s;
  if (Status s = take_integer(hf.value(), "num_key_value_heads", model, "kv_heads", false, file); !s.ok()) return s;
  if (hf.value().contains("tie_word_embeddings") && !model.contains("tied_embeddings")) {
    const json& tied = hf.value()["tie_word_embeddings"];
    if (!tied.is_boolean()) return Error{fmt::format("{}: tie_word_embeddings: expected true or false, got {}", file, tied.dump())};
    model["tied_embeddings"] = tied;
  }
  return take_mlp(hf.value(), model, file);
}

Status expand_hardware_file(json& root, const std::string& source) {
  const std::optional<json> reference = take_reference(root, "hardware", "file");
  if (!reference) return Status::Ok();
  json& hardware = root["hardware"];
  std::filesystem::path path;
  Result<json> file = read_included(*reference, source, "a hardware file (as `pipesim calibrate` writes)", path);
  if (!file.ok()) return file.error();
  for (const auto& [key, value] : file.value().items())
    if (key != "description" && key != "generator" && !hardware.contains(key)) hardware[key] = value;
  return Status::Ok();
}

}  // namespace pipesim
