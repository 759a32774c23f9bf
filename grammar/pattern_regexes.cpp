#include "grammar/pattern_regexes.h"

#include <cctype>
#include <map>
#include <sstream>
#include <vector>

namespace tessera {
namespace {

int hex_value(std::string_view digits) {
  int v = 0;
  for (const char c : digits) {
    if (!std::isxdigit(static_cast<unsigned char>(c))) return -1;
    v = v * 16 + (std::isdigit(static_cast<unsigned char>(c)) ? c - '0' : (std::tolower(c) - 'a' + 10));
  }
  return v;
}

// A character a JSON string must escape.
bool forbidden(int cp) { return cp < 0x20 || cp == '"' || cp == '\\'; }

// One UTF-8 code point at text[i] (advances i); -1 when malformed.
int code_point(std::string_view text, size_t& i) {
  const auto b = static_cast<unsigned char>(text[i]);
  const int n = b < 0x80 ? 1 : (b >> 5) == 6 ? 2 : (b >> 4) == 14 ? 3 : (b >> 3) == 30 ? 4 : 0;
  if (n == 0 || i + n > text.size()) return -1;
  int cp = n == 1 ? b : b & (0xFF >> (n + 1));
  for (int k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<unsigned char>(text[i + k]) & 0x3F);
  i += n;
  return cp;
}

// The character an escape stands for at pattern[i] (just after the backslash; advances i), or:
// -2 for a safe class (\d \w), -1 for anything that is or may be forbidden or is not known.
int escaped(std::string_view p, size_t& i) {
  if (i >= p.size()) return -1;
  const char e = p[i++];
  if (e == 'd' || e == 'w') return -2;
  if (e == 'x' && i + 2 <= p.size()) {
    const int v = hex_value(p.substr(i, 2));
    i += 2;
    return v < 0 || forbidden(v) ? -1 : v;
  }
  if (e == 'u' && i + 4 <= p.size()) {
    const int v = hex_value(p.substr(i, 4));
    i += 4;
    return v < 0 || forbidden(v) ? -1 : v;
  }
  // Punctuation stands for itself (a regex metacharacter made literal); '"' and '\\' are forbidden.
  if (std::ispunct(static_cast<unsigned char>(e)) && e != '"' && e != '\\') return e;
  return -1;  // \D \S \W \s \n \t \b \p{..} ...: may match a forbidden character, or unknown
}

}  // namespace

bool json_safe_pattern(std::string_view p) {
  for (size_t i = 0; i < p.size();) {
    const char c = p[i];
    if (c == '\\') {
      ++i;
      if (escaped(p, i) == -1) return false;
    } else if (c == '[') {
      ++i;
      if (i >= p.size() || p[i] == '^' || p[i] == ']') return false;
      while (i < p.size() && p[i] != ']') {
        int lo;
        if (p[i] == '\\') {
          ++i;
          lo = escaped(p, i);
          if (lo == -1) return false;
          if (lo == -2) continue;
        } else {
          lo = code_point(p, i);
        }
        if (lo < 0 || forbidden(lo)) return false;
        int hi = lo;
        if (i + 1 < p.size() && p[i] == '-' && p[i + 1] != ']') {
          ++i;
          if (p[i] == '\\') {
            ++i;
            hi = escaped(p, i);
          } else {
            hi = code_point(p, i);
          }
          if (hi < lo) return false;
        }
        if (lo <= '"' && hi >= '"') return false;
        if (lo <= '\\' && hi >= '\\') return false;
      }
      if (i >= p.size()) return false;  // unclosed class
      ++i;
    } else if (c == '.' || c == '"' || static_cast<unsigned char>(c) < 0x20) {
      return false;
    } else {
      ++i;
    }
  }
  return true;
}

std::optional<std::string> unescape_ebnf_literal(std::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '\\') {
      out += s[i];
      continue;
    }
    if (++i >= s.size()) return std::nullopt;
    switch (s[i]) {
      case '\\': case '"': case '?': case '\'': out += s[i]; break;
      case 'n': out += '\n'; break;
      case 'r': out += '\r'; break;
      case 't': out += '\t'; break;
      case 'x': case 'u': {
        const size_t n = s[i] == 'x' ? 2 : 4;
        if (i + n >= s.size()) return std::nullopt;
        const int v = hex_value(s.substr(i + 1, n));
        if (v < 0) return std::nullopt;
        i += n;
        if (v < 0x80) {
          out += static_cast<char>(v);
        } else if (v < 0x800) {
          out += static_cast<char>(0xC0 | (v >> 6));
          out += static_cast<char>(0x80 | (v & 0x3F));
        } else {
          out += static_cast<char>(0xE0 | (v >> 12));
          out += static_cast<char>(0x80 | ((v >> 6) & 0x3F));
          out += static_cast<char>(0x80 | (v & 0x3F));
        }
        break;
      }
      default: return std::nullopt;
    }
  }
  return out;
}

