#include "model/model_config.h"

#include <algorithm>
#include <cmath>

#include <gtest/gtest.h>

#include "model/gguf.h"
#include "tests/default_model_file.h"
#include "tests/model/loader_test_util.h"

namespace tessera {
namespace {

using loader_test::GgufBuilder;
using loader_test::TempDir;

constexpr const char* kLlama3 = R"({
  "architectures": ["LlamaForCausalLM"], "model_type": "llama",
  "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
  "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 128256,
  "max_position_embeddings": 131072, "rms_norm_eps": 1e-05, "rope_theta": 500000.0,
  "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                   "original_max_position_embeddings": 8192, "rope_type": "llama3"},
  "tie_word_embeddings": false, "bos_token_id": 128000,
  "eos_token_id": [128001, 128008, 128009], "hidden_act": "silu", "torch_dtype": "bfloat16"
})";

constexpr const char* kMistral = R"({
  "architectures": ["MistralForCausalLM"], "hidden_size": 4096, "num_hidden_layers": 32,
  "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 14336,
  "vocab_size": 32000, "max_position_embeddings": 32768, "rms_norm_eps": 1e-05,
  "rope_theta": 10000.0, "sliding_window": 4096, "bos_token_id": 1, "eos_token_id": 2
})";

constexpr const char* kQwen2 = R"({
  "architectures": ["Qwen2ForCausalLM"], "hidden_size": 896, "num_hidden_layers": 24,
  "num_attention_heads": 14, "num_key_value_heads": 2, "intermediate_size": 4864,
  "vocab_size": 151936, "max_position_embeddings": 32768, "rms_norm_eps": 1e-06,
  "rope_theta": 1000000.0, "sliding_window": 32768, "use_sliding_window": false,
  "max_window_layers": 21, "tie_word_embeddings": true, "bos_token_id": 151643,
  "eos_token_id": 151645, "hidden_act": "silu"
})";

constexpr const char* kQwen3 = R"({
  "architectures": ["Qwen3ForCausalLM"], "hidden_size": 1024, "num_hidden_layers": 28,
  "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128,
  "intermediate_size": 3072, "vocab_size": 151936, "max_position_embeddings": 40960,
  "rms_norm_eps": 1e-06, "rope_theta": 1000000, "rope_scaling": null,
  "attention_bias": false, "tie_word_embeddings": true, "bos_token_id": 151643,
  "eos_token_id": 151645, "sliding_window": null, "use_sliding_window": false
})";

ModelConfig parse_ok(const std::string& text) {
  auto r = parse_hf_config(text, "config.json");
  EXPECT_TRUE(r.is_ok()) << r.status().to_string();
  if (!r.is_ok()) return {};
  EXPECT_TRUE(r->validate("config.json").is_ok()) << r->validate("config.json").to_string();
  return *r;
}

std::string with_field(const char* base, const std::string& key, const nlohmann::json& value) {
  auto j = nlohmann::json::parse(base);
  j[key] = value;
  return j.dump();
}
std::string without_field(const char* base, const std::string& key) {
  auto j = nlohmann::json::parse(base);
  j.erase(key);
  return j.dump();
}

TEST(ModelConfig, Stories260KHfConfig) {
  TESSERA_REQUIRE_STORIES();
  auto r = load_hf_config(loader_test::stories_dir() + "/hf/config.json");
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  const ModelConfig& c = *r;
  EXPECT_EQ(c.arch, Architecture::kLlama);
  EXPECT_EQ(c.hidden, 64);
  EXPECT_EQ(c.n_layers, 5);
  EXPECT_EQ(c.n_heads, 8);
  EXPECT_EQ(c.n_kv_heads, 4);
  EXPECT_EQ(c.head_dim, 8);
  EXPECT_EQ(c.ffn, 172);
  EXPECT_EQ(c.vocab, 512);
  EXPECT_EQ(c.max_positions, 512);
  EXPECT_FLOAT_EQ(c.rms_eps, 1e-5f);
  EXPECT_FLOAT_EQ(c.rope_theta, 10000.0f);
  EXPECT_EQ(c.rope_scaling.type, RopeScalingType::kNone);
  EXPECT_TRUE(c.tie_embeddings);
  EXPECT_FALSE(c.qkv_bias);
  EXPECT_FALSE(c.qk_norm);
  EXPECT_EQ(c.sliding_window, 0);
  EXPECT_EQ(c.bos_id, 1);
  EXPECT_EQ(c.eos_ids, std::vector<int32_t>{2});
  EXPECT_TRUE(c.validate("config.json").is_ok());
}

