// Python str/dict/list methods and attribute/item lookup for the chat-template interpreter.
#include <algorithm>
#include <cstdio>

#include <fmt/format.h>

#include "template/jinja_builtins.h"
#include "template/jinja_interpreter.h"

namespace tessera::jinja {
namespace {

char32_t lower_cp(char32_t c) {
  if (c >= 'A' && c <= 'Z') return c + 32;
  if (c < 0x80) return c;
  if ((c >= 0xC0 && c <= 0xDE && c != 0xD7)) return c + 32;
  if (c >= 0x391 && c <= 0x3AB && c != 0x3A2) return c + 32;
  if (c >= 0x410 && c <= 0x42F) return c + 32;
  if (c >= 0x400 && c <= 0x40F) return c + 80;
  return c;
}

char32_t upper_cp(char32_t c) {
  if (c >= 'a' && c <= 'z') return c - 32;
  if (c < 0x80) return c;
  if (c >= 0xE0 && c <= 0xFE && c != 0xF7) return c - 32;
  if (c >= 0x3B1 && c <= 0x3CB && c != 0x3C2) return c - 32;
  if (c == 0x3C2) return 0x3A3;
  if (c >= 0x430 && c <= 0x44F) return c - 32;
  if (c >= 0x450 && c <= 0x45F) return c - 80;
  return c;
}

bool is_cased_letter(char32_t c) { return lower_cp(c) != c || upper_cp(c) != c; }
bool is_upper_cp(char32_t c) { return lower_cp(c) != c; }
bool is_lower_cp(char32_t c) { return upper_cp(c) != c; }
bool is_alpha_cp(char32_t c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= 0x80 && !is_py_space(c) && is_cased_letter(c)) ||
         (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3040 && c <= 0x30FF) || (c >= 0xAC00 && c <= 0xD7AF);
}
bool is_digit_cp(char32_t c) { return c >= '0' && c <= '9'; }

std::string map_cps(std::string_view s, char32_t (*f)(char32_t)) {
  if (is_ascii(s)) {
    std::string out(s);
    for (char& c : out) c = static_cast<char>(f(static_cast<unsigned char>(c)));
    return out;
  }
  std::u32string cps = decode_utf8(s);
  for (char32_t& c : cps) c = f(c);
  return encode_utf8(cps);
}

Value str_value(std::string s) { return Value::string(std::move(s)); }

// Index of `sub` in `s` counted in code points, or -1.
int64_t cp_index(std::string_view s, size_t byte_pos) {
  if (byte_pos == std::string_view::npos) return -1;
  return static_cast<int64_t>(utf8_length(s.substr(0, byte_pos)));
}

Result<std::string> string_arg(const CallArgs& args, size_t index, std::string_view name, std::string_view callee) {
  const Value* v = args.get(index, name);
  if (v == nullptr) return Status::invalid_argument(fmt::format("{}() missing argument '{}'", callee, name));
  if (!v->is_string()) {
    return Status::invalid_argument(fmt::format("{}() argument '{}' must be str, not {}", callee, name, v->type_name()));
  }
  return v->as_string();
}

int64_t int_arg(const CallArgs& args, size_t index, std::string_view name, int64_t fallback) {
  const Value* v = args.get(index, name);
  return (v != nullptr && v->is_integral()) ? v->as_int() : fallback;
}

bool affix_match(const std::string& s, const Value& affix, bool prefix) {
  auto one = [&](const std::string& a) {
    if (a.size() > s.size()) return false;
    return prefix ? s.compare(0, a.size(), a) == 0 : s.compare(s.size() - a.size(), a.size(), a) == 0;
  };
  if (affix.is_string()) return one(affix.as_string());
  if (affix.is_sequence()) {
    for (const Value& a : affix.as_list()) {
      if (a.is_string() && one(a.as_string())) return true;
    }
  }
  return false;
}

std::string pad(std::string_view s, int64_t width, char fill, int align /* -1 left, 0 center, 1 right */) {
  const auto len = static_cast<int64_t>(utf8_length(s));
  if (width <= len) return std::string(s);
  const int64_t total = width - len;
  int64_t left = align < 0 ? 0 : align > 0 ? total : total / 2 + (total & width & 1);
  std::string out(static_cast<size_t>(left), fill);
  out += s;
  out.append(static_cast<size_t>(total - left), fill);
  return out;
}

// str.format with automatic ({}), positional ({0}) and named ({name}) fields; no format specs.
Result<std::string> brace_format(const std::string& fmt, const CallArgs& args) {
  std::string out;
  size_t auto_index = 0;
  for (size_t i = 0; i < fmt.size(); ++i) {
    const char c = fmt[i];
    if (c == '{' && i + 1 < fmt.size() && fmt[i + 1] == '{') {
      out.push_back('{');
      ++i;
    } else if (c == '}' && i + 1 < fmt.size() && fmt[i + 1] == '}') {
      out.push_back('}');
      ++i;
    } else if (c == '{') {
      const size_t close = fmt.find('}', i);
      if (close == std::string::npos) return Status::invalid_argument("Single '{' encountered in format string");
      const std::string field = fmt.substr(i + 1, close - i - 1);
      if (field.find_first_of(":!") != std::string::npos) {
        return Status::invalid_argument("format specs in str.format are not supported in chat templates");
      }
      const Value* v = nullptr;
      if (field.empty()) {
        v = auto_index < args.positional.size() ? &args.positional[auto_index] : nullptr;
        ++auto_index;
      } else if (std::all_of(field.begin(), field.end(), [](char d) { return d >= '0' && d <= '9'; })) {
        const size_t k = std::stoul(field);
        v = k < args.positional.size() ? &args.positional[k] : nullptr;
      } else {
        for (const auto& [name, val] : args.keyword) {
          if (name == field) v = &val;
        }
      }
      if (v == nullptr) return Status::invalid_argument(fmt::format("format: no argument for field '{{{}}}'", field));
      out += v->to_str();
      i = close;
    } else if (c == '}') {
      return Status::invalid_argument("Single '}' encountered in format string");
    } else {
      out.push_back(c);
    }
  }
  return out;
}

bool is_unsafe_method(const Value& obj, std::string_view name) {
  static constexpr std::string_view kList[] = {"append", "extend", "insert", "pop", "remove", "clear", "sort", "reverse"};
  static constexpr std::string_view kDict[] = {"update", "pop", "popitem", "setdefault", "clear"};
  if (obj.kind() == Value::Kind::kList) return std::find(std::begin(kList), std::end(kList), name) != std::end(kList);
  if (obj.is_dict()) return std::find(std::begin(kDict), std::end(kDict), name) != std::end(kDict);
  return false;
}

bool has_method(const Value& obj, std::string_view name) {
  static constexpr std::string_view kStr[] = {
      "startswith", "endswith", "strip", "lstrip", "rstrip", "split", "rsplit", "splitlines", "upper", "lower",
      "title", "capitalize", "swapcase", "casefold", "replace", "find", "rfind", "index", "rindex", "count",
      "join", "format", "isdigit", "isalpha", "isalnum", "isspace", "islower", "isupper", "isnumeric",
      "isdecimal", "zfill", "center", "ljust", "rjust", "partition", "rpartition", "removeprefix",
      "removesuffix"};
  static constexpr std::string_view kDict[] = {"items", "keys", "values", "get"};
  static constexpr std::string_view kSeq[] = {"index", "count"};
  auto in = [&](const auto& table) { return std::find(std::begin(table), std::end(table), name) != std::end(table); };
  if (obj.is_string()) return in(kStr);
  if (obj.is_dict()) return in(kDict);
  if (obj.is_sequence()) return in(kSeq);
  return false;
}

Result<Value> call_string_method(const std::string& s, std::string_view name, const CallArgs& args) {
  if (name == "startswith" || name == "endswith") {
    const Value* affix = args.get(0, "prefix");
    if (affix == nullptr || !(affix->is_string() || affix->is_sequence())) {
      return Status::invalid_argument(fmt::format("{}() argument must be str or a tuple of str", name));
    }
    return Value::boolean(affix_match(s, *affix, name == "startswith"));
  }
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    const Value* chars = args.get(0, "chars");
    return str_value(py_strip(s, chars, name != "rstrip", name != "lstrip"));
  }
  if (name == "split" || name == "rsplit") {
    TESSERA_ASSIGN_OR_RETURN(ValueList parts,
                             py_split(s, args.get(0, "sep"), int_arg(args, 1, "maxsplit", -1), name == "rsplit"));
    return Value::list(std::move(parts));
  }
  if (name == "splitlines") {
    const Value* keep = args.get(0, "keepends");
    const bool keepends = keep != nullptr && keep->truthy();
    ValueList lines;
    size_t start = 0;
    for (size_t i = 0; i < s.size(); ++i) {
      if (s[i] == '\n' || s[i] == '\r') {
        size_t end = i + 1;
        if (s[i] == '\r' && i + 1 < s.size() && s[i + 1] == '\n') ++end;
        lines.push_back(str_value(s.substr(start, (keepends ? end : i) - start)));
        start = end;
        i = end - 1;
      }
    }
    if (start < s.size()) lines.push_back(str_value(s.substr(start)));
    return Value::list(std::move(lines));
  }
  if (name == "upper") return str_value(py_upper(s));
  if (name == "lower" || name == "casefold") return str_value(py_lower(s));
  if (name == "capitalize") return str_value(py_capitalize(s));
  if (name == "swapcase") {
    return str_value(map_cps(s, [](char32_t c) { return is_upper_cp(c) ? lower_cp(c) : upper_cp(c); }));
  }
  if (name == "title") {
    std::u32string cps = decode_utf8(s);
    bool prev_cased = false;
    for (char32_t& c : cps) {
      c = prev_cased ? lower_cp(c) : upper_cp(c);
      prev_cased = is_cased_letter(c);
    }
    return str_value(encode_utf8(cps));
  }
  if (name == "replace") {
    TESSERA_ASSIGN_OR_RETURN(std::string old, string_arg(args, 0, "old", name));
    TESSERA_ASSIGN_OR_RETURN(std::string repl, string_arg(args, 1, "new", name));
    return str_value(py_replace(s, old, repl, int_arg(args, 2, "count", -1)));
  }
  if (name == "find" || name == "rfind" || name == "index" || name == "rindex") {
    TESSERA_ASSIGN_OR_RETURN(std::string sub, string_arg(args, 0, "sub", name));
    const size_t pos = (name == "find" || name == "index") ? s.find(sub) : s.rfind(sub);
    if (pos == std::string::npos && (name == "index" || name == "rindex")) {
      return Status::invalid_argument("substring not found");
    }
    return Value::integer(cp_index(s, pos));
  }
  if (name == "count") {
    TESSERA_ASSIGN_OR_RETURN(std::string sub, string_arg(args, 0, "sub", name));
    if (sub.empty()) return Value::integer(static_cast<int64_t>(utf8_length(s)) + 1);
    int64_t n = 0;
    for (size_t pos = s.find(sub); pos != std::string::npos; pos = s.find(sub, pos + sub.size())) ++n;
    return Value::integer(n);
  }
  if (name == "join") {
    const Value* items = args.get(0, "iterable");
    if (items == nullptr) return Status::invalid_argument("join() takes exactly one argument");
    ValueList list;
    if (items->is_sequence()) list = items->as_list();
    else if (items->is_string()) {
      for (char32_t c : decode_utf8(items->as_string())) list.push_back(str_value(encode_utf8(std::u32string(1, c))));
    } else if (items->is_dict()) {
      for (const auto& [k, v] : items->as_dict().entries()) list.push_back(k);
    } else {
      return Status::invalid_argument("can only join an iterable");
    }
    std::string out;
    for (size_t i = 0; i < list.size(); ++i) {
      if (!list[i].is_string()) {
        return Status::invalid_argument(
            fmt::format("sequence item {}: expected str instance, {} found", i, list[i].type_name()));
      }
      if (i > 0) out += s;
      out += list[i].as_string();
    }
    return str_value(std::move(out));
  }
  if (name == "format") {
    TESSERA_ASSIGN_OR_RETURN(std::string out, brace_format(s, args));
    return str_value(std::move(out));
  }
  if (name.substr(0, 2) == "is") {
    const std::u32string cps = decode_utf8(s);
    if (cps.empty()) return Value::boolean(false);
    bool r = true;
    if (name == "isdigit" || name == "isnumeric" || name == "isdecimal") {
      r = std::all_of(cps.begin(), cps.end(), is_digit_cp);
    } else if (name == "isalpha") {
      r = std::all_of(cps.begin(), cps.end(), is_alpha_cp);
    } else if (name == "isalnum") {
      r = std::all_of(cps.begin(), cps.end(), [](char32_t c) { return is_alpha_cp(c) || is_digit_cp(c); });
    } else if (name == "isspace") {
      r = std::all_of(cps.begin(), cps.end(), is_py_space);
    } else {
      const bool want_lower = name == "islower";
      bool any_cased = false;
      for (char32_t c : cps) {
        if (want_lower ? is_upper_cp(c) : is_lower_cp(c)) return Value::boolean(false);
        any_cased = any_cased || is_cased_letter(c);
      }
      r = any_cased;
    }
    return Value::boolean(r);
  }
  if (name == "zfill") {
    const int64_t width = int_arg(args, 0, "width", 0);
    const auto len = static_cast<int64_t>(utf8_length(s));
    if (width <= len) return str_value(s);
    const bool sign = !s.empty() && (s[0] == '-' || s[0] == '+');
    std::string out = sign ? s.substr(0, 1) : "";
    out.append(static_cast<size_t>(width - len), '0');
    out += sign ? s.substr(1) : s;
    return str_value(std::move(out));
  }
  if (name == "center" || name == "ljust" || name == "rjust") {
    const int64_t width = int_arg(args, 0, "width", 0);
    const Value* fill = args.get(1, "fillchar");
    const char f = (fill != nullptr && fill->is_string() && fill->as_string().size() == 1) ? fill->as_string()[0] : ' ';
    return str_value(pad(s, width, f, name == "ljust" ? -1 : name == "rjust" ? 1 : 0));
  }
  if (name == "partition" || name == "rpartition") {
    TESSERA_ASSIGN_OR_RETURN(std::string sep, string_arg(args, 0, "sep", name));
    if (sep.empty()) return Status::invalid_argument("empty separator");
    const size_t pos = name == "partition" ? s.find(sep) : s.rfind(sep);
    if (pos == std::string::npos) {
      if (name == "partition") return Value::tuple({str_value(s), str_value(""), str_value("")});
      return Value::tuple({str_value(""), str_value(""), str_value(s)});
    }
    return Value::tuple({str_value(s.substr(0, pos)), str_value(sep), str_value(s.substr(pos + sep.size()))});
  }
  if (name == "removeprefix" || name == "removesuffix") {
    TESSERA_ASSIGN_OR_RETURN(std::string affix, string_arg(args, 0, "affix", name));
    if (name == "removeprefix" && s.compare(0, affix.size(), affix) == 0) return str_value(s.substr(affix.size()));
    if (name == "removesuffix" && affix.size() <= s.size() && !affix.empty() &&
        s.compare(s.size() - affix.size(), affix.size(), affix) == 0) {
      return str_value(s.substr(0, s.size() - affix.size()));
    }
    return str_value(s);
  }
  return Status::invalid_argument(fmt::format("'str' object has no method '{}'", name));
}

