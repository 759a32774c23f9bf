#include "model/weight_store.h"

#include <cstring>
#include <functional>
#include <filesystem>
#include <map>
#include <set>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "kernels/quant.h"
#include "kernels/weight_codec.h"
#include "model/gguf.h"
#include "tests/model/loader_test_util.h"

namespace tessera {
namespace {

using loader_test::build_safetensors;
using loader_test::Bytes;
using loader_test::GgufBuilder;
using loader_test::StEntry;
using loader_test::TempDir;
using Json = nlohmann::json;
namespace fs = std::filesystem;

std::string stories_hf() { return loader_test::stories_dir() + "/hf"; }
std::string stories_f32() { return loader_test::stories_dir() + "/stories260K-f32.gguf"; }
std::string stories_org() { return loader_test::stories_dir() + "/stories260K.ggml-org.gguf"; }

std::unique_ptr<WeightStore> open_ok(const std::string& path) {
  auto r = WeightStore::open(path);
  EXPECT_TRUE(r.is_ok()) << r.status().to_string();
  return r.is_ok() ? std::move(r).value() : nullptr;
}

std::vector<float> to_floats(const TensorView& v) {
  std::vector<float> out(static_cast<size_t>(v.numel()));
  for (int64_t r = 0; r < v.rows(); ++r)
    dequantize_row(v.type, v.row_ptr(r), out.data() + r * v.cols(), v.cols());
  return out;
}

bool same_bytes(const TensorView& a, const TensorView& b) {
  return a.type == b.type && a.shape_string() == b.shape_string() &&
         std::memcmp(a.data, b.data, a.nbytes()) == 0;
}

// ---- stories260K: the HF checkpoint and both GGUF conversions hold the same weights ----

TEST(WeightStore, StoriesGgufEqualsHfAfterConversion) {
  TESSERA_REQUIRE_STORIES();
  auto hf = open_ok(stories_hf());
  ASSERT_NE(hf, nullptr);
  EXPECT_EQ(hf->format(), ModelFormat::kHuggingFace);
  EXPECT_EQ(hf->gguf(), nullptr);
  const std::vector<std::string> hf_names = hf->names();
  ASSERT_EQ(hf_names.size(), 47u);
  for (const std::string& path : {stories_f32(), stories_org()}) {
    SCOPED_TRACE(path);
    auto g = open_ok(path);
    ASSERT_NE(g, nullptr);
    EXPECT_EQ(g->format(), ModelFormat::kGguf);
    EXPECT_NE(g->gguf(), nullptr);
    const std::vector<std::string> all = g->names();
    std::set<std::string> g_names(all.begin(), all.end());
    for (const std::string& name : hf_names) {
      ASSERT_TRUE(g->has(name)) << name;
      auto a = hf->get(name);
      auto b = g->get(name);
      ASSERT_TRUE(a.is_ok() && b.is_ok()) << name;
      EXPECT_TRUE(same_bytes(*a, *b)) << name << " differs: " << a->shape_string() << " vs "
                                      << b->shape_string();
      g_names.erase(name);
    }
    // The ggml-org file also carries an untied copy of the embedding.
    if (path == stories_org()) {
      ASSERT_EQ(g_names, std::set<std::string>{"lm_head.weight"});
      EXPECT_TRUE(same_bytes(*g->get("lm_head.weight"), *hf->get("model.embed_tokens.weight")));
    } else {
      EXPECT_TRUE(g_names.empty());
    }
  }
}

TEST(WeightStore, StoriesGgufQkRowsReallyAreReordered) {
  // Guards the test above: without the conversion, GGUF Q/K rows differ from HF's.
  TESSERA_REQUIRE_STORIES();
  auto g = GgufFile::open(stories_f32());
  ASSERT_TRUE(g.is_ok());
  auto hf = open_ok(stories_hf());
  const GgufTensorInfo* q = (*g)->find_tensor("blk.0.attn_q.weight");
  const GgufTensorInfo* v = (*g)->find_tensor("blk.0.attn_v.weight");
  ASSERT_NE(q, nullptr);
  EXPECT_FALSE(same_bytes(q->view, *hf->get("model.layers.0.self_attn.q_proj.weight")));
  EXPECT_TRUE(same_bytes(v->view, *hf->get("model.layers.0.self_attn.v_proj.weight")));
}

TEST(WeightStore, BindStories) {
  TESSERA_REQUIRE_STORIES();
  for (const std::string& path : {stories_hf(), stories_f32(), stories_org()}) {
    SCOPED_TRACE(path);
    auto s = open_ok(path);
    ASSERT_NE(s, nullptr);
    auto r = bind_model_weights(*s);
    ASSERT_TRUE(r.is_ok()) << r.status().to_string();
    const ModelWeights& w = *r;
    ASSERT_EQ(w.layers.size(), 5u);
    EXPECT_EQ(w.embed.shape_string(), "[512, 64]");
    EXPECT_EQ(w.lm_head.shape_string(), "[512, 64]");
    if (path == stories_org()) {
      EXPECT_NE(w.lm_head.data, w.embed.data);
    } else {
      EXPECT_EQ(w.lm_head.data, w.embed.data);  // tied
    }
    EXPECT_EQ(w.final_norm.type, QuantType::kF32);
    EXPECT_EQ(w.final_norm.shape_string(), "[64]");
    const LayerWeights& l = w.layers[3];
    EXPECT_EQ(l.wq.shape_string(), "[64, 64]");
    EXPECT_EQ(l.wk.shape_string(), "[32, 64]");
    EXPECT_EQ(l.wv.shape_string(), "[32, 64]");
    EXPECT_EQ(l.wo.shape_string(), "[64, 64]");
    EXPECT_EQ(l.w_gate.shape_string(), "[172, 64]");
    EXPECT_EQ(l.w_up.shape_string(), "[172, 64]");
    EXPECT_EQ(l.w_down.shape_string(), "[64, 172]");
    EXPECT_EQ(l.bq.data, nullptr);
    EXPECT_EQ(l.q_norm.data, nullptr);
    // Vectors are owned copies holding the file's values.
    auto norm = s->get("model.layers.3.input_layernorm.weight");
    ASSERT_TRUE(norm.is_ok());
    EXPECT_NE(l.attn_norm.data, norm->data);
    EXPECT_EQ(std::memcmp(l.attn_norm.data, norm->data, 64 * 4), 0);
    EXPECT_EQ(w.owned_f32.size(), 1u + 5u * 2u);
  }
}

// ---- error messages on modified copies of stories260K ----

// Copies the stories HF directory into `dir`, letting `patch` edit the safetensors header and
// `patch_config` the config.
void copy_stories_hf(const TempDir& dir, const std::function<void(Json&)>& patch,
                     const std::function<void(Json&)>& patch_config = nullptr) {
  const Bytes st = loader_test::read_file(stories_hf() + "/model.safetensors");
  Json h = loader_test::safetensors_header(st);
  patch(h);
  loader_test::write_file(dir.file("model.safetensors"), loader_test::rewrite_safetensors_header(st, h));
  Json cfg = Json::parse(loader_test::read_file(stories_hf() + "/config.json"));
  if (patch_config) patch_config(cfg);
  loader_test::write_file(dir.file("config.json"), cfg.dump(2));
}

TEST(WeightStore, WrongShapeMessage) {
  TESSERA_REQUIRE_STORIES();
  TempDir dir;
  copy_stories_hf(dir, [](Json& h) { h["model.layers.3.mlp.up_proj.weight"]["shape"] = {64, 172}; });
  auto s = open_ok(dir.path());
  ASSERT_NE(s, nullptr);
  auto r = bind_model_weights(*s);
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(r.status().message(),
            dir.file("model.safetensors") +
                ": tensor 'model.layers.3.mlp.up_proj.weight' has shape [64, 172], expected [172, 64]");
}

TEST(WeightStore, WrongVectorShapeMessage) {
  TESSERA_REQUIRE_STORIES();
  TempDir dir;
  copy_stories_hf(dir, [](Json& h) { h["model.norm.weight"]["shape"] = {8, 8}; });
  auto s = open_ok(dir.path());
  auto r = bind_model_weights(*s);
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().message(), dir.file("model.safetensors") +
                                      ": tensor 'model.norm.weight' has shape [8, 8], expected [64]");
}

TEST(WeightStore, MissingTensorMessage) {
  TESSERA_REQUIRE_STORIES();
  TempDir dir;
  copy_stories_hf(dir, [](Json& h) { h.erase("model.layers.2.mlp.down_proj.weight"); });
  auto s = open_ok(dir.path());
  ASSERT_NE(s, nullptr);
  EXPECT_FALSE(s->has("model.layers.2.mlp.down_proj.weight"));
  auto r = bind_model_weights(*s);
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(r.status().message(), dir.path() + ": no tensor 'model.layers.2.mlp.down_proj.weight'");
}

TEST(WeightStore, UntiedConfigWithoutLmHeadFallsBackToEmbedding) {
  TESSERA_REQUIRE_STORIES();
  TempDir dir;
  copy_stories_hf(dir, [](Json&) {}, [](Json& c) { c["tie_word_embeddings"] = false; });
  auto s = open_ok(dir.path());
  auto r = bind_model_weights(*s);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_EQ(r->lm_head.data, r->embed.data);
}

TEST(WeightStore, ConfigErrors) {
  TESSERA_REQUIRE_STORIES();
  TempDir dir;
  copy_stories_hf(dir, [](Json&) {}, [](Json& c) { c["architectures"] = {"FalconForCausalLM"}; });
  auto r = WeightStore::open(dir.path());
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), StatusCode::kUnimplemented);
  EXPECT_NE(r.status().message().find(dir.file("config.json")), std::string::npos);
  EXPECT_NE(r.status().message().find("'FalconForCausalLM'"), std::string::npos);

  copy_stories_hf(dir, [](Json&) {}, [](Json& c) { c["num_key_value_heads"] = 3; });
  r = WeightStore::open(dir.path());
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("num_key_value_heads"), std::string::npos);

  fs::remove(dir.file("config.json"));
  r = WeightStore::open(dir.path());
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("config.json"), std::string::npos);

  EXPECT_EQ(WeightStore::open(dir.file("nothing-here")).status().code(), StatusCode::kNotFound);
  loader_test::write_file(dir.file("notes.txt"), std::string("hello"));
  EXPECT_FALSE(WeightStore::open(dir.file("notes.txt")).is_ok());
}