TEST(ModelConfig, Llama3WithRopeScaling) {
  const ModelConfig c = parse_ok(kLlama3);
  EXPECT_EQ(c.arch, Architecture::kLlama);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.n_kv_heads, 8);
  EXPECT_FALSE(c.tie_embeddings);
  EXPECT_EQ(c.bos_id, 128000);
  EXPECT_EQ(c.eos_ids, (std::vector<int32_t>{128001, 128008, 128009}));
  EXPECT_EQ(c.rope_scaling.type, RopeScalingType::kLlama3);
  EXPECT_FLOAT_EQ(c.rope_scaling.factor, 8.0f);
  EXPECT_FLOAT_EQ(c.rope_scaling.low_freq_factor, 1.0f);
  EXPECT_FLOAT_EQ(c.rope_scaling.high_freq_factor, 4.0f);
  EXPECT_EQ(c.rope_scaling.original_max_position, 8192);
}

TEST(ModelConfig, Llama3RopeInvFreq) {
  const ModelConfig c = parse_ok(kLlama3);
  const std::vector<float> f = rope_inv_freq(c);
  ASSERT_EQ(f.size(), 64u);
  // Expected values computed offline in float64 from the published llama3 formula:
  // high frequencies unchanged, low ones divided by the factor, a smooth blend in between.
  const std::pair<int, double> expected[] = {
      {0, 1.0},
      {20, 0.016560440080994446},
      {28, 0.0032114459947525913},
      {29, 0.002166570763503359},
      {31, 0.0008567514129196321},
      {34, 0.00017850781276799638},
      {36, 7.78465527393245e-05},
      {60, 5.677088100759837e-07},
  };
  for (const auto& [i, v] : expected)
    EXPECT_NEAR(f[static_cast<size_t>(i)], v, 1e-6 * v) << "index " << i;
}

TEST(ModelConfig, RopeInvFreqPlainAndLinear) {
  ModelConfig c = parse_ok(kMistral);
  std::vector<float> f = rope_inv_freq(c);
  ASSERT_EQ(f.size(), 64u);
  for (size_t i = 0; i < f.size(); ++i)
    EXPECT_NEAR(f[i], std::pow(10000.0, -2.0 * static_cast<double>(i) / 128.0), 1e-6 * f[i]);

  auto j = nlohmann::json::parse(kMistral);
  j["rope_scaling"] = {{"type", "linear"}, {"factor", 4.0}};
  c = parse_ok(j.dump());
  EXPECT_EQ(c.rope_scaling.type, RopeScalingType::kLinear);
  EXPECT_FLOAT_EQ(c.rope_scaling.factor, 4.0f);
  const std::vector<float> g = rope_inv_freq(c);
  for (size_t i = 0; i < g.size(); ++i) EXPECT_FLOAT_EQ(g[i], f[i] / 4.0f);

  // "rope_type": "default" means no scaling.
  j["rope_scaling"] = {{"rope_type", "default"}};
  EXPECT_EQ(parse_ok(j.dump()).rope_scaling.type, RopeScalingType::kNone);
}

TEST(ModelConfig, MistralSlidingWindow) {
  ModelConfig c = parse_ok(kMistral);
  EXPECT_EQ(c.arch, Architecture::kMistral);
  EXPECT_EQ(c.sliding_window, 4096);
  EXPECT_EQ(c.n_kv_heads, 8);
  EXPECT_FALSE(c.tie_embeddings);
  c = parse_ok(with_field(kMistral, "sliding_window", nlohmann::json::value_t::null));
  EXPECT_EQ(c.sliding_window, 0);
}

TEST(ModelConfig, Qwen2HasQkvBiasAndNoWindowUnlessEnabled) {
  ModelConfig c = parse_ok(kQwen2);
  EXPECT_EQ(c.arch, Architecture::kQwen2);
  EXPECT_TRUE(c.qkv_bias);
  EXPECT_FALSE(c.qk_norm);
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_EQ(c.sliding_window, 0);
  EXPECT_TRUE(c.tie_embeddings);
  EXPECT_FLOAT_EQ(c.rope_theta, 1e6f);
  EXPECT_FLOAT_EQ(c.rms_eps, 1e-6f);
  c = parse_ok(with_field(kQwen2, "use_sliding_window", true));
  EXPECT_EQ(c.sliding_window, 32768);
}

TEST(ModelConfig, Qwen3HeadDimAndQkNorm) {
  const ModelConfig c = parse_ok(kQwen3);
  EXPECT_EQ(c.arch, Architecture::kQwen3);
  EXPECT_EQ(c.head_dim, 128);  // not hidden / heads = 64
  EXPECT_TRUE(c.qk_norm);
  EXPECT_FALSE(c.qkv_bias);
  EXPECT_EQ(c.sliding_window, 0);
}

