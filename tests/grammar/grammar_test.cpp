// Structured outputs' grammar layer over real vocabularies (Gemma 3's 262,144 tokens, stories260K's
// 512): every token a walk takes is one the mask allowed, and the text the walk ends with parses
// and matches; refusals name the keyword and its JSON path.
#include "grammar/grammar.h"

#include <gtest/gtest.h>

#include <bit>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "grammar/schema_check.h"
#include "tests/testdata.h"
#include "tokenizer/tokenizer.h"

namespace tessera {
namespace {

struct Vocab {
  std::unique_ptr<Tokenizer> tokenizer;
  std::unique_ptr<GrammarCompiler> compiler;
};

// Gemma 3's tokenizer has one token more than the model's 262,144 logits (the image token).
Vocab load(const std::string& path, GrammarCompilerOptions options = {}, int64_t model_vocab = 262144) {
  Vocab v;
  auto t = Tokenizer::from_hf_file(path);
  EXPECT_TRUE(t.is_ok()) << t.status().to_string();
  if (!t.is_ok()) return v;
  v.tokenizer = std::move(*t);
  std::vector<int32_t> stop = v.tokenizer->eos_ids();
  auto c = GrammarCompiler::create(*v.tokenizer, model_vocab, stop, options);
  EXPECT_TRUE(c.is_ok()) << c.status().to_string();
  if (c.is_ok()) v.compiler = std::move(*c);
  return v;
}

std::string gemma_path() { return testdata_dir() + "/tokenizers/gemma3/tokenizer.json"; }

// (std::regex is not used: under the sanitizers its headers warn at -O2.)
bool digits(std::string_view s) { return !s.empty() && s.find_first_not_of("0123456789") == std::string_view::npos; }
bool lower(std::string_view s) { return !s.empty() && s.find_first_not_of("abcdefghijklmnopqrstuvwxyz") == std::string_view::npos; }

bool allowed(const std::vector<uint32_t>& mask, int32_t id) { return (mask[static_cast<size_t>(id) / 32] >> (id % 32)) & 1u; }

// A walk through the grammar: at each step the allowed token whose text is longest (ties: the
// lowest id), or a stop token once the grammar is complete. Returns the text; fails when a step
// offers nothing or the walk does not end within max_steps.
std::string walk(const Vocab& v, const CompiledGrammar& g, int max_steps = 400) {
  auto m = g.matcher();
  std::vector<uint32_t> mask(static_cast<size_t>(v.compiler->mask_words()));
  std::vector<int32_t> ids;
  for (int step = 0; step < max_steps; ++step) {
    m->fill_mask(mask);
    int32_t pick = -1;
    size_t best = 0;
    const std::vector<int32_t> eos = v.tokenizer->eos_ids();
    if (m->completed()) {
      for (int32_t e : eos)
        if (allowed(mask, e)) pick = e;
    }
    if (pick < 0) {
      for (int32_t id = 0; id < v.compiler->vocab(); ++id) {
        if (!allowed(mask, id) || v.tokenizer->is_special(id)) continue;
        const int32_t one[1] = {id};
        const size_t n = v.tokenizer->decode_raw(one, false, true).size();
        if (n > best) best = n, pick = id;
      }
    }
    EXPECT_GE(pick, 0) << "no token allowed after " << ids.size() << " tokens";
    if (pick < 0) break;
    EXPECT_TRUE(m->accept(pick)) << pick;
    if (m->terminated()) return v.tokenizer->decode(ids);
    ids.push_back(pick);
  }
  ADD_FAILURE() << "the walk did not end in " << max_steps << " steps: " << v.tokenizer->decode(ids);
  return v.tokenizer->decode(ids);
}

TEST(Grammar, JsonSchemaWalkOnGemmaVocabularyValidates) {
  TESSERA_REQUIRE_TESTDATA(gemma_path());
  Vocab v = load(gemma_path());
  ASSERT_TRUE(v.compiler);
  EXPECT_EQ(v.compiler->vocab(), 262144);
  GrammarSpec spec;
  spec.kind = GrammarKind::kJsonSchema;
  spec.source = R"({"type": "object", "properties": {
      "color": {"enum": ["red", "green", "blue"]}, "ok": {"type": "boolean"},
      "n": {"type": "integer", "minimum": 0, "maximum": 99}, "tag": {"const": "x"}},
    "required": ["color", "ok", "n", "tag"], "additionalProperties": false})";
  auto g = v.compiler->compile(spec);
  ASSERT_TRUE(g.is_ok()) << g.status().to_string();
  const std::string text = walk(v, **g);
  auto j = nlohmann::json::parse(text, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << text;
  EXPECT_EQ(j.size(), 4u) << text;
  EXPECT_TRUE(j["ok"].is_boolean()) << text;
  EXPECT_EQ(j["tag"], "x") << text;
  EXPECT_TRUE(j["n"].is_number_integer() && j["n"].get<int>() >= 0 && j["n"].get<int>() <= 99) << text;
  const std::string color = j["color"].get<std::string>();
  EXPECT_TRUE(color == "red" || color == "green" || color == "blue") << text;
}

