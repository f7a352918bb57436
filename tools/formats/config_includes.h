#pragma once
/// The two places a config refers to another file, each path relative to the config's own directory:
/// `model.hf_config`, a Hugging Face `config.json` as the source of a model's shape, and
/// `hardware.file`, a hardware description such as `pipesim calibrate` writes.
#include <nlohmann/json.hpp>
#include <string>

#include "status.h"

namespace pipesim {

/// Replaces `model.hf_config` in `root` by the model fields it implies (num_hidden_layers -> layers,
/// hidden_size -> hidden, num_attention_heads -> heads, num_key_value_heads -> kv_heads,
/// intermediate_size -> ffn_hidden, vocab_size -> vocab, tie_word_embeddings -> tied_embeddings,
/// hidden_act -> mlp: silu/swish mean the gated SwiGLU MLP of Llama, Qwen and Mistral, gelu variants
/// GPT's). Fields the config's `model` gives itself win. `source` is the config's path. The error
/// names the Hugging Face file and its field.
Status expand_hf_config(nlohmann::json& root, const std::string& source);

/// Replaces `hardware.file` in `root` by the hardware fields in that file (`preset` and any field of
/// the hardware block; its `description` and `generator` are the file's own). Fields the config's
/// `hardware` gives itself win.
Status expand_hardware_file(nlohmann::json& root, const std::string& source);

}  // namespace pipesim
