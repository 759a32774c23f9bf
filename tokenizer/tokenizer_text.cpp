// Text pipeline steps of the tokenizers: PCRE2 regexes, normalizers, pre-tokenizers and
// decoders. Semantics follow the Hugging Face tokenizer.json components of the same names.
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <cstring>

#include <fmt/format.h>

#include "common/check.h"
#include "common/logging.h"
#include "tokenizer/tokenizer_impl.h"
#include "tokenizer/unicode.h"

namespace tessera::tok {

// ---- Regex --------------------------------------------------------------------------------

namespace {

// Per-thread match state: one match data (only group 0 is read) and a JIT stack large enough
// for long runs of repeated characters (the default 32 KiB machine stack is not).
struct MatchState {
  pcre2_match_data* data = nullptr;
  pcre2_match_context* context = nullptr;
  pcre2_jit_stack* jit_stack = nullptr;
  MatchState() {
    data = pcre2_match_data_create(1, nullptr);
    context = pcre2_match_context_create(nullptr);
    jit_stack = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, nullptr);
    if (context != nullptr && jit_stack != nullptr) {
      pcre2_jit_stack_assign(context, nullptr, jit_stack);
    }
  }
  ~MatchState() {
    pcre2_jit_stack_free(jit_stack);
    pcre2_match_context_free(context);
    pcre2_match_data_free(data);
  }
};

MatchState& match_state() {
  thread_local MatchState state;
  return state;
}

}  // namespace

Regex::~Regex() { pcre2_code_free(static_cast<pcre2_code*>(code_)); }

Result<std::shared_ptr<const Regex>> Regex::compile(std::string_view pattern) {
  int error = 0;
  PCRE2_SIZE offset = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                   PCRE2_UTF | PCRE2_UCP, &error, &offset, nullptr);
  if (code == nullptr) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error, message, sizeof(message));
    return Status::invalid_argument(fmt::format("regex '{}': {} at offset {}", pattern,
                                                reinterpret_cast<const char*>(message), offset));
  }
  std::shared_ptr<Regex> regex(new Regex());
  regex->code_ = code;
  regex->jit_ = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
  return std::shared_ptr<const Regex>(std::move(regex));
}

void Regex::find_all(std::string_view s, std::vector<std::pair<size_t, size_t>>& out) const {
  auto* code = static_cast<pcre2_code*>(code_);
  MatchState& state = match_state();
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(s.data());
  size_t pos = 0;
  while (pos <= s.size()) {
    int rc = jit_ ? pcre2_jit_match(code, subject, s.size(), pos, 0, state.data, state.context)
                  : PCRE2_ERROR_JIT_BADOPTION;
    if (rc < 0 && rc != PCRE2_ERROR_NOMATCH) {
      // Interpreter fallback (no JIT, or the JIT stack ran out): same result, heap frames.
      rc = pcre2_match(code, subject, s.size(), pos, PCRE2_NO_UTF_CHECK, state.data, nullptr);
    }
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      TESSERA_LOG_WARN("tokenizer regex match failed (PCRE2 error {}); rest of text unsplit", rc);
      break;
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(state.data);
    const size_t begin = ov[0], end = ov[1];
    if (end <= begin) {  // empty match: step over one character
      if (begin >= s.size()) break;
      pos = begin + unicode::utf8_len_from_lead(static_cast<uint8_t>(s[begin]));
      continue;
    }
    out.emplace_back(begin, end);
    pos = end;
  }
}

void Pattern::find_all(std::string_view s, std::vector<std::pair<size_t, size_t>>& out) const {
  if (regex) {
    regex->find_all(s, out);
    return;
  }
  if (literal.empty()) return;
  size_t pos = 0;
  while ((pos = s.find(literal, pos)) != std::string_view::npos) {
    out.emplace_back(pos, pos + literal.size());
    pos += literal.size();
  }
}

std::string Pattern::replace_all(std::string_view s, std::string_view content) const {
  std::vector<std::pair<size_t, size_t>> matches;
  find_all(s, matches);
  if (matches.empty()) return std::string(s);
  std::string out;
  out.reserve(s.size() + matches.size() * content.size());
  size_t pos = 0;
  for (auto [b, e] : matches) {
    out.append(s.substr(pos, b - pos));
    out.append(content);
    pos = e;
  }
  out.append(s.substr(pos));
  return out;
}

// ---- normalizers --------------------------------------------------------------------------

namespace {

bool is_ascii_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

}  // namespace

std::string normalize(const std::vector<Normalizer>& steps, std::string text) {
  for (const Normalizer& n : steps) {
    switch (n.kind) {
      case Normalizer::kNfc:
        text = unicode::nfc(text);
        break;
      case Normalizer::kPrepend:
        if (!text.empty()) text.insert(0, n.text);
        break;
      case Normalizer::kReplace:
        text = n.pattern.replace_all(text, n.text);
        break;
      case Normalizer::kStrip: {
        size_t b = 0, e = text.size();
        if (n.strip_left) while (b < e && is_ascii_space(text[b])) ++b;
        if (n.strip_right) while (e > b && is_ascii_space(text[e - 1])) --e;
        text = text.substr(b, e - b);
        break;
      }
    }
  }
  return text;
}

