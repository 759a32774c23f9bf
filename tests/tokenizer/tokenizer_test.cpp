// Tokenizer tests: the reference vectors of four real tokenizers (tokenizer.json), the
// stories260K cases through tokenizer.json and GGUF, byte-level tokenizers converted to GGUF
// "gpt2" metadata, streaming decode, errors and a few unit checks of the pieces.
#include "tokenizer/tokenizer.h"

#include <stdlib.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <nlohmann/json.hpp>

#include "common/env.h"
#include "model/gguf.h"
#include "tests/testdata.h"
#include "tokenizer/unicode.h"
#include "tools/testmodel/gguf_writer.h"

namespace tessera {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

const char* const kTokenizerNames[] = {"llama3", "qwen3", "mistral-spm", "gemma3"};

std::string tokenizer_dir(const std::string& name) {
  return testdata_dir() + "/tokenizers/" + name;
}
std::string stories_dir() { return testdata_dir() + "/stories260K"; }

struct Vector {
  std::string text;
  std::vector<int32_t> ids, ids_with_special;
  std::string decoded;
};

std::vector<Vector> read_vectors(const std::string& path) {
  std::vector<Vector> out;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    json j = json::parse(line);
    out.push_back({j["text"].get<std::string>(), j["ids"].get<std::vector<int32_t>>(),
                   j["ids_with_special"].get<std::vector<int32_t>>(),
                   j["decoded"].get<std::string>()});
  }
  return out;
}

// Each tokenizer.json is loaded once per test binary (gemma3's is 33 MB).
const Tokenizer* cached_tokenizer(const std::string& name) {
  static std::mutex mu;
  static std::map<std::string, std::unique_ptr<Tokenizer>> cache;
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache.find(name);
  if (it != cache.end()) return it->second.get();
  const std::string path = tokenizer_dir(name) + "/tokenizer.json";
  if (!fs::exists(path)) {
    ADD_FAILURE() << test::missing_testdata(path);
    return nullptr;
  }
  const auto t0 = std::chrono::steady_clock::now();
  auto r = Tokenizer::from_hf_file(path);
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_TRUE(r.is_ok()) << r.status().to_string();
  if (!r.is_ok()) return nullptr;
  std::printf("[ loaded ] %s in %.0f ms\n", name.c_str(), ms);
  return (cache[name] = std::move(r).value()).get();
}

std::string ids_str(const std::vector<int32_t>& ids) { return fmt::format("[{}]", fmt::join(ids, ",")); }

// Runs every vector; returns how many pass fully and reports the failures.
int check_vectors(const Tokenizer& t, const std::vector<Vector>& vectors, const std::string& what,
                  bool check_with_special = true) {
  int pass = 0;
  for (const Vector& v : vectors) {
    const auto ids = t.encode(v.text, false);
    const auto with = t.encode(v.text, true);
    const std::string dec = t.decode(v.ids);
    EXPECT_EQ(ids_str(ids), ids_str(v.ids)) << what << " encode: " << json(v.text).dump();
    if (check_with_special) {
      EXPECT_EQ(ids_str(with), ids_str(v.ids_with_special))
          << what << " encode+special: " << json(v.text).dump();
    }
    EXPECT_EQ(dec, v.decoded) << what << " decode: " << json(v.text).dump();
    pass += ids == v.ids && (!check_with_special || with == v.ids_with_special) && dec == v.decoded;
  }
  std::printf("[ vectors ] %s: %d/%zu pass\n", what.c_str(), pass, vectors.size());
  return pass;
}

class TokenizerVectors : public ::testing::TestWithParam<const char*> {};

TEST_P(TokenizerVectors, MatchReference) {
  const std::string name = GetParam();
  const std::string vectors_path = tokenizer_dir(name) + "/vectors.jsonl";
  TESSERA_REQUIRE_TESTDATA(vectors_path);
  const Tokenizer* t = cached_tokenizer(name);
  ASSERT_NE(t, nullptr);
  const auto vectors = read_vectors(vectors_path);
  ASSERT_GE(vectors.size(), 50u);
  EXPECT_EQ(check_vectors(*t, vectors, name), static_cast<int>(vectors.size()));
}