TEST(Grammar, MaskAllowsOnlyWhatTheGrammarAccepts) {
  TESSERA_REQUIRE_TESTDATA(gemma_path());
  Vocab v = load(gemma_path());
  ASSERT_TRUE(v.compiler);
  GrammarSpec spec;
  spec.kind = GrammarKind::kRegex;
  spec.source = "[0-9]{3}-[a-z]+";
  auto g = v.compiler->compile(spec);
  ASSERT_TRUE(g.is_ok()) << g.status().to_string();
  auto m = (*g)->matcher();
  std::vector<uint32_t> mask(static_cast<size_t>(v.compiler->mask_words()));
  EXPECT_TRUE(m->fill_mask(mask));  // a real restriction
  int64_t n_allowed = 0;
  for (uint32_t w : mask) n_allowed += std::popcount(w);
  EXPECT_GT(n_allowed, 0);
  EXPECT_LT(n_allowed, 2000);
  // Every allowed token's text is digits only (at most three of them), and a rejected token
  // does not move the matcher.
  for (int32_t id = 0; id < v.compiler->vocab(); ++id) {
    if (!allowed(mask, id)) continue;
    const int32_t one[1] = {id};
    const std::string t = v.tokenizer->decode_raw(one, false, true);
    EXPECT_TRUE(!t.empty() && t.size() <= 3 && t.find_first_not_of("0123456789") == std::string::npos) << id << " '" << t << "'";
  }
  const auto letter = v.tokenizer->encode("a", false);
  ASSERT_EQ(letter.size(), 1u);
  EXPECT_FALSE(m->accept(letter[0]));
  const std::string text = walk(v, **g);
  EXPECT_TRUE(text.size() > 4 && digits(text.substr(0, 3)) && text[3] == '-' && lower(text.substr(4))) << text;
}

