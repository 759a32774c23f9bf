// Unbounded runs of digits capped (grammar/digit_runs.h): the text rewrite, and through a
// compiled schema numbers up to the cap taken and past it refused, so every number ends.
#include "grammar/digit_runs.h"

#include <gtest/gtest.h>

#include "grammar/grammar.h"

namespace tessera {
namespace {

TEST(DigitRuns, BoundsEveryUnboundedRun) {
  const std::string ebnf =
      "basic_integer ::= ((\"0\") | (basic_integer_1 [1-9] [0-9]*))\n"
      "basic_number_3 ::= (\"\" | (\".\" basic_number_digits{1, -1}))\n"
      "basic_number_digits ::= (([0-9]))\n"
      "frac ::= (([0-9] frac) | ([0-9]))\n"
      "other ::= ((\"a\"{1, -1}))\n"
      "min_100 ::= (([1-9] basic_number_digits{2, 2}) | ([1-9] basic_number_digits{3, -1}))\n";
  const std::optional<std::string> out = cap_digit_runs(ebnf);
  ASSERT_TRUE(out.has_value());
  EXPECT_NE(out->find("basic_integer ::= ((\"0\") | (basic_integer_1 [1-9] [0-9]{0, 18}))\n"), std::string::npos)
      << *out;
  EXPECT_NE(out->find("(\".\" basic_number_digits{1, 19}))\n"), std::string::npos) << *out;
  EXPECT_NE(out->find("frac ::= (([0-9]{1, 19}))\n"), std::string::npos) << *out;
  EXPECT_NE(out->find("other ::= ((\"a\"{1, -1}))\n"), std::string::npos) << *out;
  EXPECT_NE(out->find("min_100 ::= (([1-9] basic_number_digits{2, 2}) | ([1-9] basic_number_digits{3, 18}))\n"),
            std::string::npos)
      << *out;
  EXPECT_FALSE(cap_digit_runs("root ::= ((\"a\"))\n").has_value());
}

TEST(DigitRuns, CompiledNumbersEndWithinTheCap) {
  std::vector<std::string> tokens = {"", "1", "0", ".", "e", "-"};
  auto compiler = GrammarCompiler::create(tokens, static_cast<int64_t>(tokens.size()), {0}, {});
  ASSERT_TRUE(compiler.is_ok()) << compiler.status().to_string();
  for (const char* schema : {R"({"type": "integer"})", R"({"type": "number"})", R"({"type": "integer", "minimum": 5})",
                            R"({"type": "integer", "minimum": 100})"}) {
    SCOPED_TRACE(schema);
    auto g = (*compiler)->compile({GrammarKind::kJsonSchema, schema});
    ASSERT_TRUE(g.is_ok()) << g.status().to_string();
    auto m = (*g)->matcher();
    ASSERT_TRUE(m->accept(1));
    for (int i = 1; i < kMaxDigitRun; ++i) ASSERT_TRUE(m->accept(2)) << "digit " << i + 1;
    EXPECT_TRUE(m->completed());
    EXPECT_FALSE(m->accept(2)) << "digit " << kMaxDigitRun + 1;
  }
}

}  // namespace
}  // namespace tessera
