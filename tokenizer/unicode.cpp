#include "tokenizer/unicode.h"

#include <array>
#include <cstdlib>
#include <memory>
#include <new>

#include <utf8proc.h>

#include "common/check.h"

namespace tessera::unicode {

Utf8Step next_utf8(std::string_view s, size_t pos) {
  const auto* p = reinterpret_cast<const uint8_t*>(s.data()) + pos;
  const size_t avail = s.size() - pos;
  const uint8_t b0 = p[0];
  if (b0 < 0x80) return {Utf8Step::kValid, 1, b0};
  size_t need;
  uint8_t lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  char32_t cp;
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 2;
    cp = b0 & 0x1F;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 3;
    cp = b0 & 0x0F;
    if (b0 == 0xE0) lo = 0xA0;  // overlong
    if (b0 == 0xED) hi = 0x9F;  // surrogates
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 4;
    cp = b0 & 0x07;
    if (b0 == 0xF0) lo = 0x90;  // overlong
    if (b0 == 0xF4) hi = 0x8F;  // above U+10FFFF
  } else {
    return {Utf8Step::kInvalid, 1};
  }
  for (size_t k = 1; k < need; ++k) {
    if (k >= avail) return {Utf8Step::kTruncated, avail};
    const uint8_t b = p[k];
    const uint8_t min = k == 1 ? lo : 0x80, max = k == 1 ? hi : 0xBF;
    if (b < min || b > max) return {Utf8Step::kInvalid, k};
    cp = (cp << 6) | (b & 0x3F);
  }
  return {Utf8Step::kValid, need, cp};
}

bool is_valid_utf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    // Runs of ASCII are the common case: skip them without the full decoder.
    if (static_cast<uint8_t>(s[i]) < 0x80) {
      ++i;
      continue;
    }
    Utf8Step st = next_utf8(s, i);
    if (st.kind != Utf8Step::kValid) return false;
    i += st.len;
  }
  return true;
}

std::string sanitize_utf8(std::string_view s, bool keep_truncated_tail) {
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    Utf8Step st = next_utf8(s, i);
    if (st.kind == Utf8Step::kValid) {
      out.append(s.substr(i, st.len));
    } else if (st.kind == Utf8Step::kTruncated && keep_truncated_tail) {
      out.append(s.substr(i, st.len));
    } else {
      append_utf8(out, kReplacementChar);
    }
    i += st.len;
  }
  return out;
}

void append_utf8(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

// ---- NFC ----------------------------------------------------------------------------------

// Normalization is utf8proc's (Debian libutf8proc 2.8, Unicode 15.0). It replaced tables
// generated from Python's unicodedata (Unicode 14.0): the two agree on the NFD, the NFC and the
// combining class of every code point assigned in 14.0 (checked code point by code point), as
// Unicode's normalization stability policy promises. They differ only on the ten combining marks
// new in 15.0 (U+10EFD..10EFF, U+11F41..11F42, U+1E08F, U+1E4EC..1E4EF), which 14.0 data treats
// as unassigned starters; no tokenizer test vector contains one.
std::string nfc(std::string_view s) {
  bool ascii = true;
  for (char c : s) {
    if (static_cast<uint8_t>(c) >= 0x80) {
      ascii = false;
      break;
    }
  }
  if (ascii) return std::string(s);  // already NFC; skips utf8proc's UTF-32 round trip

  utf8proc_uint8_t* normalized = nullptr;
  // An explicit length (no UTF8PROC_NULLTERM), so embedded NUL bytes are kept.
  auto map = [&normalized](std::string_view text) {
    return utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(text.data()),
                        static_cast<utf8proc_ssize_t>(text.size()), &normalized,
                        static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
  };
  utf8proc_ssize_t n = map(s);
  if (n == UTF8PROC_ERROR_INVALIDUTF8) {
    // The contract asks for valid UTF-8; repair it the way the tokenizers do rather than fail.
    n = map(sanitize_utf8(s, false));
  }
  if (n == UTF8PROC_ERROR_NOMEM) throw std::bad_alloc();
  TESSERA_CHECK(n >= 0, "utf8proc_map on {} bytes: {}", s.size(), utf8proc_errmsg(n));
  const std::unique_ptr<utf8proc_uint8_t, decltype(&std::free)> owned(normalized, &std::free);
  return std::string(reinterpret_cast<const char*>(normalized), static_cast<size_t>(n));
}

// ---- GPT-2 byte-level alphabet --------------------------------------------------------------

namespace {

struct ByteMap {
  std::array<std::string, 256> to_unicode;
  std::array<int16_t, 0x144> to_byte;  // every mapped code point is below 256 + 68
};

const ByteMap& byte_map() {
  static const ByteMap map = [] {
    ByteMap m;
    m.to_byte.fill(-1);
    char32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      // Printable Latin-1 bytes stand for themselves; the others are moved above U+00FF.
      const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      const char32_t cp = printable ? static_cast<char32_t>(b) : next++;
      append_utf8(m.to_unicode[b], cp);
      m.to_byte[cp] = static_cast<int16_t>(b);
    }
    return m;
  }();
  return map;
}

}  // namespace

const std::string& byte_to_unicode(uint8_t b) { return byte_map().to_unicode[b]; }

int unicode_to_byte(char32_t cp) {
  const auto& m = byte_map();
  return cp < m.to_byte.size() ? m.to_byte[cp] : -1;
}

}  // namespace tessera::unicode