TEST(Grammar, ChoiceAndEbnfAndJsonObject) {
  TESSERA_REQUIRE_TESTDATA(gemma_path());
  Vocab v = load(gemma_path());
  ASSERT_TRUE(v.compiler);
  GrammarSpec choice{GrammarKind::kChoice, R"j(["yes (sure)", "no.", "a\\b"])j"};
  auto g = v.compiler->compile(choice);
  ASSERT_TRUE(g.is_ok()) << g.status().to_string();
  const std::string c = walk(v, **g);
  EXPECT_TRUE(c == "yes (sure)" || c == "no." || c == "a\\b") << c;

  GrammarSpec ebnf{GrammarKind::kEbnf, R"(root ::= "answer: " [0-9] [0-9]?)"};
  g = v.compiler->compile(ebnf);
  ASSERT_TRUE(g.is_ok()) << g.status().to_string();
  const std::string answer = walk(v, **g);
  EXPECT_TRUE(answer.rfind("answer: ", 0) == 0 && answer.size() >= 9 && answer.size() <= 10 && digits(answer.substr(8)))
      << answer;

  GrammarSpec object{GrammarKind::kJsonObject, ""};
  g = v.compiler->compile(object);
  ASSERT_TRUE(g.is_ok()) << g.status().to_string();
  auto m = (*g)->matcher();
  std::vector<uint32_t> mask(static_cast<size_t>(v.compiler->mask_words()));
  m->fill_mask(mask);
  for (int32_t id = 0; id < v.compiler->vocab(); ++id) {
    if (!allowed(mask, id)) continue;
    const int32_t one[1] = {id};
    EXPECT_EQ(v.tokenizer->decode_raw(one, false, true).front(), '{') << id;
  }
}

TEST(Grammar, RefusalsNameTheProblem) {
  TESSERA_REQUIRE_TESTDATA(gemma_path());
  Vocab v = load(gemma_path());
  ASSERT_TRUE(v.compiler);
  auto refused = [&](GrammarKind kind, const std::string& source) {
    auto g = v.compiler->compile(GrammarSpec{kind, source});
    EXPECT_FALSE(g.is_ok()) << source;
    return g.is_ok() ? std::string() : g.status().message();
  };
  EXPECT_EQ(refused(GrammarKind::kJsonSchema,
                    R"({"type": "object", "properties": {"tags": {"type": "array", "uniqueItems": true}}})"),
            "$.properties.tags.uniqueItems: 'uniqueItems' is not supported (array items are generated independently)");
  // A property named like a keyword is a name, not the keyword.
  EXPECT_TRUE(v.compiler->compile(GrammarSpec{GrammarKind::kJsonSchema,
                                              R"({"type": "object", "properties": {"not": {"type": "integer"}}})"})
                  .is_ok());
  EXPECT_NE(refused(GrammarKind::kJsonSchema, R"({"type": "string", "format": "credit-card"})").find(
                "$.format: format 'credit-card' is not supported"),
            std::string::npos);
  EXPECT_NE(refused(GrammarKind::kJsonSchema, R"({"anyOf": [{"type": "number", "multipleOf": 0.5}]})")
                .find("$.anyOf[0].multipleOf"),
            std::string::npos);
  EXPECT_NE(refused(GrammarKind::kJsonSchema, "{not json").find("not valid JSON"), std::string::npos);
  EXPECT_NE(refused(GrammarKind::kRegex, "(unclosed").find("regex cannot be compiled"), std::string::npos);
  EXPECT_NE(refused(GrammarKind::kEbnf, "root ::= ").find("grammar cannot be compiled"), std::string::npos);
  EXPECT_NE(refused(GrammarKind::kChoice, "[]").find("non-empty list"), std::string::npos);
  EXPECT_EQ(v.compiler->stats().refused, 7);
}

TEST(Grammar, CacheSharesOneCompilationAndTheBudgetRefusesLateOnes) {
  TESSERA_REQUIRE_TESTDATA(gemma_path());
  GrammarCompilerOptions options;
  options.compile_timeout = std::chrono::milliseconds(0);
  Vocab v = load(gemma_path(), options);
  ASSERT_TRUE(v.compiler);
  GrammarSpec spec{GrammarKind::kJsonSchema, R"({"type": "object", "properties": {"a": {"type": "string"}}})"};
  // No time at all: refused (the compilation itself goes on).
  auto late = v.compiler->compile(spec);
  ASSERT_FALSE(late.is_ok());
  EXPECT_EQ(late.status().code(), StatusCode::kDeadlineExceeded);
  EXPECT_NE(late.status().message().find("--grammar-compile-timeout"), std::string::npos);

  Vocab w = load(gemma_path());
  ASSERT_TRUE(w.compiler);
  auto a = w.compiler->compile(spec);
  auto b = w.compiler->compile(spec);
  ASSERT_TRUE(a.is_ok() && b.is_ok());
  EXPECT_EQ(a->get(), b->get());
  EXPECT_EQ(w.compiler->stats().compiled, 1);
  EXPECT_EQ(w.compiler->stats().cache_hits, 1);
  spec.strict = false;  // another key
  auto c = w.compiler->compile(spec);
  ASSERT_TRUE(c.is_ok());
  EXPECT_NE(a->get(), c->get());
}

