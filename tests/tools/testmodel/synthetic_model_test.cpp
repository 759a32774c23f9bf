// The synthetic model generator and the GGUF / safetensors writers, checked through Tessera's
// own readers (GgufFile, SafetensorsCheckpoint, WeightStore, Tokenizer).
#include "tools/testmodel/synthetic_model.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "common/mapped_file.h"
#include "kernels/quant.h"
#include "model/gguf.h"
#include "model/safetensors.h"
#include "model/weight_store.h"
#include "template/chat_template.h"
#include "tokenizer/tokenizer.h"
#include "tools/testmodel/gguf_writer.h"
#include "tools/testmodel/safetensors_writer.h"
#include "tools/testmodel/synthetic_vocab.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;

// A fresh directory per test, removed afterwards.
class TempDir {
 public:
  TempDir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    path_ = fs::path(::testing::TempDir()) /
            (std::string("tessera_synth_") + info->test_suite_name() + "_" + info->name() + "_" +
             std::to_string(::getpid()));
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  std::string operator/(std::string_view name) const { return (path_ / name).string(); }
  std::string str() const { return path_.string(); }

 private:
  fs::path path_;
};

std::string read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// A small spec for tests: tiny's shape with fewer layers and the smallest useful vocabulary.
SyntheticModelSpec small_spec() {
  SyntheticModelSpec s = synthetic_preset("tiny").value();
  s.n_layers = 2;
  s.vocab = 512;
  return s;
}

std::vector<uint8_t> f32_bytes(std::initializer_list<float> v) {
  std::vector<uint8_t> b(v.size() * 4);
  std::memcpy(b.data(), std::data(v), b.size());
  return b;
}

// ---------------------------------------------------------------------------------------------
// Presets and validation

TEST(SyntheticPreset, AllPresetsAreValid) {
  for (const std::string& name : synthetic_preset_names()) {
    auto spec = synthetic_preset(name);
    ASSERT_TRUE(spec.is_ok()) << name;
    EXPECT_TRUE(validate_synthetic_spec(*spec).is_ok()) << name << ": " << validate_synthetic_spec(*spec).to_string();
  }
  const SyntheticModelSpec tiny = synthetic_preset("tiny").value();
  EXPECT_EQ(tiny.hidden, 128);
  EXPECT_EQ(tiny.n_layers, 4);
  EXPECT_EQ(tiny.n_heads, 4);
  EXPECT_EQ(tiny.n_kv_heads, 2);
  EXPECT_EQ(tiny.ffn, 384);
  EXPECT_EQ(tiny.vocab, 2048);
  EXPECT_EQ(tiny.max_positions, 1024);
  const SyntheticModelSpec l3 = synthetic_preset("llama3-8b").value();
  EXPECT_EQ(l3.hidden, 4096);
  EXPECT_EQ(l3.n_kv_heads, 8);
  EXPECT_EQ(l3.ffn, 14336);
  EXPECT_EQ(l3.vocab, 128256);
  EXPECT_FLOAT_EQ(l3.rope_theta, 500000.0f);
  EXPECT_EQ(synthetic_preset("1.1b")->n_layers, 22);
  EXPECT_EQ(synthetic_preset("110m")->hidden, 768);
  EXPECT_EQ(synthetic_preset("gqa4")->n_heads, 8);
  const SyntheticModelSpec g3 = synthetic_preset("gemma3-tiny").value();
  EXPECT_EQ(g3.arch, "gemma3");
  EXPECT_EQ(g3.hidden, 128);
  EXPECT_EQ(g3.n_layers, 7);
  EXPECT_EQ(g3.n_heads, 4);
  EXPECT_EQ(g3.n_kv_heads, 1);
  EXPECT_EQ(synthetic_head_dim(g3), 64);
  EXPECT_EQ(g3.sliding_window, 8);
  EXPECT_TRUE(g3.qk_norm);
  EXPECT_TRUE(g3.tie_embeddings);
  EXPECT_FLOAT_EQ(g3.rope_theta, 1e6f);

  auto unknown = synthetic_preset("70b");
  ASSERT_FALSE(unknown.is_ok());
  EXPECT_EQ(unknown.status().code(), StatusCode::kNotFound);
  EXPECT_NE(unknown.status().message().find("tiny"), std::string::npos);
}

TEST(SyntheticPreset, ValidationNamesTheField) {
  struct Case {
    const char* what;
    void (*mutate)(SyntheticModelSpec&);
    const char* expected;
  };
  const Case cases[] = {
      {"heads", [](SyntheticModelSpec& s) { s.n_heads = 3; }, "n_heads"},
      {"kv heads", [](SyntheticModelSpec& s) { s.n_kv_heads = 3; }, "n_kv_heads"},
      {"odd head dim", [](SyntheticModelSpec& s) { s.hidden = 132; s.n_heads = 12; }, "head_dim"},
      {"vocab", [](SyntheticModelSpec& s) { s.vocab = 100; }, "vocab"},
      {"arch", [](SyntheticModelSpec& s) { s.arch = "gpt2"; }, "gpt2"},
      {"qwen2 bias", [](SyntheticModelSpec& s) { s.arch = "qwen2"; }, "qkv_bias"},
      {"qwen3 norm", [](SyntheticModelSpec& s) { s.arch = "qwen3"; }, "qk_norm"},
      {"llama bias", [](SyntheticModelSpec& s) { s.qkv_bias = true; }, "qkv_bias"},
      {"ffn", [](SyntheticModelSpec& s) { s.ffn = 0; }, "ffn"},
      {"eps", [](SyntheticModelSpec& s) { s.rms_eps = 0; }, "rms_eps"},
  };
  for (const Case& c : cases) {
    SyntheticModelSpec s = small_spec();
    c.mutate(s);
    const Status st = validate_synthetic_spec(s);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << c.what;
    EXPECT_NE(st.message().find(c.expected), std::string::npos) << c.what << ": " << st.message();
  }
  const Case gemma_cases[] = {
      {"gemma3 q/k norms", [](SyntheticModelSpec& s) { s.qk_norm = false; }, "qk_norm"},
      {"gemma3 untied", [](SyntheticModelSpec& s) { s.tie_embeddings = false; }, "tie_embeddings"},
      {"gemma3 no window", [](SyntheticModelSpec& s) { s.sliding_window = 0; }, "sliding_window"},
      {"gemma3 pattern", [](SyntheticModelSpec& s) { s.sliding_window_pattern = 0; }, "sliding_window_pattern"},
      {"odd head_dim", [](SyntheticModelSpec& s) { s.head_dim = 63; }, "head_dim"},
      {"llama window", [](SyntheticModelSpec& s) { s = small_spec(); s.sliding_window = 8; }, "sliding_window"},
  };
  for (const Case& c : gemma_cases) {
    SyntheticModelSpec s = synthetic_preset("gemma3-tiny").value();
    c.mutate(s);
    const Status st = validate_synthetic_spec(s);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << c.what;
    EXPECT_NE(st.message().find(c.expected), std::string::npos) << c.what << ": " << st.message();
  }
}