// ---- pre-tokenizers -----------------------------------------------------------------------

std::string_view gpt2_split_regex() {
  return R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
}

namespace {

struct Span {
  size_t begin, end;
  bool is_match;
};

// Cuts `piece` at `matches` (sorted, non-overlapping) and regroups per `behavior`, the way HF's
// NormalizedString::split does. Appends the non-empty results to `out`.
void split_piece(const std::string& piece, const std::vector<std::pair<size_t, size_t>>& matches,
                 SplitBehavior behavior, bool invert, std::vector<std::string>& out) {
  std::vector<Span> spans;
  size_t pos = 0;
  for (auto [b, e] : matches) {
    if (b > pos) spans.push_back({pos, b, invert});
    spans.push_back({b, e, !invert});
    pos = e;
  }
  if (pos < piece.size()) spans.push_back({pos, piece.size(), invert});

  std::vector<std::pair<size_t, size_t>> parts;
  switch (behavior) {
    case SplitBehavior::kRemoved:
      for (const Span& s : spans) {
        if (!s.is_match) parts.emplace_back(s.begin, s.end);
      }
      break;
    case SplitBehavior::kIsolated:
      for (const Span& s : spans) parts.emplace_back(s.begin, s.end);
      break;
    case SplitBehavior::kMergedWithPrevious: {
      bool previous_match = false;
      for (const Span& s : spans) {
        if (s.is_match && !previous_match && !parts.empty()) {
          parts.back().second = s.end;
        } else {
          parts.emplace_back(s.begin, s.end);
        }
        previous_match = s.is_match;
      }
      break;
    }
    case SplitBehavior::kMergedWithNext: {
      bool previous_match = false;  // the span to the right
      for (size_t i = spans.size(); i-- > 0;) {
        const Span& s = spans[i];
        if (s.is_match && !previous_match && !parts.empty()) {
          parts.back().first = s.begin;
        } else {
          parts.emplace_back(s.begin, s.end);
        }
        previous_match = s.is_match;
      }
      std::reverse(parts.begin(), parts.end());
      break;
    }
    case SplitBehavior::kContiguous: {
      bool previous_match = false;
      for (const Span& s : spans) {
        if (s.is_match && previous_match && !parts.empty()) {
          parts.back().second = s.end;
        } else {
          parts.emplace_back(s.begin, s.end);
        }
        previous_match = s.is_match;
      }
      break;
    }
  }
  for (auto [b, e] : parts) {
    if (e > b) out.push_back(piece.substr(b, e - b));
  }
}

std::string byte_level_map(std::string_view s) {
  std::string out;
  out.reserve(s.size() * 2);
  for (char c : s) out.append(unicode::byte_to_unicode(static_cast<uint8_t>(c)));
  return out;
}

const std::shared_ptr<const Regex>& gpt2_regex() {
  static const std::shared_ptr<const Regex> regex = [] {
    auto r = Regex::compile(gpt2_split_regex());
    TESSERA_CHECK(r.is_ok(), "built-in GPT-2 regex: {}", r.status().to_string());
    return std::move(r).value();
  }();
  return regex;
}

void apply_pre_tokenizer(const PreTokenizer& p, std::vector<std::string>& pieces,
                         bool at_text_start) {
  std::vector<std::string> next;
  next.reserve(pieces.size());
  std::vector<std::pair<size_t, size_t>> matches;
  for (size_t i = 0; i < pieces.size(); ++i) {
    std::string& piece = pieces[i];
    matches.clear();
    switch (p.kind) {
      case PreTokenizer::kSplit:
        p.pattern.find_all(piece, matches);
        split_piece(piece, matches, p.behavior, p.invert, next);
        break;
      case PreTokenizer::kByteLevel: {
        if (p.add_prefix_space && (piece.empty() || piece[0] != ' ')) piece.insert(0, " ");
        if (!p.use_regex) {
          next.push_back(byte_level_map(piece));
          break;
        }
        std::vector<std::string> split;
        gpt2_regex()->find_all(piece, matches);
        split_piece(piece, matches, SplitBehavior::kIsolated, false, split);
        for (const std::string& s : split) next.push_back(byte_level_map(s));
        break;
      }
      case PreTokenizer::kMetaspace: {
        std::string text;
        text.reserve(piece.size() + p.replacement.size());
        const bool prepend = p.prepend_scheme == PrependScheme::kAlways ||
                             (p.prepend_scheme == PrependScheme::kFirst && at_text_start && i == 0);
        if (prepend && piece.compare(0, p.replacement.size(), p.replacement) != 0 &&
            !(piece.size() > 0 && piece[0] == ' ')) {
          text.append(p.replacement);
        }
        for (char c : piece) {
          if (c == ' ') {
            text.append(p.replacement);
          } else {
            text.push_back(c);
          }
        }
        if (!p.split) {
          next.push_back(std::move(text));
          break;
        }
        Pattern sep;
        sep.literal = p.replacement;
        sep.find_all(text, matches);
        split_piece(text, matches, SplitBehavior::kMergedWithNext, false, next);
        break;
      }
      case PreTokenizer::kDigits: {
        size_t b = 0;
        while (b < piece.size()) {
          const bool digit = piece[b] >= '0' && piece[b] <= '9';
          size_t e = b + 1;
          if (!digit) {
            while (e < piece.size() && !(piece[e] >= '0' && piece[e] <= '9')) ++e;
          } else if (!p.individual_digits) {
            while (e < piece.size() && piece[e] >= '0' && piece[e] <= '9') ++e;
          }
          next.push_back(piece.substr(b, e - b));
          b = e;
        }
        break;
      }
    }
  }
  pieces = std::move(next);
}

}  // namespace

