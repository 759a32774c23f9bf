#include "grammar/bounded_strings.h"

#include <algorithm>
#include <cctype>
#include <map>
#include <set>
#include <vector>
#include <sstream>
#include <string_view>

#include <fmt/format.h>

namespace tessera {
namespace {

bool is_identifier(std::string_view s) {
  if (s.empty() || std::isdigit(static_cast<unsigned char>(s[0]))) return false;
  for (const char c : s)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_') return false;
  return true;
}

// A whole non-negative number of at most 6 digits.
std::optional<int> small_number(std::string_view s) {
  if (s.empty() || s.size() > 6) return std::nullopt;
  int v = 0;
  for (const char c : s) {
    if (!std::isdigit(static_cast<unsigned char>(c))) return std::nullopt;
    v = v * 10 + (c - '0');
  }
  return v;
}

struct Bounded {
  std::string name;
  std::string chars;
  int lo = 0;
  int hi = 0;
};

// name ::= (("\"" chars{lo, hi} "\""))   (the converter's bounded string, one line per rule)
std::optional<Bounded> parse_bounded(std::string_view line) {
  constexpr std::string_view kDef = " ::= ";
  constexpr std::string_view kOpen = "((\"\\\"\" ";
  constexpr std::string_view kClose = " \"\\\"\"))";
  const size_t def = line.find(kDef);
  if (def == std::string_view::npos) return std::nullopt;
  Bounded b;
  b.name = std::string(line.substr(0, def));
  std::string_view body = line.substr(def + kDef.size());
  if (!is_identifier(b.name) || !body.starts_with(kOpen) || !body.ends_with(kClose)) return std::nullopt;
  body = body.substr(kOpen.size(), body.size() - kOpen.size() - kClose.size());  // chars{lo, hi}
  const size_t brace = body.find('{');
  const size_t comma = body.find(", ");
  if (brace == std::string_view::npos || comma == std::string_view::npos || comma < brace || !body.ends_with("}"))
    return std::nullopt;
  b.chars = std::string(body.substr(0, brace));
  const std::optional<int> lo = small_number(body.substr(brace + 1, comma - brace - 1));
  const std::string_view hi_text = body.substr(comma + 2, body.size() - comma - 3);
  const std::optional<int> hi = hi_text == "-1" ? std::optional<int>(-1) : small_number(hi_text);
  if (!is_identifier(b.chars) || !lo || !hi) return std::nullopt;
  b.lo = *lo;
  b.hi = *hi;
  return b;
}

// The character class xgrammar 0.2.8 gives a length-bounded string's characters: it lets raw
// control characters through (a tab, U+0000), so an output could be invalid JSON.
constexpr std::string_view kConverterChars = R"((([^\"\\\r\n])))";
// What it is here: any character a JSON string holds without an escape (RFC 8259: anything but
// '"', '\' and U+0000-U+001F). Escapes are left out on purpose: as an alternative of the class
// they make every state of the chain undecidable at compile time (mask p99 54 ms instead of
// 44 us on Gemma 3's vocabulary), so a bounded string cannot hold '"', '\' or a control character
// (docs/structured_outputs.md lists it).
constexpr std::string_view kJsonChars = R"((([^\0-\x1f\"\\])))";

}  // namespace

std::optional<std::string> unroll_bounded_strings(const std::string& ebnf) {
  std::vector<std::string> lines;
  std::map<std::string, std::string> bodies;  // rule name -> its body
  {
    std::istringstream in(ebnf);
    for (std::string line; std::getline(in, line);) {
      const size_t def = line.find(" ::= ");
      if (def != std::string::npos) bodies[line.substr(0, def)] = line.substr(def + 5);
      lines.push_back(std::move(line));
    }
  }
  // The chains share their states: "r more characters allowed, q of them still required"
  // depends only on the characters, r and q, so `maxLength: 12` and `maxLength: 20` fields (and
  // every field with the same bounds) use the same rules, compiled once.
  std::map<std::string, std::string> prefixes;  // the characters' body -> the first rule named for them
  std::set<std::string> emitted;
  std::set<std::string> char_rules;  // the converter's character rules of bounded strings, rewritten
  std::string out;
  std::string states;
  bool changed = false;
  for (const std::string& line : lines) {
    const std::optional<Bounded> b = parse_bounded(line);
    if (b && bodies.contains(b->chars) && bodies[b->chars] == kConverterChars) char_rules.insert(b->chars);
  }
  for (const std::string& line : lines) {
    const size_t def = line.find(" ::= ");
    if (def != std::string::npos && char_rules.contains(line.substr(0, def))) {
      out += fmt::format("{} ::= {}\n", line.substr(0, def), kJsonChars);
      changed = true;
      continue;
    }
    const std::optional<Bounded> b = parse_bounded(line);
    if (!b || b->hi <= 0 || b->hi > kMaxUnrolledStringLength || b->lo > b->hi || !bodies.contains(b->chars)) {
      out += line + "\n";
      continue;
    }
    changed = true;
    const std::string& prefix = prefixes.try_emplace(bodies[b->chars], b->chars).first->second;
    const auto state = [&](int r, int q) {
      return q == 0 ? fmt::format("{}_left_{}", prefix, r) : fmt::format("{}_left_{}_need_{}", prefix, r, q);
    };
    out += fmt::format("{} ::= ((\"\\\"\" {}))\n", b->name, state(b->hi, b->lo));
    for (int r = b->hi, q = b->lo; r >= 0; --r, q = std::max(0, q - 1)) {
      if (!emitted.insert(state(r, q)).second) continue;
      if (r == 0)
        states += fmt::format("{} ::= ((\"\\\"\"))\n", state(r, q));
      else if (q > 0)
        states += fmt::format("{} ::= (({} {}))\n", state(r, q), prefix, state(r - 1, q - 1));
      else
        states += fmt::format("{} ::= ((\"\\\"\") | ({} {}))\n", state(r, q), prefix, state(r - 1, 0));
    }
  }
  out += states;
  if (!changed) return std::nullopt;
  return out;
}

}  // namespace tessera
