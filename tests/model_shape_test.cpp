// Real model shapes: a Hugging Face config.json read field by field (explicit config fields win,
// errors name the file and its field), and grouped-query attention and SwiGLU costed as they are --
// FLOPs, parameters and activations re-derived here term by term.
#include <filesystem>
#include <fstream>

#include "helpers.h"
#include "model_math.h"

using namespace pipesim;
using namespace pipesim::testing;

namespace {

/// A directory holding `hf.json` with `hf_text`; the config path to parse against sits beside it.
struct HfDir {
  std::filesystem::path dir;
  explicit HfDir(const std::string& hf_text) {
    dir = std::filesystem::temp_directory_path() / ("pipesim-hf-" + std::to_string(std::hash<std::string>{}(hf_text)));
    std::filesystem::create_directories(dir);
    std::ofstream(dir / "hf.json") << hf_text;
  }
  ~HfDir() { std::filesystem::remove_all(dir); }
  Result<Config> parse(const std::string& model_extra = "") const {
    const std::string text = R"({"model": {"hf_config": "hf.json", "seq_len": 4096)" + model_extra +
                             R"(}, "parallel": {"pp": 4, "microbatches": 8}})";
    return parse_config(text, (dir / "c.json").string());
  }
};

const char* kLlama8b = R"({"num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": 32,
  "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 128256, "hidden_act": "silu",
  "tie_word_embeddings": false, "rope_theta": 500000.0})";

}  // namespace

TEST_CASE("a Hugging Face config.json gives the model's shape") {
  const HfDir hf(kLlama8b);
  const Result<Config> c = hf.parse();
  REQUIRE(c.ok());
  const ModelConfig& m = c.value().model;
  CHECK(m.layers == 32);
  CHECK(m.hidden == 4096);
  CHECK(m.heads == 32);
  CHECK(m.key_value_heads() == 8);
  CHECK(m.ffn_hidden == 14336);
  CHECK(m.vocab == 128256);
  CHECK(m.mlp == MlpKind::SwiGlu);
  CHECK_FALSE(m.tied_embeddings);
  CHECK(m.seq_len == 4096);  // the config's own: config.json has no training sequence length
  // A field the config gives itself wins over the file's.
  const Result<Config> fewer = hf.parse(R"(, "layers": 16, "mlp": "gelu")");
  REQUIRE(fewer.ok());
  CHECK(fewer.value().model.layers == 16);
  CHECK(fewer.value().model.mlp == MlpKind::Gelu);
}

TEST_CASE("a bad Hugging Face config.json is refused naming the file and its field") {
  const std::pair<std::string, std::string> cases[] = {
      {R"({"hidden_size": 64, "num_attention_heads": 4, "intermediate_size": 256, "vocab_size": 100})",
       "num_hidden_layers: missing; pipesim reads Llama/Qwen/Mistral-style config.json files (or give model.layers in "
       "the config)"},
      {R"({"num_hidden_layers": 4, "hidden_size": "64", "num_attention_heads": 4, "intermediate_size": 256, "vocab_size": 100})",
       "hidden_size: expected a positive integer, got \"64\""},
      {R"({"num_hidden_layers": 4, "hidden_size": 64, "num_attention_heads": 4, "intermediate_size": 256, "vocab_size": 100,
           "hidden_act": "relu"})",
       "hidden_act: \"relu\" is not modelled; silu/swish (gated SwiGLU MLP) and gelu variants are (or give model.mlp in "
       "the config)"},
      {R"([1, 2])", "not a JSON object (expected a Hugging Face config.json)"},
  };
  for (const auto& [text, message] : cases) {
    const HfDir hf(text);
    const Result<Config> c = hf.parse();
    INFO(text);
    REQUIRE_FALSE(c.ok());
    const std::string file = (hf.dir / "hf.json").string();
    CHECK(c.error().message == (hf.dir / "c.json").string() + ": model.hf_config: " + file + ": " + message);
  }
  const HfDir nothing("{}");
  const Result<Config> missing = parse_config(R"({"model": {"hf_config": "nowhere.json", "seq_len": 8},
    "parallel": {"microbatches": 1}})", (nothing.dir / "c.json").string());
  REQUIRE_FALSE(missing.ok());
  CHECK_THAT(missing.error().message, Catch::EndsWith("nowhere.json: no such file; give the path of a Hugging Face "
                                                      "config.json, relative to this config"));
}

TEST_CASE("grouped-query attention and SwiGLU are costed term by term") {
  const double b = 2, s = 1024, h = 2048, a = 16, kv = 4, f = 5632, g = kv / a;
  ModelConfig m{.layers = 4, .hidden = int(h), .heads = int(a), .kv_heads = int(kv), .ffn_hidden = int(f),
                .seq_len = int(s), .vocab = 32000, .micro_batch_size = int(b), .mlp = MlpKind::SwiGlu,
                .tied_embeddings = false};
  // Q and O are h×h; K and V are h×(g·h); gate, up and down are h×f: 2 FLOPs per multiply-add.
  CHECK(layer_gemm_flops(m) == Approx(2 * b * s * (h * h + 2 * h * g * h + h * h) + 2 * b * s * 3 * h * f));
  CHECK(layer_attention_flops(m) == Approx(4 * b * s * s * h));  // every query head scores every key
  CHECK(layer_params(m) == Approx(2 * h * h + 2 * g * h * h + 3 * h * f + 2 * h));  // Llama: no biases, 2 RMSNorms
  // Per token and hidden unit: attention 2 (input) + 2 (Q) + 4g (K, V) + 2 (scores' output) + 2 (O input)
  // + 1 (mask) = 7 + 4g; MLP 2 (input) + 6f/h (gate, up, product) + 1 = 3 + 6f/h; two norms 4.
  Config c;  // 2-byte activations, flash attention, no tensor or context parallelism
  c.model = m;
  CHECK(layer_activation_bytes(c) == Approx(b * s * h * ((7 + 4 * g) + (3 + 6 * f / h) + 4)));
  // With every head its own K and V and a GELU MLP of 4h, the figures are GPT's (Korthikanti's 34).
  m.kv_heads = m.heads, m.mlp = MlpKind::Gelu, m.ffn_hidden = 4 * m.hidden;
  CHECK(layer_gemm_flops(m) == Approx(8 * b * s * h * h + 4 * b * s * h * 4 * h));
  CHECK(layer_params(m) == Approx(12 * h * h + 13 * h));
  c.model = m;
  CHECK(layer_activation_bytes(c) == Approx(34 * b * s * h));
}