// ---------------------------------------------------------------------------------------------
// Vocabulary

TEST(SyntheticVocab, LayoutAndScores) {
  for (int64_t n : {synthetic_vocab_min_size(), int64_t{512}, int64_t{2048}, int64_t{6000}}) {
    auto v = build_synthetic_vocab(n);
    ASSERT_TRUE(v.is_ok()) << n;
    ASSERT_EQ(static_cast<int64_t>(v->tokens.size()), n);
    ASSERT_EQ(v->scores.size(), v->tokens.size());
    ASSERT_EQ(v->token_types.size(), v->tokens.size());
    EXPECT_EQ(v->tokens[0], "<unk>");
    EXPECT_EQ(v->tokens[1], "<s>");
    EXPECT_EQ(v->tokens[2], "</s>");
    EXPECT_EQ(v->tokens[3], "<0x00>");
    EXPECT_EQ(v->tokens[258], "<0xFF>");
    EXPECT_EQ(v->token_types[0], 2);
    EXPECT_EQ(v->token_types[1], 3);
    EXPECT_EQ(v->token_types[100], 6);
    EXPECT_EQ(std::set<std::string>(v->tokens.begin(), v->tokens.end()).size(), v->tokens.size()) << "duplicates";
    for (size_t i = 260; i < v->scores.size(); ++i) ASSERT_LT(v->scores[i], v->scores[i - 1]) << i;
    // Every multi-character piece can be made by some merge.
    std::set<std::string> merged;
    for (const std::string& m : v->merges) merged.insert(m.substr(0, m.find(' ')) + m.substr(m.find(' ') + 1));
    for (size_t i = 259; i < v->tokens.size(); ++i) {
      const std::string& p = v->tokens[i];
      const bool single_char = p == "\xE2\x96\x81" || p.size() == 1;
      if (!single_char) {
        EXPECT_TRUE(merged.count(p)) << "unreachable piece '" << p << "'";
      }
    }
  }
  EXPECT_FALSE(build_synthetic_vocab(synthetic_vocab_min_size() - 1).is_ok());
  // Deterministic.
  EXPECT_EQ(build_synthetic_vocab(3000)->tokens, build_synthetic_vocab(3000)->tokens);
}

// ---------------------------------------------------------------------------------------------
// GGUF writer

TEST(GgufWriter, MetadataAndTensorsRoundTrip) {
  TempDir dir;
  GgufWriter w;
  w.set_u8("t.u8", 200);
  w.set_i8("t.i8", -100);
  w.set_u16("t.u16", 60000);
  w.set_i16("t.i16", -30000);
  w.set_u32("t.u32", 4000000000u);
  w.set_i32("t.i32", -2000000000);
  w.set_u64("t.u64", 1ull << 40);
  w.set_i64("t.i64", -(1ll << 40));
  w.set_f32("t.f32", 1.5f);
  w.set_f64("t.f64", -2.25);
  w.set_bool("t.bool", true);
  w.set_string("t.str", "h\xC3\xA9llo");
  const std::vector<std::string> strs = {"a", "", "\xE2\x96\x81the"};
  w.set_string_array("t.strs", strs);
  const std::vector<int32_t> ints = {1, -2, 3};
  w.set_i32_array("t.ints", ints);
  const std::vector<float> floats = {0.5f, -1.0f};
  w.set_f32_array("t.floats", floats);
  w.set_u32("t.u32", 7);  // replaces the value, keeps one key

  const int64_t shape2[] = {3, 2};
  ASSERT_TRUE(w.add_tensor("a.weight", shape2, QuantType::kF32, f32_bytes({1, 2, 3, 4, 5, 6})).is_ok());
  const int64_t shape1[] = {3};
  ASSERT_TRUE(w.add_tensor("b.bias", shape1, QuantType::kF32, [](std::span<uint8_t> dst) {
                 const float v[3] = {7, 8, 9};
                 std::memcpy(dst.data(), v, 12);
                 return Status::ok();
               }).is_ok());
  const int64_t shape_q[] = {2, 64};
  std::vector<uint8_t> q8(2 * row_bytes(QuantType::kQ8_0, 64), 0x11);
  ASSERT_TRUE(w.add_tensor("c.q8", shape_q, QuantType::kQ8_0, q8).is_ok());
  const std::string path = dir / "t.gguf";
  ASSERT_TRUE(w.write(path).is_ok());

  auto file = GgufFile::open(path);
  ASSERT_TRUE(file.is_ok()) << file.status().to_string();
  const GgufFile& g = **file;
  EXPECT_EQ(g.version(), 3u);
  EXPECT_EQ(*g.get_int("general.alignment"), 32);
  EXPECT_EQ(*g.get_int("t.u8"), 200);
  EXPECT_EQ(*g.get_int("t.i8"), -100);
  EXPECT_EQ(*g.get_int("t.u16"), 60000);
  EXPECT_EQ(*g.get_int("t.i16"), -30000);
  EXPECT_EQ(*g.get_int("t.u32"), 7);
  EXPECT_EQ(*g.get_int("t.i32"), -2000000000);
  EXPECT_EQ(*g.get_int("t.u64"), 1ll << 40);
  EXPECT_EQ(*g.get_int("t.i64"), -(1ll << 40));
  EXPECT_DOUBLE_EQ(*g.get_float("t.f32"), 1.5);
  EXPECT_DOUBLE_EQ(*g.get_float("t.f64"), -2.25);
  EXPECT_TRUE(*g.get_bool("t.bool"));
  EXPECT_EQ(*g.get_string("t.str"), "h\xC3\xA9llo");
  EXPECT_EQ(*g.get_string_array("t.strs"), strs);
  EXPECT_EQ(*g.get_int_array("t.ints"), (std::vector<int64_t>{1, -2, 3}));
  EXPECT_EQ(*g.get_float_array("t.floats"), (std::vector<double>{0.5, -1.0}));
  EXPECT_EQ(g.metadata().at("t.u32").type, GgufValueType::kUint32);
  EXPECT_EQ(g.metadata().at("t.ints").array_type, GgufValueType::kInt32);

  ASSERT_EQ(g.tensors().size(), 3u);
  const GgufTensorInfo* a = g.find_tensor("a.weight");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->shape, (std::vector<int64_t>{3, 2}));
  EXPECT_EQ(a->view.type, QuantType::kF32);
  EXPECT_EQ(static_cast<const float*>(a->view.data)[5], 6.0f);
  const GgufTensorInfo* b = g.find_tensor("b.bias");
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(static_cast<const float*>(b->view.data)[2], 9.0f);
  EXPECT_EQ(b->offset % 32, 0u);
  const GgufTensorInfo* c = g.find_tensor("c.q8");
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->ggml_type, 8);
  EXPECT_EQ(c->shape, (std::vector<int64_t>{2, 64}));
  EXPECT_EQ(c->offset % 32, 0u);
  EXPECT_EQ(std::memcmp(c->view.data, q8.data(), q8.size()), 0);
}

