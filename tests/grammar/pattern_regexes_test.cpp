// JSON Schema patterns through xgrammar's regex expansion (grammar/pattern_regexes.h): which
// patterns are safe to take out of the JSON-string automaton, the literal unescaping, the rule
// renaming, and through a compiled grammar the case the automaton gets wrong.
#include "grammar/pattern_regexes.h"

#include <gtest/gtest.h>

#include <algorithm>

#include "grammar/grammar.h"

namespace tessera {
namespace {

// Whether `text`, one single-character token at a time over `tokens`, is accepted and complete.
bool accepts_whole(const CompiledGrammar& g, const std::vector<std::string>& tokens, const std::string& text) {
  auto m = g.matcher();
  for (char c : text) {
    const auto it = std::find(tokens.begin(), tokens.end(), std::string(1, c));
    if (it == tokens.end() || !m->accept(static_cast<int32_t>(it - tokens.begin()))) return false;
  }
  return m->completed();
}

TEST(PatternRegexes, JsonSafePatterns) {
  for (const char* p : {"^[A-Z]{2}[0-9]{2}$", "^v[0-9]{1,2}(\\.[0-9]{1,2})?$", "^(small|medium|large)$", "\\d+\\w*",
                        "^#[0-9a-fA-F]{6}$", "^[a-z0-9]{1,6}(-[a-z0-9]{1,6}){0,2}$", "^\\+?[0-9]{3}-[0-9]{4}$",
                        "[é-ü]+", "^[\\-_]$", "^\\u0041$"})
    EXPECT_TRUE(json_safe_pattern(p)) << p;
  for (const char* p : {".*", "^[^a]$", "\\s", "\\S+", "\\D", "\\W", "[ -~]", "[!-#]", "[A-^]", "\"", "a\\\\b",
                        "\\n", "\\x1f", "\\u0022", "[\\\\]", "[\\s]", "[", "[]", "\\p{L}", "\\b"})
    EXPECT_FALSE(json_safe_pattern(p)) << p;
}

TEST(PatternRegexes, UnescapesXgrammarsLiterals) {
  EXPECT_EQ(unescape_ebnf_literal(R"(^v[0-9]{1,2}(\\.[0-9]{1,2})\?$)"), "^v[0-9]{1,2}(\\.[0-9]{1,2})?$");
  EXPECT_EQ(unescape_ebnf_literal(R"(\"a\'\t\x41\u00e9)"), "\"a'\tA\xc3\xa9");
  EXPECT_FALSE(unescape_ebnf_literal(R"(\q)").has_value());
  EXPECT_FALSE(unescape_ebnf_literal(R"(\x4)").has_value());
  EXPECT_FALSE(unescape_ebnf_literal("\\").has_value());
}

TEST(PatternRegexes, ReplacesSafePatternRulesWithRenamedExpansions) {
  const std::string ebnf =
      "root ::= ((\"{\" p \", \" q \"}\"))\n"
      "p ::= Regex(\"^v[0-9]\\?$\", json_string=true)\n"
      "q ::= Regex(\"^.$\", json_string=true)\n";
  std::vector<std::string> asked;
  const auto out = expand_pattern_regexes(ebnf, [&](const std::string& pattern) -> std::optional<std::string> {
    asked.push_back(pattern);
    return "root ::= ((\"v\" root_1))\nroot_1 ::= (\"\" | ([0-9]))\n";
  });
  ASSERT_TRUE(out.has_value());
  EXPECT_EQ(asked, std::vector<std::string>{"^v[0-9]?$"}) << "q's '.' may match a quote: left to the automaton";
  EXPECT_NE(out->find("p ::= ((p_re))\n"), std::string::npos) << *out;
  EXPECT_NE(out->find("p_re ::= ((\"v\" p_re_1))\n"), std::string::npos) << *out;
  EXPECT_NE(out->find("p_re_1 ::= (\"\" | ([0-9]))\n"), std::string::npos) << *out;
  EXPECT_NE(out->find("q ::= Regex(\"^.$\", json_string=true)\n"), std::string::npos) << *out;
  EXPECT_NE(out->find("root ::= ((\"{\" p \", \" q \"}\"))\n"), std::string::npos) << *out;
  EXPECT_FALSE(expand_pattern_regexes("root ::= ((\"a\"))\n", [](const std::string&) {
                 return std::optional<std::string>("root ::= ((\"b\"))\n");
               }).has_value());
}

// xgrammar 0.2.8's pattern automaton took "v202" for ^v[0-9]{1,2}(x[0-9]{1,2})?$.
TEST(PatternRegexes, CompiledSchemaRefusesWhatThePatternDoesNotMatch) {
  std::vector<std::string> tokens = {"", "\"", "v", "x", "0", "1", "2", "."};
  auto compiler = GrammarCompiler::create(tokens, static_cast<int64_t>(tokens.size()), {0}, {});
  ASSERT_TRUE(compiler.is_ok()) << compiler.status().to_string();
  for (const char* schema : {R"({"type": "string", "pattern": "^v[0-9]{1,2}(x[0-9]{1,2})?$"})",
                             R"({"type": "string", "pattern": "^v[0-9]{1,2}(\\.[0-9]{1,2})?$"})"}) {
    SCOPED_TRACE(schema);
    auto g = (*compiler)->compile({GrammarKind::kJsonSchema, schema});
    ASSERT_TRUE(g.is_ok()) << g.status().to_string();
    const auto walk = [&](const std::vector<int32_t>& ids) {
      auto m = (*g)->matcher();
      for (int32_t id : ids)
        if (!m->accept(id)) return false;
      return m->completed();
    };
    constexpr int32_t q = 1, v = 2, x = 3, d0 = 4, d1 = 5, d2 = 6, dot = 7;
    const int32_t sep = std::string_view(schema).find('x') != std::string_view::npos ? x : dot;
    EXPECT_FALSE(walk({q, v, d2, d0, d2, q})) << "v202";
    EXPECT_TRUE(walk({q, v, d2, d0, q}));
    EXPECT_TRUE(walk({q, v, d2, sep, d1, q}));
    EXPECT_TRUE(walk({q, v, d2, d0, sep, d1, d2, q}));
    EXPECT_FALSE(walk({q, v, d2, sep, q}));
  }
}

// A structural tag's schemas (tool arguments) get the same rewrites as a json_schema request's.
TEST(PatternRegexes, StructuralTagSchemasAreRewrittenToo) {
  std::vector<std::string> tokens = {"", "\"", "v", "x", "0", "2", "<", ">"};
  auto compiler = GrammarCompiler::create(tokens, static_cast<int64_t>(tokens.size()), {0}, {});
  ASSERT_TRUE(compiler.is_ok()) << compiler.status().to_string();
  const std::string tag = R"({"type": "structural_tag", "format": {"type": "tag", "begin": "<", "end": ">",
      "content": {"type": "json_schema", "json_schema": {"type": "string", "pattern": "^v[0-9]{1,2}(x[0-9]{1,2})?$"}}}})";
  auto g = (*compiler)->compile({GrammarKind::kStructuralTag, tag});
  ASSERT_TRUE(g.is_ok()) << g.status().to_string();
  const auto walk = [&](const std::string& text) { return accepts_whole(**g, tokens, text); };
  EXPECT_TRUE(walk(R"(<"v20">)"));
  EXPECT_TRUE(walk(R"(<"v20x2">)"));
  EXPECT_FALSE(walk(R"(<"v202">)"));
}