TEST(ModelConfig, DefaultsForOptionalFields) {
  auto j = nlohmann::json::parse(kMistral);
  j.erase("num_key_value_heads");
  j.erase("rope_theta");
  j.erase("bos_token_id");
  j.erase("eos_token_id");
  const ModelConfig c = parse_ok(j.dump());
  EXPECT_EQ(c.n_kv_heads, 32);
  EXPECT_FLOAT_EQ(c.rope_theta, 10000.0f);
  EXPECT_EQ(c.bos_id, -1);
  EXPECT_TRUE(c.eos_ids.empty());
  EXPECT_FALSE(c.tie_embeddings);
}

TEST(ModelConfig, ModelTypeFallback) {
  auto j = nlohmann::json::parse(kQwen3);
  j.erase("architectures");
  j["model_type"] = "qwen3";
  EXPECT_EQ(parse_ok(j.dump()).arch, Architecture::kQwen3);
  j["model_type"] = "gpt2";
  auto r = parse_hf_config(j.dump(), "x/config.json");
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), StatusCode::kUnimplemented);
  EXPECT_NE(r.status().message().find("gpt2"), std::string::npos);
  j.erase("model_type");
  r = parse_hf_config(j.dump(), "x/config.json");
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("architectures"), std::string::npos);
}

TEST(ModelConfig, UnknownArchitectureNamesFileAndArchitecture) {
  auto r = parse_hf_config(with_field(kMistral, "architectures", {"GPTNeoXForCausalLM"}),
                           "models/neox/config.json");
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), StatusCode::kUnimplemented);
  EXPECT_NE(r.status().message().find("models/neox/config.json"), std::string::npos);
  EXPECT_NE(r.status().message().find("'GPTNeoXForCausalLM'"), std::string::npos);
}

TEST(ModelConfig, MissingAndInvalidFieldsNameFileAndField) {
  for (const char* field : {"hidden_size", "num_hidden_layers", "num_attention_heads",
                            "intermediate_size", "vocab_size", "max_position_embeddings"}) {
    auto r = parse_hf_config(without_field(kLlama3, field), "m/config.json");
    ASSERT_FALSE(r.is_ok()) << field;
    EXPECT_EQ(r.status().message(), std::string("m/config.json: missing field '") + field + "'");
  }
  auto r = parse_hf_config(with_field(kLlama3, "hidden_size", "big"), "m/config.json");
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("'hidden_size'"), std::string::npos);
  EXPECT_NE(r.status().message().find("m/config.json"), std::string::npos);
  r = parse_hf_config(with_field(kLlama3, "rms_norm_eps", "tiny"), "m/config.json");
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("'rms_norm_eps'"), std::string::npos);
  r = parse_hf_config(with_field(kLlama3, "eos_token_id", {1, "two"}), "m/config.json");
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("'eos_token_id'"), std::string::npos);
  r = parse_hf_config(with_field(kLlama3, "tie_word_embeddings", 3), "m/config.json");
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("'tie_word_embeddings'"), std::string::npos);
  // An integral float is accepted as an integer.
  EXPECT_EQ(parse_ok(with_field(kLlama3, "hidden_size", 4096.0)).hidden, 4096);
}

TEST(ModelConfig, RopeScalingErrors) {
  auto j = nlohmann::json::parse(kLlama3);
  j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}};
  auto r = parse_hf_config(j.dump(), "c.json");
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), StatusCode::kUnimplemented);
  EXPECT_NE(r.status().message().find("yarn"), std::string::npos);
  j["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 8.0}};
  r = parse_hf_config(j.dump(), "c.json");
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("low_freq_factor"), std::string::npos);
  j["rope_scaling"] = 5;
  EXPECT_FALSE(parse_hf_config(j.dump(), "c.json").is_ok());
}

TEST(ModelConfig, InvalidJson) {
  for (const char* text : {"", "{", "[1,2]", "{\"hidden_size\": }", "null", "\xff\xfe"}) {
    auto r = parse_hf_config(text, "bad.json");
    ASSERT_FALSE(r.is_ok()) << text;
    EXPECT_NE(r.status().message().find("bad.json"), std::string::npos);
  }
  auto r = load_hf_config("/nonexistent/dir/config.json");
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("/nonexistent/dir/config.json"), std::string::npos);
}

TEST(ModelConfig, UnsupportedFeaturesAreRefused) {
  EXPECT_EQ(parse_hf_config(with_field(kLlama3, "hidden_act", "gelu"), "c").status().code(),
            StatusCode::kUnimplemented);
  EXPECT_EQ(parse_hf_config(with_field(kLlama3, "attention_bias", true), "c").status().code(),
            StatusCode::kUnimplemented);
  EXPECT_EQ(parse_hf_config(with_field(kLlama3, "mlp_bias", true), "c").status().code(),
            StatusCode::kUnimplemented);
}