// A schema whose bounded strings could never compile within the budget is refused before any
// compile thread takes it, naming the bound and its path; the estimate scales with the vocabulary.
TEST(Grammar, BoundedStringsPastTheBudgetAreRefusedUpFront) {
  const std::string essay = R"({"type": "object", "properties": {"title": {"type": "string", "maxLength": 12},
      "essay": {"type": "string", "minLength": 10, "maxLength": 1000}}})";
  Status s = check_compile_cost(essay, 262144, 5000);
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("$.properties.essay.maxLength: a string bounded to 1000 characters"), std::string::npos)
      << s.message();
  EXPECT_NE(s.message().find("--grammar-compile-timeout"), std::string::npos);
  EXPECT_TRUE(check_compile_cost(essay, 512, 5000).is_ok()) << "a small vocabulary compiles it quickly";
  EXPECT_TRUE(check_compile_cost(essay, 262144, 60000).is_ok()) << "a larger budget";
  EXPECT_TRUE(check_compile_cost(R"({"type": "string", "maxLength": 31})", 262144, 5000).is_ok());
  EXPECT_TRUE(check_compile_cost("not json", 262144, 5000).is_ok()) << "the compilation reports that";
  // Many distinct long bounds add up; identical ones are expanded once.
  std::string many = R"({"type": "object", "properties": {)";
  for (int i = 0; i < 8; ++i) many += fmt::format(R"({}"p{}": {{"type": "string", "maxLength": {}}})", i ? ", " : "", i, 40 + i);
  many += "}}";
  EXPECT_FALSE(check_compile_cost(many, 262144, 5000).is_ok());
  std::string same = R"({"type": "object", "properties": {)";
  for (int i = 0; i < 8; ++i) same += fmt::format(R"({}"p{}": {{"type": "string", "maxLength": 40}})", i ? ", " : "", i);
  same += "}}";
  EXPECT_TRUE(check_compile_cost(same, 262144, 5000).is_ok());

  TESSERA_REQUIRE_TESTDATA(gemma_path());
  Vocab v = load(gemma_path());
  ASSERT_TRUE(v.compiler);
  auto r = v.compiler->compile({GrammarKind::kJsonSchema, essay});
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("$.properties.essay.maxLength"), std::string::npos) << r.status().message();
  EXPECT_EQ(v.compiler->stats().refused, 1);
  EXPECT_EQ(v.compiler->stats().compiled, 0);
}

TEST(Grammar, SmallVocabularyWithModelPadding) {
  const std::string path = testdata_dir() + "/stories260K/hf/tokenizer.json";
  TESSERA_REQUIRE_TESTDATA(path);
  auto t = Tokenizer::from_hf_file(path);
  ASSERT_TRUE(t.is_ok());
  // Logits wider than the vocabulary: the padding ids are never allowed.
  auto c = GrammarCompiler::create(**t, 520, (*t)->eos_ids(), {});
  ASSERT_TRUE(c.is_ok()) << c.status().to_string();
  EXPECT_EQ((*c)->mask_words(), 17);
  auto g = (*c)->compile(GrammarSpec{GrammarKind::kJsonSchema, R"({"type": "object", "properties": {"b": {"type": "boolean"}}, "required": ["b"]})"});
  ASSERT_TRUE(g.is_ok()) << g.status().to_string();
  auto m = (*g)->matcher();
  std::vector<uint32_t> mask(17);
  m->fill_mask(mask);
  for (int32_t id = 512; id < 520; ++id) EXPECT_FALSE(allowed(mask, id)) << id;
  EXPECT_FALSE(m->accept(515));
  // Jump-forward: the forced start is spelled token by token exactly (no SentencePiece dummy
  // space), and the matcher takes every one of those tokens.
  const std::string forced = m->forced_string();
  EXPECT_EQ(forced, "{\"b\": ");
  const std::vector<int32_t> spelled = (*g)->spell(forced);
  ASSERT_FALSE(spelled.empty());
  EXPECT_EQ((*t)->decode_raw(spelled, false, true), forced);
  for (int32_t id : spelled) EXPECT_TRUE(m->accept(id)) << id;
  EXPECT_TRUE((*g)->spell("\x01\x02").size() <= 2);
}