// xgrammar's ipv4 format took "026"; PyPI's jsonschema and RFC 2673 do not. The property order
// of the schema stays (the rewritten schema is re-serialized in order).
TEST(PatternRegexes, Ipv4FormatHasNoLeadingZerosAndOrderStays) {
  std::vector<std::string> tokens = {"", "\"", "0", "1", "2", "6", ".", "{", "}", ":", " ", ",", "b", "a"};
  auto compiler = GrammarCompiler::create(tokens, static_cast<int64_t>(tokens.size()), {0}, {});
  ASSERT_TRUE(compiler.is_ok()) << compiler.status().to_string();
  auto g = (*compiler)->compile(
      {GrammarKind::kJsonSchema, R"({"type": "object", "properties": {"b": {"type": "string", "format": "ipv4"},
                                     "a": {"const": {"format": "ipv4"}}}, "required": ["b"]})"});
  ASSERT_TRUE(g.is_ok()) << g.status().to_string();
  const auto walk = [&](const std::string& text) { return accepts_whole(**g, tokens, text); };
  EXPECT_TRUE(walk(R"({"b": "1.2.0.26"})"));
  EXPECT_TRUE(walk(R"({"b": "126.0.0.1"})"));
  EXPECT_FALSE(walk(R"({"b": "1.2.0.026"})"));
  EXPECT_FALSE(walk(R"({"b": "01.2.0.2"})"));
}

}  // namespace
}  // namespace tessera
