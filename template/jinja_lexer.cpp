#include "template/jinja_lexer.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>

#include <fmt/format.h>

#include "template/jinja_value.h"

namespace tessera::jinja {
namespace {

bool is_name_start(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool is_name_char(char c) { return is_name_start(c) || (c >= '0' && c <= '9'); }
bool is_digit(char c) { return c >= '0' && c <= '9'; }

// Length in bytes of the Python whitespace character at `s[i]`, or 0 if there is none.
size_t space_at(std::string_view s, size_t i) {
  const auto b = static_cast<unsigned char>(s[i]);
  if (b < 0x80) return is_py_space(b) ? 1 : 0;
  size_t len = (b & 0xE0) == 0xC0 ? 2 : (b & 0xF0) == 0xE0 ? 3 : (b & 0xF8) == 0xF0 ? 4 : 1;
  if (i + len > s.size()) return 0;
  const std::u32string c = decode_utf8(s.substr(i, len));
  return (c.size() == 1 && is_py_space(c[0])) ? len : 0;
}

// Python str.rstrip() on UTF-8.
std::string_view rstrip_py(std::string_view s) {
  const std::u32string cps = decode_utf8(s);
  size_t keep = cps.size();
  while (keep > 0 && is_py_space(cps[keep - 1])) --keep;
  if (keep == cps.size()) return s;
  return s.substr(0, encode_utf8(std::u32string_view(cps).substr(0, keep)).size());
}

bool all_space(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const size_t n = space_at(s, i);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

class Lexer {
 public:
  Lexer(std::string source, const LexerOptions& options) : src_(std::move(source)), options_(options) {
    line_starts_.push_back(0);
    for (size_t i = 0; i < src_.size(); ++i) {
      if (src_[i] == '\n') line_starts_.push_back(i + 1);
    }
  }

  Result<std::vector<Token>> run() {
    bool line_starting = true;  // the previous match ended with a newline (or nothing came yet)
    while (pos_ < src_.size()) {
      const size_t start = find_tag_start(pos_);
      if (start == std::string::npos) {
        emit_text(std::string_view(src_).substr(pos_), pos_);
        pos_ = src_.size();
        break;
      }
      const char kind = src_[start + 1];  // '{', '%' or '#'
      const char sign = start + 2 < src_.size() ? src_[start + 2] : '\0';
      const bool has_sign = sign == '-' || sign == '+';
      std::string_view text = std::string_view(src_).substr(pos_, start - pos_);
      if (sign == '-') {
        text = rstrip_py(text);
      } else if (sign != '+' && options_.lstrip_blocks && kind != '{') {
        const size_t nl = text.rfind('\n');
        const size_t l_pos = nl == std::string_view::npos ? 0 : nl + 1;
        if ((l_pos > 0 || line_starting) && l_pos < text.size() && all_space(text.substr(l_pos))) {
          text = text.substr(0, l_pos);
        }
      }
      emit_text(text, pos_);
      pos_ = start + 2 + (has_sign ? 1 : 0);
      if (kind == '#') {
        TESSERA_RETURN_IF_ERROR(lex_comment(start));
      } else if (kind == '%' && is_raw_begin()) {
        TESSERA_RETURN_IF_ERROR(lex_raw(start));
      } else {
        TESSERA_RETURN_IF_ERROR(lex_tag(kind == '%', start));
      }
      line_starting = pos_ > 0 && src_[pos_ - 1] == '\n';
    }
    Token eof;
    eof.type = Token::Type::kEof;
    set_position(eof, src_.size());
    tokens_.push_back(std::move(eof));
    return std::move(tokens_);
  }

 private:
  size_t find_tag_start(size_t from) const {
    size_t i = from;
    while ((i = src_.find('{', i)) != std::string::npos) {
      if (i + 1 < src_.size() && (src_[i + 1] == '{' || src_[i + 1] == '%' || src_[i + 1] == '#')) return i;
      ++i;
    }
    return std::string::npos;
  }

  // Columns count characters. Positions are asked for in increasing order, so the count resumes
  // from the previous position on the same line instead of rescanning the line (templates are
  // often one long line).
  void set_position(Token& t, size_t offset) const {
    const auto it = std::upper_bound(line_starts_.begin(), line_starts_.end(), offset);
    const size_t line_start = *(it - 1);
    t.line = static_cast<int>(it - line_starts_.begin());
    size_t from = line_start;
    int64_t column = 1;
    if (col_cache_offset_ >= line_start && col_cache_offset_ <= offset) {
      from = col_cache_offset_;
      column = col_cache_column_;
    }
    column += static_cast<int64_t>(utf8_length(std::string_view(src_).substr(from, offset - from)));
    col_cache_offset_ = offset;
    col_cache_column_ = column;
    t.column = static_cast<int>(column);
  }

  Status error_at(size_t offset, std::string_view what) const {
    Token t;
    set_position(t, std::min(offset, src_.size()));
    return Status::invalid_argument(fmt::format("syntax error at line {}, column {}: {}", t.line, t.column, what));
  }

  void emit_text(std::string_view text, size_t offset) {
    if (text.empty()) return;
    Token t;
    t.type = Token::Type::kText;
    t.text = std::string(text);
    set_position(t, offset);
    tokens_.push_back(std::move(t));
  }

  void skip_spaces() {
    while (pos_ < src_.size()) {
      const size_t n = space_at(src_, pos_);
      if (n == 0) break;
      pos_ += n;
    }
  }

  // After `{%` (and a sign): whitespace, "raw", whitespace, then "%}" or "-%}".
  bool is_raw_begin() const {
    size_t i = pos_;
    while (i < src_.size() && space_at(src_, i)) i += space_at(src_, i);
    if (src_.compare(i, 3, "raw") != 0 || (i + 3 < src_.size() && is_name_char(src_[i + 3]))) return false;
    i += 3;
    while (i < src_.size() && space_at(src_, i)) i += space_at(src_, i);
    return src_.compare(i, 2, "%}") == 0 || src_.compare(i, 3, "-%}") == 0;
  }

  Status lex_comment(size_t start) {
    const size_t body = pos_;
    const size_t end = src_.find("#}", body);
    if (end == std::string::npos) return error_at(start, "missing end of comment tag");
    const char sign = end > body ? src_[end - 1] : '\0';
    pos_ = end + 2;
    finish_tag_end(sign, /*block_like=*/true);
    return Status::ok();
  }

  // {% raw %}...{% endraw %}: the content is text, verbatim apart from whitespace control at its
  // ends (lstrip before the closing tag, as the reference lexer does).
  Status lex_raw(size_t start) {
    while (pos_ < src_.size() && src_[pos_] != '%' && src_[pos_] != '-') ++pos_;  // past "raw"
    if (src_[pos_] == '-') {
      pos_ += 3;
      skip_spaces();
    } else {
      pos_ += 2;
    }
    const bool content_line_starting = pos_ > 0 && src_[pos_ - 1] == '\n';
    size_t search = pos_;
    while (true) {
      const size_t tag = src_.find("{%", search);
      if (tag == std::string::npos) return error_at(start, "missing end of raw directive");
      size_t i = tag + 2;
      const char sign = i < src_.size() && (src_[i] == '-' || src_[i] == '+') ? src_[i] : '\0';
      if (sign) ++i;
      while (i < src_.size() && space_at(src_, i)) i += space_at(src_, i);
      if (src_.compare(i, 6, "endraw") != 0) {
        search = tag + 2;
        continue;
      }
      i += 6;
      while (i < src_.size() && space_at(src_, i)) i += space_at(src_, i);
      char end_sign = '\0';
      if (src_.compare(i, 3, "-%}") == 0 || src_.compare(i, 3, "+%}") == 0) {
        end_sign = src_[i];
        i += 3;
      } else if (src_.compare(i, 2, "%}") == 0) {
        i += 2;
      } else {
        search = tag + 2;
        continue;
      }
      std::string_view text = std::string_view(src_).substr(pos_, tag - pos_);
      if (sign == '-') {
        text = rstrip_py(text);
      } else if (sign != '+' && options_.lstrip_blocks) {
        const size_t nl = text.rfind('\n');
        const size_t l_pos = nl == std::string_view::npos ? 0 : nl + 1;
        if ((l_pos > 0 || content_line_starting) && l_pos < text.size() && all_space(text.substr(l_pos))) {
          text = text.substr(0, l_pos);
        }
      }
      emit_text(text, pos_);
      pos_ = i;
      finish_tag_end(end_sign, /*block_like=*/true);
      return Status::ok();
    }
  }

  // Whitespace handling after a closing delimiter: "-" strips all following whitespace; a plain
  // block/comment end drops one newline when trim_blocks is on.
  void finish_tag_end(char sign, bool block_like) {
    if (sign == '-') {
      skip_spaces();
    } else if (sign != '+' && block_like && options_.trim_blocks && pos_ < src_.size() && src_[pos_] == '\n') {
      ++pos_;
    }
  }

  Status lex_tag(bool block, size_t start) {
    Token begin;
    begin.type = block ? Token::Type::kBlockBegin : Token::Type::kVarBegin;
    set_position(begin, start);
    tokens_.push_back(std::move(begin));
    std::vector<char> brackets;
    while (true) {
      skip_spaces();
      if (pos_ >= src_.size()) return error_at(start, block ? "unexpected end of template inside '{%' tag"
                                                            : "unexpected end of template inside '{{' tag");
      if (brackets.empty() && try_tag_end(block)) return Status::ok();
      TESSERA_RETURN_IF_ERROR(lex_token(brackets));
    }
  }

  bool try_tag_end(bool block) {
    const std::string_view close = block ? "%}" : "}}";
    char sign = '\0';
    size_t len = 0;
    if ((src_[pos_] == '-' || (block && src_[pos_] == '+')) && src_.compare(pos_ + 1, 2, close) == 0) {
      sign = src_[pos_];
      len = 3;
    } else if (src_.compare(pos_, 2, close) == 0) {
      len = 2;
    } else {
      return false;
    }
    Token end;
    end.type = block ? Token::Type::kBlockEnd : Token::Type::kVarEnd;
    set_position(end, pos_);
    tokens_.push_back(std::move(end));
    pos_ += len;
    finish_tag_end(sign, block);
    return true;
  }

  Status lex_token(std::vector<char>& brackets) {
    const size_t start = pos_;
    const char c = src_[pos_];
    Token t;
    set_position(t, start);
    if (is_name_start(c)) {
      while (pos_ < src_.size() && is_name_char(src_[pos_])) ++pos_;
      t.type = Token::Type::kName;
      t.text = src_.substr(start, pos_ - start);
    } else if (is_digit(c)) {
      TESSERA_RETURN_IF_ERROR(lex_number(t));
    } else if (c == '\'' || c == '"') {
      TESSERA_RETURN_IF_ERROR(lex_string(t));
    } else {
      static constexpr std::string_view kTwo[] = {"**", "//", "==", "!=", ">=", "<="};
      static constexpr std::string_view kOne = "+-/*%~[](){}><=.:|,;";
      t.type = Token::Type::kOp;
      for (std::string_view op : kTwo) {
        if (src_.compare(pos_, 2, op) == 0) t.text = std::string(op);
      }
      if (t.text.empty() && kOne.find(c) != std::string_view::npos) t.text = std::string(1, c);
      if (t.text.empty()) return error_at(start, fmt::format("unexpected character '{}'", c));
      pos_ += t.text.size();
      if (c == '(' || c == '[' || c == '{') {
        brackets.push_back(c);
      } else if (c == ')' || c == ']' || c == '}') {
        const char open = c == ')' ? '(' : c == ']' ? '[' : '{';
        if (brackets.empty() || brackets.back() != open) {
          return error_at(start, fmt::format("unexpected '{}'", c));
        }
        brackets.pop_back();
      }
    }
    tokens_.push_back(std::move(t));
    return Status::ok();
  }

  // Integers and floats, with '_' digit separators. After '.', only an integer is read, so that
  // `x.0.1` is two item lookups rather than a float.
  Status lex_number(Token& t) {
    const size_t start = pos_;
    auto digits = [&] {
      while (pos_ < src_.size() && (is_digit(src_[pos_]) || (src_[pos_] == '_' && pos_ + 1 < src_.size() &&
                                                               is_digit(src_[pos_ + 1])))) {
        ++pos_;
      }
    };
    digits();
    bool is_float = false;
    const bool after_dot = !tokens_.empty() && tokens_.back().type == Token::Type::kOp && tokens_.back().text == ".";
    if (!after_dot && pos_ + 1 < src_.size() && src_[pos_] == '.' && is_digit(src_[pos_ + 1])) {
      is_float = true;
      ++pos_;
      digits();
    }
    if (!after_dot && pos_ < src_.size() && (src_[pos_] == 'e' || src_[pos_] == 'E')) {
      size_t k = pos_ + 1;
      if (k < src_.size() && (src_[k] == '+' || src_[k] == '-')) ++k;
      if (k < src_.size() && is_digit(src_[k])) {
        is_float = true;
        pos_ = k;
        digits();
      }
    }
    std::string text;
    for (size_t i = start; i < pos_; ++i) {
      if (src_[i] != '_') text.push_back(src_[i]);
    }
    t.text = text;
    if (is_float) {
      t.type = Token::Type::kFloat;
      t.float_value = std::strtod(text.c_str(), nullptr);
      return Status::ok();
    }
    t.type = Token::Type::kInt;
    errno = 0;
    char* end = nullptr;
    const long long v = std::strtoll(text.c_str(), &end, 10);
    if (errno == ERANGE) return error_at(start, fmt::format("integer literal {} does not fit 64 bits", text));
    t.int_value = v;
    return Status::ok();
  }

  // Python string-literal escapes, as Jinja decodes them ("unicode-escape").
  Status lex_string(Token& t) {
    const size_t start = pos_;
    const char quote = src_[pos_++];
    std::string out;
    while (true) {
      if (pos_ >= src_.size()) return error_at(start, "unterminated string literal");
      const char c = src_[pos_];
      if (c == quote) {
        ++pos_;
        break;
      }
      if (c != '\\') {
        out.push_back(c);
        ++pos_;
        continue;
      }
      if (pos_ + 1 >= src_.size()) return error_at(start, "unterminated string literal");
      const char e = src_[pos_ + 1];
      pos_ += 2;
      switch (e) {
        case '\n': break;  // line continuation
        case '\\': out.push_back('\\'); break;
        case '\'': out.push_back('\''); break;
        case '"': out.push_back('"'); break;
        case 'a': out.push_back('\a'); break;
        case 'b': out.push_back('\b'); break;
        case 'f': out.push_back('\f'); break;
        case 'n': out.push_back('\n'); break;
        case 'r': out.push_back('\r'); break;
        case 't': out.push_back('\t'); break;
        case 'v': out.push_back('\v'); break;
        case 'x': case 'u': case 'U': {
          const size_t n = e == 'x' ? 2 : e == 'u' ? 4 : 8;
          if (pos_ + n > src_.size()) return error_at(start, fmt::format("truncated \\{} escape", e));
          uint32_t v = 0;
          for (size_t k = 0; k < n; ++k) {
            const char h = src_[pos_ + k];
            int d = (h >= '0' && h <= '9') ? h - '0' : (h >= 'a' && h <= 'f') ? h - 'a' + 10
                  : (h >= 'A' && h <= 'F') ? h - 'A' + 10 : -1;
            if (d < 0) return error_at(start, fmt::format("truncated \\{} escape", e));
            v = v * 16 + static_cast<uint32_t>(d);
          }
          if (v > 0x10FFFF) return error_at(start, "illegal Unicode character in escape");
          pos_ += n;
          append_utf8(out, v);
          break;
        }
        default:
          if (e >= '0' && e <= '7') {
            uint32_t v = static_cast<uint32_t>(e - '0');
            for (int k = 0; k < 2 && pos_ < src_.size() && src_[pos_] >= '0' && src_[pos_] <= '7'; ++k) {
              v = v * 8 + static_cast<uint32_t>(src_[pos_++] - '0');
            }
            append_utf8(out, v);
          } else {
            // Unknown escapes keep their backslash, as in Python.
            out.push_back('\\');
            pos_ -= 1;
          }
      }
    }
    t.type = Token::Type::kString;
    t.text = std::move(out);
    return Status::ok();
  }

  std::string src_;
  LexerOptions options_;
  size_t pos_ = 0;
  std::vector<size_t> line_starts_;
  std::vector<Token> tokens_;
  mutable size_t col_cache_offset_ = 0;
  mutable int64_t col_cache_column_ = 1;
};

}  // namespace

Result<std::vector<Token>> tokenize(std::string_view source, const LexerOptions& options) {
  // Jinja normalises newlines and drops one trailing newline (keep_trailing_newline=False).
  std::string normalized;
  normalized.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      normalized.push_back('\n');
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      normalized.push_back(source[i]);
    }
  }
  if (!normalized.empty() && normalized.back() == '\n') normalized.pop_back();
  return Lexer(std::move(normalized), options).run();
}

}  // namespace tessera::jinja