// Streaming decode returns valid UTF-8 pieces whose concatenation is decode(all).
TEST_P(TokenizerVectors, IncrementalDecoderMatchesDecode) {
  const std::string name = GetParam();
  const std::string vectors_path = tokenizer_dir(name) + "/vectors.jsonl";
  TESSERA_REQUIRE_TESTDATA(vectors_path);
  const Tokenizer* t = cached_tokenizer(name);
  ASSERT_NE(t, nullptr);
  std::vector<std::vector<int32_t>> sequences;
  std::vector<int32_t> all;
  for (const Vector& v : read_vectors(vectors_path)) {
    sequences.push_back(v.ids_with_special);
    all.insert(all.end(), v.ids_with_special.begin(), v.ids_with_special.end());
  }
  sequences.push_back(all);  // one long stream across every vector
  for (bool skip : {false, true}) {
    for (const auto& ids : sequences) {
      IncrementalDecoder dec(*t, skip);
      std::string streamed;
      for (int32_t id : ids) {
        const std::string piece = dec.push(id);
        EXPECT_TRUE(unicode::is_valid_utf8(piece)) << name << " piece " << json(piece).dump();
        streamed += piece;
      }
      const std::string rest = dec.flush();
      EXPECT_TRUE(unicode::is_valid_utf8(rest));
      streamed += rest;
      EXPECT_EQ(streamed, t->decode(ids, skip)) << name << " skip_special=" << skip << " ids "
                                                << ids_str(ids);
    }
  }
}

TEST_P(TokenizerVectors, ConcurrentEncodeIsConsistent) {
  const std::string name = GetParam();
  const std::string vectors_path = tokenizer_dir(name) + "/vectors.jsonl";
  TESSERA_REQUIRE_TESTDATA(vectors_path);
  const Tokenizer* t = cached_tokenizer(name);
  ASSERT_NE(t, nullptr);
  const auto vectors = read_vectors(vectors_path);
  std::vector<int> bad(4, 0);
  std::vector<std::thread> threads;
  for (int k = 0; k < 4; ++k) {
    threads.emplace_back([&, k] {
      for (const Vector& v : vectors) bad[static_cast<size_t>(k)] += t->encode(v.text, false) != v.ids;
    });
  }
  for (auto& th : threads) th.join();
  for (int b : bad) EXPECT_EQ(b, 0);
}

INSTANTIATE_TEST_SUITE_P(All, TokenizerVectors, ::testing::ValuesIn(kTokenizerNames),
                         [](const auto& info) {
                           std::string s = info.param;
                           for (char& c : s) c = (c == '-') ? '_' : c;
                           return s;
                         });

TEST(Tokenizer, SpecialTokensAndLookups) {
  struct Expect {
    const char* name;
    int32_t vocab_size, bos;
    std::vector<int32_t> eos;
    const char *bos_token, *eos_token;
  };
  const Expect cases[] = {
      {"llama3", 128256, 128000, {128001}, "<|begin_of_text|>", "<|end_of_text|>"},
      {"qwen3", 151669, -1, {151645}, "", "<|im_end|>"},
      {"mistral-spm", 32000, 1, {2}, "<s>", "</s>"},
      {"gemma3", 262145, 2, {106}, "<bos>", "<end_of_turn>"},
  };
  for (const Expect& e : cases) {
    TESSERA_REQUIRE_TESTDATA(tokenizer_dir(e.name));
    const Tokenizer* t = cached_tokenizer(e.name);
    ASSERT_NE(t, nullptr);
    EXPECT_EQ(t->vocab_size(), e.vocab_size) << e.name;
    EXPECT_EQ(t->bos_id(), e.bos) << e.name;
    EXPECT_EQ(t->eos_ids(), e.eos) << e.name;
    EXPECT_EQ(t->bos_token(), e.bos_token) << e.name;
    EXPECT_EQ(t->eos_token(), e.eos_token) << e.name;
    if (e.bos >= 0) {
      EXPECT_TRUE(t->is_special(e.bos)) << e.name;
      EXPECT_EQ(t->id_to_token(e.bos), e.bos_token) << e.name;
      EXPECT_EQ(t->token_to_id(e.bos_token), e.bos) << e.name;
    }
    EXPECT_FALSE(t->token_to_id("definitely not a token \x01\x02").has_value());
    EXPECT_EQ(t->id_to_token(-5), "");
    EXPECT_EQ(t->id_to_token(t->vocab_size() + 10), "");
  }
  if (const Tokenizer* t = cached_tokenizer("llama3")) {
    const std::vector<int32_t> ids = {128000, 9906, 1917, 128001};
    EXPECT_EQ(t->decode(ids, false), "<|begin_of_text|>Hello world<|end_of_text|>");
    EXPECT_EQ(t->decode(ids, true), "Hello world");
    EXPECT_EQ(t->id_to_token(9906), "Hello");
    EXPECT_FALSE(t->is_special(9906));
  }
  if (const Tokenizer* t = cached_tokenizer("qwen3")) {
    // Non-special added tokens are matched in text but kept by skip_special.
    const auto ids = t->encode("<think>x</think>", false);
    ASSERT_GE(ids.size(), 3u);
    EXPECT_EQ(ids.front(), 151667);
    EXPECT_EQ(ids.back(), 151668);
    EXPECT_FALSE(t->is_special(151667));
    EXPECT_EQ(t->decode(ids, true), "<think>x</think>");
    EXPECT_EQ(t->encode("<|im_start|>user", false).front(), 151644);
  }
}

