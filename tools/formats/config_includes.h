#pragma once
/// The two places a config refers to another file, each path relative to the config's own directory:
/// `model.hf_config`, a Hugging Face `config.json` as the source of a model's shape, and
/// `hardware.file`, a hardware description such as `pipesim calibrate` writes. Also the strict JSON
/// reader that configs, those files and profiles all go through.
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

#include "status.h"

namespace pipesim {

/// How deep any JSON document pipesim reads may nest. A config nests 3 levels (the top, a section,
/// an array of per-device costs) and a Hugging Face config.json a few; the bound keeps the copies and
/// dumps of a document, which recurse, far from the end of the stack (60,000 `[` overflowed it).
constexpr int kMaxJsonDepth = 64;

/// `text` as one JSON document, refusing what JSON readers disagree on or pipesim cannot hold, each
/// with `source`, line and column: a NUL byte (nothing after it would be read), nesting deeper than
/// kMaxJsonDepth (named by the path to it; `nesting` says how deep a good `source` goes), a key twice
/// in one object, a number beyond a double, text after the value, and any syntax error.
Result<nlohmann::json> parse_json_text(std::string_view text, const std::string& source, std::string_view nesting);

/// The path to the first `[` or `{` of `text` nested deeper than kMaxJsonDepth ("model.x[0]...")
/// and its byte offset, found without building anything; nullopt when none is.
struct TooDeep {
  std::string path;  ///< empty when the top-level value itself is the array
  std::size_t offset = 0;
};
std::optional<TooDeep> too_deep(std::string_view text);

/// `file:line:column` of the byte at `offset` of `text`.
std::string text_position(std::string_view text, std::size_t offset, const std::string& file);

/// A JSON value for a message: strings quoted and cut to 40 bytes, arrays and objects by kind.
std::string describe_json(const nlohmann::json& value);

/// Where config fields taken from an included file came from: the config path ("model.layers") ->
/// the file and its key ("llama.json num_hidden_layers"), so that an error in a value the config
/// did not give itself names the file that did.
using FieldOrigins = std::map<std::string, std::string>;

/// Replaces `model.hf_config` in `root` by the model fields it implies (num_hidden_layers -> layers,
/// hidden_size -> hidden, num_attention_heads -> heads, num_key_value_heads -> kv_heads,
/// intermediate_size -> ffn_hidden, vocab_size -> vocab, tie_word_embeddings -> tied_embeddings,
/// hidden_act -> mlp: silu/swish mean the gated SwiGLU MLP of Llama, Qwen and Mistral, gelu variants
/// GPT's). Fields the config's `model` gives itself win. `source` is the config's path. The error
/// names the Hugging Face file and its field; `origins` gets each field taken from it.
Status expand_hf_config(nlohmann::json& root, const std::string& source, FieldOrigins& origins);

/// Replaces `hardware.file` in `root` by the hardware fields in that file (`preset` and any field of
/// the hardware block; its `description` and `generator` are the file's own). Fields the config's
/// `hardware` gives itself win; `origins` gets each field taken from the file.
Status expand_hardware_file(nlohmann::json& root, const std::string& source, FieldOrigins& origins);

}  // namespace pipesim