TEST(WeightStore, OpensSafetensorsFilePath) {
  TESSERA_REQUIRE_STORIES();
  auto s = open_ok(stories_hf() + "/model.safetensors");
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(s->config().hidden, 64);
  EXPECT_EQ(s->source_file("model.norm.weight"), stories_hf() + "/model.safetensors");
  auto missing = s->get("lm_head.weight");
  ASSERT_FALSE(missing.is_ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
}

// ---- load_model_config: the config alone, as WeightStore::open reads it ----

void expect_same_config(const ModelConfig& a, const ModelConfig& b) {
  EXPECT_EQ(a.arch, b.arch);
  EXPECT_EQ(a.hidden, b.hidden);
  EXPECT_EQ(a.n_layers, b.n_layers);
  EXPECT_EQ(a.n_heads, b.n_heads);
  EXPECT_EQ(a.n_kv_heads, b.n_kv_heads);
  EXPECT_EQ(a.head_dim, b.head_dim);
  EXPECT_EQ(a.ffn, b.ffn);
  EXPECT_EQ(a.vocab, b.vocab);
  EXPECT_EQ(a.max_positions, b.max_positions);
  EXPECT_EQ(a.rms_eps, b.rms_eps);
  EXPECT_EQ(a.rope_theta, b.rope_theta);
  EXPECT_EQ(a.rope_scaling.type, b.rope_scaling.type);
  EXPECT_EQ(a.rope_scaling.factor, b.rope_scaling.factor);
  EXPECT_EQ(a.sliding_window, b.sliding_window);
  EXPECT_EQ(a.qkv_bias, b.qkv_bias);
  EXPECT_EQ(a.qk_norm, b.qk_norm);
  EXPECT_EQ(a.tie_embeddings, b.tie_embeddings);
  EXPECT_EQ(a.bos_id, b.bos_id);
  EXPECT_EQ(a.eos_ids, b.eos_ids);
  EXPECT_EQ(a.quantization.method, b.quantization.method);
}

TEST(LoadModelConfig, SameConfigAsTheWeightStoreInEveryFormat) {
  TESSERA_REQUIRE_STORIES();
  for (const std::string& path : {stories_hf(), stories_hf() + "/model.safetensors",
                                  stories_f32(), stories_org()}) {
    SCOPED_TRACE(path);
    auto store = open_ok(path);
    ASSERT_NE(store, nullptr);
    auto config = load_model_config(path);
    ASSERT_TRUE(config.is_ok()) << config.status().to_string();
    expect_same_config(*config, store->config());
  }
}

TEST(LoadModelConfig, ResolvesPathsAsTheWeightStoreDoes) {
  TESSERA_REQUIRE_STORIES();
  auto dir = resolve_model_path(stories_hf());
  ASSERT_TRUE(dir.is_ok());
  EXPECT_EQ(dir->format, ModelFormat::kHuggingFace);
  EXPECT_EQ(dir->dir, stories_hf());
  auto file = resolve_model_path(stories_hf() + "/model.safetensors");
  ASSERT_TRUE(file.is_ok());
  EXPECT_EQ(file->dir, stories_hf());
  EXPECT_EQ(file->file, stories_hf() + "/model.safetensors");
  auto gguf = resolve_model_path(stories_f32());
  ASSERT_TRUE(gguf.is_ok());
  EXPECT_EQ(gguf->format, ModelFormat::kGguf);
  EXPECT_EQ(gguf->file, stories_f32());

  TempDir tmp;
  // The GGUF magic is enough, whatever the name.
  fs::copy_file(stories_f32(), tmp.file("model.bin"));
  auto magic = load_model_config(tmp.file("model.bin"));
  ASSERT_TRUE(magic.is_ok()) << magic.status().to_string();
  EXPECT_EQ(magic->hidden, 64);
  EXPECT_EQ(load_model_config(tmp.file("nothing-here")).status().code(), StatusCode::kNotFound);
  loader_test::write_file(tmp.file("notes.txt"), std::string("hello"));
  EXPECT_EQ(load_model_config(tmp.file("notes.txt")).status().code(), StatusCode::kInvalidArgument);
  // No weights are needed, and a bad config is refused naming the file.
  copy_stories_hf(tmp, [](Json&) {}, [](Json& c) { c["num_key_value_heads"] = 3; });
  fs::remove(tmp.file("model.safetensors"));
  auto bad = load_model_config(tmp.path());
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().message().find("num_key_value_heads"), std::string::npos);
  copy_stories_hf(tmp, [](Json&) {}, [](Json&) {});
  fs::remove(tmp.file("model.safetensors"));
  EXPECT_TRUE(load_model_config(tmp.path()).is_ok());
}