// Long inputs: one 40 KB "word" for the SentencePiece-style tokenizers (no pre-tokenizer
// splits it), long whitespace runs for the regexes. Checks the round trip; prints the time.
TEST(Tokenizer, LongInputsRoundTrip) {
  std::string prose;
  while (prose.size() < 10000) {
    prose += "Once upon a time, in a land far away, there lived a curious fox named Zürich. "
             "It counted 1,234,567 stars — 星星 — and said: \"naïve café\"!\n";
  }
  const std::string no_spaces(40000, 'a');
  std::string spaces = "x" + std::string(30000, ' ') + "y\n\n\n" + std::string(5000, '\n');
  std::string mixed;
  for (int i = 0; i < 2000; ++i) mixed += "ab\xC3\xA9 \xF0\x9F\x98\x80 \t";
  for (const char* name : kTokenizerNames) {
    TESSERA_REQUIRE_TESTDATA(tokenizer_dir(name));
    const Tokenizer* t = cached_tokenizer(name);
    ASSERT_NE(t, nullptr);
    for (const std::string* text : std::vector<const std::string*>{&prose, &no_spaces, &spaces, &mixed}) {
      const auto t0 = std::chrono::steady_clock::now();
      const auto ids = t->encode(*text, false);
      const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      std::printf("[ encode ] %-12s %6zu bytes -> %6zu ids in %7.2f ms\n", name, text->size(),
                  ids.size(), ms);
      EXPECT_EQ(t->decode(ids), *text) << name;
    }
  }
}

// ---- stories260K: tokenizer.json and GGUF ---------------------------------------------------

struct StoriesCase {
  std::string text;
  std::vector<int32_t> ids;
};

std::vector<StoriesCase> stories_cases() {
  std::ifstream in(stories_dir() + "/reference.json");
  json j = json::parse(in);
  std::vector<StoriesCase> out;
  for (const json& c : j["tokenizer_cases"]["cases"]) {
    out.push_back({c["text"].get<std::string>(), c["ids"].get<std::vector<int32_t>>()});
  }
  return out;
}

void check_stories(const Tokenizer& t, const std::string& what) {
  const auto cases = stories_cases();
  ASSERT_GE(cases.size(), 5u);
  int pass = 0;
  for (const StoriesCase& c : cases) {
    const auto ids = t.encode(c.text, true);
    EXPECT_EQ(ids_str(ids), ids_str(c.ids)) << what << ": " << json(c.text).dump();
    EXPECT_EQ(t.decode(ids, true), c.text) << what;
    pass += ids == c.ids;
  }
  std::printf("[ stories ] %s: %d/%zu pass\n", what.c_str(), pass, cases.size());
  EXPECT_EQ(t.bos_id(), 1);
  EXPECT_EQ(t.eos_ids(), std::vector<int32_t>{2});
  EXPECT_EQ(t.bos_token(), "<s>");
  EXPECT_EQ(t.eos_token(), "</s>");
  EXPECT_EQ(t.vocab_size(), 512);
  EXPECT_TRUE(t.is_special(1));
  EXPECT_FALSE(t.is_special(300));
}

TEST(Tokenizer, Stories260KHf) {
  const std::string path = stories_dir() + "/hf/tokenizer.json";
  TESSERA_REQUIRE_TESTDATA(path);
  auto t = Tokenizer::from_hf_file(path);
  ASSERT_TRUE(t.is_ok()) << t.status().to_string();
  check_stories(**t, "stories260K tokenizer.json");
}

