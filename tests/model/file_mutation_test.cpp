// Randomized mutation test of the GGUF and safetensors parsers (and the config / weight binding
// on top of them): every mutated file must give an error or a valid model whose views lie
// inside the file, never a crash. Seeded, so a failure reproduces; sized to take a few seconds
// under ASan/UBSan.
#include <cstring>
#include <random>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "model/gguf.h"
#include "model/model_config.h"
#include "model/safetensors.h"
#include "model/weight_store.h"
#include "tests/model/loader_test_util.h"

namespace tessera {
namespace {

using loader_test::Bytes;
using loader_test::GgufBuilder;
using loader_test::TempDir;
using Json = nlohmann::json;

class Mutator {
 public:
  explicit Mutator(uint64_t seed) : rng_(seed) {}

  uint64_t below(uint64_t n) { return n == 0 ? 0 : rng_() % n; }

  // Applies 1-3 random edits, mostly inside [0, hot_end) where the headers live.
  Bytes mutate(const Bytes& src, size_t hot_end) {
    Bytes b = src;
    const int n = 1 + static_cast<int>(below(3));
    for (int i = 0; i < n && !b.empty(); ++i) {
      const size_t hot = std::min(hot_end, b.size());
      const size_t pos = below(10) < 9 ? below(hot) : below(b.size());
      switch (below(7)) {
        case 0:  // flip some bits
          for (uint64_t k = 0, m = 1 + below(8); k < m; ++k)
            b[std::min(b.size() - 1, pos + k)] ^= static_cast<uint8_t>(1 + below(255));
          break;
        case 1: {  // a 64-bit "length" or "offset" with an extreme value
          const uint64_t vals[] = {~0ull,       1ull << 63,  1ull << 32, 0x7fffffffull,
                                   rng_(),      0,           b.size(),   b.size() + 1,
                                   1ull << 40, 0xffffffffull};
          overwrite(&b, pos, vals[below(std::size(vals))], 8);
          break;
        }
        case 2: {  // a 32-bit type / count / dimension
          const uint64_t vals[] = {~0u, 0, 1, 5, 9, 13, 31, 99, static_cast<uint32_t>(rng_())};
          overwrite(&b, pos, vals[below(std::size(vals))], 4);
          break;
        }
        case 3:  // truncate
          b.resize(below(b.size()));
          break;
        case 4: {  // delete a slice
          const size_t len = std::min<size_t>(1 + below(16), b.size() - pos);
          b.erase(b.begin() + static_cast<std::ptrdiff_t>(pos),
                  b.begin() + static_cast<std::ptrdiff_t>(pos + len));
          break;
        }
        case 5: {  // insert random bytes
          Bytes ins(1 + below(16));
          for (auto& x : ins) x = static_cast<uint8_t>(rng_());
          b.insert(b.begin() + static_cast<std::ptrdiff_t>(pos), ins.begin(), ins.end());
          break;
        }
        case 6: {  // copy a chunk of the file over another place
          const size_t from = below(hot), len = std::min<size_t>(1 + below(32), b.size() - pos);
          for (size_t k = 0; k < len && from + k < b.size(); ++k) b[pos + k] = b[from + k];
          break;
        }
      }
    }
    return b;
  }

  // Structure-aware edit of a JSON text: replaces a number or a string with an extreme value.
  std::string mutate_json(const std::string& s) {
    std::string out = s;
    if (out.empty()) return out;
    const char* repl[] = {"18446744073709551615", "-1", "1e308", "99999999999999999999999",
                          "0", "null", "\"F64\"", "[]", "{}", "[1,2,3,4,5]", "\"\"", "true",
                          "4294967296", "-9223372036854775808", "\"x\\u0000y\""};
    for (int tries = 0; tries < 8; ++tries) {
      const size_t pos = below(out.size());
      const char c = out[pos];
      size_t end = pos;
      if ((c >= '0' && c <= '9') || c == '-') {
        while (end < out.size() && std::strchr("0123456789-+.eE", out[end])) ++end;
      } else if (c == '"') {
        end = out.find('"', pos + 1);
        if (end == std::string::npos) continue;
        ++end;
      } else {
        continue;
      }
      out.replace(pos, end - pos, repl[below(std::size(repl))]);
      return out;
    }
    out[below(out.size())] = static_cast<char>(rng_());
    return out;
  }

