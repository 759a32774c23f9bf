#include "tokenizer/unicode.h"

#include <algorithm>
#include <array>
#include <unordered_map>
#include <vector>

#include "tokenizer/unicode_tables.h"

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

namespace {

using unicode_data::kCccRunCount;
using unicode_data::kCccRuns;
using unicode_data::kDecompositionCount;
using unicode_data::kDecompositions;

constexpr char32_t kSBase = 0xAC00, kLBase = 0x1100, kVBase = 0x1161, kTBase = 0x11A7;
constexpr char32_t kLCount = 19, kVCount = 21, kTCount = 28;
constexpr char32_t kNCount = kVCount * kTCount, kSCount = kLCount * kNCount;

uint8_t ccc_of(char32_t cp) {
  if (cp < 0x300) return 0;
  const auto* end = kCccRuns + kCccRunCount;
  const auto* it = std::upper_bound(kCccRuns, end, cp,
                                    [](char32_t c, const unicode_data::CccRun& r) { return c < r.first; });
  if (it == kCccRuns) return 0;
  --it;
  return cp <= it->last ? it->ccc : 0;
}

const unicode_data::Decomposition* find_decomposition(char32_t cp) {
  if (cp < 0xC0) return nullptr;
  const auto* end = kDecompositions + kDecompositionCount;
  const auto* it = std::lower_bound(
      kDecompositions, end, cp,
      [](const unicode_data::Decomposition& d, char32_t c) { return d.cp < c; });
  return (it != end && it->cp == cp) ? it : nullptr;
}

const std::unordered_map<uint64_t, char32_t>& composition_pairs() {
  static const std::unordered_map<uint64_t, char32_t> pairs = [] {
    std::unordered_map<uint64_t, char32_t> m;
    m.reserve(kDecompositionCount);
    for (size_t i = 0; i < kDecompositionCount; ++i) {
      const auto& d = kDecompositions[i];
      if (d.composable) m.emplace((uint64_t{d.d0} << 32) | d.d1, d.cp);
    }
    return m;
  }();
  return pairs;
}

void decompose(char32_t cp, std::u32string& out) {
  if (cp >= kSBase && cp < kSBase + kSCount) {
    const char32_t s = cp - kSBase;
    out.push_back(kLBase + s / kNCount);
    out.push_back(kVBase + (s % kNCount) / kTCount);
    if (s % kTCount != 0) out.push_back(kTBase + s % kTCount);
    return;
  }
  const auto* d = find_decomposition(cp);
  if (d == nullptr) {
    out.push_back(cp);
    return;
  }
  decompose(d->d0, out);
  if (d->d1 != 0) decompose(d->d1, out);
}

// 0 when the pair does not compose.
char32_t compose_pair(char32_t a, char32_t b) {
  if (a >= kLBase && a < kLBase + kLCount && b >= kVBase && b < kVBase + kVCount) {
    return kSBase + ((a - kLBase) * kVCount + (b - kVBase)) * kTCount;
  }
  if (a >= kSBase && a < kSBase + kSCount && (a - kSBase) % kTCount == 0 && b > kTBase &&
      b < kTBase + kTCount) {
    return a + (b - kTBase);
  }
  const auto& pairs = composition_pairs();
  auto it = pairs.find((uint64_t{a} << 32) | b);
  return it == pairs.end() ? 0 : it->second;
}

}  // namespace

std::string nfc(std::string_view s) {
  bool ascii = true;
  for (char c : s) {
    if (static_cast<uint8_t>(c) >= 0x80) {
      ascii = false;
      break;
    }
  }
  if (ascii) return std::string(s);

  std::u32string chars;
  chars.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    Utf8Step st = next_utf8(s, i);
    decompose(st.kind == Utf8Step::kValid ? st.cp : kReplacementChar, chars);
    i += st.len;
  }
  std::vector<uint8_t> ccc(chars.size());
  for (size_t i = 0; i < chars.size(); ++i) ccc[i] = ccc_of(chars[i]);
  // Canonical ordering: stable insertion sort of each run of non-starters by class.
  for (size_t i = 1; i < chars.size(); ++i) {
    if (ccc[i] == 0) continue;
    size_t j = i;
    while (j > 0 && ccc[j - 1] > ccc[j]) {
      std::swap(chars[j - 1], chars[j]);
      std::swap(ccc[j - 1], ccc[j]);
      --j;
    }
  }
  // Canonical composition.
  std::u32string out;
  out.reserve(chars.size());
  std::vector<uint8_t> out_ccc;
  out_ccc.reserve(chars.size());
  size_t starter = std::u32string::npos;
  for (size_t i = 0; i < chars.size(); ++i) {
    const char32_t c = chars[i];
    const uint8_t cc = ccc[i];
    if (starter != std::u32string::npos) {
      const bool adjacent = starter == out.size() - 1;
      const uint8_t last_cc = out_ccc.back();
      if (adjacent || (last_cc != 0 && last_cc < cc)) {
        if (char32_t comp = compose_pair(out[starter], c); comp != 0) {
          out[starter] = comp;
          continue;
        }
      }
    }
    if (cc == 0) starter = out.size();
    out.push_back(c);
    out_ccc.push_back(cc);
  }
  std::string result;
  result.reserve(s.size());
  for (char32_t c : out) append_utf8(result, c);
  return result;
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