TEST(Tokenizer, Stories260KGguf) {
  const std::string path = stories_dir() + "/stories260K-f32.gguf";
  TESSERA_REQUIRE_TESTDATA(path);
  auto g = GgufFile::open(path);
  ASSERT_TRUE(g.is_ok()) << g.status().to_string();
  auto t = Tokenizer::from_gguf(**g);
  ASSERT_TRUE(t.is_ok()) << t.status().to_string();
  check_stories(**t, "stories260K GGUF");
}

// The self-draft's head rows (speculation): SentencePiece scores rank a GGUF "llama" vocabulary
// (stories260K: by score, no control or byte tokens); a tokenizer.json BPE vocabulary is taken
// in id order without its special tokens.
TEST(Tokenizer, FrequentIds) {
  const std::string gguf_path = stories_dir() + "/stories260K-f32.gguf";
  TESSERA_REQUIRE_TESTDATA(gguf_path);
  auto g = GgufFile::open(gguf_path);
  ASSERT_TRUE(g.is_ok()) << g.status().to_string();
  auto t = Tokenizer::from_gguf(**g);
  ASSERT_TRUE(t.is_ok()) << t.status().to_string();
  auto scores = (*g)->get_float_array("tokenizer.ggml.scores");
  ASSERT_TRUE(scores.is_ok());
  const std::vector<int32_t> ids = (*t)->frequent_ids(200);
  ASSERT_EQ(ids.size(), 200u);
  size_t chars = 0;  // the single ASCII characters come first
  while (chars < ids.size() && (*t)->id_to_token(ids[chars]).size() == 1) ++chars;
  EXPECT_GT(chars, 20u);
  EXPECT_NE(std::find(ids.begin(), ids.end(), *(*t)->token_to_id("a")), ids.end());
  for (size_t i = 0; i < ids.size(); ++i) {
    EXPECT_FALSE((*t)->is_special(ids[i]));
    EXPECT_EQ((*t)->id_to_token(ids[i]).rfind("<0x", 0), std::string::npos) << "a byte token: " << ids[i];
    if (i > chars) {
      EXPECT_GE((*scores)[static_cast<size_t>(ids[i - 1])], (*scores)[static_cast<size_t>(ids[i])]) << i;
    }
  }
  EXPECT_EQ(std::set<int32_t>(ids.begin(), ids.end()).size(), ids.size());
  EXPECT_LE((*t)->frequent_ids(100000).size(), 512u);
  const std::string hf = testdata_dir() + "/tokenizers/llama3/tokenizer.json";
  TESSERA_REQUIRE_TESTDATA(hf);
  auto l = Tokenizer::from_hf_file(hf);
  ASSERT_TRUE(l.is_ok()) << l.status().to_string();
  const std::vector<int32_t> first = (*l)->frequent_ids(300);
  ASSERT_EQ(first.size(), 300u);
  // Byte-level BPE: its printable single characters (ids 0..93), then the rest in id order.
  for (size_t i = 1; i < first.size(); ++i) {
    if ((*l)->id_to_token(first[i]).size() > 1 && (*l)->id_to_token(first[i - 1]).size() > 1) {
      EXPECT_LT(first[i - 1], first[i]) << "id order";
    }
  }
  EXPECT_TRUE(std::set<int32_t>(first.begin(), first.end()).count(0));
}

TEST(Tokenizer, LoadForModel) {
  TESSERA_REQUIRE_TESTDATA(stories_dir());
  for (const std::string& path : std::vector<std::string>{stories_dir() + "/hf", stories_dir() + "/hf/tokenizer.json",
                                 stories_dir() + "/stories260K-f32.gguf"}) {
    auto t = load_tokenizer_for_model(path);
    ASSERT_TRUE(t.is_ok()) << path << ": " << t.status().to_string();
    EXPECT_EQ((*t)->encode("Once upon a time", true), (std::vector<int32_t>{1, 403, 407, 261, 378}))
        << path;
  }
  const std::string missing = testdata_dir() + "/no/such/model";
  auto r = load_tokenizer_for_model(missing);
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
  EXPECT_NE(r.status().message().find(missing), std::string::npos) << r.status().message();
  // A directory without tokenizer.json.
  auto d = load_tokenizer_for_model(testdata_dir() + "/tokenizers");
  ASSERT_FALSE(d.is_ok());
  EXPECT_EQ(d.status().code(), StatusCode::kNotFound);
  EXPECT_NE(d.status().message().find("tokenizer.json"), std::string::npos);
}