// ---- synthetic models in both formats ----

struct SynthTensor {
  std::vector<int64_t> shape;
  std::vector<float> values;
};

struct Synth {
  std::string arch = "llama";  // GGUF architecture name
  int64_t hidden = 64, heads = 4, kv = 2, hd = 16, ffn = 96, vocab = 40, layers = 2;
  bool bias = false, qk_norm = false, tie = false;
  std::map<std::string, SynthTensor> tensors;  // by HF name
};

Synth make_synth(const std::string& arch, bool bias, bool qk_norm, bool tie) {
  Synth s;
  s.arch = arch;
  s.bias = bias;
  s.qk_norm = qk_norm;
  s.tie = tie;
  uint32_t seed = 10;
  auto add = [&](const std::string& name, std::vector<int64_t> shape) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    s.tensors[name] = {shape, loader_test::test_values(static_cast<size_t>(n), seed++)};
  };
  add("model.embed_tokens.weight", {s.vocab, s.hidden});
  add("model.norm.weight", {s.hidden});
  if (!tie) add("lm_head.weight", {s.vocab, s.hidden});
  for (int64_t i = 0; i < s.layers; ++i) {
    const std::string p = fmt::format("model.layers.{}.", i);
    add(p + "input_layernorm.weight", {s.hidden});
    add(p + "post_attention_layernorm.weight", {s.hidden});
    add(p + "self_attn.q_proj.weight", {s.heads * s.hd, s.hidden});
    add(p + "self_attn.k_proj.weight", {s.kv * s.hd, s.hidden});
    add(p + "self_attn.v_proj.weight", {s.kv * s.hd, s.hidden});
    add(p + "self_attn.o_proj.weight", {s.hidden, s.heads * s.hd});
    add(p + "mlp.gate_proj.weight", {s.ffn, s.hidden});
    add(p + "mlp.up_proj.weight", {s.ffn, s.hidden});
    add(p + "mlp.down_proj.weight", {s.hidden, s.ffn});
    if (bias) {
      add(p + "self_attn.q_proj.bias", {s.heads * s.hd});
      add(p + "self_attn.k_proj.bias", {s.kv * s.hd});
      add(p + "self_attn.v_proj.bias", {s.kv * s.hd});
    }
    if (qk_norm) {
      add(p + "self_attn.q_norm.weight", {s.hd});
      add(p + "self_attn.k_norm.weight", {s.hd});
    }
  }
  return s;
}