TEST(ModelConfig, ValidateCatchesInconsistentValues) {
  const ModelConfig good = parse_ok(kLlama3);
  auto expect_bad = [&](auto mutate, const char* needle) {
    ModelConfig c = good;
    mutate(c);
    Status s = c.validate("cfg.json");
    ASSERT_FALSE(s.is_ok()) << needle;
    EXPECT_NE(s.message().find("cfg.json"), std::string::npos) << s.message();
    EXPECT_NE(s.message().find(needle), std::string::npos) << s.message();
  };
  expect_bad([](ModelConfig& c) { c.hidden = 0; }, "hidden_size");
  expect_bad([](ModelConfig& c) { c.n_layers = -1; }, "num_hidden_layers");
  expect_bad([](ModelConfig& c) { c.n_kv_heads = 5; }, "num_key_value_heads");
  expect_bad([](ModelConfig& c) { c.head_dim = 7; }, "head_dim");
  expect_bad([](ModelConfig& c) { c.ffn = 0; }, "intermediate_size");
  expect_bad([](ModelConfig& c) { c.vocab = 0; }, "vocab_size");
  expect_bad([](ModelConfig& c) { c.rms_eps = 0; }, "rms_norm_eps");
  expect_bad([](ModelConfig& c) { c.rope_theta = NAN; }, "rope_theta");
  expect_bad([](ModelConfig& c) { c.eos_ids.push_back(200000); }, "eos_token_id");
  expect_bad([](ModelConfig& c) { c.bos_id = 128256; }, "bos_token_id");
  expect_bad([](ModelConfig& c) { c.rope_scaling.high_freq_factor = 0.5f; }, "rope_scaling");
  expect_bad([](ModelConfig& c) { c.hidden = int64_t{1} << 40; }, "hidden_size");
}

TEST(ModelConfig, ArchitectureNames) {
  EXPECT_EQ(architecture_name(Architecture::kLlama), "llama");
  EXPECT_EQ(architecture_name(Architecture::kMistral), "mistral");
  EXPECT_EQ(architecture_name(Architecture::kQwen2), "qwen2");
  EXPECT_EQ(architecture_name(Architecture::kQwen3), "qwen3");
}

// ---- GGUF metadata ----

TEST(ModelConfigGguf, Stories260KMatchesHfConfig) {
  TESSERA_REQUIRE_STORIES();
  auto hf = load_hf_config(loader_test::stories_dir() + "/hf/config.json");
  ASSERT_TRUE(hf.is_ok());
  for (const char* name : {"stories260K-f32.gguf", "stories260K.ggml-org.gguf"}) {
    SCOPED_TRACE(name);
    auto g = GgufFile::open(loader_test::stories_dir() + "/" + name);
    ASSERT_TRUE(g.is_ok()) << g.status().to_string();
    auto r = config_from_gguf(**g);
    ASSERT_TRUE(r.is_ok()) << r.status().to_string();
    const ModelConfig& c = *r;
    EXPECT_EQ(c.arch, hf->arch);
    EXPECT_EQ(c.hidden, hf->hidden);
    EXPECT_EQ(c.n_layers, hf->n_layers);
    EXPECT_EQ(c.n_heads, hf->n_heads);
    EXPECT_EQ(c.n_kv_heads, hf->n_kv_heads);
    EXPECT_EQ(c.head_dim, hf->head_dim);
    EXPECT_EQ(c.ffn, hf->ffn);
    EXPECT_EQ(c.vocab, hf->vocab);
    EXPECT_FLOAT_EQ(c.rms_eps, hf->rms_eps);
    EXPECT_FLOAT_EQ(c.rope_theta, hf->rope_theta);
    EXPECT_EQ(c.bos_id, hf->bos_id);
    EXPECT_EQ(c.eos_ids, hf->eos_ids);
    EXPECT_TRUE(c.validate(name).is_ok());
  }
  auto f32 = GgufFile::open(loader_test::stories_dir() + "/stories260K-f32.gguf");
  EXPECT_TRUE(config_from_gguf(**f32)->tie_embeddings);
  EXPECT_EQ(config_from_gguf(**f32)->max_positions, 512);
  auto org = GgufFile::open(loader_test::stories_dir() + "/stories260K.ggml-org.gguf");
  EXPECT_FALSE(config_from_gguf(**org)->tie_embeddings);  // it carries output.weight
  EXPECT_EQ(config_from_gguf(**org)->max_positions, 2048);
}