// ---- byte-level tokenizers as GGUF "gpt2" metadata -------------------------------------------

class TempFile {
 public:
  explicit TempFile(const std::string& name) {
    std::string tmpl = ::testing::TempDir() + "tessera_tok_XXXXXX";
    char* p = ::mkdtemp(tmpl.data());
    EXPECT_NE(p, nullptr);
    dir_ = tmpl;
    path_ = dir_ + "/" + name;
  }
  ~TempFile() {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string dir_, path_;
};

// Writes the tokenizer.json's vocabulary as tokenizer.ggml.* metadata, the way llama.cpp's
// converter does (added special tokens are control tokens, other added tokens user-defined).
Status write_gpt2_gguf(const std::string& tokenizer_json, const std::string& pre, int32_t bos,
                       int32_t eos, const std::string& out_path) {
  std::ifstream in(tokenizer_json);
  json j = json::parse(in);
  std::vector<std::string> tokens;
  std::vector<int32_t> types;
  for (auto it = j["model"]["vocab"].begin(); it != j["model"]["vocab"].end(); ++it) {
    const auto id = it.value().get<size_t>();
    if (tokens.size() <= id) tokens.resize(id + 1), types.resize(id + 1, 1);
    tokens[id] = it.key();
  }
  for (const json& a : j["added_tokens"]) {
    const auto id = a["id"].get<size_t>();
    if (tokens.size() <= id) tokens.resize(id + 1), types.resize(id + 1, 1);
    tokens[id] = a["content"].get<std::string>();
    types[id] = a["special"].get<bool>() ? 3 : 4;
  }
  std::vector<std::string> merges;
  for (const json& m : j["model"]["merges"]) {
    merges.push_back(m.is_string() ? m.get<std::string>()
                                   : m[0].get<std::string>() + " " + m[1].get<std::string>());
  }
  GgufWriter w;
  w.set_string("general.architecture", "llama");
  w.set_string("tokenizer.ggml.model", "gpt2");
  w.set_string("tokenizer.ggml.pre", pre);
  w.set_string_array("tokenizer.ggml.tokens", tokens);
  w.set_i32_array("tokenizer.ggml.token_type", types);
  w.set_string_array("tokenizer.ggml.merges", merges);
  if (bos >= 0) w.set_u32("tokenizer.ggml.bos_token_id", static_cast<uint32_t>(bos));
  w.set_u32("tokenizer.ggml.eos_token_id", static_cast<uint32_t>(eos));
  w.set_bool("tokenizer.ggml.add_bos_token", bos >= 0);
  return w.write(out_path);
}

TEST(Tokenizer, Gpt2GgufMatchesTokenizerJson) {
  struct Case {
    const char *name, *pre;
    int32_t bos, eos;
  };
  const Case cases[] = {{"llama3", "llama-bpe", 128000, 128001}, {"qwen3", "qwen2", -1, 151645}};
  for (const auto& [name, pre, bos, eos] : cases) {
    const std::string dir = tokenizer_dir(name);
    TESSERA_REQUIRE_TESTDATA(dir + "/vectors.jsonl");
    TempFile file(std::string(name) + ".gguf");
    Status s = write_gpt2_gguf(dir + "/tokenizer.json", pre, bos, eos, file.path());
    ASSERT_TRUE(s.is_ok()) << s.to_string();
    auto g = GgufFile::open(file.path());
    ASSERT_TRUE(g.is_ok()) << g.status().to_string();
    auto t = Tokenizer::from_gguf(**g);
    ASSERT_TRUE(t.is_ok()) << t.status().to_string();
    const auto vectors = read_vectors(dir + "/vectors.jsonl");
    // add_special differs by design (BOS from add_bos_token), so only ids and decode compare.
    EXPECT_EQ(check_vectors(**t, vectors, std::string(name) + " as GGUF", false),
              static_cast<int>(vectors.size()));
    EXPECT_EQ((*t)->bos_id(), bos);
    EXPECT_EQ((*t)->eos_ids(), std::vector<int32_t>{eos});
    const auto with = (*t)->encode("Hello", true);
    ASSERT_FALSE(with.empty());
    if (bos >= 0) {
      EXPECT_EQ(with.front(), bos);
    }
    EXPECT_TRUE((*t)->is_special(eos));
  }
}

// ---- errors -----------------------------------------------------------------------------------

TEST(TokenizerErrors, MissingFile) {
  const std::string path = "/nonexistent/dir/tokenizer.json";
  auto r = Tokenizer::from_hf_file(path);
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
  EXPECT_NE(r.status().message().find(path), std::string::npos) << r.status().message();
}

TEST(TokenizerErrors, MalformedJson) {
  auto r = Tokenizer::from_hf_json("{\"model\": {\"type\": \"BPE\", ", "", "broken.json");
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), StatusCode::kCorrupt);
  EXPECT_NE(r.status().message().find("broken.json"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("malformed JSON"), std::string::npos);

  auto c = Tokenizer::from_hf_json(R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}})",
                                   "{oops", "tok.json");
  ASSERT_FALSE(c.is_ok());
  EXPECT_NE(c.status().message().find("tokenizer_config"), std::string::npos) << c.status().message();
}