void pre_tokenize(const std::vector<PreTokenizer>& steps, std::string text, bool at_text_start,
                  std::vector<std::string>& words) {
  if (text.empty()) return;
  if (steps.empty()) {
    words.push_back(std::move(text));
    return;
  }
  std::vector<std::string> pieces;
  pieces.push_back(std::move(text));
  for (const PreTokenizer& p : steps) apply_pre_tokenizer(p, pieces, at_text_start);
  for (std::string& piece : pieces) {
    if (!piece.empty()) words.push_back(std::move(piece));
  }
}

// ---- decoders -----------------------------------------------------------------------------

namespace {

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

// "<0xNN>" -> NN, else -1.
int byte_fallback_value(std::string_view t) {
  if (t.size() != 6 || t.compare(0, 3, "<0x") != 0 || t[5] != '>') return -1;
  const int hi = hex_value(t[3]), lo = hex_value(t[4]);
  return (hi < 0 || lo < 0) ? -1 : hi * 16 + lo;
}

std::string byte_level_unmap(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    unicode::Utf8Step st = unicode::next_utf8(s, i);
    const int b = st.kind == unicode::Utf8Step::kValid ? unicode::unicode_to_byte(st.cp) : -1;
    if (b >= 0) {
      out.push_back(static_cast<char>(b));
    } else {
      out.append(s.substr(i, st.len));  // not in the byte alphabet: keep as it is
    }
    i += st.len;
  }
  return out;
}

void strip_token(std::string& t, const std::string& content, int start, int stop, bool skip_start) {
  if (content.empty()) return;
  size_t b = 0, e = t.size();
  for (int k = 0; k < start && !skip_start; ++k) {
    if (t.compare(b, content.size(), content) != 0) break;
    b += content.size();
  }
  for (int k = 0; k < stop; ++k) {
    if (e < b + content.size() || t.compare(e - content.size(), content.size(), content) != 0) break;
    e -= content.size();
  }
  t = t.substr(b, e - b);
}

}  // namespace

std::string run_decoders(const std::vector<Decoder>& steps, std::vector<std::string> tokens,
                         bool continuation) {
  // After Fuse or ByteLevel the single token is the whole text, so a Strip of its start is a
  // strip of the start of the text: skipped when these tokens continue earlier output.
  bool joined = false;
  for (const Decoder& d : steps) {
    switch (d.kind) {
      case Decoder::kByteLevel: {
        std::string all;
        for (const std::string& t : tokens) all.append(t);
        tokens.assign(1, byte_level_unmap(all));
        joined = true;
        break;
      }
      case Decoder::kReplace:
        for (std::string& t : tokens) {
          // A regex needs valid UTF-8; after ByteFallback a token may be a lone byte.
          if (d.pattern.regex && !unicode::is_valid_utf8(t)) continue;
          t = d.pattern.replace_all(t, d.content);
        }
        break;
      case Decoder::kByteFallback:
        for (std::string& t : tokens) {
          const int b = byte_fallback_value(t);
          if (b >= 0) t.assign(1, static_cast<char>(b));
        }
        break;
      case Decoder::kFuse: {
        std::string all;
        for (const std::string& t : tokens) all.append(t);
        tokens.assign(1, std::move(all));
        joined = true;
        break;
      }
      case Decoder::kStrip:
        for (size_t i = 0; i < tokens.size(); ++i) {
          strip_token(tokens[i], d.content, d.strip_start, d.strip_stop,
                      continuation && joined && i == 0);
        }
        break;
      case Decoder::kMetaspace:
        for (size_t i = 0; i < tokens.size(); ++i) {
          std::string& t = tokens[i];
          Pattern rep;
          rep.literal = d.replacement;
          t = rep.replace_all(t, " ");
          const bool first = i == 0 && !continuation;
          if (first && d.prepend_scheme != PrependScheme::kNever && !t.empty() && t[0] == ' ') {
            t.erase(0, 1);
          }
        }
        break;
    }
  }
  std::string out;
  size_t total = 0;
  for (const std::string& t : tokens) total += t.size();
  out.reserve(total);
  for (const std::string& t : tokens) out.append(t);
  return out;
}

}  // namespace tessera::tok