 private:
  static void overwrite(Bytes* b, size_t pos, uint64_t v, size_t n) {
    for (size_t k = 0; k < n && pos + k < b->size(); ++k) (*b)[pos + k] = static_cast<uint8_t>(v >> (8 * k));
  }
  std::mt19937_64 rng_;
};

// How many mutated copies were refused / accepted / went as far as binding a model. Both
// outcomes must occur, or the mutations are not exercising anything.
struct Outcomes {
  uint64_t sink = 0;  // keeps the touched bytes observable
  int refused = 0, opened = 0, bound = 0;
  void expect_both(const char* what) const {
    EXPECT_GT(refused, 0) << what;
    EXPECT_GT(opened, 0) << what;
    ::testing::Test::RecordProperty(std::string(what) + ".refused", refused);
    ::testing::Test::RecordProperty(std::string(what) + ".opened", opened);
    ::testing::Test::RecordProperty(std::string(what) + ".bound", bound);
  }
};

// Reads every byte range a view claims, so a view past the file would fault (and ASan-visible
// owned buffers would report) rather than pass silently.
uint64_t touch(const TensorView& v) {
  if (!v.data) return 0;
  const auto* p = static_cast<const uint8_t*>(v.data);
  const size_t n = v.nbytes();
  return n ? static_cast<uint64_t>(p[0]) + p[n - 1] + p[n / 2] : 0;
}

void check_bound(const WeightStore& store, Outcomes* out) {
  for (const std::string& name : store.names()) {
    auto v = store.get(name);
    if (v.is_ok()) out->sink += touch(*v);
  }
  auto w = bind_model_weights(store);
  if (!w.is_ok()) {
    EXPECT_FALSE(w.status().message().empty());
    return;
  }
  ++out->bound;
  out->sink += touch(w->embed) + touch(w->lm_head) + touch(w->final_norm);
  for (const LayerWeights& l : w->layers)
    for (const TensorView* v : {&l.attn_norm, &l.wq, &l.wk, &l.wv, &l.wo, &l.bq, &l.bk, &l.bv,
                                &l.q_norm, &l.k_norm, &l.ffn_norm, &l.w_gate, &l.w_up, &l.w_down})
      out->sink += touch(*v);
}

void check_gguf_file(const std::string& path, int iter, Outcomes* out) {
  auto r = GgufFile::open(path);
  if (!r.is_ok()) {
    ++out->refused;
    ASSERT_EQ(r.status().message().rfind(path, 0), 0u) << iter << ": " << r.status().message();
    return;
  }
  ++out->opened;
  const GgufFile& g = **r;
  for (const auto& t : g.tensors()) {
    if (!t.supported) continue;
    const auto* p = static_cast<const uint8_t*>(t.view.data);
    ASSERT_GE(p, g.file_data()) << iter << ": " << t.name;
    ASSERT_LE(static_cast<size_t>(p - g.file_data()) + t.view.nbytes(), g.file_size())
        << iter << ": " << t.name;
    out->sink += touch(t.view);
  }
  for (const auto& [key, value] : g.metadata()) {
    (void)g.get_int(key);
    (void)g.get_float(key);
    (void)g.get_string(key);
    (void)g.get_string_array(key);
    (void)g.get_float_array(key);
  }
  auto c = config_from_gguf(g);
  if (c.is_ok() && c->validate(path).is_ok()) out->sink += rope_inv_freq(*c).size();
  auto ws = WeightStore::open(path);
  if (ws.is_ok()) check_bound(**ws, out);
}

void check_hf_dir(const std::string& dir, int iter, Outcomes* out) {
  auto r = SafetensorsCheckpoint::open(dir);
  if (r.is_ok()) {
    ++out->opened;
    const SafetensorsCheckpoint& ck = **r;
    for (const auto& [name, t] : ck.tensors()) {
      if (!t.view.data) continue;
      const MappedFile& mf = ck.mapped_files()[0];
      const auto* p = static_cast<const uint8_t*>(t.view.data);
      ASSERT_GE(p, mf.data()) << iter << ": " << name;
      ASSERT_LE(static_cast<size_t>(p - mf.data()) + t.view.nbytes(), mf.size()) << iter << ": " << name;
      out->sink += touch(t.view);
    }
  } else {
    ++out->refused;
    ASSERT_FALSE(r.status().message().empty());
  }
  auto ws = WeightStore::open(dir);
  if (ws.is_ok()) check_bound(**ws, out);
}

// A complete tiny llama model (so mutated copies that still parse go through binding), plus
// metadata of every kind and tensors of several types.
GgufBuilder tiny_gguf() {
  GgufBuilder b;
  b.kv_str("general.architecture", "llama")
      .kv_u32("llama.embedding_length", 32)
      .kv_u32("llama.block_count", 1)
      .kv_u32("llama.attention.head_count", 2)
      .kv_u32("llama.attention.head_count_kv", 1)
      .kv_u32("llama.feed_forward_length", 32)
      .kv_u32("llama.context_length", 64)
      .kv_f32("llama.rope.freq_base", 10000.0f)
      .kv_str_array("tokenizer.ggml.tokens", {"<unk>", "<s>", "</s>", "a", "b", "c", "d", "e"})
      .kv_array<float>("tokenizer.ggml.scores", loader_test::kGF32, std::vector<float>(8, 0.5f))
      .kv_array<int32_t>("tokenizer.ggml.token_type", loader_test::kGI32, std::vector<int32_t>(8, 1))
      .kv<uint8_t>("tokenizer.ggml.add_bos_token", loader_test::kGBool, 1)
      .kv_u32("tokenizer.ggml.bos_token_id", 1)
      .kv_u32("tokenizer.ggml.eos_token_id", 2);
  Bytes nested;
  loader_test::put<uint32_t>(&nested, loader_test::kGArr);
  loader_test::put<uint64_t>(&nested, 1);
  loader_test::put<uint32_t>(&nested, loader_test::kGU16);
  loader_test::put<uint64_t>(&nested, 2);
  loader_test::put<uint16_t>(&nested, 1);
  loader_test::put<uint16_t>(&nested, 2);
  b.kv_raw("x.nested", loader_test::kGArr, nested);
  auto vals = [](size_t n, uint32_t seed) { return loader_test::test_values(n, seed); };
  b.f32_tensor("token_embd.weight", {8, 32}, vals(256, 1))
      .f32_tensor("output_norm.weight", {32}, vals(32, 2))
      .f32_tensor("blk.0.attn_norm.weight", {32}, vals(32, 3))
      .f32_tensor("blk.0.attn_q.weight", {32, 32}, vals(1024, 4))
      .f32_tensor("blk.0.attn_k.weight", {16, 32}, vals(512, 5))
      .tensor("blk.0.attn_v.weight", {16, 32}, 1, loader_test::f16_bytes(vals(512, 6)))
      .tensor("blk.0.attn_output.weight", {32, 32}, 8, Bytes(32 * 34, 0x3c))  // Q8_0
      .tensor("blk.0.ffn_norm.weight", {32}, 30, loader_test::bf16_bytes(vals(32, 7)))
      .f32_tensor("blk.0.ffn_gate.weight", {32, 32}, vals(1024, 8))
      .f32_tensor("blk.0.ffn_up.weight", {32, 32}, vals(1024, 9))
      .f32_tensor("blk.0.ffn_down.weight", {32, 32}, vals(1024, 10))
      .tensor("blk.0.extra_q4k.weight", {1, 256}, 12, Bytes(144, 0x11))
      .tensor("blk.0.extra_unknown.weight", {4}, 77, Bytes(8, 0));
  return b;
}

void write_tiny_hf(const TempDir& dir, Bytes* st, std::string* config) {
  auto vals = [](size_t n, uint32_t seed) { return loader_test::test_values(n, seed); };
  std::vector<loader_test::StEntry> e = {
      {"model.embed_tokens.weight", "F32", {8, 32}, loader_test::f32_bytes(vals(256, 1))},
      {"model.norm.weight", "BF16", {32}, loader_test::bf16_bytes(vals(32, 2))},
      {"model.layers.0.input_layernorm.weight", "F16", {32}, loader_test::f16_bytes(vals(32, 3))},
      {"model.layers.0.post_attention_layernorm.weight", "F32", {32}, loader_test::f32_bytes(vals(32, 4))},
      {"model.layers.0.self_attn.q_proj.weight", "BF16", {32, 32}, loader_test::bf16_bytes(vals(1024, 5))},
      {"model.layers.0.self_attn.k_proj.weight", "F16", {16, 32}, loader_test::f16_bytes(vals(512, 6))},
      {"model.layers.0.self_attn.v_proj.weight", "F32", {16, 32}, loader_test::f32_bytes(vals(512, 7))},
      {"model.layers.0.self_attn.o_proj.weight", "F32", {32, 32}, loader_test::f32_bytes(vals(1024, 8))},
      {"model.layers.0.mlp.gate_proj.weight", "F32", {32, 32}, loader_test::f32_bytes(vals(1024, 9))},
      {"model.layers.0.mlp.up_proj.weight", "F32", {32, 32}, loader_test::f32_bytes(vals(1024, 10))},
      {"model.layers.0.mlp.down_proj.weight", "F32", {32, 32}, loader_test::f32_bytes(vals(1024, 11))},
      {"extra.i64", "I64", {2}, Bytes(16, 0)},
      {"extra.u8", "U8", {3}, Bytes{1, 2, 3}},
  };
  *st = loader_test::build_safetensors(e, true, Json{{"format", "pt"}});
  *config = Json{{"architectures", {"LlamaForCausalLM"}},
                 {"hidden_size", 32},
                 {"num_hidden_layers", 1},
                 {"num_attention_heads", 2},
                 {"num_key_value_heads", 1},
                 {"intermediate_size", 32},
                 {"vocab_size", 8},
                 {"max_position_embeddings", 64},
                 {"rms_norm_eps", 1e-5},
                 {"rope_scaling", {{"rope_type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 1.0},
                                   {"high_freq_factor", 4.0},
                                   {"original_max_position_embeddings", 32}}},
                 {"tie_word_embeddings", true},
                 {"bos_token_id", 1},
                 {"eos_token_id", {2, 3}}}
                .dump(1);
  loader_test::write_file(dir.file("model.safetensors"), *st);
  loader_test::write_file(dir.file("config.json"), *config);
}

size_t gguf_header_end(const std::string& path) {
  auto g = GgufFile::open(path);
  if (!g.is_ok()) return 0;
  size_t end = (*g)->file_size();
  for (const auto& t : (*g)->tensors())
    if (t.supported)
      end = std::min(end, static_cast<size_t>(static_cast<const uint8_t*>(t.view.data) - (*g)->file_data()));
  return end;
}

size_t safetensors_header_end(const Bytes& b) {
  uint64_t n = 0;
  std::memcpy(&n, b.data(), 8);
  return static_cast<size_t>(8 + n);
}

TEST(FileMutation, HandBuiltGguf) {
  TempDir dir;
  const Bytes base = tiny_gguf().build();
  const std::string path = dir.file("m.gguf");
  loader_test::write_file(path, base);
  {  // the unmutated file is a valid model
    auto ws = WeightStore::open(path);
    ASSERT_TRUE(ws.is_ok()) << ws.status().to_string();
    ASSERT_TRUE(bind_model_weights(**ws).is_ok());
  }
  const size_t hot = gguf_header_end(path);
  ASSERT_GT(hot, 0u);
  Mutator m(0x6775'6666'0001ull);
  Outcomes outcomes;
  for (int i = 0; i < 1500; ++i) {
    loader_test::write_file(path, m.mutate(base, hot));
    check_gguf_file(path, i, &outcomes);
    if (::testing::Test::HasFatalFailure()) return;
  }
  outcomes.expect_both("hand_built_gguf");
}

TEST(FileMutation, StoriesGguf) {
  TESSERA_REQUIRE_STORIES();
  TempDir dir;
  Mutator m(0x6775'6666'0002ull);
  Outcomes outcomes;
  const std::string path = dir.file("s.gguf");
  for (const char* name : {"stories260K-f32.gguf", "stories260K.ggml-org.gguf"}) {
    const Bytes base = loader_test::read_file(loader_test::stories_dir() + "/" + name);
    const size_t hot = gguf_header_end(loader_test::stories_dir() + "/" + name);
    ASSERT_GT(hot, 0u);
    for (int i = 0; i < 100; ++i) {
      loader_test::write_file(path, m.mutate(base, hot));
      check_gguf_file(path, i, &outcomes);
      if (::testing::Test::HasFatalFailure()) return;
    }
  }
  outcomes.expect_both("stories_gguf");
}

TEST(FileMutation, HandBuiltSafetensorsAndConfig) {
  TempDir dir;
  Bytes base;
  std::string config;
  write_tiny_hf(dir, &base, &config);
  {
    auto ws = WeightStore::open(dir.path());
    ASSERT_TRUE(ws.is_ok()) << ws.status().to_string();
    ASSERT_TRUE(bind_model_weights(**ws).is_ok());
  }
  const size_t hot = safetensors_header_end(base);
  const std::string header(base.begin() + 8, base.begin() + static_cast<std::ptrdiff_t>(hot));
  Mutator m(0x7361'6665'0001ull);
  Outcomes outcomes;
  for (int i = 0; i < 1000; ++i) {
    Bytes b;
    if (i % 3 == 0) {  // edit the JSON header and keep its length field right
      const std::string h = m.mutate_json(header);
      loader_test::put<uint64_t>(&b, h.size());
      b.insert(b.end(), h.begin(), h.end());
      b.insert(b.end(), base.begin() + static_cast<std::ptrdiff_t>(hot), base.end());
    } else {
      b = m.mutate(base, hot);
    }
    loader_test::write_file(dir.file("model.safetensors"), b);
    check_hf_dir(dir.path(), i, &outcomes);
    if (::testing::Test::HasFatalFailure()) return;
  }
  loader_test::write_file(dir.file("model.safetensors"), base);
  for (int i = 0; i < 300; ++i) {
    const std::string c = i % 2 ? m.mutate_json(config) : [&] {
      const Bytes cb = m.mutate(Bytes(config.begin(), config.end()), config.size());
      return std::string(cb.begin(), cb.end());
    }();
    loader_test::write_file(dir.file("config.json"), c);
    auto parsed = parse_hf_config(c, "config.json");
    if (parsed.is_ok() && parsed->validate("config.json").is_ok()) outcomes.sink += rope_inv_freq(*parsed).size();
    check_hf_dir(dir.path(), i, &outcomes);
    if (::testing::Test::HasFatalFailure()) return;
  }
  outcomes.expect_both("hand_built_safetensors");
}

TEST(FileMutation, StoriesSafetensors) {
  TESSERA_REQUIRE_STORIES();
  TempDir dir;
  const Bytes base = loader_test::read_file(loader_test::stories_dir() + "/hf/model.safetensors");
  loader_test::write_file(dir.file("config.json"),
                          loader_test::read_file(loader_test::stories_dir() + "/hf/config.json"));
  const size_t hot = safetensors_header_end(base);
  const std::string header(base.begin() + 8, base.begin() + static_cast<std::ptrdiff_t>(hot));
  Mutator m(0x7361'6665'0002ull);
  Outcomes outcomes;
  for (int i = 0; i < 200; ++i) {
    Bytes b;
    if (i % 2 == 0) {
      const std::string h = m.mutate_json(header);
      loader_test::put<uint64_t>(&b, h.size());
      b.insert(b.end(), h.begin(), h.end());
      b.insert(b.end(), base.begin() + static_cast<std::ptrdiff_t>(hot), base.end());
    } else {
      b = m.mutate(base, hot);
    }
    loader_test::write_file(dir.file("model.safetensors"), b);
    check_hf_dir(dir.path(), i, &outcomes);
    if (::testing::Test::HasFatalFailure()) return;
  }
  outcomes.expect_both("stories_safetensors");
}

}  // namespace
}  // namespace tessera