TEST(TokenizerErrors, UnsupportedPieces) {
  struct Case {
    const char* json;
    StatusCode code;
    const char* needle;
  };
  const Case cases[] = {
      {R"({"model": {"type": "WordPiece", "vocab": {"a": 0}}})", StatusCode::kUnimplemented,
       "model.type 'WordPiece'"},
      {R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []},
           "normalizer": {"type": "NFKC"}})",
       StatusCode::kUnimplemented, "normalizer: type 'NFKC'"},
      {R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []},
           "pre_tokenizer": {"type": "Sequence", "pretokenizers": [{"type": "Bogus"}]}})",
       StatusCode::kUnimplemented, "pre_tokenizer.pretokenizers[0]: type 'Bogus'"},
      {R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []},
           "pre_tokenizer": {"type": "Split", "pattern": {"Regex": "(unclosed"}, "behavior": "Isolated"}})",
       StatusCode::kInvalidArgument, "pre_tokenizer.pattern"},
      {R"({"model": {"type": "BPE", "vocab": ["a"], "merges": []}})", StatusCode::kInvalidArgument,
       "model.vocab"},
      {R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": [7]}})",
       StatusCode::kInvalidArgument, "model.merges[0]"},
      {R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}, "decoder": {"type": "CTC"}})",
       StatusCode::kUnimplemented, "decoder: type 'CTC'"},
      {R"([1, 2])", StatusCode::kInvalidArgument, "expected a JSON object"},
  };
  for (const Case& c : cases) {
    auto r = Tokenizer::from_hf_json(c.json, "", "t.json");
    ASSERT_FALSE(r.is_ok()) << c.json;
    EXPECT_EQ(r.status().code(), c.code) << r.status().to_string();
    EXPECT_NE(r.status().message().find("t.json"), std::string::npos) << r.status().message();
    EXPECT_NE(r.status().message().find(c.needle), std::string::npos) << r.status().message();
  }
}

TEST(TokenizerErrors, GgufUnknownModel) {
  TempFile file("bad.gguf");
  GgufWriter w;
  w.set_string("tokenizer.ggml.model", "t5");
  w.set_string_array("tokenizer.ggml.tokens", std::vector<std::string>{"a", "b"});
  ASSERT_TRUE(w.write(file.path()).is_ok());
  auto g = GgufFile::open(file.path());
  ASSERT_TRUE(g.is_ok()) << g.status().to_string();
  auto t = Tokenizer::from_gguf(**g);
  ASSERT_FALSE(t.is_ok());
  EXPECT_EQ(t.status().code(), StatusCode::kUnimplemented);
  EXPECT_NE(t.status().message().find("tokenizer.ggml.model 't5'"), std::string::npos)
      << t.status().message();

  TempFile file2("nomodel.gguf");
  GgufWriter w2;
  w2.set_string("general.architecture", "llama");
  ASSERT_TRUE(w2.write(file2.path()).is_ok());
  auto g2 = GgufFile::open(file2.path());
  ASSERT_TRUE(g2.is_ok());
  auto t2 = Tokenizer::from_gguf(**g2);
  ASSERT_FALSE(t2.is_ok());
  EXPECT_NE(t2.status().message().find("tokenizer.ggml.model"), std::string::npos)
      << t2.status().message();
}