GgufBuilder base_gguf(const std::string& arch, uint32_t layers = 2, uint32_t bos = 1) {
  GgufBuilder b;
  b.kv_str("general.architecture", arch)
      .kv_u32(arch + ".embedding_length", 256)
      .kv_u32(arch + ".block_count", layers)
      .kv_u32(arch + ".attention.head_count", 4)
      .kv_u32(arch + ".attention.head_count_kv", 2)
      .kv_u32(arch + ".feed_forward_length", 512)
      .kv_u32(arch + ".context_length", 4096)
      .kv_f32(arch + ".attention.layer_norm_rms_epsilon", 1e-6f)
      .kv_f32(arch + ".rope.freq_base", 1e6f)
      .kv_u32(arch + ".vocab_size", 1000)
      .kv_u32("tokenizer.ggml.bos_token_id", bos)
      .kv_u32("tokenizer.ggml.eos_token_id", 2)
      .kv_u32("tokenizer.ggml.eot_token_id", 7)
      .kv_u32("tokenizer.ggml.padding_token_id", 0xffffffffu);
  return b;
}

Result<ModelConfig> config_of(const GgufBuilder& b, const TempDir& dir) {
  const std::string path = dir.file("m.gguf");
  loader_test::write_file(path, b.build());
  TESSERA_ASSIGN_OR_RETURN(auto g, GgufFile::open(path));
  return config_from_gguf(*g);
}

// A BOS id outside the vocabulary is an error naming the key; 0xFFFFFFFF (a uint32 -1) is "none".
TEST(ModelConfigGguf, BosIdOutsideTheVocabularyIsRefused) {
  TempDir dir;
  auto bad = config_of(base_gguf("llama", 2, 1000), dir);
  ASSERT_FALSE(bad.is_ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("tokenizer.ggml.bos_token_id is 1000, outside the vocabulary of 1000"),
            std::string::npos)
      << bad.status().to_string();
  auto none = config_of(base_gguf("llama", 2, 0xffffffffu), dir);
  ASSERT_TRUE(none.is_ok()) << none.status().to_string();
  EXPECT_EQ(none->bos_id, -1);
  auto last = config_of(base_gguf("llama", 2, 999), dir);
  ASSERT_TRUE(last.is_ok()) << last.status().to_string();
  EXPECT_EQ(last->bos_id, 999);
}

TEST(ModelConfigGguf, ArchitecturesAndKeys) {
  TempDir dir;
  {
    GgufBuilder b = base_gguf("qwen3");
    b.kv_u32("qwen3.attention.key_length", 128).kv_u32("qwen3.attention.value_length", 128);
    auto r = config_of(b, dir);
    ASSERT_TRUE(r.is_ok()) << r.status().to_string();
    EXPECT_EQ(r->arch, Architecture::kQwen3);
    EXPECT_EQ(r->head_dim, 128);
    EXPECT_TRUE(r->qk_norm);
    EXPECT_EQ(r->vocab, 1000);
    EXPECT_EQ(r->n_kv_heads, 2);
    EXPECT_EQ(r->max_positions, 4096);
    EXPECT_FLOAT_EQ(r->rope_theta, 1e6f);
    EXPECT_EQ(r->eos_ids, (std::vector<int32_t>{2, 7}));
    EXPECT_TRUE(r->tie_embeddings);
    EXPECT_TRUE(r->validate("m.gguf").is_ok());
  }
  {
    auto r = config_of(base_gguf("qwen2"), dir);
    ASSERT_TRUE(r.is_ok());
    EXPECT_EQ(r->arch, Architecture::kQwen2);
    EXPECT_TRUE(r->qkv_bias);
    EXPECT_EQ(r->head_dim, 64);
  }
  {
    GgufBuilder b = base_gguf("llama");
    b.kv_u32("llama.attention.sliding_window", 4096)
        .kv_str("llama.rope.scaling.type", "linear")
        .kv_f32("llama.rope.scaling.factor", 2.0f);
    auto r = config_of(b, dir);
    ASSERT_TRUE(r.is_ok()) << r.status().to_string();
    EXPECT_EQ(r->arch, Architecture::kMistral);
    EXPECT_EQ(r->sliding_window, 4096);
    EXPECT_EQ(r->rope_scaling.type, RopeScalingType::kLinear);
    EXPECT_FLOAT_EQ(r->rope_scaling.factor, 2.0f);
  }
  {
    auto r = config_of(base_gguf("gpt2"), dir);
    ASSERT_FALSE(r.is_ok());
    EXPECT_EQ(r.status().code(), StatusCode::kUnimplemented);
    EXPECT_NE(r.status().message().find("'gpt2'"), std::string::npos);
    EXPECT_NE(r.status().message().find(dir.file("m.gguf")), std::string::npos);
  }
  {
    GgufBuilder b;
    b.kv_str("general.architecture", "llama").kv_u32("llama.embedding_length", 64);
    auto r = config_of(b, dir);
    ASSERT_FALSE(r.is_ok());
    EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
    EXPECT_NE(r.status().message().find("llama.block_count"), std::string::npos);
  }
  {
    GgufBuilder b = base_gguf("llama");
    b.kv_str("llama.rope.scaling.type", "yarn");
    EXPECT_EQ(config_of(b, dir).status().code(), StatusCode::kUnimplemented);
  }
  {
    GgufBuilder b = base_gguf("llama");
    b.kv_str("llama.block_count_typo", "x").kv_str("llama.attention.key_length", "eight");
    auto r = config_of(b, dir);
    ASSERT_FALSE(r.is_ok());
    EXPECT_NE(r.status().message().find("llama.attention.key_length"), std::string::npos);
  }
}