TEST(GgufWriter, CopiesValuesReadBack) {
  TempDir dir;
  GgufWriter w;
  w.set_i16("k.i16", -5);
  const std::vector<std::string> strs = {"x", "y"};
  w.set_string_array("k.strs", strs);
  const std::vector<double> ds = {0.25, 8.0};
  w.set_f64_array("k.f64s", ds);
  ASSERT_TRUE(w.write(dir / "a.gguf").is_ok());
  auto a = GgufFile::open(dir / "a.gguf");
  ASSERT_TRUE(a.is_ok()) << a.status().to_string();

  GgufWriter copy;
  for (const auto& [key, value] : (*a)->metadata()) ASSERT_TRUE(copy.set_value(key, value).is_ok()) << key;
  ASSERT_TRUE(copy.write(dir / "b.gguf").is_ok());
  EXPECT_EQ(read_bytes(dir / "a.gguf").size(), read_bytes(dir / "b.gguf").size());
  auto b = GgufFile::open(dir / "b.gguf");
  ASSERT_TRUE(b.is_ok());
  EXPECT_EQ(*(*b)->get_int("k.i16"), -5);
  EXPECT_EQ((*b)->metadata().at("k.i16").type, GgufValueType::kInt16);
  EXPECT_EQ(*(*b)->get_string_array("k.strs"), strs);
  EXPECT_EQ(*(*b)->get_float_array("k.f64s"), ds);

  GgufValue too_big;
  too_big.type = GgufValueType::kUint8;
  too_big.value = int64_t{300};
  EXPECT_EQ(copy.set_value("k.bad", too_big).code(), StatusCode::kInvalidArgument);
}

