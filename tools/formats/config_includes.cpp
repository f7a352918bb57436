#include "config_includes.h"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <limits>
#include <optional>
#include <type_traits>
#include <unordered_set>
#include <vector>

#include "files.h"
#include "spellcheck.h"

namespace pipesim {
namespace {

using json = nlohmann::json;

/// Large enough for any real config.json or hardware file (a few KiB); a bigger file is not one.
constexpr std::size_t kMaxIncludedBytes = std::size_t(1) << 20;

/// nlohmann's document builder, refusing a key twice in one object and keeping where a parse failed.
/// sax_parse calls these members by name, so hiding the builder's is enough.
class StrictBuilder : public nlohmann::detail::json_sax_dom_parser<json> {
 public:
  explicit StrictBuilder(json& root) : json_sax_dom_parser(root, false) {}

  bool start_object(std::size_t size) {
    keys_.emplace_back();
    return deeper() && json_sax_dom_parser::start_object(size);
  }
  bool end_object() {
    keys_.pop_back();
    --depth_;
    return json_sax_dom_parser::end_object();
  }
  bool start_array(std::size_t size) { return deeper() && json_sax_dom_parser::start_array(size); }
  bool end_array() {
    --depth_;
    return json_sax_dom_parser::end_array();
  }
  /// Duplicate keys are refused: JSON readers disagree on which one wins, so the file is ambiguous.
  bool key(std::string& key) {
    if (!keys_.back().insert(key).second) {
      failure_ = fmt::format("key \"{}\" appears twice in one object; keep one", visible(abbreviate(key)));
      return false;
    }
    return json_sax_dom_parser::key(key);
  }
  template <class Exception>
  bool parse_error(std::size_t position, const std::string& token, const Exception& e) {
    position_ = position;
    token_ = token;
    if constexpr (std::is_same_v<Exception, nlohmann::detail::out_of_range>) {
      number_overflow_ = true;
    }
    const std::string what = e.what();
    failure_ = what.substr(what.find(':') + 2);
    return false;
  }

  /// The message after a failed parse of `text`.
  std::string message(std::string_view text, const std::string& source) const {
    if (!position_) return fmt::format("{}: {}", source, failure_);  // a duplicate key
    // The parser stops just past what it could not take: point at the last byte it read, or at the
    // start of a number (its token is the number alone; others hold what came before too).
    const std::size_t last = *position_ > 0 ? *position_ - 1 : 0;
    if (number_overflow_)
      return fmt::format("{}: a number out of range: {} is beyond what a double holds (about 1.8e308)",
                         text_position(text, *position_ - std::min(*position_, token_.size()), source),
                         visible(abbreviate(token_)));
    if (failure_.ends_with("; expected end of input"))
      return fmt::format("{}: unexpected text after the JSON value; a file holds one value (remove what follows it)",
                         text_position(text, last, source));
    return fmt::format("{}: invalid JSON: {}", text_position(text, last, source), visible(failure_));
  }

 private:
  /// too_deep has refused deeper text before parsing; this only keeps the builder honest.
  bool deeper() {
    if (++depth_ <= kMaxJsonDepth) return true;
    failure_ = fmt::format("nesting deeper than {} levels", kMaxJsonDepth);
    return false;
  }

