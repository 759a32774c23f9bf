// UTF-8 helpers, NFC normalization and the GPT-2 byte <-> character map used by the
// tokenizers. Internal to tokenizer/ (not part of the public tokenizer API).
//
// Thread-safety: all functions are pure; lazily built tables are initialised once.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace tessera::unicode {

inline constexpr char32_t kReplacementChar = 0xFFFD;

// Outcome of reading one UTF-8 sequence at a position.
struct Utf8Step {
  enum Kind { kValid, kInvalid, kTruncated } kind;
  size_t len;       // kValid: bytes of the character; kInvalid: bytes of the maximal invalid
                    // subpart (>= 1, replaced by one U+FFFD); kTruncated: bytes up to the end
  char32_t cp = 0;  // kValid only
};

// Reads the sequence starting at s[pos] (pos < s.size()). Follows the Unicode "maximal subpart"
// rule, so replacing each invalid subpart by U+FFFD is the same streamed or all at once.
Utf8Step next_utf8(std::string_view s, size_t pos);

bool is_valid_utf8(std::string_view s);

// Replaces every invalid subpart by U+FFFD. A truncated (possibly still valid) sequence at the
// very end is kept as raw bytes when keep_truncated_tail, else replaced by U+FFFD.
std::string sanitize_utf8(std::string_view s, bool keep_truncated_tail);

// Length of a character from its lead byte, for input already known to be valid UTF-8.
inline size_t utf8_len_from_lead(uint8_t b) {
  return b < 0x80 ? 1 : b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4;
}

void append_utf8(std::string& out, char32_t cp);

// Canonical composition (NFC) of valid UTF-8. ASCII-only input is returned unchanged quickly.
std::string nfc(std::string_view valid_utf8);

// GPT-2 byte-level alphabet: each byte value is a printable character (UTF-8, 1 or 2 bytes).
const std::string& byte_to_unicode(uint8_t b);
// The byte that code point `cp` stands for in the byte-level alphabet, or -1.
int unicode_to_byte(char32_t cp);

}  // namespace tessera::unicode