Json synth_config(const Synth& s) {
  const char* cls = s.arch == "qwen2" ? "Qwen2ForCausalLM"
                    : s.arch == "qwen3" ? "Qwen3ForCausalLM"
                                        : "LlamaForCausalLM";
  return {{"architectures", {cls}},        {"hidden_size", s.hidden},
          {"num_hidden_layers", s.layers}, {"num_attention_heads", s.heads},
          {"num_key_value_heads", s.kv},   {"head_dim", s.hd},
          {"intermediate_size", s.ffn},    {"vocab_size", s.vocab},
          {"max_position_embeddings", 256}, {"rms_norm_eps", 1e-6},
          {"tie_word_embeddings", s.tie},  {"bos_token_id", 1},
          {"eos_token_id", 2}};
}

// HF directory: matrices in BF16 (values are exact in bf16), vectors in F32. `shards` > 1
// writes a sharded checkpoint with an index.
void write_hf(const Synth& s, const TempDir& dir, int shards = 1) {
  loader_test::write_file(dir.file("config.json"), synth_config(s).dump());
  std::vector<std::vector<StEntry>> parts(static_cast<size_t>(shards));
  Json weight_map = Json::object();
  size_t i = 0;
  for (const auto& [name, t] : s.tensors) {
    const bool matrix = t.shape.size() == 2;
    const size_t part = i++ % static_cast<size_t>(shards);
    parts[part].push_back({name, matrix ? "BF16" : "F32", t.shape,
                           matrix ? loader_test::bf16_bytes(t.values) : loader_test::f32_bytes(t.values)});
    weight_map[name] = fmt::format("model-{:05d}-of-{:05d}.safetensors", part + 1, shards);
  }
  if (shards == 1) {
    loader_test::write_file(dir.file("model.safetensors"), build_safetensors(parts[0]));
    return;
  }
  for (int p = 0; p < shards; ++p)
    loader_test::write_file(dir.file(fmt::format("model-{:05d}-of-{:05d}.safetensors", p + 1, shards)),
                            build_safetensors(parts[static_cast<size_t>(p)]));
  loader_test::write_file(dir.file("model.safetensors.index.json"),
                          Json{{"weight_map", weight_map}}.dump());
}