TEST(ModelConfigGguf, Llama3RopeFreqsTensor) {
  // Llama 3.1 GGUFs store the scaling as per-frequency divisors in rope_freqs.weight.
  const ModelConfig ref = parse_ok(kLlama3);
  const std::vector<float> scaled = rope_inv_freq(ref);
  ModelConfig plain = ref;
  plain.rope_scaling = RopeScaling{};
  const std::vector<float> base = rope_inv_freq(plain);
  std::vector<float> div(base.size());
  for (size_t i = 0; i < div.size(); ++i) div[i] = base[i] / scaled[i];

  TempDir dir;
  GgufBuilder b;
  b.kv_str("general.architecture", "llama")
      .kv_u32("llama.embedding_length", 4096)
      .kv_u32("llama.block_count", 1)
      .kv_u32("llama.attention.head_count", 32)
      .kv_u32("llama.attention.head_count_kv", 8)
      .kv_u32("llama.feed_forward_length", 14336)
      .kv_u32("llama.context_length", 131072)
      .kv_f32("llama.rope.freq_base", 500000.0f)
      .kv_u32("llama.vocab_size", 128256)
      .f32_tensor("rope_freqs.weight", {64}, div);
  auto r = config_of(b, dir);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_EQ(r->rope_scaling.type, RopeScalingType::kLlama3);
  EXPECT_NEAR(r->rope_scaling.factor, 8.0f, 1e-4f);
  const std::vector<float> got = rope_inv_freq(*r);
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], scaled[i], 1e-4 * scaled[i]) << i;

  div[40] *= 3.0f;  // not a llama3 curve any more
  GgufBuilder b3;
  b3.kv_str("general.architecture", "llama")
      .kv_u32("llama.embedding_length", 4096)
      .kv_u32("llama.block_count", 1)
      .kv_u32("llama.attention.head_count", 32)
      .kv_u32("llama.feed_forward_length", 14336)
      .kv_u32("llama.context_length", 131072)
      .kv_f32("llama.rope.freq_base", 500000.0f)
      .kv_u32("llama.vocab_size", 128256)
      .f32_tensor("rope_freqs.weight", {64}, div);
  EXPECT_EQ(config_of(b3, dir).status().code(), StatusCode::kUnimplemented);
}


// load_model_config reads a GGUF through its header (GgufFile::open_metadata); rope_freqs.weight
// is tensor data all the same, read on its own.
TEST(ModelConfigGguf, LoadModelConfigReadsRopeFreqsWithoutTheMapping) {
  const ModelConfig ref = parse_ok(kLlama3);
  const std::vector<float> scaled = rope_inv_freq(ref);
  ModelConfig plain = ref;
  plain.rope_scaling = RopeScaling{};
  const std::vector<float> base = rope_inv_freq(plain);
  std::vector<float> div(base.size());
  for (size_t i = 0; i < div.size(); ++i) div[i] = base[i] / scaled[i];

  TempDir dir;
  GgufBuilder b;
  b.kv_str("general.architecture", "llama")
      .kv_u32("llama.embedding_length", 4096)
      .kv_u32("llama.block_count", 1)
      .kv_u32("llama.attention.head_count", 32)
      .kv_u32("llama.attention.head_count_kv", 8)
      .kv_u32("llama.feed_forward_length", 14336)
      .kv_u32("llama.context_length", 131072)
      .kv_f32("llama.rope.freq_base", 500000.0f)
      .kv_u32("llama.vocab_size", 128256)
      .f32_tensor("rope_freqs.weight", {64}, div);
  const std::string path = dir.file("m.gguf");
  loader_test::write_file(path, b.build());
  auto header = GgufFile::open_metadata(path);
  ASSERT_TRUE(header.is_ok()) << header.status().to_string();
  EXPECT_EQ((*header)->find_tensor("rope_freqs.weight")->view.data, nullptr);
  auto r = load_model_config(path);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_EQ(r->rope_scaling.type, RopeScalingType::kLlama3);
  EXPECT_NEAR(r->rope_scaling.factor, 8.0f, 1e-4f);
  auto mapped = config_of(b, dir);
  ASSERT_TRUE(mapped.is_ok()) << mapped.status().to_string();
  EXPECT_EQ(r->rope_scaling.factor, mapped->rope_scaling.factor);
  EXPECT_EQ(rope_inv_freq(*r), rope_inv_freq(*mapped));
}