// ---- small synthetic tokenizers: pipeline pieces --------------------------------------------

// A SentencePiece-style BPE over a tiny vocabulary with byte fallback.
constexpr const char* kTinySpm = R"({
  "added_tokens": [{"id": 0, "content": "<unk>", "special": true, "normalized": false},
                   {"id": 1, "content": "<s>", "special": true, "normalized": false},
                   {"id": 2, "content": "</s>", "special": true, "normalized": false},
                   {"id": 9, "content": "[X]", "special": false, "normalized": false,
                    "lstrip": true, "rstrip": true}],
  "normalizer": {"type": "Sequence", "normalizers": [
      {"type": "Prepend", "prepend": "▁"}, {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]},
  "pre_tokenizer": null,
  "post_processor": {"type": "TemplateProcessing",
      "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                 {"SpecialToken": {"id": "</s>", "type_id": 0}}],
      "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]},
                         "</s>": {"id": "</s>", "ids": [2], "tokens": ["</s>"]}}},
  "decoder": {"type": "Sequence", "decoders": [
      {"type": "Replace", "pattern": {"String": "▁"}, "content": " "}, {"type": "ByteFallback"},
      {"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
  "model": {"type": "BPE", "unk_token": "<unk>", "byte_fallback": true, "fuse_unk": true,
            "vocab": {"<unk>": 0, "<s>": 1, "</s>": 2, "▁": 3, "a": 4, "b": 5, "▁a": 6, "ab": 7, "▁ab": 8,
                      "<0xC3>": 10, "<0xA9>": 11},
            "merges": [["a", "b"], "▁ ab", "▁ a"]}
})";

TEST(Tokenizer, TinySpmPipeline) {
  auto r = Tokenizer::from_hf_json(kTinySpm, "", "tiny.json");
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  const Tokenizer& t = **r;
  EXPECT_EQ(t.encode("ab", false), (std::vector<int32_t>{8}));
  EXPECT_EQ(t.encode("ab", true), (std::vector<int32_t>{1, 8, 2}));
  EXPECT_EQ(t.encode("aab", false), (std::vector<int32_t>{6, 7}));
  // é has no token: byte fallback. "z" has neither a token nor byte tokens: <unk>, fused.
  EXPECT_EQ(t.encode("é", false), (std::vector<int32_t>{3, 10, 11}));
  EXPECT_EQ(t.encode("zz", false), (std::vector<int32_t>{3, 0}));
  EXPECT_EQ(t.decode(t.encode("ab ab", false)), "ab ab");
  EXPECT_EQ(t.decode(t.encode("é", false)), "é");
  // lstrip/rstrip: the spaces around [X] belong to it.
  EXPECT_EQ(t.encode("ab [X] ab", false), (std::vector<int32_t>{8, 9, 8}));
  // A literal special string in text is that special token.
  EXPECT_EQ(t.encode("<s>ab", false), (std::vector<int32_t>{1, 8}));
  EXPECT_EQ(t.decode(std::vector<int32_t>{1, 8, 2}, true), "ab");
  EXPECT_EQ(t.bos_id(), 1);
  // A lone byte token decodes to U+FFFD inside text and stays raw at the end.
  EXPECT_EQ(t.decode(std::vector<int32_t>{10, 4}), "\xEF\xBF\xBD" "a");
  EXPECT_EQ(t.decode(std::vector<int32_t>{4, 10}), "a\xC3");
  IncrementalDecoder dec(t);
  EXPECT_EQ(dec.push(4), "a");
  EXPECT_EQ(dec.push(10), "");
  EXPECT_EQ(dec.push(11), "\xC3\xA9");
  EXPECT_EQ(dec.push(10), "");
  EXPECT_EQ(dec.flush(), "\xEF\xBF\xBD");
}

// A tool-call marker a tokenizer calls special (Mistral's [TOOL_CALLS]) stays text: decoding with
// skip_special shows it, so the tool-call parser sees it.
TEST(Tokenizer, ToolCallMarkersAreText) {
  std::string json = kTinySpm;
  const std::string x = R"({"id": 9, "content": "[X]")";
  json.replace(json.find(x), 0, R"({"id": 12, "content": "[TOOL_CALLS]", "special": true, "normalized": false}, )");
  auto r = Tokenizer::from_hf_json(json, "", "tiny.json");
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  const Tokenizer& t = **r;
  EXPECT_FALSE(t.is_special(12));
  EXPECT_TRUE(t.is_special(1));
  EXPECT_TRUE(is_tool_call_marker("<|python_tag|>"));
  EXPECT_FALSE(is_tool_call_marker("<s>"));
  const std::vector<int32_t> ids = t.encode("ab[TOOL_CALLS]ab", false);
  EXPECT_NE(std::find(ids.begin(), ids.end(), 12), ids.end());
  EXPECT_NE(t.decode(ids, /*skip_special=*/true).find("[TOOL_CALLS]"), std::string::npos);
  EXPECT_EQ(t.decode(std::vector<int32_t>{1, 8}, true), "ab");
}

TEST(Tokenizer, ConfigOverridesBosEos) {
  auto r = Tokenizer::from_hf_json(kTinySpm,
                                   R"({"bos_token": {"content": "<s>"}, "eos_token": "</s>",
                                       "add_bos_token": false, "add_eos_token": true})",
                                   "tiny.json");
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_EQ((*r)->encode("ab", true), (std::vector<int32_t>{8, 2}));
  EXPECT_EQ((*r)->bos_token(), "<s>");
  EXPECT_EQ((*r)->eos_ids(), std::vector<int32_t>{2});
}