TEST(GgufWriter, RejectsBadTensorsAndReportsIoErrors) {
  GgufWriter w;
  const int64_t shape[] = {2, 3};
  ASSERT_TRUE(w.add_tensor("x", shape, QuantType::kF32, std::vector<uint8_t>(24)).is_ok());
  EXPECT_EQ(w.add_tensor("x", shape, QuantType::kF32, std::vector<uint8_t>(24)).code(), StatusCode::kInvalidArgument);
  const Status wrong_size = w.add_tensor("y", shape, QuantType::kF32, std::vector<uint8_t>(20));
  EXPECT_EQ(wrong_size.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(wrong_size.message().find("'y'"), std::string::npos);
  const Status bad_block = w.add_tensor("z", shape, QuantType::kQ4_0, GgufTensorFill());
  EXPECT_EQ(bad_block.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad_block.message().find("'z'"), std::string::npos);
  const int64_t zero[] = {0, 3};
  EXPECT_FALSE(w.add_tensor("w", zero, QuantType::kF32, GgufTensorFill()).is_ok());
  EXPECT_EQ(w.tensor_count(), 1u);

  const std::string bad_path = "/nonexistent-tessera-dir/sub/model.gguf";
  const Status io = w.write(bad_path);
  EXPECT_EQ(io.code(), StatusCode::kIoError);
  EXPECT_NE(io.message().find(bad_path), std::string::npos) << io.message();

  // A failing fill aborts the write and leaves neither the file nor a temporary behind.
  TempDir dir;
  GgufWriter f;
  ASSERT_TRUE(f.add_tensor("boom", shape, QuantType::kF32,
                           [](std::span<uint8_t>) { return Status::internal("no data"); }).is_ok());
  const Status st = f.write(dir / "f.gguf");
  EXPECT_EQ(st.code(), StatusCode::kInternal);
  EXPECT_NE(st.message().find("boom"), std::string::npos);
  EXPECT_TRUE(fs::is_empty(dir.str()));
}

// ---------------------------------------------------------------------------------------------
// Safetensors writer

TEST(SafetensorsWriter, SingleFileRoundTrip) {
  TempDir dir;
  SafetensorsWriter w;
  const int64_t s23[] = {2, 3};
  const int64_t s3[] = {3};
  ASSERT_TRUE(w.add_tensor("z.weight", s23, QuantType::kF32, f32_bytes({1, 2, 3, 4, 5, 6})).is_ok());
  ASSERT_TRUE(w.add_tensor("a.half", s3, QuantType::kF16, std::vector<uint8_t>{0, 0x3c, 0, 0x40, 0, 0xc0}).is_ok());
  ASSERT_TRUE(w.add_tensor("m.bf", s3, QuantType::kBF16, std::vector<uint8_t>(6, 0)).is_ok());
  ASSERT_TRUE(w.add_tensor("i.eight", s3, QuantType::kI8, std::vector<uint8_t>{1, 0xff, 3}).is_ok());
  ASSERT_TRUE(w.add_tensor("i.thirty_two", s3, QuantType::kI32, std::vector<uint8_t>(12, 0)).is_ok());
  EXPECT_EQ(w.add_tensor("q", s3, QuantType::kQ4_K, std::vector<uint8_t>()).code(), StatusCode::kInvalidArgument);
  const std::string path = dir / "model.safetensors";
  ASSERT_TRUE(w.write(path).is_ok());

  const std::string raw = read_bytes(path);
  uint64_t header_len = 0;
  std::memcpy(&header_len, raw.data(), 8);
  EXPECT_EQ(header_len % 8, 0u);
  EXPECT_EQ(raw.size(), 8 + header_len + w.total_bytes());

  auto ck = SafetensorsCheckpoint::open(path);
  ASSERT_TRUE(ck.is_ok()) << ck.status().to_string();
  const SafetensorsTensor* z = (*ck)->find("z.weight");
  ASSERT_NE(z, nullptr);
  EXPECT_EQ(z->dtype, "F32");
  EXPECT_EQ(z->shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(static_cast<const float*>(z->view.data)[4], 5.0f);
  const SafetensorsTensor* h = (*ck)->find("a.half");
  ASSERT_NE(h, nullptr);
  EXPECT_EQ(h->dtype, "F16");
  EXPECT_EQ(fp16_to_f32(static_cast<const uint16_t*>(h->view.data)[2]), -2.0f);
  EXPECT_EQ((*ck)->find("m.bf")->dtype, "BF16");
  EXPECT_EQ((*ck)->find("i.eight")->dtype, "I8");
  EXPECT_EQ((*ck)->find("i.thirty_two")->dtype, "I32");
}

TEST(SafetensorsWriter, ShardedCheckpoint) {
  TempDir dir;
  SafetensorsWriter w;
  for (int i = 0; i < 7; ++i) {
    const int64_t shape[] = {i + 1, 4};
    std::vector<uint8_t> bytes(static_cast<size_t>((i + 1) * 16));
    for (size_t k = 0; k < bytes.size(); ++k) bytes[k] = static_cast<uint8_t>(i * 31 + k);
    ASSERT_TRUE(w.add_tensor("t" + std::to_string(i), shape, QuantType::kF32, bytes).is_ok());
  }
  EXPECT_EQ(w.write_sharded(dir.str(), 8).code(), StatusCode::kInvalidArgument);
  ASSERT_TRUE(w.write_sharded(dir.str(), 3).is_ok());
  for (const char* f : {"model-00001-of-00003.safetensors", "model-00002-of-00003.safetensors",
                        "model-00003-of-00003.safetensors", "model.safetensors.index.json"})
    EXPECT_TRUE(fs::exists(dir / f)) << f;

  auto ck = SafetensorsCheckpoint::open(dir.str());
  ASSERT_TRUE(ck.is_ok()) << ck.status().to_string();
  EXPECT_EQ((*ck)->tensors().size(), 7u);
  EXPECT_EQ((*ck)->files().size(), 3u);
  for (int i = 0; i < 7; ++i) {
    const SafetensorsTensor* t = (*ck)->find("t" + std::to_string(i));
    ASSERT_NE(t, nullptr);
    EXPECT_EQ(t->shape, (std::vector<int64_t>{i + 1, 4}));
    EXPECT_EQ(static_cast<const uint8_t*>(t->view.data)[3], static_cast<uint8_t>(i * 31 + 3));
  }
}

// ---------------------------------------------------------------------------------------------
// Synthetic models through the loaders

void expect_same_tensors(const WeightStore& hf, const WeightStore& gguf) {
  const std::vector<std::string> names = hf.names();
  ASSERT_FALSE(names.empty());
  EXPECT_EQ(names.size(), gguf.names().size());
  for (const std::string& name : names) {
    auto a = hf.get(name);
    auto b = gguf.get(name);
    ASSERT_TRUE(a.is_ok()) << a.status().to_string();
    ASSERT_TRUE(b.is_ok()) << name << ": " << b.status().to_string();
    ASSERT_EQ(a->type, QuantType::kF32) << name;
    ASSERT_EQ(b->type, QuantType::kF32) << name;
    ASSERT_EQ(a->shape_string(), b->shape_string()) << name;
    EXPECT_EQ(std::memcmp(a->data, b->data, a->nbytes()), 0) << name << " differs between HF and GGUF";
  }
}

TEST(SyntheticModel, HfAndF32GgufAreTheSameModel) {
  TempDir dir;
  const SyntheticModelSpec spec = synthetic_preset("tiny").value();
  ASSERT_TRUE(write_synthetic_hf(spec, dir / "hf").is_ok());
  ASSERT_TRUE(write_synthetic_gguf(spec, dir / "m.gguf").is_ok());
  for (const char* f : {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                        "generation_config.json"})
    EXPECT_TRUE(fs::exists(dir / (std::string("hf/") + f))) << f;

  auto hf = WeightStore::open(dir / "hf");
  ASSERT_TRUE(hf.is_ok()) << hf.status().to_string();
  auto gguf = WeightStore::open(dir / "m.gguf");
  ASSERT_TRUE(gguf.is_ok()) << gguf.status().to_string();
  EXPECT_EQ((*hf)->format(), ModelFormat::kHuggingFace);
  EXPECT_EQ((*gguf)->format(), ModelFormat::kGguf);
  for (const ModelConfig* c : {&(*hf)->config(), &(*gguf)->config()}) {
    EXPECT_EQ(c->arch, Architecture::kLlama);
    EXPECT_EQ(c->hidden, 128);
    EXPECT_EQ(c->n_layers, 4);
    EXPECT_EQ(c->n_heads, 4);
    EXPECT_EQ(c->n_kv_heads, 2);
    EXPECT_EQ(c->head_dim, 32);
    EXPECT_EQ(c->ffn, 384);
    EXPECT_EQ(c->vocab, 2048);
    EXPECT_EQ(c->max_positions, 1024);
    EXPECT_FLOAT_EQ(c->rms_eps, 1e-5f);
    EXPECT_FLOAT_EQ(c->rope_theta, 10000.0f);
    EXPECT_FALSE(c->tie_embeddings);
    EXPECT_EQ(c->bos_id, 1);
  }
  expect_same_tensors(**hf, **gguf);

  // The HF file holds exactly the generator's values (Q/K in HF order).
  for (const char* name : {"model.layers.1.self_attn.q_proj.weight", "model.layers.0.self_attn.k_proj.weight",
                           "model.norm.weight", "lm_head.weight"}) {
    auto values = synthetic_tensor_values(spec, name);
    ASSERT_TRUE(values.is_ok());
    auto view = (*hf)->get(name);
    ASSERT_TRUE(view.is_ok());
    ASSERT_EQ(values->size(), static_cast<size_t>(view->numel()));
    EXPECT_EQ(std::memcmp(values->data(), view->data, values->size() * 4), 0) << name;
  }
  auto bound = bind_model_weights(**gguf);
  EXPECT_TRUE(bound.is_ok()) << bound.status().to_string();
}

TEST(SyntheticModel, GgufStoresLlamaQkInAdjacentPairOrder) {
  TempDir dir;
  const SyntheticModelSpec spec = small_spec();
  ASSERT_TRUE(write_synthetic_gguf(spec, dir / "m.gguf").is_ok());
  auto g = GgufFile::open(dir / "m.gguf");
  ASSERT_TRUE(g.is_ok()) << g.status().to_string();
  const GgufTensorInfo* q = (*g)->find_tensor("blk.0.attn_q.weight");
  ASSERT_NE(q, nullptr);
  const auto hf_q = synthetic_tensor_values(spec, "model.layers.0.self_attn.q_proj.weight").value();
  const int64_t hd = spec.hidden / spec.n_heads, cols = spec.hidden;
  const auto* stored = static_cast<const float*>(q->view.data);
  for (int64_t h : {int64_t{0}, spec.n_heads - 1}) {
    for (int64_t i : {int64_t{0}, int64_t{1}, hd / 2 - 1}) {
      EXPECT_EQ(std::memcmp(stored + (h * hd + 2 * i) * cols, hf_q.data() + (h * hd + i) * cols, cols * 4), 0);
      EXPECT_EQ(std::memcmp(stored + (h * hd + 2 * i + 1) * cols, hf_q.data() + (h * hd + i + hd / 2) * cols, cols * 4), 0);
    }
  }
  EXPECT_EQ(*(*g)->get_string("general.architecture"), "llama");
  EXPECT_EQ(*(*g)->get_int("llama.rope.dimension_count"), hd);
  EXPECT_EQ(*(*g)->get_int("general.file_type"), 0);
  EXPECT_EQ(*(*g)->get_string("tokenizer.ggml.model"), "llama");
  EXPECT_EQ((*g)->get_string_array("tokenizer.ggml.tokens")->size(), 512u);
  EXPECT_TRUE((*g)->has("tokenizer.chat_template"));
}

TEST(SyntheticModel, QwenVariantsMatchAcrossFormats) {
  for (const char* arch : {"qwen2", "qwen3"}) {
    SCOPED_TRACE(arch);
    TempDir dir;
    SyntheticModelSpec spec = small_spec();
    spec.arch = arch;
    spec.qkv_bias = spec.arch == "qwen2";
    spec.qk_norm = spec.arch == "qwen3";
    spec.tie_embeddings = true;
    ASSERT_TRUE(write_synthetic_hf(spec, dir / "hf").is_ok());
    ASSERT_TRUE(write_synthetic_gguf(spec, dir / "m.gguf").is_ok());
    auto hf = WeightStore::open(dir / "hf");
    ASSERT_TRUE(hf.is_ok()) << hf.status().to_string();
    auto gguf = WeightStore::open(dir / "m.gguf");
    ASSERT_TRUE(gguf.is_ok()) << gguf.status().to_string();
    EXPECT_EQ((*hf)->config().arch, spec.arch == "qwen2" ? Architecture::kQwen2 : Architecture::kQwen3);
    EXPECT_EQ((*gguf)->config().arch, (*hf)->config().arch);
    EXPECT_TRUE((*hf)->config().tie_embeddings);
    const char* extra = spec.arch == "qwen2" ? "model.layers.1.self_attn.k_proj.bias"
                                             : "model.layers.1.self_attn.k_norm.weight";
    EXPECT_TRUE((*hf)->has(extra));
    EXPECT_TRUE((*gguf)->has(extra));
    expect_same_tensors(**hf, **gguf);
  }
}

bool same_view(const TensorView& a, const TensorView& b) {
  if ((a.data == nullptr) != (b.data == nullptr)) return false;
  if (a.data == nullptr) return true;
  return a.type == b.type && a.shape_string() == b.shape_string() && std::memcmp(a.data, b.data, a.nbytes()) == 0;
}

// Gemma 3: the HF directory stores norms as w - 1 (config norm offset 1), the GGUF file as w
// (offset 0), Q/K unpermuted in both; once bound, every weight is bitwise the same.
TEST(SyntheticModel, Gemma3HfAndF32GgufAreTheSameModel) {
  TempDir dir;
  SyntheticModelSpec spec = synthetic_preset("gemma3-tiny").value();
  spec.vocab = 512;
  ASSERT_TRUE(write_synthetic_hf(spec, dir / "hf").is_ok());
  ASSERT_TRUE(write_synthetic_gguf(spec, dir / "m.gguf").is_ok());

  const auto config = nlohmann::json::parse(read_bytes(dir / "hf/config.json"));
  EXPECT_EQ(config["model_type"], "gemma3_text");
  EXPECT_EQ(config["architectures"][0], "Gemma3ForCausalLM");
  EXPECT_EQ(config["hidden_activation"], "gelu_pytorch_tanh");
  EXPECT_FALSE(config.contains("hidden_act"));
  EXPECT_EQ(config["query_pre_attn_scalar"], 64);
  EXPECT_EQ(config["head_dim"], 64);
  EXPECT_EQ(config["sliding_window"], 8);
  EXPECT_EQ(config["layer_types"][5], "full_attention");
  EXPECT_EQ(config["layer_types"][6], "sliding_attention");
  EXPECT_EQ(config["tie_word_embeddings"], true);

  auto hf = WeightStore::open(dir / "hf");
  ASSERT_TRUE(hf.is_ok()) << hf.status().to_string();
  auto gguf = WeightStore::open(dir / "m.gguf");
  ASSERT_TRUE(gguf.is_ok()) << gguf.status().to_string();
  const std::vector<bool> local = {true, true, true, true, true, false, true};
  for (const ModelConfig* c : {&(*hf)->config(), &(*gguf)->config()}) {
    SCOPED_TRACE(c == &(*hf)->config() ? "hf" : "gguf");
    EXPECT_EQ(c->arch, Architecture::kGemma3);
    EXPECT_EQ(c->hidden, 128);
    EXPECT_EQ(c->n_layers, 7);
    EXPECT_EQ(c->n_heads, 4);
    EXPECT_EQ(c->n_kv_heads, 1);
    EXPECT_EQ(c->head_dim, 64);
    EXPECT_EQ(c->ffn, 384);
    EXPECT_EQ(c->vocab, 512);
    EXPECT_EQ(c->sliding_window, 8);
    EXPECT_EQ(c->local_layers, local);
    EXPECT_TRUE(c->is_local_layer(6));
    EXPECT_FALSE(c->is_local_layer(5));
    EXPECT_FLOAT_EQ(c->rope_theta, 1e6f);
    EXPECT_FLOAT_EQ(c->rope_theta_local, 10000.0f);
    EXPECT_FLOAT_EQ(c->query_pre_attn_scalar, 64.0f);
    EXPECT_FLOAT_EQ(c->rms_eps, 1e-6f);
    EXPECT_TRUE(c->qk_norm);
    EXPECT_FALSE(c->qkv_bias);
    EXPECT_TRUE(c->tie_embeddings);
    EXPECT_EQ(c->bos_id, 1);
  }
  EXPECT_EQ((*hf)->config().norm_weight_offset, 1.0f);
  EXPECT_EQ((*gguf)->config().norm_weight_offset, 0.0f);

  // The files: GGUF keys and names as llama.cpp writes a gemma3 file, no LM head, no pattern key.
  auto g = GgufFile::open(dir / "m.gguf");
  ASSERT_TRUE(g.is_ok()) << g.status().to_string();
  EXPECT_EQ(*(*g)->get_string("general.architecture"), "gemma3");
  EXPECT_EQ(*(*g)->get_int("gemma3.attention.sliding_window"), 8);
  EXPECT_EQ(*(*g)->get_int("gemma3.attention.key_length"), 64);
  EXPECT_FALSE((*g)->has("gemma3.attention.sliding_window_pattern"));
  EXPECT_EQ((*g)->find_tensor("output.weight"), nullptr);
  for (const char* t : {"blk.0.post_attention_norm.weight", "blk.0.ffn_norm.weight", "blk.0.post_ffw_norm.weight",
                        "blk.6.attn_q_norm.weight", "blk.6.attn_k_norm.weight"})
    EXPECT_NE((*g)->find_tensor(t), nullptr) << t;

  // Raw tensors: the same names; norms differ by exactly 1, everything else (Q/K included) is equal.
  const std::vector<std::string> names = (*hf)->names();
  EXPECT_EQ(names.size(), (*gguf)->names().size());
  int norms = 0;
  for (const std::string& name : names) {
    auto a = (*hf)->get(name);
    auto b = (*gguf)->get(name);
    ASSERT_TRUE(a.is_ok()) << a.status().to_string();
    ASSERT_TRUE(b.is_ok()) << name << ": " << b.status().to_string();
    ASSERT_EQ(a->type, QuantType::kF32) << name;
    ASSERT_EQ(b->type, QuantType::kF32) << name;
    ASSERT_EQ(a->shape_string(), b->shape_string()) << name;
    const auto values = synthetic_tensor_values(spec, name).value();
    ASSERT_EQ(values.size(), static_cast<size_t>(a->numel())) << name;
    EXPECT_EQ(std::memcmp(values.data(), a->data, a->nbytes()), 0) << name << ": HF differs from the generator";
    const bool norm = name.find("norm.weight") != std::string::npos;
    norms += norm;
    const auto* hv = static_cast<const float*>(a->data);
    const auto* gv = static_cast<const float*>(b->data);
    for (int64_t i = 0; i < a->numel(); ++i) {
      const float want = norm ? hv[i] + 1.0f : hv[i];
      ASSERT_EQ(std::memcmp(&want, &gv[i], 4), 0) << name << "[" << i << "]: HF " << hv[i] << ", GGUF " << gv[i];
    }
  }
  EXPECT_EQ(norms, 7 * 6 + 1);

  auto wh = bind_model_weights(**hf);
  ASSERT_TRUE(wh.is_ok()) << wh.status().to_string();
  auto wg = bind_model_weights(**gguf);
  ASSERT_TRUE(wg.is_ok()) << wg.status().to_string();
  EXPECT_TRUE(same_view(wh->embed, wg->embed));
  EXPECT_TRUE(same_view(wh->final_norm, wg->final_norm));
  EXPECT_EQ(wh->lm_head.data, wh->embed.data);
  EXPECT_EQ(wg->lm_head.data, wg->embed.data);
  ASSERT_EQ(wh->layers.size(), 7u);
  ASSERT_EQ(wg->layers.size(), 7u);
  for (size_t l = 0; l < wh->layers.size(); ++l) {
    const LayerWeights& a = wh->layers[l];
    const LayerWeights& b = wg->layers[l];
    const std::pair<const char*, std::pair<const TensorView*, const TensorView*>> views[] = {
        {"attn_norm", {&a.attn_norm, &b.attn_norm}},     {"wq", {&a.wq, &b.wq}},
        {"wk", {&a.wk, &b.wk}},                          {"wv", {&a.wv, &b.wv}},
        {"wo", {&a.wo, &b.wo}},                          {"q_norm", {&a.q_norm, &b.q_norm}},
        {"k_norm", {&a.k_norm, &b.k_norm}},              {"ffn_norm", {&a.ffn_norm, &b.ffn_norm}},
        {"post_attn_norm", {&a.post_attn_norm, &b.post_attn_norm}},
        {"post_ffn_norm", {&a.post_ffn_norm, &b.post_ffn_norm}},
        {"w_gate", {&a.w_gate, &b.w_gate}},              {"w_up", {&a.w_up, &b.w_up}},
        {"w_down", {&a.w_down, &b.w_down}}};
    for (const auto& [what, v] : views) {
      ASSERT_NE(v.first->data, nullptr) << "layer " << l << " " << what;
      EXPECT_TRUE(same_view(*v.first, *v.second)) << "layer " << l << " " << what << " differs between HF and GGUF";
    }
    EXPECT_EQ(a.bq.data, nullptr);
  }
  // The bound norms are 1 + (w - 1): near 1, not near 0.
  const auto* post = static_cast<const float*>(wh->layers[3].post_ffn_norm.data);
  EXPECT_NEAR(post[0], 1.0f, 0.1f);
  EXPECT_NE(post[0], 1.0f);
}

// A 16-bit HF Gemma file holds the same norms (w - 1 is exact in bf16 and f16).
TEST(SyntheticModel, Gemma3NormsAreExactIn16BitFiles) {
  TempDir dir;
  SyntheticModelSpec spec = synthetic_preset("gemma3-tiny").value();
  spec.vocab = 512;
  spec.n_layers = 2;
  ASSERT_TRUE(write_synthetic_gguf(spec, dir / "m.gguf").is_ok());
  auto gguf = WeightStore::open(dir / "m.gguf");
  ASSERT_TRUE(gguf.is_ok()) << gguf.status().to_string();
  auto wg = bind_model_weights(**gguf);
  ASSERT_TRUE(wg.is_ok());
  for (QuantType type : {QuantType::kBF16, QuantType::kF16}) {
    SCOPED_TRACE(std::string(quant_name(type)));
    spec.weight_type = type;
    const std::string path = dir / (std::string("hf-") + std::string(quant_name(type)));
    ASSERT_TRUE(write_synthetic_hf(spec, path).is_ok());
    auto hf = WeightStore::open(path);
    ASSERT_TRUE(hf.is_ok()) << hf.status().to_string();
    auto wh = bind_model_weights(**hf);
    ASSERT_TRUE(wh.is_ok()) << wh.status().to_string();
    EXPECT_TRUE(same_view(wh->final_norm, wg->final_norm));
    for (size_t l = 0; l < 2; ++l) {
      EXPECT_TRUE(same_view(wh->layers[l].post_attn_norm, wg->layers[l].post_attn_norm)) << l;
      EXPECT_TRUE(same_view(wh->layers[l].ffn_norm, wg->layers[l].ffn_norm)) << l;
      EXPECT_TRUE(same_view(wh->layers[l].q_norm, wg->layers[l].q_norm)) << l;
    }
  }
  // Another layer pattern reaches both files' configs (the GGUF one through its pattern key).
  spec.weight_type = QuantType::kF32;
  spec.n_layers = 4;
  spec.sliding_window_pattern = 2;
  ASSERT_TRUE(write_synthetic_gguf(spec, dir / "p2.gguf").is_ok());
  ASSERT_TRUE(write_synthetic_hf(spec, dir / "p2").is_ok());
  for (const std::string& path : {dir / "p2.gguf", dir / "p2"}) {
    auto c = load_model_config(path);
    ASSERT_TRUE(c.is_ok()) << c.status().to_string();
    EXPECT_EQ(c->local_layers, (std::vector<bool>{true, false, true, false})) << path;
  }
}

TEST(SyntheticModel, ShardedHfMatchesSingleFile) {
  TempDir dir;
  SyntheticModelSpec spec = small_spec();
  ASSERT_TRUE(write_synthetic_hf(spec, dir / "one").is_ok());
  spec.hf_shards = 3;
  ASSERT_TRUE(write_synthetic_hf(spec, dir / "three").is_ok());
  EXPECT_TRUE(fs::exists(dir / "three/model.safetensors.index.json"));
  EXPECT_FALSE(fs::exists(dir / "three/model.safetensors"));
  auto one = WeightStore::open(dir / "one");
  auto three = WeightStore::open(dir / "three");
  ASSERT_TRUE(one.is_ok()) << one.status().to_string();
  ASSERT_TRUE(three.is_ok()) << three.status().to_string();
  expect_same_tensors(**one, **three);
}

// Relative RMS error of each stored matrix against the generator's fp32 values.
void expect_close_to_fp32(const SyntheticModelSpec& spec, const WeightStore& store) {
  for (const SyntheticTensorInfo& t : synthetic_tensors(spec)) {
    auto view = store.get(t.hf_name);
    ASSERT_TRUE(view.is_ok()) << view.status().to_string();
    const QuantType expected_type = synthetic_gguf_tensor_type(spec, t.hf_name).value();
    EXPECT_EQ(view->type, expected_type) << t.hf_name;
    const auto ref = synthetic_tensor_values(spec, t.hf_name).value();
    const int64_t rows = view->rows(), cols = view->cols();
    ASSERT_EQ(static_cast<size_t>(rows * cols), ref.size()) << t.hf_name;
    std::vector<float> row(static_cast<size_t>(cols));
    double err = 0, norm = 0;
    for (int64_t r = 0; r < rows; ++r) {
      dequantize_row(view->type, view->row_ptr(r), row.data(), cols);
      for (int64_t c = 0; c < cols; ++c) {
        const double d = row[static_cast<size_t>(c)] - ref[static_cast<size_t>(r * cols + c)];
        err += d * d;
        norm += static_cast<double>(ref[static_cast<size_t>(r * cols + c)]) * ref[static_cast<size_t>(r * cols + c)];
      }
    }
    double tolerance = 0;
    switch (view->type) {
      case QuantType::kF32: tolerance = 0; break;
      // About 1.3x the errors measured on these values (Q4_0 0.077, Q4_K 0.069, ...).
      case QuantType::kF16: tolerance = 5e-4; break;
      case QuantType::kBF16: tolerance = 3e-3; break;
      case QuantType::kQ8_0: tolerance = 0.008; break;
      case QuantType::kQ6_K: tolerance = 0.025; break;
      case QuantType::kQ5_0: case QuantType::kQ5_K: tolerance = 0.05; break;
      // Measured 0.139 (Q3_K), 0.263 (Q2_K), 0.419 (TQ1_0, TQ2_0).
      case QuantType::kQ3_K: tolerance = 0.17; break;
      case QuantType::kQ2_K: tolerance = 0.32; break;
      case QuantType::kTQ1_0: case QuantType::kTQ2_0: tolerance = 0.5; break;
      default: tolerance = 0.1; break;  // 4-bit
    }
    EXPECT_LE(std::sqrt(err / norm), tolerance) << t.hf_name << " as " << quant_name(view->type);
  }
}

TEST(SyntheticModel, QuantizedGgufDequantizesCloseToFp32) {
  // hidden and ffn multiples of 256 so K-quants apply to every matrix.
  SyntheticModelSpec spec = synthetic_preset("gqa4").value();
  spec.n_layers = 1;
  spec.vocab = 512;
  for (QuantType type : {QuantType::kF16, QuantType::kBF16, QuantType::kQ8_0, QuantType::kQ4_0, QuantType::kQ5_0,
                         QuantType::kQ4_K, QuantType::kQ5_K, QuantType::kQ6_K, QuantType::kQ2_K, QuantType::kQ3_K,
                         QuantType::kTQ1_0, QuantType::kTQ2_0}) {
    SCOPED_TRACE(std::string(quant_name(type)));
    TempDir dir;
    spec.weight_type = type;
    ASSERT_TRUE(write_synthetic_gguf(spec, dir / "m.gguf").is_ok());
    auto store = WeightStore::open(dir / "m.gguf");
    ASSERT_TRUE(store.is_ok()) << store.status().to_string();
    expect_close_to_fp32(spec, **store);
  }
}

TEST(SyntheticModel, Q4KMixAndFallbacks) {
  SyntheticModelSpec spec = synthetic_preset("gqa4").value();
  spec.n_layers = 2;
  spec.vocab = 512;
  spec.gguf_mixed_q4_k_m = true;
  EXPECT_EQ(synthetic_gguf_file_type(spec), 15u);
  EXPECT_EQ(*synthetic_gguf_tensor_type(spec, "model.layers.0.self_attn.q_proj.weight"), QuantType::kQ4_K);
  EXPECT_EQ(*synthetic_gguf_tensor_type(spec, "model.layers.0.self_attn.v_proj.weight"), QuantType::kQ6_K);
  EXPECT_EQ(*synthetic_gguf_tensor_type(spec, "model.layers.1.self_attn.v_proj.weight"), QuantType::kQ4_K);
  EXPECT_EQ(*synthetic_gguf_tensor_type(spec, "model.layers.0.mlp.down_proj.weight"), QuantType::kQ6_K);
  EXPECT_EQ(*synthetic_gguf_tensor_type(spec, "lm_head.weight"), QuantType::kQ6_K);
  EXPECT_EQ(*synthetic_gguf_tensor_type(spec, "model.norm.weight"), QuantType::kF32);
  TempDir dir;
  ASSERT_TRUE(write_synthetic_gguf(spec, dir / "m.gguf").is_ok());
  auto store = WeightStore::open(dir / "m.gguf");
  ASSERT_TRUE(store.is_ok()) << store.status().to_string();
  expect_close_to_fp32(spec, **store);

  // tiny's ffn (384) is not a multiple of 256: rows of 384 fall back to 32-element blocks.
  SyntheticModelSpec tiny = synthetic_preset("tiny").value();
  tiny.weight_type = QuantType::kQ4_K;
  EXPECT_EQ(*synthetic_gguf_tensor_type(tiny, "model.layers.0.mlp.down_proj.weight"), QuantType::kQ5_0);
  EXPECT_EQ(*synthetic_gguf_tensor_type(tiny, "model.layers.0.mlp.up_proj.weight"), QuantType::kQ5_0);
  tiny.weight_type = QuantType::kQ6_K;
  EXPECT_EQ(*synthetic_gguf_tensor_type(tiny, "model.layers.0.mlp.down_proj.weight"), QuantType::kQ8_0);
  tiny.weight_type = QuantType::kQ2_K;
  EXPECT_EQ(*synthetic_gguf_tensor_type(tiny, "model.layers.0.mlp.down_proj.weight"), QuantType::kQ4_0);
  tiny.weight_type = QuantType::kTQ2_0;
  EXPECT_EQ(*synthetic_gguf_tensor_type(tiny, "model.layers.0.mlp.down_proj.weight"), QuantType::kF16);
}

TEST(SyntheticModel, Deterministic) {
  TempDir dir;
  SyntheticModelSpec spec = small_spec();
  spec.weight_type = QuantType::kQ8_0;
  ASSERT_TRUE(write_synthetic_gguf(spec, dir / "a.gguf").is_ok());
  ASSERT_TRUE(write_synthetic_gguf(spec, dir / "b.gguf").is_ok());
  spec.seed = 99;
  ASSERT_TRUE(write_synthetic_gguf(spec, dir / "c.gguf").is_ok());
  const std::string a = read_bytes(dir / "a.gguf"), b = read_bytes(dir / "b.gguf"), c = read_bytes(dir / "c.gguf");
  ASSERT_FALSE(a.empty());
  EXPECT_TRUE(a == b) << "same seed, different bytes";
  EXPECT_EQ(a.size(), c.size());
  EXPECT_FALSE(a == c) << "different seeds, same bytes";

  spec = small_spec();
  ASSERT_TRUE(write_synthetic_hf(spec, dir / "h1").is_ok());
  ASSERT_TRUE(write_synthetic_hf(spec, dir / "h2").is_ok());
  for (const char* f : {"model.safetensors", "tokenizer.json", "config.json"})
    EXPECT_TRUE(read_bytes(dir / (std::string("h1/") + f)) == read_bytes(dir / (std::string("h2/") + f))) << f;

  // Values have the intended scale.
  const auto w = synthetic_tensor_values(spec, "model.layers.0.mlp.gate_proj.weight").value();
  double sum = 0, sq = 0;
  for (float x : w) {
    sum += x;
    sq += static_cast<double>(x) * x;
  }
  const double mean = sum / static_cast<double>(w.size());
  const double std = std::sqrt(sq / static_cast<double>(w.size()) - mean * mean);
  EXPECT_NEAR(mean, 0.0, 0.01 / std::sqrt(128.0) * 10);
  EXPECT_NEAR(std, 1.0 / std::sqrt(128.0), 0.02 / std::sqrt(128.0));
}

TEST(SyntheticModel, TokenizerRoundTripThroughBothFiles) {
  TempDir dir;
  const SyntheticModelSpec spec = synthetic_preset("tiny").value();
  ASSERT_TRUE(write_synthetic_hf(spec, dir / "hf").is_ok());
  ASSERT_TRUE(write_synthetic_gguf(spec, dir / "m.gguf").is_ok());
  auto hf = Tokenizer::from_hf_file(dir / "hf/tokenizer.json");
  ASSERT_TRUE(hf.is_ok()) << hf.status().to_string();
  auto g = GgufFile::open(dir / "m.gguf");
  ASSERT_TRUE(g.is_ok()) << g.status().to_string();
  auto gg = Tokenizer::from_gguf(**g);
  ASSERT_TRUE(gg.is_ok()) << gg.status().to_string();
  EXPECT_EQ((*hf)->vocab_size(), 2048);
  EXPECT_EQ((*gg)->vocab_size(), 2048);
  EXPECT_EQ((*hf)->bos_id(), 1);
  EXPECT_EQ((*gg)->bos_id(), 1);
  EXPECT_EQ((*hf)->eos_ids(), std::vector<int32_t>{2});
  EXPECT_EQ((*gg)->eos_ids(), std::vector<int32_t>{2});

  const std::vector<int32_t> once = (*hf)->encode("Once upon a time", false);
  ASSERT_EQ(once.size(), 4u) << "each word is one piece";
  EXPECT_EQ((*hf)->id_to_token(once[0]), "\xE2\x96\x81Once");
  EXPECT_EQ((*hf)->id_to_token(once[3]), "\xE2\x96\x81time");
  for (const std::string text : {"Once upon a time", "Hello world! The girl's dog ran to the sea.",
                                 "caf\xC3\xA9 123 xyzzy", "  two  spaces", "Tom and Lily played in the park"}) {
    const std::vector<int32_t> a = (*hf)->encode(text, false);
    const std::vector<int32_t> b = (*gg)->encode(text, false);
    EXPECT_EQ(a, b) << text;
    EXPECT_EQ((*hf)->decode(a), text);
    EXPECT_EQ((*gg)->decode(b), text);
    const std::vector<int32_t> with_bos = (*hf)->encode(text, true);
    ASSERT_FALSE(with_bos.empty());
    EXPECT_EQ(with_bos[0], 1);
    EXPECT_EQ((*gg)->encode(text, true), with_bos) << text;
  }
}

TEST(SyntheticModel, ChatTemplateThroughBothFiles) {
  TempDir dir;
  const SyntheticModelSpec spec = small_spec();
  ASSERT_TRUE(write_synthetic_hf(spec, dir / "hf").is_ok());
  ASSERT_TRUE(write_synthetic_gguf(spec, dir / "m.gguf").is_ok());
  auto from_config = ChatTemplate::from_tokenizer_config(dir / "hf/tokenizer_config.json");
  ASSERT_TRUE(from_config.is_ok()) << from_config.status().to_string();
  auto g = GgufFile::open(dir / "m.gguf");
  ASSERT_TRUE(g.is_ok());
  auto from_gguf = ChatTemplate::from_gguf(**g);
  ASSERT_TRUE(from_gguf.is_ok()) << from_gguf.status().to_string();
  ChatTemplateOptions options;
  options.bos_token = "<s>";
  options.eos_token = "</s>";
  const std::vector<ChatMessage> chat = {
      {"system", "Be brief."}, {"user", "Hi"}, {"assistant", "Hello."}, {"user", "A story?"}};
  const std::string expected = "<s><<SYS>>\nBe brief.\n<</SYS>>\n\n[INST] Hi [/INST] Hello.</s>[INST] A story? [/INST]";
  for (const ChatTemplate* t : {&*from_config, &*from_gguf}) {
    auto text = t->render(chat, options);
    ASSERT_TRUE(text.is_ok()) << text.status().to_string();
    EXPECT_EQ(*text, expected);
  }
}

TEST(SyntheticModel, WriterErrors) {
  SyntheticModelSpec spec = small_spec();
  const std::string bad = "/nonexistent-tessera-dir/model.gguf";
  const Status st = write_synthetic_gguf(spec, bad);
  EXPECT_EQ(st.code(), StatusCode::kIoError);
  EXPECT_NE(st.message().find(bad), std::string::npos) << st.message();

  TempDir dir;
  const std::string blocker = dir / "file";
  std::ofstream(blocker) << "x";
  const Status hf_st = write_synthetic_hf(spec, blocker + "/hf");
  EXPECT_EQ(hf_st.code(), StatusCode::kIoError);
  EXPECT_NE(hf_st.message().find(blocker), std::string::npos) << hf_st.message();

  spec.weight_type = QuantType::kQ4_K;
  EXPECT_EQ(write_synthetic_hf(spec, dir / "q").code(), StatusCode::kInvalidArgument);
  spec.weight_type = QuantType::kI8;
  EXPECT_EQ(write_synthetic_gguf(spec, dir / "i8.gguf").code(), StatusCode::kInvalidArgument);
  spec = small_spec();
  spec.n_kv_heads = 3;
  EXPECT_EQ(write_synthetic_gguf(spec, dir / "x.gguf").code(), StatusCode::kInvalidArgument);
  EXPECT_FALSE(fs::exists(dir / "x.gguf"));
  EXPECT_EQ(synthetic_tensor_values(small_spec(), "no.such.tensor").status().code(), StatusCode::kNotFound);
}

}  // namespace
}  // namespace tessera