// ---- stop tokens ----

Result<std::vector<int32_t>> stop_ids_of(const GgufBuilder& b, const TempDir& dir) {
  const std::string path = dir.file("stop.gguf");
  loader_test::write_file(path, b.build());
  TESSERA_ASSIGN_OR_RETURN(auto g, GgufFile::open_metadata(path));
  return gguf_stop_token_ids(*g, 12);
}

const std::vector<std::string> kChatVocab = {"<pad>", "<eos>", "<bos>", "a", "b", "c", "d", "<eot>",
                                             "<start_of_turn>", "<end_of_turn>", "e", "f"};

TEST(ModelConfigGguf, GemmaStopsAtEndOfTurnFoundByItsString) {
  TempDir dir;
  GgufBuilder b = base_gguf("gemma3");
  b.kv_str_array("tokenizer.ggml.tokens", kChatVocab);
  auto ids = stop_ids_of(b, dir);
  ASSERT_TRUE(ids.is_ok()) << ids.status().to_string();
  EXPECT_EQ(*ids, (std::vector<int32_t>{2, 7, 9}));  // eos, eot, then <end_of_turn>
}

TEST(ModelConfigGguf, EndOfTurnOnlyForTheArchitecturesThatLeaveItUnmarked) {
  TempDir dir;
  GgufBuilder b = base_gguf("qwen3");
  b.kv_str_array("tokenizer.ggml.tokens", kChatVocab);
  auto ids = stop_ids_of(b, dir);
  ASSERT_TRUE(ids.is_ok()) << ids.status().to_string();
  EXPECT_EQ(*ids, (std::vector<int32_t>{2, 7}));
}

TEST(ModelConfigGguf, GemmaWithoutEndOfTurnInItsVocabulary) {
  TempDir dir;
  GgufBuilder b = base_gguf("gemma3");
  b.kv_str_array("tokenizer.ggml.tokens", {"<pad>", "<eos>", "<bos>", "a", "b", "c", "d", "<eot>", "x", "y", "z", "w"});
  auto ids = stop_ids_of(b, dir);
  ASSERT_TRUE(ids.is_ok()) << ids.status().to_string();
  EXPECT_EQ(*ids, (std::vector<int32_t>{2, 7}));
}

TEST(ModelConfigGguf, RealGemmaConfigStopsAtEosAndEndOfTurn) {
  const std::string path = tessera::testing::default_model_file();
  if (path.empty()) GTEST_SKIP() << "default model absent (scripts/default_model.sh fetches it)";
  auto g = GgufFile::open_metadata(path);
  ASSERT_TRUE(g.is_ok()) << g.status().to_string();
  auto c = config_from_gguf(**g);
  ASSERT_TRUE(c.is_ok()) << c.status().to_string();
  EXPECT_EQ(c->arch, Architecture::kGemma3);
  auto tokens = (*g)->get_string_array("tokenizer.ggml.tokens");
  ASSERT_TRUE(tokens.is_ok());
  const auto eot = std::find(tokens->begin(), tokens->end(), "<end_of_turn>");
  ASSERT_NE(eot, tokens->end());
  const auto eot_id = static_cast<int32_t>(eot - tokens->begin());
  EXPECT_NE(std::find(c->eos_ids.begin(), c->eos_ids.end(), eot_id), c->eos_ids.end());
  EXPECT_NE(std::find(c->eos_ids.begin(), c->eos_ids.end(), 1), c->eos_ids.end());  // <eos>
}
// ---- Gemma 3 ----

// The shape of google/gemma-3-270m's config.json (text model).
constexpr const char* kGemma3 = R"({
  "architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text",
  "hidden_size": 640, "num_hidden_layers": 18, "num_attention_heads": 4, "num_key_value_heads": 1,
  "head_dim": 256, "intermediate_size": 2048, "vocab_size": 262144, "max_position_embeddings": 32768,
  "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "rope_local_base_freq": 10000.0, "rope_scaling": null,
  "query_pre_attn_scalar": 256, "sliding_window": 512, "hidden_activation": "gelu_pytorch_tanh",
  "final_logit_softcapping": null, "attn_logit_softcapping": null, "bos_token_id": 2, "eos_token_id": 1,
  "layer_types": ["sliding_attention", "sliding_attention", "sliding_attention", "sliding_attention",
                  "sliding_attention", "full_attention", "sliding_attention", "sliding_attention",
                  "sliding_attention", "sliding_attention", "sliding_attention", "full_attention",
                  "sliding_attention", "sliding_attention", "sliding_attention", "sliding_attention",
                  "sliding_attention", "full_attention"]
})";