TEST(Unicode, Nfc) {
  EXPECT_EQ(unicode::nfc("e\xCC\x81"), "\xC3\xA9");                 // e + acute -> é
  EXPECT_EQ(unicode::nfc("\xE2\x84\xAB"), "\xC3\x85");              // Angstrom sign -> Å
  EXPECT_EQ(unicode::nfc("\xE1\x84\x80\xE1\x85\xA1"), "\xEA\xB0\x80");  // Hangul L V -> 가
  EXPECT_EQ(unicode::nfc("\xEA\xB0\x80\xE1\x86\xA8"), "\xEA\xB0\x81");  // LV + T -> 각
  // a + dot below + circumflex and a + circumflex + dot below both give ậ.
  EXPECT_EQ(unicode::nfc("a\xCC\xA3\xCC\x82"), "\xE1\xBA\xAD");
  EXPECT_EQ(unicode::nfc("a\xCC\x82\xCC\xA3"), "\xE1\xBA\xAD");
  // Composition exclusion: U+0958 stays decomposed (क + nukta).
  EXPECT_EQ(unicode::nfc("\xE0\xA5\x98"), "\xE0\xA4\x95\xE0\xA4\xBC");
  EXPECT_EQ(unicode::nfc("plain ascii"), "plain ascii");
  // An embedded NUL is kept (the length is explicit), and invalid bytes become U+FFFD.
  EXPECT_EQ(unicode::nfc(std::string_view("\0" "e\xCC\x81", 4)), std::string("\0\xC3\xA9", 3));
  EXPECT_EQ(unicode::nfc("\xFF" "e\xCC\x81"), "\xEF\xBF\xBD\xC3\xA9");
}

TEST(Unicode, Utf8Repair) {
  EXPECT_TRUE(unicode::is_valid_utf8("h\xC3\xA9llo \xF0\x9F\x98\x80"));
  EXPECT_FALSE(unicode::is_valid_utf8("\xC0\x80"));
  EXPECT_FALSE(unicode::is_valid_utf8("\xED\xA0\x80"));  // surrogate
  EXPECT_EQ(unicode::sanitize_utf8("a\xE2\x82z", false), "a\xEF\xBF\xBDz");
  EXPECT_EQ(unicode::sanitize_utf8("a\xE2\x82", true), "a\xE2\x82");
  EXPECT_EQ(unicode::sanitize_utf8("a\xE2\x82", false), "a\xEF\xBF\xBD");
  EXPECT_EQ(unicode::sanitize_utf8("\xFF\xFE", false), "\xEF\xBF\xBD\xEF\xBF\xBD");
}

TEST(Tokenizer, InvalidUtf8InputIsRepaired) {
  TESSERA_REQUIRE_TESTDATA(tokenizer_dir("llama3"));
  const Tokenizer* t = cached_tokenizer("llama3");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->decode(t->encode("ok\xFF!", false)), "ok\xEF\xBF\xBD!");
}

}  // namespace
}  // namespace tessera
