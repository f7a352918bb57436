#pragma once
/// `model.hf_config`: a Hugging Face `config.json` as the source of a model's shape. The one place a
/// config refers to another file: the path is relative to the config's own directory.
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

}  // namespace pipesim