std::string hf_to_gguf(const std::string& hf) {
  static const std::map<std::string, std::string> kTop = {
      {"model.embed_tokens.weight", "token_embd.weight"},
      {"model.norm.weight", "output_norm.weight"},
      {"lm_head.weight", "output.weight"}};
  if (auto it = kTop.find(hf); it != kTop.end()) return it->second;
  static const std::map<std::string, std::string> kLayer = {
      {"input_layernorm.weight", "attn_norm.weight"},
      {"post_attention_layernorm.weight", "ffn_norm.weight"},
      {"self_attn.q_proj.weight", "attn_q.weight"},
      {"self_attn.k_proj.weight", "attn_k.weight"},
      {"self_attn.v_proj.weight", "attn_v.weight"},
      {"self_attn.o_proj.weight", "attn_output.weight"},
      {"self_attn.q_proj.bias", "attn_q.bias"},
      {"self_attn.k_proj.bias", "attn_k.bias"},
      {"self_attn.v_proj.bias", "attn_v.bias"},
      {"self_attn.q_norm.weight", "attn_q_norm.weight"},
      {"self_attn.k_norm.weight", "attn_k_norm.weight"},
      {"mlp.gate_proj.weight", "ffn_gate.weight"},
      {"mlp.up_proj.weight", "ffn_up.weight"},
      {"mlp.down_proj.weight", "ffn_down.weight"}};
  const std::string prefix = "model.layers.";
  const size_t dot = hf.find('.', prefix.size());
  const std::string layer = hf.substr(prefix.size(), dot - prefix.size());
  return "blk." + layer + "." + kLayer.at(hf.substr(dot + 1));
}

// llama.cpp's order: within each head, HF rows [0, hd/2) go to even rows, [hd/2, hd) to odd.
std::vector<float> to_gguf_order(const std::vector<float>& v, int64_t rows, int64_t cols,
                                 int64_t heads) {
  std::vector<float> out(v.size());
  const int64_t hd = rows / heads;
  for (int64_t h = 0; h < heads; ++h)
    for (int64_t j = 0; j < hd; ++j) {
      const int64_t src = h * hd + j;
      const int64_t dst = h * hd + (j < hd / 2 ? 2 * j : 2 * (j - hd / 2) + 1);
      std::copy_n(v.begin() + src * cols, cols, out.begin() + dst * cols);
    }
  return out;
}

Bytes encode(QuantType t, const std::vector<float>& v, int64_t cols) {
  const int64_t rows = static_cast<int64_t>(v.size()) / cols;
  Bytes b(static_cast<size_t>(rows) * row_bytes(t, cols));
  for (int64_t r = 0; r < rows; ++r)
    quantize_row(t, v.data() + r * cols, b.data() + static_cast<size_t>(r) * row_bytes(t, cols), cols);
  return b;
}

struct GgufOptions {
  QuantType matrix_type = QuantType::kF32;
  QuantType vector_type = QuantType::kF32;
  std::map<std::string, std::vector<int64_t>> shape_override;  // by GGUF name
};

GgufBuilder synth_gguf(const Synth& s, const GgufOptions& o = {}) {
  GgufBuilder b;
  const std::string& a = s.arch;
  b.kv_str("general.architecture", a)
      .kv_u32(a + ".embedding_length", static_cast<uint32_t>(s.hidden))
      .kv_u32(a + ".block_count", static_cast<uint32_t>(s.layers))
      .kv_u32(a + ".attention.head_count", static_cast<uint32_t>(s.heads))
      .kv_u32(a + ".attention.head_count_kv", static_cast<uint32_t>(s.kv))
      .kv_u32(a + ".attention.key_length", static_cast<uint32_t>(s.hd))
      .kv_u32(a + ".feed_forward_length", static_cast<uint32_t>(s.ffn))
      .kv_u32(a + ".context_length", 256)
      .kv_f32(a + ".attention.layer_norm_rms_epsilon", 1e-6f)
      .kv_u32(a + ".vocab_size", static_cast<uint32_t>(s.vocab))
      .kv_u32("tokenizer.ggml.bos_token_id", 1)
      .kv_u32("tokenizer.ggml.eos_token_id", 2);
  for (const auto& [name, t] : s.tensors) {
    const std::string gname = hf_to_gguf(name);
    std::vector<float> v = t.values;
    const int64_t cols = t.shape.size() == 2 ? t.shape[1] : 1;
    const int64_t rows = t.shape[0];
    const bool q = gname.find("attn_q.") != std::string::npos;
    const bool k = gname.find("attn_k.") != std::string::npos;
    if (a == "llama" && (q || k)) v = to_gguf_order(v, rows, cols, q ? s.heads : s.kv);
    const QuantType type = t.shape.size() == 2 ? o.matrix_type : o.vector_type;
    std::vector<int64_t> shape = t.shape;
    if (auto it = o.shape_override.find(gname); it != o.shape_override.end()) shape = it->second;
    b.tensor(gname, shape, static_cast<uint32_t>(quant_traits(type).ggml_type),
             encode(type, v, t.shape.back()));
  }
  return b;
}