  std::vector<std::unordered_set<std::string>> keys_;  ///< per open object, the keys seen so far
  int depth_ = 0;
  std::string failure_;
  std::optional<std::size_t> position_;  ///< bytes read when the parser failed; none for a duplicate key
  std::string token_;
  bool number_overflow_ = false;
};

/// One level of the path that too_deep names.
struct Frame {
  bool object = false;
  bool want_key = false;  ///< in an object, the next string is a key
  std::string_view key;
  std::size_t index = 0;  ///< in an array, the element's index
};

std::string path_of(const std::vector<Frame>& frames) {
  constexpr std::size_t kShown = 4;  // enough to name the field; the rest is more of the same
  std::string path;
  for (std::size_t i = 0; i < frames.size() && i < kShown; ++i) {
    if (!frames[i].object) path += fmt::format("[{}]", frames[i].index);
    else path += (path.empty() ? "" : ".") + visible(abbreviate(frames[i].key));
  }
  return frames.size() > kShown ? path + "..." : path;
}

/// The JSON object in the file `reference` names (relative to the config `source`); `what` says
/// what the file should be, for the messages.
Result<json> read_included(const json& reference, const std::string& source, std::string_view what,
                           std::string_view nesting, std::filesystem::path& path) {
  if (!reference.is_string()) return Error{fmt::format("expected the path of {}, got {}", what, describe_json(reference))};
  path = reference.get<std::string>();
  if (path.is_relative()) path = std::filesystem::path(source).parent_path() / path;
  std::error_code error;
  if (!std::filesystem::exists(path, error))
    return Error{fmt::format("{}: no such file; give the path of {}, relative to this config", path.string(), what)};
  Result<std::string> text = read_text_file(path.string(), kMaxIncludedBytes);
  if (!text.ok()) return text.error();
  Result<json> value = parse_json_text(text.value(), path.string(), nesting);
  if (!value.ok()) return value.error();
  if (!value.value().is_object())
    return Error{fmt::format("{}: not a JSON object (expected {})", path.string(), what)};
  return value;
}

/// Puts hf[key] into model[field] unless the config gives the field itself.
Status take_integer(const json& hf, const std::string& key, json& model, const std::string& field, bool required,
                    const std::string& file, FieldOrigins& origins) {
  if (!hf.contains(key)) {
    if (!required || model.contains(field)) return Status::Ok();
    return Error{fmt::format("{}: {}: missing; pipesim reads Llama/Qwen/Mistral-style config.json files (or give "
                             "model.{} in the config)",
                             file, key, field)};
  }
  const json& v = hf.at(key);
  if (!v.is_number_integer() || v.get<long long>() < 1 || v.get<long long>() > std::numeric_limits<int>::max())
    return Error{fmt::format("{}: {}: expected a positive integer, got {}", file, key, describe_json(v))};
  if (!model.contains(field)) {
    model[field] = v;
    origins["model." + field] = file + " " + key;
  }
  return Status::Ok();
}

Status take_mlp(const json& hf, json& model, const std::string& file, FieldOrigins& origins) {
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
                             file, describe_json(v))};
  origins["model.mlp"] = file + " hidden_act";
  return Status::Ok();
}

/// The attention's widths where a config.json gives them: head_dim (Qwen3's heads are wider than
/// hidden / heads), and DeepSeek-V2/V3's multi-head latent attention.
Status take_attention(const json& hf, json& model, const std::string& file, FieldOrigins& origins) {
  const bool latent = hf.contains("kv_lora_rank") && !hf.at("kv_lora_rank").is_null();
  if (!latent) return take_integer(hf, "head_dim", model, "head_dim", false, file, origins);
  for (const char* key : {"kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"})
    if (Status s = take_integer(hf, key, model, key, true, file, origins); !s.ok()) return s;
  if (hf.contains("q_lora_rank") && !hf.at("q_lora_rank").is_null())
    return take_integer(hf, "q_lora_rank", model, "q_lora_rank", false, file, origins);
  return Status::Ok();
}