TEST(ModelConfigHf, Gemma3) {
  const ModelConfig c = parse_ok(kGemma3);
  EXPECT_EQ(c.arch, Architecture::kGemma3);
  EXPECT_EQ(architecture_name(c.arch), "gemma3");
  EXPECT_TRUE(c.qk_norm);
  EXPECT_TRUE(c.tie_embeddings);  // the Gemma 3 default
  EXPECT_EQ(c.sliding_window, 512);
  EXPECT_EQ(c.rope_theta, 1e6f);
  EXPECT_EQ(c.rope_theta_local, 1e4f);
  EXPECT_EQ(c.query_pre_attn_scalar, 256.0f);
  EXPECT_EQ(c.norm_weight_offset, 1.0f);  // HF stores w - 1
  ASSERT_EQ(c.local_layers.size(), 18u);
  for (int64_t l = 0; l < 18; ++l) EXPECT_EQ(c.is_local_layer(l), (l + 1) % 6 != 0) << l;
  // Without layer_types: sliding_window_pattern (default 6).
  const ModelConfig p = parse_ok(with_field(without_field(kGemma3, "layer_types").c_str(), "sliding_window_pattern", 3));
  for (int64_t l = 0; l < 18; ++l) EXPECT_EQ(p.is_local_layer(l), (l + 1) % 3 != 0) << l;
  // The newer nesting of the two RoPE settings.
  auto j = nlohmann::json::parse(kGemma3);
  j.erase("rope_theta");
  j.erase("rope_local_base_freq");
  j["rope_parameters"] = {{"full_attention", {{"rope_type", "linear"}, {"factor", 8.0}, {"rope_theta", 1e6}}},
                          {"sliding_attention", {{"rope_type", "default"}, {"rope_theta", 1e4}}}};
  const ModelConfig n = parse_ok(j.dump());
  EXPECT_EQ(n.rope_theta, 1e6f);
  EXPECT_EQ(n.rope_theta_local, 1e4f);
  EXPECT_EQ(n.rope_scaling.type, RopeScalingType::kLinear);
  // Scaling applies to the global layers' table only.
  EXPECT_EQ(rope_inv_freq_local(n)[1], rope_inv_freq_local(c)[1]);
  EXPECT_NE(rope_inv_freq(n)[1], rope_inv_freq(c)[1]);
}

TEST(ModelConfigHf, Gemma3RefusalsNameTheField) {
  auto code_and_message = [](const std::string& text) {
    auto r = parse_hf_config(text, "config.json");
    EXPECT_FALSE(r.is_ok());
    return r.is_ok() ? std::string() : r.status().message();
  };
  EXPECT_NE(code_and_message(with_field(kGemma3, "final_logit_softcapping", 30.0)).find("final_logit_softcapping"),
            std::string::npos);
  EXPECT_NE(code_and_message(with_field(kGemma3, "hidden_activation", "relu")).find("hidden_activation"),
            std::string::npos);
  EXPECT_NE(code_and_message(with_field(kGemma3, "layer_types", nlohmann::json::array({"moe"}))).find("layer_types"),
            std::string::npos);
  // layer_types must name every layer.
  auto r = parse_hf_config(with_field(kGemma3, "layer_types", nlohmann::json::array({"full_attention"})), "c.json");
  ASSERT_TRUE(r.is_ok());
  EXPECT_NE(r->validate("c.json").message().find("layer_types"), std::string::npos);
}

TEST(ModelConfigGguf, Gemma3DefaultsLlamaCppAssumes) {
  TempDir dir;
  GgufBuilder b = base_gguf("gemma3", 12);
  b.kv_u32("gemma3.attention.sliding_window", 512);
  auto c = config_of(b, dir);
  ASSERT_TRUE(c.is_ok()) << c.status().to_string();
  EXPECT_EQ(c->arch, Architecture::kGemma3);
  EXPECT_EQ(c->rope_theta_local, 1e4f);
  EXPECT_EQ(c->query_pre_attn_scalar, static_cast<float>(c->head_dim));
  EXPECT_EQ(c->norm_weight_offset, 0.0f);  // llama.cpp's converter added the 1
  for (int64_t l = 0; l < 12; ++l) EXPECT_EQ(c->is_local_layer(l), l != 5 && l != 11) << l;
  GgufBuilder p = base_gguf("gemma3", 12);
  p.kv_u32("gemma3.attention.sliding_window", 512).kv_u32("gemma3.attention.sliding_window_pattern", 4);
  auto cp = config_of(p, dir);
  ASSERT_TRUE(cp.is_ok()) << cp.status().to_string();
  for (int64_t l = 0; l < 12; ++l) EXPECT_EQ(cp->is_local_layer(l), (l + 1) % 4 != 0) << l;
}

}  // namespace
}  // namespace tessera