Result<Value> call_method(const Value& self, std::string_view name, const CallArgs& args) {
  if (self.is_string()) return call_string_method(self.as_string(), name, args);
  if (self.is_dict()) {
    const ValueDict& d = self.as_dict();
    if (name == "get") {
      const Value* key = args.get(0, "key");
      if (key == nullptr) return Status::invalid_argument("get expected at least 1 argument, got 0");
      if (const Value* v = d.find(*key)) return *v;
      const Value* fallback = args.get(1, "default");
      return fallback != nullptr ? *fallback : Value::none();
    }
    ValueList out;
    for (const auto& [k, v] : d.entries()) {
      if (name == "items") out.push_back(Value::tuple({k, v}));
      else if (name == "keys") out.push_back(k);
      else out.push_back(v);
    }
    return Value::list(std::move(out));
  }
  if (self.is_sequence()) {
    const Value* x = args.get(0, "value");
    if (x == nullptr) return Status::invalid_argument(fmt::format("{}() takes exactly one argument", name));
    const ValueList& items = self.as_list();
    int64_t count = 0;
    for (size_t i = 0; i < items.size(); ++i) {
      if (py_equal(items[i], *x)) {
        if (name == "index") return Value::integer(static_cast<int64_t>(i));
        ++count;
      }
    }
    if (name == "index") return Status::invalid_argument(fmt::format("{} is not in list", x->repr()));
    return Value::integer(count);
  }
  return Status::invalid_argument(fmt::format("'{}' object has no method '{}'", self.type_name(), name));
}