std::unique_ptr<WeightStore> open_gguf(const TempDir& dir, const GgufBuilder& b) {
  loader_test::write_file(dir.file("m.gguf"), b.build());
  return open_ok(dir.file("m.gguf"));
}

// Binds both stores and checks they hold the same values (block-quantized GGUF tensors hold
// exactly the quantized HF rows).
void expect_same_model(const WeightStore& hf, const WeightStore& g, const Synth& s,
                       bool gguf_vectors_exact = true) {
  auto wh = bind_model_weights(hf, {.codec = &cpu_weight_codec()});
  auto wg = bind_model_weights(g, {.codec = &cpu_weight_codec()});
  ASSERT_TRUE(wh.is_ok()) << wh.status().to_string();
  ASSERT_TRUE(wg.is_ok()) << wg.status().to_string();
  for (const auto& [name, t] : s.tensors) {
    auto a = hf.get(name);
    auto b = g.get(name);
    ASSERT_TRUE(a.is_ok() && b.is_ok()) << name;
    if (b->type == QuantType::kF32 || b->type == QuantType::kF16) {
      EXPECT_EQ(to_floats(*a), to_floats(*b)) << name;
      EXPECT_EQ(to_floats(*b), t.values) << name;
    } else {  // block formats: the loaded rows are exactly the quantized HF rows
      const Bytes expect = encode(b->type, t.values, t.shape.back());
      ASSERT_EQ(b->nbytes(), expect.size()) << name;
      EXPECT_EQ(std::memcmp(b->data, expect.data(), expect.size()), 0) << name;
    }
  }
  for (size_t i = 0; i < wh->layers.size(); ++i) {
    const LayerWeights& lh = wh->layers[i];
    const LayerWeights& lg = wg->layers[i];
    for (auto [x, y] : {std::pair{lh.attn_norm, lg.attn_norm}, {lh.ffn_norm, lg.ffn_norm},
                        {lh.bq, lg.bq}, {lh.bk, lg.bk}, {lh.bv, lg.bv},
                        {lh.q_norm, lg.q_norm}, {lh.k_norm, lg.k_norm}}) {
      ASSERT_EQ(x.data == nullptr, y.data == nullptr);
      if (!x.data) continue;
      EXPECT_EQ(x.type, QuantType::kF32);
      EXPECT_EQ(y.type, QuantType::kF32);
      const std::vector<float> fx = to_floats(x), fy = to_floats(y);
      ASSERT_EQ(fx.size(), fy.size());
      // Exact for float files; Q8_0 vectors carry at most half a quantization step (< 1/254).
      const float tol = gguf_vectors_exact ? 0.0f : 1.0f / 254.0f;
      for (size_t j = 0; j < fx.size(); ++j) EXPECT_NEAR(fx[j], fy[j], tol) << j;
    }
  }
}

TEST(WeightStoreSynthetic, LlamaWithBiasesF32) {
  const Synth s = make_synth("llama", /*bias=*/true, /*qk_norm=*/false, /*tie=*/false);
  TempDir hd, gd;
  write_hf(s, hd);
  auto hf = open_ok(hd.path());
  auto g = open_gguf(gd, synth_gguf(s));
  ASSERT_TRUE(hf && g);
  EXPECT_TRUE(g->config().qkv_bias);  // announced by the tensors
  expect_same_model(*hf, *g, s);
  auto w = bind_model_weights(*g);
  ASSERT_TRUE(w.is_ok());
  EXPECT_NE(w->layers[1].bq.data, nullptr);
  EXPECT_EQ(w->layers[1].bk.shape_string(), "[32]");
  EXPECT_NE(w->lm_head.data, w->embed.data);
}

TEST(WeightStoreSynthetic, Qwen2BiasesAreNotReordered) {
  const Synth s = make_synth("qwen2", true, false, true);
  TempDir hd, gd;
  write_hf(s, hd);
  auto hf = open_ok(hd.path());
  auto g = open_gguf(gd, synth_gguf(s));
  ASSERT_TRUE(hf && g);
  EXPECT_EQ(g->config().arch, Architecture::kQwen2);
  expect_same_model(*hf, *g, s);
  auto w = bind_model_weights(*g);
  ASSERT_TRUE(w.is_ok());
  EXPECT_EQ(w->lm_head.data, w->embed.data);
}

TEST(WeightStoreSynthetic, Qwen3QkNormAndShardedHf) {
  const Synth s = make_synth("qwen3", false, true, true);
  TempDir hd, gd;
  write_hf(s, hd, /*shards=*/3);
  auto hf = open_ok(hd.path());
  auto g = open_gguf(gd, synth_gguf(s, {QuantType::kF32, QuantType::kF16, {}}));
  ASSERT_TRUE(hf && g);
  EXPECT_TRUE(g->config().qk_norm);
  expect_same_model(*hf, *g, s);
  auto w = bind_model_weights(*hf);
  ASSERT_TRUE(w.is_ok());
  EXPECT_EQ(w->layers[0].q_norm.shape_string(), "[16]");
  EXPECT_EQ(w->layers[0].k_norm.type, QuantType::kF32);
  EXPECT_NE(hf->source_file("model.layers.0.self_attn.q_norm.weight"), hd.path());
}