/// A mixture-of-experts config.json: Mixtral names its experts num_local_experts, Qwen-MoE
/// num_experts (with moe_intermediate_size, decoder_sparse_step, mlp_only_layers and, Qwen2-MoE,
/// shared_expert_intermediate_size), DeepSeek n_routed_experts (with n_shared_experts and
/// first_k_dense_replace); all route num_experts_per_tok of them.
Status take_experts(const json& hf, json& model, const std::string& file, FieldOrigins& origins) {
  const char* experts = nullptr;
  for (const char* key : {"num_local_experts", "num_experts", "n_routed_experts"})
    if (hf.contains(key) && !hf.at(key).is_null() && !(hf.at(key).is_number_integer() && hf.at(key).get<long long>() <= 1))
      experts = key;
  if (!experts) return Status::Ok();
  for (const auto& [key, field] : {std::pair{experts, "num_experts"}, std::pair{"num_experts_per_tok", "moe_router_topk"},
                                   std::pair{"moe_intermediate_size", "moe_ffn_hidden_size"},
                                   std::pair{"shared_expert_intermediate_size", "moe_shared_expert_intermediate_size"}})
    if (Status s = take_integer(hf, key, model, field, false, file, origins); !s.ok()) return s;
  // DeepSeek: n_shared_experts experts as wide as the routed ones, always used: one shared MLP.
  if (hf.contains("n_shared_experts") && hf.at("n_shared_experts").is_number_integer() &&
      !model.contains("moe_shared_expert_intermediate_size") && hf.contains("moe_intermediate_size") &&
      hf.at("moe_intermediate_size").is_number_integer()) {
    model["moe_shared_expert_intermediate_size"] =
        hf.at("n_shared_experts").get<long long>() * hf.at("moe_intermediate_size").get<long long>();
    origins["model.moe_shared_expert_intermediate_size"] = file + " n_shared_experts x moe_intermediate_size";
  }
  // DeepSeek: experts in n_group groups, a token's from topk_group of them (node-limited routing).
  if (hf.contains("n_group") && hf.at("n_group").is_number_integer() && hf.at("n_group").get<long long>() > 1)
    for (const auto& [key, field] : {std::pair{"n_group", "moe_router_num_groups"}, std::pair{"topk_group", "moe_router_group_topk"}})
      if (Status s = take_integer(hf, key, model, field, true, file, origins); !s.ok()) return s;
  if (model.contains("moe_layer_freq")) return Status::Ok();
  const long long layers = model.value("layers", 0LL);
  // DeepSeek: the first first_k_dense_replace layers dense.
  if (hf.contains("first_k_dense_replace")) {
    const json& v = hf.at("first_k_dense_replace");
    if (!v.is_number_integer() || v.get<long long>() < 0 || v.get<long long>() > layers)
      return Error{fmt::format("{}: first_k_dense_replace: expected a layer count of at most {}, got {}", file, layers,
                               describe_json(v))};
    json pattern = json::array();
    for (long long l = 0; l < layers; ++l) pattern.push_back(l < v.get<long long>() ? 0 : 1);
    model["moe_layer_freq"] = pattern;
    origins["model.moe_layer_freq"] = file + " first_k_dense_replace";
    return Status::Ok();
  }
  // Qwen-MoE: layer i is MoE when (i + 1) % decoder_sparse_step == 0 and i is not in mlp_only_layers.
  long long step = 1;
  if (hf.contains("decoder_sparse_step")) {
    const json& v = hf.at("decoder_sparse_step");
    if (!v.is_number_integer() || v.get<long long>() < 1)
      return Error{fmt::format("{}: decoder_sparse_step: expected a positive integer, got {}", file, describe_json(v))};
    step = v.get<long long>();
  }
  const json dense = hf.value("mlp_only_layers", json::array());
  if (!dense.is_array())
    return Error{fmt::format("{}: mlp_only_layers: expected a list of layer numbers, got {}", file, describe_json(dense))};
  if (step == 1 && dense.empty()) return Status::Ok();
  json pattern = json::array();
  for (long long l = 0; l < layers; ++l) pattern.push_back((l + 1) % step == 0 ? 1 : 0);
  for (const json& l : dense) {
    if (!l.is_number_integer() || l.get<long long>() < 0 || l.get<long long>() >= layers)
      return Error{fmt::format("{}: mlp_only_layers: {} is not a layer of {}", file, describe_json(l), layers)};
    pattern[std::size_t(l.get<long long>())] = 0;
  }
  model["moe_layer_freq"] = pattern;
  origins["model.moe_layer_freq"] = file + " decoder_sparse_step, mlp_only_layers";
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

std::string text_position(std::string_view text, std::size_t offset, const std::string& file) {
  std::size_t line = 1, column = 1;
  for (std::size_t i = 0; i < offset && i < text.size(); ++i) {
    if (text[i] == '\n') ++line, column = 1;
    else ++column;
  }
  return fmt::format("{}:{}:{}", file, line, column);
}

std::optional<TooDeep> too_deep(std::string_view text) {
  std::vector<Frame> frames;
  for (std::size_t i = 0; i < text.size(); ++i) {
    switch (text[i]) {
      case '"': {  // a string: skipped whole, so that brackets inside it do not count
        const std::size_t start = ++i;
        while (i < text.size() && text[i] != '"') i += text[i] == '\\' ? 2 : 1;
        if (!frames.empty() && frames.back().want_key)
          frames.back().key = text.substr(start, std::min(i, text.size()) - start);
        break;
      }
      case '{':
      case '[':
        if (frames.size() == std::size_t(kMaxJsonDepth)) return TooDeep{path_of(frames), i};
        frames.push_back({text[i] == '{', text[i] == '{', {}, 0});
        break;
      case '}':
      case ']':
        if (!frames.empty()) frames.pop_back();
        break;
      case ':':
        if (!frames.empty()) frames.back().want_key = false;
        break;
      case ',':
        if (!frames.empty()) (frames.back().object ? frames.back().want_key = true : bool(++frames.back().index));
        break;
      default: break;
    }
  }
  return std::nullopt;
}

Result<json> parse_json_text(std::string_view text, const std::string& source, std::string_view nesting) {
  // nlohmann takes a NUL for the end of the text: whatever follows it would be silently ignored.
  if (const std::size_t nul = text.find('\0'); nul != std::string_view::npos)
    return Error{fmt::format("{}: a NUL byte at offset {}; JSON is text and has none (is it the right file?)",
                             text_position(text, nul, source), nul)};
  if (const std::optional<TooDeep> deep = too_deep(text))
    return Error{fmt::format("{}: {}nesting deeper than {} levels; {}", text_position(text, deep->offset, source),
                             deep->path.empty() ? "" : deep->path + ": ", kMaxJsonDepth, nesting)};
  json root;
  StrictBuilder builder(root);
  if (!json::sax_parse(text, &builder)) return Error{builder.message(text, source)};
  return root;
}

std::string describe_json(const json& value) {
  if (value.is_string()) {  // quoted as JSON would, with anything not printable ASCII as \xNN
    std::string quoted = "\"";
    for (const char c : visible(abbreviate(value.get<std::string>()))) quoted += c == '"' ? "\\\"" : std::string(1, c);
    return quoted + "\"";
  }
  if (value.is_array()) return "an array";
  if (value.is_object()) return "an object";
  return value.dump();  // a number, true, false or null
}

Status expand_hf_config(json& root, const std::string& source, FieldOrigins& origins) {
  const std::optional<json> reference = take_reference(root, "model", "hf_config");
  if (!reference) return Status::Ok();
  json& model = root["model"];
  std::filesystem::path path;
  Result<json> hf = read_included(*reference, source, "a Hugging Face config.json",
                                  "a Hugging Face config.json nests a few levels", path);
  if (!hf.ok()) return hf.error();
  const std::string file = path.string();
  const std::pair<const char*, const char*> required[] = {{"num_hidden_layers", "layers"}, {"hidden_size", "hidden"},
                                                          {"num_attention_heads", "heads"}, {"intermediate_size", "ffn_hidden"},
                                                          {"vocab_size", "vocab"}};
  for (const auto& [key, field] : required)
    if (Status s = take_integer(hf.value(), key, model, field, true, file, origins); !s.ok()) return s;
  if (Status s = take_integer(hf.value(), "num_key_value_heads", model, "kv_heads", false, file, origins); !s.ok())
    return s;
  if (Status s = take_attention(hf.value(), model, file, origins); !s.ok()) return s;
  if (Status s = take_experts(hf.value(), model, file, origins); !s.ok()) return s;
  if (hf.value().contains("tie_word_embeddings") && !model.contains("tied_embeddings")) {
    const json& tied = hf.value()["tie_word_embeddings"];
    if (!tied.is_boolean())
      return Error{fmt::format("{}: tie_word_embeddings: expected true or false, got {}", file, describe_json(tied))};
    model["tied_embeddings"] = tied;
    origins["model.tied_embeddings"] = file + " tie_word_embeddings";
  }
  return take_mlp(hf.value(), model, file, origins);
}

Status expand_hardware_file(json& root, const std::string& source, FieldOrigins& origins) {
  const std::optional<json> reference = take_reference(root, "hardware", "file");
  if (!reference) return Status::Ok();
  json& hardware = root["hardware"];
  std::filesystem::path path;
  Result<json> file = read_included(*reference, source, "a hardware file (as `pipesim calibrate` writes)",
                                    "a hardware file is one object of numbers", path);
  if (!file.ok()) return file.error();
  for (const auto& [key, value] : file.value().items())
    if (key != "description" && key != "generator" && !hardware.contains(key)) {
      hardware[key] = value;
      origins["hardware." + key] = path.string();
    }
  return Status::Ok();
}

}  // namespace pipesim