std::string object_name(const Value& v) { return fmt::format("'{} object'", v.type_name()); }

}  // namespace

// ---------------------------------------------------------------------------------------------
// String helpers

std::string py_lower(std::string_view s) { return map_cps(s, lower_cp); }
std::string py_upper(std::string_view s) { return map_cps(s, upper_cp); }

std::string py_capitalize(std::string_view s) {
  std::u32string cps = decode_utf8(s);
  for (size_t i = 0; i < cps.size(); ++i) cps[i] = i == 0 ? upper_cp(cps[i]) : lower_cp(cps[i]);
  return encode_utf8(cps);
}

std::string py_strip(std::string_view s, const Value* chars, bool left, bool right) {
  const bool by_space = chars == nullptr || chars->is_none() || chars->is_undefined() || !chars->is_string();
  if (by_space && is_ascii(s)) {
    size_t b = 0;
    size_t e = s.size();
    if (left) {
      while (b < e && is_py_space(static_cast<unsigned char>(s[b]))) ++b;
    }
    if (right) {
      while (e > b && is_py_space(static_cast<unsigned char>(s[e - 1]))) --e;
    }
    return std::string(s.substr(b, e - b));
  }
  const std::u32string cps = decode_utf8(s);
  const std::u32string set = by_space ? std::u32string() : decode_utf8(chars->as_string());
  auto strip_it = [&](char32_t c) { return by_space ? is_py_space(c) : set.find(c) != std::u32string::npos; };
  size_t b = 0;
  size_t e = cps.size();
  if (left) {
    while (b < e && strip_it(cps[b])) ++b;
  }
  if (right) {
    while (e > b && strip_it(cps[e - 1])) --e;
  }
  return encode_utf8(std::u32string_view(cps).substr(b, e - b));
}