TEST(WeightStoreSynthetic, Q8_0MatricesAndVectorsInLlamaOrder) {
  // Block-quantized Q/K rows move whole; Q8_0 norm vectors are dequantized to F32.
  const Synth s = make_synth("llama", false, false, false);
  TempDir hd, gd;
  write_hf(s, hd);
  auto hf = open_ok(hd.path());
  auto g = open_gguf(gd, synth_gguf(s, {QuantType::kQ8_0, QuantType::kQ8_0, {}}));
  ASSERT_TRUE(hf && g);
  expect_same_model(*hf, *g, s, /*gguf_vectors_exact=*/false);
  auto wq = g->get("model.layers.1.self_attn.q_proj.weight");
  ASSERT_TRUE(wq.is_ok());
  EXPECT_EQ(wq->type, QuantType::kQ8_0);
  // Widening a Q8_0 norm is arithmetic the loader's caller provides: without a codec, the load
  // names what it lacks.
  auto no_codec = bind_model_weights(*g);
  ASSERT_FALSE(no_codec.is_ok());
  EXPECT_EQ(no_codec.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(no_codec.status().message().find("is stored as Q8_0"), std::string::npos) << no_codec.status().message();
  EXPECT_NE(no_codec.status().message().find("needs a weight codec"), std::string::npos);
  auto w = bind_model_weights(*g, {.codec = &cpu_weight_codec()});
  ASSERT_TRUE(w.is_ok()) << w.status().to_string();
  EXPECT_EQ(w->layers[1].wk.type, QuantType::kQ8_0);
  std::vector<float> expect(64);
  dequantize_row(QuantType::kQ8_0,
                 encode(QuantType::kQ8_0, s.tensors.at("model.norm.weight").values, 64).data(),
                 expect.data(), 64);
  EXPECT_EQ(std::vector<float>(static_cast<const float*>(w->final_norm.data),
                               static_cast<const float*>(w->final_norm.data) + 64),
            expect);
}

TEST(WeightStoreSynthetic, GgufShapeErrorNamesFileAndHfTensor) {
  const Synth s = make_synth("qwen2", true, false, true);
  TempDir gd;
  GgufOptions o;
  o.shape_override["blk.1.ffn_up.weight"] = {64, 96};  // transposed, same byte count
  auto g = open_gguf(gd, synth_gguf(s, o));
  ASSERT_NE(g, nullptr);
  auto r = bind_model_weights(*g);
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().message(),
            gd.file("m.gguf") +
                ": tensor 'model.layers.1.mlp.up_proj.weight' has shape [64, 96], expected [96, 64]");
}

TEST(WeightStoreSynthetic, QkRowsNotDivisibleByHeads) {
  const Synth s = make_synth("llama", false, false, true);
  TempDir gd;
  GgufOptions o;
  o.shape_override["blk.0.attn_k.weight"] = {1, 2048};  // 1 row cannot hold 2 heads
  loader_test::write_file(gd.file("m.gguf"), synth_gguf(s, o).build());
  auto r = WeightStore::open(gd.file("m.gguf"));
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("blk.0.attn_k.weight"), std::string::npos);
  EXPECT_NE(r.status().message().find(gd.file("m.gguf")), std::string::npos);
}

TEST(WeightStoreSynthetic, UnsupportedGgmlTypeOnlyFailsWhenNeeded) {
  const Synth s = make_synth("qwen3", false, true, true);
  TempDir gd;
  GgufBuilder b = synth_gguf(s);
  b.tensor("blk.0.extra.weight", {1, 256}, 16, Bytes(66, 0));  // IQ2_XXS, not used
  auto g = open_gguf(gd, b);
  ASSERT_NE(g, nullptr);
  EXPECT_TRUE(g->has("blk.0.extra.weight"));
  EXPECT_EQ(g->get("blk.0.extra.weight").status().code(), StatusCode::kUnimplemented);
  EXPECT_TRUE(bind_model_weights(*g).is_ok());

  // The same type on a tensor the model needs.
  TempDir gd2;
  GgufBuilder b2;
  b2.kv_str("general.architecture", "qwen3")
      .kv_u32("qwen3.embedding_length", 256)
      .kv_u32("qwen3.block_count", 1)
      .kv_u32("qwen3.attention.head_count", 4)
      .kv_u32("qwen3.feed_forward_length", 256)
      .kv_u32("qwen3.context_length", 64)
      .kv_u32("qwen3.vocab_size", 8)
      .tensor("token_embd.weight", {8, 256}, 16, Bytes(8 * 66, 0));
  auto g2 = open_gguf(gd2, b2);
  ASSERT_NE(g2, nullptr);
  auto r = bind_model_weights(*g2);
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), StatusCode::kUnimplemented);
  EXPECT_NE(r.status().message().find("'token_embd.weight' has ggml type 16 (IQ2_XXS)"),
            std::string::npos);
}

