// Length-bounded strings rewritten as shared chains of rules (grammar/bounded_strings.h): the
// text rewrite itself, and through a compiled grammar exactly the lengths the schema allows, with
// the masks agreeing with the matcher token by token.
#include "grammar/bounded_strings.h"

#include <gtest/gtest.h>

#include "grammar/grammar.h"

namespace tessera {
namespace {

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

TEST(BoundedStrings, RewritesTheConvertersBoundedStringsIntoSharedStates) {
  const std::string ebnf =
      "root ::= ((\"{\" root_prop_0 \", \" root_prop_1 \", \" root_prop_2 \"}\"))\n"
      "root_prop_0 ::= ((\"\\\"\" root_prop_0_characters{0, 12} \"\\\"\"))\n"
      "root_prop_0_characters ::= (([^\\\"\\\\\\r\\n]))\n"
      "root_prop_1 ::= ((\"\\\"\" root_prop_1_characters{2, 20} \"\\\"\"))\n"
      "root_prop_1_characters ::= (([^\\\"\\\\\\r\\n]))\n"
      "root_prop_2 ::= ((\"\\\"\" root_prop_2_characters{0, 40} \"\\\"\"))\n"
      "root_prop_2_characters ::= (([^\\\"\\\\\\r\\n]))\n";
  const std::optional<std::string> out = unroll_bounded_strings(ebnf);
  ASSERT_TRUE(out.has_value());
  EXPECT_NE(out->find("root_prop_0 ::= ((\"\\\"\" root_prop_0_characters_left_12))\n"), std::string::npos) << *out;
  // The same characters: the second string starts in the first one's family of states.
  EXPECT_NE(out->find("root_prop_1 ::= ((\"\\\"\" root_prop_0_characters_left_20_need_2))\n"), std::string::npos)
      << *out;
  EXPECT_NE(out->find("root_prop_0_characters_left_20_need_2 ::= ((root_prop_0_characters "
                      "root_prop_0_characters_left_19_need_1))\n"),
            std::string::npos)
      << *out;
  EXPECT_NE(out->find("root_prop_0_characters_left_1 ::= ((\"\\\"\") | (root_prop_0_characters "
                      "root_prop_0_characters_left_0))\n"),
            std::string::npos)
      << *out;
  EXPECT_EQ(count(*out, "root_prop_0_characters_left_12 ::="), 1u) << "shared, defined once";
  EXPECT_EQ(count(*out, "root_prop_0_characters_left_0 ::="), 1u);
  // Past kMaxUnrolledStringLength the converter's repetition stays.
  EXPECT_NE(out->find("root_prop_2_characters{0, 40}"), std::string::npos);
  EXPECT_NE(out->find("root ::= ((\"{\" root_prop_0"), std::string::npos);
  // Every bounded string's characters become what JSON holds unescaped: no raw control characters.
  EXPECT_NE(out->find("root_prop_2_characters ::= (([^\\0-\\x1f\\\"\\\\]))\n"), std::string::npos) << *out;
  // Only a minimum (maxLength absent): not unrolled, its characters still rewritten.
  const std::optional<std::string> min_only = unroll_bounded_strings(
      "root ::= ((\"\\\"\" chars{1, -1} \"\\\"\"))\nchars ::= (([^\\\"\\\\\\r\\n]))\n");
  ASSERT_TRUE(min_only.has_value());
  EXPECT_NE(min_only->find("chars{1, -1}"), std::string::npos) << *min_only;
  EXPECT_NE(min_only->find("chars ::= (([^\\0-\\x1f"), std::string::npos) << *min_only;
  EXPECT_FALSE(unroll_bounded_strings("root ::= ((\"a\"))\n").has_value());
  EXPECT_FALSE(unroll_bounded_strings("root ::= ((\"\\\"\" nothing{0, 3} \"\\\"\"))\n").has_value())
      << "a repetition of an undefined rule is left alone";
}

// A tiny byte vocabulary: single characters and a few longer tokens.
std::unique_ptr<GrammarCompiler> tiny_compiler() {
  std::vector<std::string> tokens = {"", "\"", "a", "b", "aa", "aaaa", "aaaaaaa", "a\"", "{", "}", ":", " ", ","};
  auto c = GrammarCompiler::create(tokens, static_cast<int64_t>(tokens.size()), {0}, {});
  EXPECT_TRUE(c.is_ok()) << c.status().to_string();
  return c.is_ok() ? std::move(*c) : nullptr;
}

bool allowed(const std::vector<uint32_t>& mask, int32_t id) { return (mask[static_cast<size_t>(id) / 32] >> (id % 32)) & 1u; }

TEST(BoundedStrings, CompiledGrammarTakesExactlyTheAllowedLengths) {
  auto compiler = tiny_compiler();
  ASSERT_NE(compiler, nullptr);
  auto g = compiler->compile({GrammarKind::kJsonSchema, R"({"type": "string", "minLength": 2, "maxLength": 5})"});
  ASSERT_TRUE(g.is_ok()) << g.status().to_string();
  constexpr int32_t kQuote = 1, kA = 2, kAA = 4, kA4 = 5, kA7 = 6, kAQuote = 7;
  std::vector<uint32_t> mask(static_cast<size_t>(compiler->mask_words()));
  for (int len = 0; len <= 6; ++len) {
    auto m = (*g)->matcher();
    ASSERT_TRUE(m->accept(kQuote));
    bool ok = true;
    for (int i = 0; i < len && ok; ++i) {
      m->fill_mask(mask);
      const bool may = m->accept(kA);
      EXPECT_EQ(allowed(mask, kA), may) << "length " << len << " at " << i;
      ok = may;
    }
    EXPECT_EQ(ok, len <= 5) << "length " << len;
    if (!ok) continue;
    m->fill_mask(mask);
    const bool closes = m->accept(kQuote);
    EXPECT_EQ(allowed(mask, kQuote), closes);
    EXPECT_EQ(closes, len >= 2) << "closing after " << len << " characters";
  }
  // Longer tokens count all their characters: after one "a", "aaaa" makes 5 (allowed), "aaaaaaa"
  // 8 (not); after two, "aaaa" makes 6 (not); "a\"" closes at 2 but not at 1.
  auto m = (*g)->matcher();
  ASSERT_TRUE(m->accept(kQuote));
  ASSERT_TRUE(m->accept(kA));
  m->fill_mask(mask);
  EXPECT_TRUE(allowed(mask, kA4));
  EXPECT_FALSE(allowed(mask, kA7));
  EXPECT_TRUE(allowed(mask, kAQuote));
  EXPECT_TRUE(allowed(mask, kAA));
  EXPECT_TRUE(m->accept(kA));
  m->fill_mask(mask);
  EXPECT_FALSE(allowed(mask, kA4));
  EXPECT_FALSE(m->accept(kA4));
  EXPECT_TRUE(m->accept(kAQuote));
  EXPECT_TRUE(m->completed());
}

// xgrammar's own class for these characters let a raw tab or U+0000 through: an output could be
// invalid JSON. Escapes are not taken either (they would make every mask slow).
TEST(BoundedStrings, CharactersAreWhatJsonHoldsUnescaped) {
  std::vector<std::string> tokens = {"", "\"", "a", "\t", "\\t", std::string(1, '\0'), "\\", "\x7f", "\xc3\xa9"};
  auto compiler = GrammarCompiler::create(tokens, static_cast<int64_t>(tokens.size()), {0}, {});
  ASSERT_TRUE(compiler.is_ok()) << compiler.status().to_string();
  constexpr int32_t kQuote = 1, kA = 2, kRawTab = 3, kEscTab = 4, kNul = 5, kBackslash = 6, kDel = 7, kE = 8;
  for (const char* schema : {R"({"type": "string", "maxLength": 3})", R"({"type": "string", "maxLength": 40})",
                             R"({"type": "string", "minLength": 1})"}) {
    SCOPED_TRACE(schema);
    auto g = (*compiler)->compile({GrammarKind::kJsonSchema, schema});
    ASSERT_TRUE(g.is_ok()) << g.status().to_string();
    std::vector<uint32_t> mask(static_cast<size_t>((*compiler)->mask_words()));
    auto m = (*g)->matcher();
    ASSERT_TRUE(m->accept(kQuote));
    m->fill_mask(mask);
    EXPECT_FALSE(allowed(mask, kRawTab));
    EXPECT_FALSE(allowed(mask, kNul));
    EXPECT_FALSE(allowed(mask, kEscTab));
    EXPECT_FALSE(allowed(mask, kBackslash));
    EXPECT_TRUE(allowed(mask, kDel));
    EXPECT_FALSE(m->accept(kRawTab));
    EXPECT_TRUE(m->accept(kA));
    EXPECT_TRUE(m->accept(kE));
    EXPECT_TRUE(m->accept(kDel));
    if (std::string_view(schema).find("maxLength\": 3") != std::string_view::npos) {
      m->fill_mask(mask);  // three characters: only the closing quote
      EXPECT_FALSE(allowed(mask, kA));
    }
    EXPECT_TRUE(m->accept(kQuote));
    EXPECT_TRUE(m->completed());
  }
}

}  // namespace
}  // namespace tessera