namespace {

// `text` with every identifier in `names` replaced by its new name, outside string literals and
// character classes.
std::string rename_rules(const std::string& text, const std::map<std::string, std::string>& names) {
  std::string out;
  for (size_t i = 0; i < text.size();) {
    const char c = text[i];
    if (c == '"' || c == '[') {
      const char close = c == '"' ? '"' : ']';
      size_t j = i + 1;
      while (j < text.size() && text[j] != close) j += text[j] == '\\' ? 2 : 1;
      j = std::min(j + 1, text.size());
      out.append(text, i, j - i);
      i = j;
    } else if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      size_t j = i;
      while (j < text.size() && (std::isalnum(static_cast<unsigned char>(text[j])) || text[j] == '_')) ++j;
      const std::string word = text.substr(i, j - i);
      const auto it = names.find(word);
      out += it == names.end() ? word : it->second;
      i = j;
    } else {
      out += c;
      ++i;
    }
  }
  return out;
}

}  // namespace

std::optional<std::string> expand_pattern_regexes(
    const std::string& ebnf, const std::function<std::optional<std::string>(const std::string&)>& expand) {
  constexpr std::string_view kDef = " ::= ";
  constexpr std::string_view kOpen = "Regex(\"";
  constexpr std::string_view kClose = "\", json_string=true)";
  std::istringstream in(ebnf);
  std::string out;
  std::string added;
  bool changed = false;
  for (std::string line; std::getline(in, line);) {
    const size_t def = line.find(kDef);
    const std::string_view body =
        def == std::string::npos ? std::string_view() : std::string_view(line).substr(def + kDef.size());
    std::optional<std::string> sub;
    if (body.starts_with(kOpen) && body.ends_with(kClose) && body.size() > kOpen.size() + kClose.size()) {
      const std::optional<std::string> pattern =
          unescape_ebnf_literal(body.substr(kOpen.size(), body.size() - kOpen.size() - kClose.size()));
      if (pattern && json_safe_pattern(*pattern)) sub = expand(*pattern);
    }
    if (!sub) {
      out += line + "\n";
      continue;
    }
    const std::string rule = line.substr(0, def);
    std::map<std::string, std::string> names;
    {
      std::istringstream sub_lines(*sub);
      for (std::string l; std::getline(sub_lines, l);) {
        const size_t d = l.find(kDef);
        if (d == std::string::npos) continue;
        const std::string name = l.substr(0, d);
        names[name] = name == "root"               ? rule + "_re"
                      : name.starts_with("root_") ? rule + "_re" + name.substr(4)
                                                   : rule + "_re_" + name;
      }
    }
    if (!names.contains("root")) {
      out += line + "\n";
      continue;
    }
    out += rule + " ::= ((" + names["root"] + "))\n";
    std::string renamed = rename_rules(*sub, names);
    while (!renamed.empty() && renamed.back() == '\n') renamed.pop_back();
    added += renamed + "\n";
    changed = true;
  }
  if (!changed) return std::nullopt;
  return out + added;
}

}  // namespace tessera