TEST(WeightStoreSynthetic, RefusesOutputBiasAndIntegerMatrices) {
  Synth s = make_synth("llama", false, false, true);
  s.tensors["model.layers.0.self_attn.o_proj.bias"] = {{64}, std::vector<float>(64, 0.0f)};
  TempDir hd;
  write_hf(s, hd);
  auto hf = open_ok(hd.path());
  auto r = bind_model_weights(*hf);
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), StatusCode::kUnimplemented);
  EXPECT_NE(r.status().message().find("o_proj.bias"), std::string::npos);

  // An I8 matrix without scales.
  Synth s2 = make_synth("llama", false, false, true);
  TempDir hd2;
  write_hf(s2, hd2);
  const Bytes st = loader_test::read_file(hd2.file("model.safetensors"));
  Json h = loader_test::safetensors_header(st);
  Json& up = h["model.layers.0.mlp.up_proj.weight"];
  up["dtype"] = "I8";
  up["data_offsets"][1] = up["data_offsets"][0].get<uint64_t>() + 96 * 64;
  loader_test::write_file(hd2.file("model.safetensors"), loader_test::rewrite_safetensors_header(st, h));
  auto hf2 = open_ok(hd2.path());
  ASSERT_NE(hf2, nullptr);
  auto r2 = bind_model_weights(*hf2);
  ASSERT_FALSE(r2.is_ok());
  EXPECT_EQ(r2.status().code(), StatusCode::kUnimplemented);
  EXPECT_NE(r2.status().message().find("'model.layers.0.mlp.up_proj.weight' is a plain I8 matrix"),
            std::string::npos)
      << r2.status().message();
}

// ---- helpers ----

TEST(WeightStoreNames, GgufToHf) {
  const std::pair<const char*, const char*> cases[] = {
      {"token_embd.weight", "model.embed_tokens.weight"},
      {"output_norm.weight", "model.norm.weight"},
      {"output.weight", "lm_head.weight"},
      {"blk.0.attn_norm.weight", "model.layers.0.input_layernorm.weight"},
      {"blk.12.attn_q.weight", "model.layers.12.self_attn.q_proj.weight"},
      {"blk.3.attn_k.bias", "model.layers.3.self_attn.k_proj.bias"},
      {"blk.3.attn_output.weight", "model.layers.3.self_attn.o_proj.weight"},
      {"blk.3.attn_q_norm.weight", "model.layers.3.self_attn.q_norm.weight"},
      {"blk.3.attn_k_norm.weight", "model.layers.3.self_attn.k_norm.weight"},
      {"blk.3.ffn_norm.weight", "model.layers.3.post_attention_layernorm.weight"},
      {"blk.3.ffn_gate.weight", "model.layers.3.mlp.gate_proj.weight"},
      {"blk.3.ffn_up.weight", "model.layers.3.mlp.up_proj.weight"},
      {"blk.3.ffn_down.weight", "model.layers.3.mlp.down_proj.weight"},
      {"rope_freqs.weight", "rope_freqs.weight"},
      {"blk.x.attn_q.weight", "blk.x.attn_q.weight"},
      {"blk.3.ffn_gate_exps.weight", "blk.3.ffn_gate_exps.weight"},
      {"blk..attn_q.weight", "blk..attn_q.weight"},
  };
  for (const auto& [g, hf] : cases) EXPECT_EQ(gguf_to_hf_name(g), hf) << g;
}

TEST(WeightStoreNames, UnpermuteRows) {
  // 2 heads of hd 4, 1 column: GGUF order per head is [0, 2, 1, 3] of HF rows.
  const std::vector<float> gguf = {0, 2, 1, 3, 4, 6, 5, 7};
  std::vector<uint8_t> owned;
  TensorView out;
  ASSERT_TRUE(unpermute_gguf_qk_rows(make_view(gguf.data(), QuantType::kF32, {8}), 2, "t", &owned,
                                     &out)
                  .is_ok());
  const auto* f = static_cast<const float*>(out.data);
  for (int i = 0; i < 8; ++i) EXPECT_EQ(f[i], static_cast<float>(i));
  EXPECT_EQ(out.shape_string(), "[8]");
  ASSERT_TRUE(unpermute_gguf_qk_rows(make_view(gguf.data(), QuantType::kF32, {4, 2}), 1, "t",
                                     &owned, &out)
                  .is_ok());
  f = static_cast<const float*>(out.data);
  EXPECT_EQ(std::vector<float>(f, f + 8), (std::vector<float>{0, 2, 4, 6, 1, 3, 5, 7}));
  Status st = unpermute_gguf_qk_rows(make_view(gguf.data(), QuantType::kF32, {8}), 3, "tensor 'x'",
                                     &owned, &out);
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("tensor 'x'"), std::string::npos);
  const Bytes q8(34 * 2, 0);
  EXPECT_FALSE(unpermute_gguf_qk_rows(make_view(q8.data(), QuantType::kQ8_0, {64}), 1, "t",
                                      &owned, &out)
                   .is_ok());
}

}  // namespace
}  // namespace tessera