Result<ValueList> py_split(std::string_view s, const Value* sep, int64_t maxsplit, bool from_right) {
  std::vector<std::string> parts;
  if (sep == nullptr || sep->is_none() || sep->is_undefined()) {
    // Whitespace runs; empty pieces are never produced.
    std::u32string cps = decode_utf8(s);
    if (from_right) std::reverse(cps.begin(), cps.end());
    size_t i = 0;
    while (true) {
      while (i < cps.size() && is_py_space(cps[i])) ++i;
      if (i >= cps.size()) break;
      if (maxsplit >= 0 && static_cast<int64_t>(parts.size()) == maxsplit) {
        std::u32string rest = cps.substr(i);
        if (from_right) std::reverse(rest.begin(), rest.end());
        parts.push_back(encode_utf8(rest));
        break;
      }
      size_t j = i;
      while (j < cps.size() && !is_py_space(cps[j])) ++j;
      std::u32string word = cps.substr(i, j - i);
      if (from_right) std::reverse(word.begin(), word.end());
      parts.push_back(encode_utf8(word));
      i = j;
    }
    if (from_right) std::reverse(parts.begin(), parts.end());
  } else {
    if (!sep->is_string()) {
      return Status::invalid_argument(fmt::format("must be str or None, not {}", sep->type_name()));
    }
    const std::string& d = sep->as_string();
    if (d.empty()) return Status::invalid_argument("empty separator");
    if (!from_right) {
      size_t start = 0;
      while (true) {
        const size_t pos = s.find(d, start);
        if (pos == std::string_view::npos || (maxsplit >= 0 && static_cast<int64_t>(parts.size()) == maxsplit)) {
          parts.emplace_back(s.substr(start));
          break;
        }
        parts.emplace_back(s.substr(start, pos - start));
        start = pos + d.size();
      }
    } else {
      size_t end = s.size();
      while (true) {
        const size_t pos = end >= d.size() ? s.rfind(d, end - d.size()) : std::string_view::npos;
        if (pos == std::string_view::npos || (maxsplit >= 0 && static_cast<int64_t>(parts.size()) == maxsplit)) {
          parts.emplace_back(s.substr(0, end));
          break;
        }
        parts.emplace_back(s.substr(pos + d.size(), end - pos - d.size()));
        end = pos;
      }
      std::reverse(parts.begin(), parts.end());
    }
  }
  ValueList out;
  out.reserve(parts.size());
  for (auto& p : parts) out.push_back(Value::string(std::move(p)));
  return out;
}