// Reasoning models: free text inside <think> ... </think> (opened by the output, if it wants, or
// by the prompt), then the constrained text; the text after "</think>" is held to the schema.
TEST(Grammar, ReasoningPrefixLeavesThinkingFreeAndConstrainsTheAnswer) {
  const std::vector<std::string> tokens = {"", "<think>", "</think>", "hm, ", "{\"a\": ", "1", "}", "\n", "x", "<", "/"};
  enum : int32_t { kEos, kOpen, kClose, kHm, kKey, kOne, kEnd, kNl, kX, kLt, kSlash };
  auto c = GrammarCompiler::create(tokens, static_cast<int64_t>(tokens.size()), {kEos}, {});
  ASSERT_TRUE(c.is_ok()) << c.status().to_string();
  const std::string schema = R"({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]})";
  const auto run = [&](ReasoningPrefix prefix, const std::vector<int32_t>& ids) {
    GrammarSpec spec{GrammarKind::kJsonSchema, schema};
    spec.reasoning = prefix;
    auto g = (*c)->compile(spec);
    EXPECT_TRUE(g.is_ok()) << g.status().to_string();
    if (!g.is_ok()) return -2;
    auto m = (*g)->matcher();
    for (size_t i = 0; i < ids.size(); ++i)
      if (!m->accept(ids[i])) return static_cast<int>(i);  // the first refused token
    return m->terminated() ? -1 : static_cast<int>(ids.size());
  };
  // Opened by the output: reasoning with any text ("<" and "/" too), then the JSON, then EOS.
  EXPECT_EQ(run(ReasoningPrefix::kThink, {kOpen, kHm, kLt, kSlash, kX, kClose, kNl, kKey, kOne, kEnd, kEos}), -1);
  EXPECT_EQ(run(ReasoningPrefix::kThink, {kKey, kOne, kEnd, kEos}), -1) << "or no reasoning at all";
  EXPECT_EQ(run(ReasoningPrefix::kThink, {kX}), 0);
  EXPECT_EQ(run(ReasoningPrefix::kThink, {kOpen, kHm, kClose, kX}), 3) << "the answer is held to the schema";
  // Opened by the prompt: the output starts inside the reasoning.
  EXPECT_EQ(run(ReasoningPrefix::kInside, {kHm, kX, kClose, kKey, kOne, kEnd, kEos}), -1);
  EXPECT_EQ(run(ReasoningPrefix::kInside, {kHm, kEos}), 1) << "no end before the answer";
  // Without a prefix the same schema takes the JSON at once.
  EXPECT_EQ(run(ReasoningPrefix::kNone, {kKey, kOne, kEnd, kEos}), -1);
  EXPECT_EQ(run(ReasoningPrefix::kNone, {kOpen}), 0);
  GrammarSpec a{GrammarKind::kJsonSchema, schema}, b = a;
  b.reasoning = ReasoningPrefix::kThink;
  EXPECT_NE(a.key(), b.key());
}

}  // namespace
}  // namespace tessera
