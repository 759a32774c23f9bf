// Tokenizer for chat-template Jinja: splits the source into text and tag tokens, applying the
// whitespace control of the reference renderer (Hugging Face's Jinja environment uses
// trim_blocks=True, lstrip_blocks=True and keeps no trailing newline).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace tessera::jinja {

struct Token {
  enum class Type : uint8_t {
    kText,        // template data, already whitespace-controlled
    kVarBegin,    // {{
    kVarEnd,      // }}
    kBlockBegin,  // {%
    kBlockEnd,    // %}
    kName,
    kString,      // text holds the decoded literal
    kInt,
    kFloat,
    kOp,          // text holds the operator: "+", "//", "==", "(", ...
    kEof,
  };
  Type type = Type::kEof;
  std::string text;
  int64_t int_value = 0;
  double float_value = 0;
  int line = 1;    // 1-based
  int column = 1;  // 1-based, in characters
};

struct LexerOptions {
  bool trim_blocks = true;    // drop the first newline after a block or comment tag
  bool lstrip_blocks = true;  // drop spaces and tabs before a block or comment tag at line start
};

// Fails on unterminated tags, comments and strings and on unknown characters inside tags, naming
// line and column.
Result<std::vector<Token>> tokenize(std::string_view source, const LexerOptions& options = {});

}  // namespace tessera::jinja