std::string py_replace(std::string_view s, std::string_view old, std::string_view repl, int64_t count) {
  std::string out;
  int64_t done = 0;
  if (old.empty()) {
    // Python inserts the replacement around every character.
    const std::u32string cps = decode_utf8(s);
    for (size_t i = 0; i <= cps.size(); ++i) {
      if (count < 0 || done < count) {
        out += repl;
        ++done;
      }
      if (i < cps.size()) append_utf8(out, cps[i]);
    }
    return out;
  }
  size_t start = 0;
  while (true) {
    const size_t pos = (count >= 0 && done >= count) ? std::string_view::npos : s.find(old, start);
    if (pos == std::string_view::npos) {
      out += s.substr(start);
      return out;
    }
    out += s.substr(start, pos - start);
    out += repl;
    start = pos + old.size();
    ++done;
  }
}

Result<std::string> py_percent_format(std::string_view fmt_str, const Value& args) {
  ValueList items;
  if (args.kind() == Value::Kind::kTuple) items = args.as_list();
  else items.push_back(args);
  // Python lets a mapping-like single argument go unused ('a' % {'x': 1} == 'a').
  const bool mapping_like = args.is_dict() || args.kind() == Value::Kind::kList || args.is_undefined();
  std::string out;
  size_t next_arg = 0;
  for (size_t i = 0; i < fmt_str.size(); ++i) {
    if (fmt_str[i] != '%') {
      out.push_back(fmt_str[i]);
      continue;
    }
    ++i;
    const Value* keyed = nullptr;
    if (i < fmt_str.size() && fmt_str[i] == '(') {
      const size_t close = fmt_str.find(')', i);
      if (close == std::string_view::npos) return Status::invalid_argument("incomplete format key");
      if (!args.is_dict()) return Status::invalid_argument("format requires a mapping");
      keyed = args.as_dict().find(fmt_str.substr(i + 1, close - i - 1));
      if (keyed == nullptr) {
        return Status::invalid_argument(fmt::format("format key '{}' not found", fmt_str.substr(i + 1, close - i - 1)));
      }
      i = close + 1;
    }
    std::string spec = "%";
    while (i < fmt_str.size() && std::string_view("-+ 0#").find(fmt_str[i]) != std::string_view::npos) spec += fmt_str[i++];
    while (i < fmt_str.size() && fmt_str[i] >= '0' && fmt_str[i] <= '9') spec += fmt_str[i++];
    if (i < fmt_str.size() && fmt_str[i] == '.') {
      spec += fmt_str[i++];
      while (i < fmt_str.size() && fmt_str[i] >= '0' && fmt_str[i] <= '9') spec += fmt_str[i++];
    }
    if (i >= fmt_str.size()) return Status::invalid_argument("incomplete format");
    const char conv = fmt_str[i];
    if (conv == '%') {
      out.push_back('%');
      continue;
    }
    if (keyed == nullptr && next_arg >= items.size()) {
      return Status::invalid_argument("not enough arguments for format string");
    }
    const Value& v = keyed != nullptr ? *keyed : items[next_arg++];
    char buf[512];
    if (conv == 's' || conv == 'r') {
      const std::string text = conv == 's' ? v.to_str() : v.repr();
      if (spec == "%") {
        out += text;
      } else {
        std::snprintf(buf, sizeof(buf), (spec + "s").c_str(), text.c_str());
        out += buf;
      }
    } else if (std::string_view("dixXoc").find(conv) != std::string_view::npos) {
      if (!v.is_number()) {
        return Status::invalid_argument(fmt::format("%{} format: a number is required, not {}", conv, v.type_name()));
      }
      const long long n = v.is_float() ? static_cast<long long>(v.as_double()) : v.as_int();
      std::snprintf(buf, sizeof(buf), (spec + "ll" + (conv == 'i' ? 'd' : conv)).c_str(), n);
      out += buf;
    } else if (std::string_view("eEfFgG").find(conv) != std::string_view::npos) {
      if (!v.is_number()) {
        return Status::invalid_argument(fmt::format("%{} format: a number is required, not {}", conv, v.type_name()));
      }
      std::snprintf(buf, sizeof(buf), (spec + conv).c_str(), v.as_double());
      out += buf;
    } else {
      return Status::invalid_argument(fmt::format("unsupported format character '{}'", conv));
    }
  }
  if (next_arg < items.size() && !(mapping_like && args.kind() != Value::Kind::kTuple)) {
    return Status::invalid_argument("not all arguments converted during string formatting");
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// Lookup

Result<Value> get_attribute(const Value& object, std::string_view name) {
  if (object.is_undefined()) return Status::invalid_argument(object.undefined_message());
  if (is_unsafe_method(object, name)) {
    return Status::invalid_argument(
        fmt::format("access to attribute '{}' of '{}' object is unsafe", name, object.type_name()));
  }
  if (has_method(object, name)) {
    const std::string method(name);
    return Value::callable(method, [object, method](Interpreter&, const CallArgs& args) {
      return call_method(object, method, args);
    });
  }
  if (object.is_dict() || object.is_namespace()) {
    const ValueDict& d = object.is_dict() ? object.as_dict() : object.namespace_dict();
    if (const Value* v = d.find(name)) return *v;
  }
  return Value::undefined(fmt::format("{} has no attribute '{}'", object_name(object), name));
}

Result<Value> get_item(const Value& object, const Value& key) {
  if (object.is_undefined()) return Status::invalid_argument(object.undefined_message());
  if ((object.is_sequence() || object.is_string()) && key.is_integral()) {
    int64_t i = key.as_int();
    if (object.is_string()) {
      const std::u32string cps = decode_utf8(object.as_string());
      const auto n = static_cast<int64_t>(cps.size());
      if (i < 0) i += n;
      if (i < 0 || i >= n) return Value::undefined(fmt::format("str object has no element {}", key.as_int()));
      return Value::string(encode_utf8(std::u32string(1, cps[static_cast<size_t>(i)])));
    }
    const auto n = static_cast<int64_t>(object.as_list().size());
    if (i < 0) i += n;
    if (i < 0 || i >= n) {
      return Value::undefined(fmt::format("{} object has no element {}", object.type_name(), key.as_int()));
    }
    return object.as_list()[static_cast<size_t>(i)];
  }
  if (object.is_dict() || object.is_namespace()) {
    const ValueDict& d = object.is_dict() ? object.as_dict() : object.namespace_dict();
    if (const Value* v = d.find(key)) return *v;
  }
  if (key.is_string()) return get_attribute(object, key.as_string());
  return Value::undefined(fmt::format("{} has no element {}", object_name(object), key.repr()));
}

}  // namespace tessera::jinja
