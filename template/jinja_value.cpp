#include "template/jinja_value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace tessera::jinja {

// ---------------------------------------------------------------------------------------------
// UTF-8

void append_utf8(std::string& out, char32_t c) {
  if (c >= 0xDC80 && c <= 0xDCFF) {  // surrogateescape: the raw byte that failed to decode
    out.push_back(static_cast<char>(c - 0xDC00));
  } else if (c < 0x80) {
    out.push_back(static_cast<char>(c));
  } else if (c < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (c >> 6)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else if (c < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (c >> 12)));
    out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (c >> 18)));
    out.push_back(static_cast<char>(0x80 | ((c >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  }
}

std::u32string decode_utf8(std::string_view s) {
  std::u32string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    const auto b0 = static_cast<unsigned char>(s[i]);
    if (b0 < 0x80) {
      out.push_back(b0);
      ++i;
      continue;
    }
    int len = 0;
    char32_t c = 0;
    char32_t min = 0;
    if ((b0 & 0xE0) == 0xC0) { len = 2; c = b0 & 0x1F; min = 0x80; }
    else if ((b0 & 0xF0) == 0xE0) { len = 3; c = b0 & 0x0F; min = 0x800; }
    else if ((b0 & 0xF8) == 0xF0) { len = 4; c = b0 & 0x07; min = 0x10000; }
    bool ok = len > 0 && i + len <= s.size();
    for (int k = 1; ok && k < len; ++k) {
      const auto b = static_cast<unsigned char>(s[i + k]);
      if ((b & 0xC0) != 0x80) ok = false;
      c = (c << 6) | (b & 0x3F);
    }
    if (ok && (c < min || c > 0x10FFFF || (c >= 0xD800 && c <= 0xDFFF))) ok = false;
    if (ok) {
      out.push_back(c);
      i += len;
    } else {
      out.push_back(0xDC00 + b0);
      ++i;
    }
  }
  return out;
}

std::string encode_utf8(std::u32string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char32_t c : s) append_utf8(out, c);
  return out;
}

bool is_ascii(std::string_view s) {
  return std::all_of(s.begin(), s.end(), [](char c) { return static_cast<unsigned char>(c) < 0x80; });
}

size_t utf8_length(std::string_view s) {
  if (is_ascii(s)) return s.size();
  return decode_utf8(s).size();
}

bool is_py_space(char32_t c) {
  switch (c) {
    case ' ': case '\t': case '\n': case '\v': case '\f': case '\r':
    case 0x1C: case 0x1D: case 0x1E: case 0x1F: case 0x85: case 0xA0: case 0x1680:
    case 0x2028: case 0x2029: case 0x202F: case 0x205F: case 0x3000:
      return true;
    default:
      return c >= 0x2000 && c <= 0x200A;
  }
}

namespace {

// Python's str.isprintable() for the code points a chat template may plausibly print through
// repr(); unassigned code points are not tracked.
bool is_py_printable(char32_t c) {
  if (c < 0x20 || (c >= 0x7F && c <= 0xA0) || c == 0xAD) return false;
  if (c == 0x1680 || (c >= 0x2000 && c <= 0x200F) || (c >= 0x2028 && c <= 0x202F)) return false;
  if ((c >= 0x205F && c <= 0x206F) || c == 0x3000 || c == 0xFEFF) return false;
  if ((c >= 0x600 && c <= 0x605) || c == 0x61C || c == 0x6DD || c == 0x70F || c == 0x180E) return false;
  if ((c >= 0xD800 && c <= 0xF8FF) || (c >= 0xFFF9 && c <= 0xFFFB)) return false;
  if (c >= 0xE0000) return false;
  return true;
}

std::string repr_string(std::string_view s) {
  const bool has_single = s.find('\'') != std::string_view::npos;
  const bool has_double = s.find('"') != std::string_view::npos;
  const char quote = (has_single && !has_double) ? '"' : '\'';
  std::string out(1, quote);
  for (char32_t c : decode_utf8(s)) {
    if (c == static_cast<char32_t>(quote) || c == '\\') {
      out.push_back('\\');
      out.push_back(static_cast<char>(c));
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (is_py_printable(c)) {
      append_utf8(out, c);
    } else if (c < 0x100) {
      out += fmt::format("\\x{:02x}", static_cast<uint32_t>(c));
    } else if (c < 0x10000) {
      out += fmt::format("\\u{:04x}", static_cast<uint32_t>(c));
    } else {
      out += fmt::format("\\U{:08x}", static_cast<uint32_t>(c));
    }
  }
  out.push_back(quote);
  return out;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Containers and arguments

const Value* ValueDict::find(const Value& key) const {
  if (key.is_string()) return find(std::string_view(key.as_string()));
  for (const auto& [k, v] : entries_) {
    if (py_equal(k, key)) return &v;
  }
  return nullptr;
}

const Value* ValueDict::find(std::string_view key) const {
  for (const auto& [k, v] : entries_) {
    if (k.is_string() && k.as_string() == key) return &v;
  }
  return nullptr;
}

void ValueDict::set(Value key, Value value) {
  for (auto& [k, v] : entries_) {
    if (py_equal(k, key)) {
      v = std::move(value);
      return;
    }
  }
  entries_.emplace_back(std::move(key), std::move(value));
}

void ValueDict::append_new(Value key, Value value) { entries_.emplace_back(std::move(key), std::move(value)); }

const Value* CallArgs::get(size_t index, std::string_view name) const {
  if (index < positional.size()) return &positional[index];
  for (const auto& [k, v] : keyword) {
    if (k == name) return &v;
  }
  return nullptr;
}

Status CallArgs::check_arity(std::string_view callee, size_t max_positional,
                             std::initializer_list<std::string_view> names) const {
  if (positional.size() > max_positional) {
    return Status::invalid_argument(fmt::format("{}() takes at most {} positional argument(s), got {}",
                                                callee, max_positional, positional.size()));
  }
  for (const auto& [k, v] : keyword) {
    if (std::find(names.begin(), names.end(), k) == names.end()) {
      return Status::invalid_argument(fmt::format("{}() got an unexpected keyword argument '{}'", callee, k));
    }
  }
  return Status::ok();
}

// ---------------------------------------------------------------------------------------------
// Value

Value Value::undefined(std::string hint) {
  Value v;
  if (!hint.empty()) v.str_ = std::make_shared<const std::string>(std::move(hint));
  return v;
}
Value Value::none() {
  Value v;
  v.kind_ = Kind::kNone;
  return v;
}
Value Value::boolean(bool b) {
  Value v;
  v.kind_ = Kind::kBool;
  v.b_ = b;
  return v;
}
Value Value::integer(int64_t i) {
  Value v;
  v.kind_ = Kind::kInt;
  v.i_ = i;
  return v;
}
Value Value::number(double f) {
  Value v;
  v.kind_ = Kind::kFloat;
  v.f_ = f;
  return v;
}
Value Value::string(std::string s) {
  Value v;
  v.kind_ = Kind::kString;
  v.str_ = std::make_shared<const std::string>(std::move(s));
  return v;
}
namespace {
uint32_t depth_of(const ValueList& items) {
  uint32_t d = 0;
  for (const Value& item : items) d = std::max(d, item.depth());
  return d + 1;
}
uint32_t depth_of(const ValueDict& dict) {
  uint32_t d = 0;
  for (const auto& [k, item] : dict.entries()) d = std::max({d, k.depth(), item.depth()});
  return d + 1;
}
}  // namespace

Value Value::list(ValueList items) {
  Value v;
  v.kind_ = Kind::kList;
  v.depth_ = depth_of(items);
  v.list_ = std::make_shared<const ValueList>(std::move(items));
  return v;
}
Value Value::tuple(ValueList items) {
  Value v;
  v.kind_ = Kind::kTuple;
  v.depth_ = depth_of(items);
  v.list_ = std::make_shared<const ValueList>(std::move(items));
  return v;
}
Value Value::dict(ValueDict d) {
  Value v;
  v.kind_ = Kind::kDict;
  v.depth_ = depth_of(d);
  v.dict_ = std::make_shared<ValueDict>(std::move(d));
  return v;
}
Value Value::make_namespace(ValueDict d) {
  Value v;
  v.kind_ = Kind::kNamespace;
  v.depth_ = 1;
  v.dict_ = std::make_shared<ValueDict>(std::move(d));
  return v;
}
Value Value::callable(std::string name, NativeFunction fn) {
  Value v;
  v.kind_ = Kind::kCallable;
  v.fn_ = std::make_shared<const Callable>(Callable{std::move(name), std::move(fn)});
  return v;
}

Value Value::generator(std::string name, ValueList items, Status deferred) {
  Value v;
  v.kind_ = Kind::kGenerator;
  v.gen_ = std::make_shared<GeneratorState>();
  v.gen_->name = std::move(name);
  v.gen_->items = std::move(items);
  v.gen_->deferred = std::move(deferred);
  v.depth_ = depth_of(v.gen_->items);
  return v;
}

std::string Value::undefined_message() const {
  if (str_ && !str_->empty()) return *str_;
  return "value is undefined";
}

bool Value::truthy() const {
  switch (kind_) {
    case Kind::kUndefined: case Kind::kNone: return false;
    case Kind::kBool: return b_;
    case Kind::kInt: return i_ != 0;
    case Kind::kFloat: return f_ != 0.0;
    case Kind::kString: return !str_->empty();
    case Kind::kList: case Kind::kTuple: return !list_->empty();
    case Kind::kDict: return dict_->size() > 0;
    case Kind::kNamespace: case Kind::kCallable: case Kind::kGenerator: return true;
  }
  return false;
}

std::string_view Value::type_name() const {
  switch (kind_) {
    case Kind::kUndefined: return "Undefined";
    case Kind::kNone: return "NoneType";
    case Kind::kBool: return "bool";
    case Kind::kInt: return "int";
    case Kind::kFloat: return "float";
    case Kind::kString: return "str";
    case Kind::kList: return "list";
    case Kind::kTuple: return "tuple";
    case Kind::kDict: return "dict";
    case Kind::kNamespace: return "Namespace";
    case Kind::kCallable: return "function";
    case Kind::kGenerator: return "generator";
  }
  return "object";
}

std::string format_float(double f) {
  if (std::isnan(f)) return "nan";
  if (std::isinf(f)) return f > 0 ? "inf" : "-inf";
  char buf[64];
  // Shortest round-trip digits, then laid out the way Python's float.__repr__ does.
  auto res = std::to_chars(buf, buf + sizeof(buf), f, std::chars_format::scientific);
  std::string_view sci(buf, static_cast<size_t>(res.ptr - buf));
  const size_t e_pos = sci.find('e');
  std::string mantissa(sci.substr(0, e_pos));
  const int exp = std::stoi(std::string(sci.substr(e_pos + 1)));
  const bool negative = !mantissa.empty() && mantissa[0] == '-';
  if (negative) mantissa.erase(0, 1);
  std::string digits;
  for (char c : mantissa) {
    if (c != '.') digits.push_back(c);
  }
  std::string out = negative ? "-" : "";
  if (exp >= -4 && exp < 16) {
    if (exp < 0) {
      out += "0.";
      out.append(static_cast<size_t>(-exp - 1), '0');
      out += digits;
    } else {
      const size_t int_digits = static_cast<size_t>(exp) + 1;
      if (digits.size() <= int_digits) {
        out += digits;
        out.append(int_digits - digits.size(), '0');
        out += ".0";
      } else {
        out += digits.substr(0, int_digits);
        out += '.';
        out += digits.substr(int_digits);
      }
    }
  } else {
    out += digits.substr(0, 1);
    if (digits.size() > 1) {
      out += '.';
      out += digits.substr(1);
    }
    out += fmt::format("e{}{:02d}", exp < 0 ? '-' : '+', std::abs(exp));
  }
  return out;
}

std::string Value::to_str() const {
  switch (kind_) {
    case Kind::kUndefined: return "";
    case Kind::kString: return *str_;
    default: return repr();
  }
}

std::string Value::repr() const {
  std::vector<const ValueDict*> active;
  return repr_in(active);
}

std::string Value::repr_in(std::vector<const ValueDict*>& active) const {
  switch (kind_) {
    case Kind::kUndefined: return "Undefined";
    case Kind::kNone: return "None";
    case Kind::kBool: return b_ ? "True" : "False";
    case Kind::kInt: return std::to_string(i_);
    case Kind::kFloat: return format_float(f_);
    case Kind::kString: return repr_string(*str_);
    case Kind::kList: case Kind::kTuple: {
      const bool tuple = kind_ == Kind::kTuple;
      std::string out = tuple ? "(" : "[";
      for (size_t i = 0; i < list_->size(); ++i) {
        if (i > 0) out += ", ";
        out += (*list_)[i].repr_in(active);
      }
      if (tuple && list_->size() == 1) out += ",";
      out += tuple ? ")" : "]";
      return out;
    }
    case Kind::kDict: case Kind::kNamespace: {
      // Only a namespace can contain itself; Python prints the inner occurrence as "{...}".
      if (std::find(active.begin(), active.end(), dict_.get()) != active.end()) return "<Namespace {...}>";
      if (kind_ == Kind::kNamespace) active.push_back(dict_.get());
      std::string out = kind_ == Kind::kNamespace ? "<Namespace {" : "{";
      bool first = true;
      for (const auto& [k, v] : dict_->entries()) {
        if (!first) out += ", ";
        first = false;
        out += k.repr_in(active);
        out += ": ";
        out += v.repr_in(active);
      }
      out += kind_ == Kind::kNamespace ? "}>" : "}";
      if (kind_ == Kind::kNamespace) active.pop_back();
      return out;
    }
    case Kind::kCallable: return fmt::format("<function {}>", fn_->name);
    case Kind::kGenerator: return fmt::format("<generator object {}>", gen_->name);
  }
  return "";
}

bool Value::same_as(const Value& other) const {
  if (kind_ != other.kind_) return false;
  switch (kind_) {
    case Kind::kList: case Kind::kTuple: return list_ == other.list_;
    case Kind::kDict: case Kind::kNamespace: return dict_ == other.dict_;
    case Kind::kCallable: return fn_ == other.fn_;
    case Kind::kGenerator: return gen_ == other.gen_;
    default: return py_equal(*this, other);
  }
}

bool py_equal(const Value& a, const Value& b) {
  using K = Value::Kind;
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return a.as_double() == b.as_double();
    return a.as_int() == b.as_int();
  }
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case K::kUndefined: case K::kNone: return true;
    case K::kString: return a.as_string() == b.as_string();
    case K::kList: case K::kTuple: {
      const auto& x = a.as_list();
      const auto& y = b.as_list();
      if (x.size() != y.size()) return false;
      for (size_t i = 0; i < x.size(); ++i) {
        if (!py_equal(x[i], y[i])) return false;
      }
      return true;
    }
    case K::kDict: {
      if (a.as_dict().size() != b.as_dict().size()) return false;
      for (const auto& [k, v] : a.as_dict().entries()) {
        const Value* other = b.as_dict().find(k);
        if (other == nullptr || !py_equal(v, *other)) return false;
      }
      return true;
    }
    default: return a.same_as(b);
  }
}

Result<bool> py_less(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return a.as_double() < b.as_double();
    return a.as_int() < b.as_int();
  }
  if (a.is_string() && b.is_string()) return a.as_string() < b.as_string();
  if (a.is_sequence() && a.kind() == b.kind()) {
    const auto& x = a.as_list();
    const auto& y = b.as_list();
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (py_equal(x[i], y[i])) continue;
      return py_less(x[i], y[i]);
    }
    return x.size() < y.size();
  }
  return Status::invalid_argument(fmt::format("'<' not supported between instances of '{}' and '{}'",
                                              a.type_name(), b.type_name()));
}

// ---------------------------------------------------------------------------------------------
// JSON

namespace {

void json_escape(std::string& out, std::string_view s, bool ensure_ascii) {
  out.push_back('"');
  for (char32_t c : decode_utf8(s)) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20 || (ensure_ascii && c >= 0x7F)) {
          if (c >= 0x10000) {
            const char32_t v = c - 0x10000;
            out += fmt::format("\\u{:04x}\\u{:04x}", 0xD800 + (v >> 10), 0xDC00 + (v & 0x3FF));
          } else {
            out += fmt::format("\\u{:04x}", static_cast<uint32_t>(c));
          }
        } else {
          append_utf8(out, c);
        }
    }
  }
  out.push_back('"');
}

Result<std::string> json_key(const Value& k) {
  switch (k.kind()) {
    case Value::Kind::kString: return k.as_string();
    case Value::Kind::kBool: return std::string(k.as_bool() ? "true" : "false");
    case Value::Kind::kInt: return std::to_string(k.as_int());
    case Value::Kind::kFloat: return format_float(k.as_double());
    case Value::Kind::kNone: return std::string("null");
    default:
      return Status::invalid_argument(
          fmt::format("keys must be str, int, float, bool or None, not {}", k.type_name()));
  }
}

Status json_write(std::string& out, const Value& v, const JsonOptions& o, int level) {
  if (level > 512) return Status::invalid_argument("tojson: value nested too deeply");
  const std::string item_sep = o.has_separators ? o.item_separator : (o.indent >= 0 ? "," : ", ");
  const std::string key_sep = o.has_separators ? o.key_separator : ": ";
  auto newline = [&](int lvl) {
    if (o.indent < 0) return;
    out.push_back('\n');
    out.append(static_cast<size_t>(o.indent) * static_cast<size_t>(lvl), ' ');
  };
  switch (v.kind()) {
    case Value::Kind::kNone: out += "null"; return Status::ok();
    case Value::Kind::kBool: out += v.as_bool() ? "true" : "false"; return Status::ok();
    case Value::Kind::kInt: out += std::to_string(v.as_int()); return Status::ok();
    case Value::Kind::kFloat: {
      const double f = v.as_double();
      if (std::isnan(f)) out += "NaN";
      else if (std::isinf(f)) out += f > 0 ? "Infinity" : "-Infinity";
      else out += format_float(f);
      return Status::ok();
    }
    case Value::Kind::kString: json_escape(out, v.as_string(), o.ensure_ascii); return Status::ok();
    case Value::Kind::kList: case Value::Kind::kTuple: {
      const auto& items = v.as_list();
      if (items.empty()) {
        out += "[]";
        return Status::ok();
      }
      out.push_back('[');
      for (size_t i = 0; i < items.size(); ++i) {
        if (i > 0) out += item_sep;
        newline(level + 1);
        TESSERA_RETURN_IF_ERROR(json_write(out, items[i], o, level + 1));
      }
      newline(level);
      out.push_back(']');
      return Status::ok();
    }
    case Value::Kind::kDict: {
      std::vector<std::pair<std::string, const Value*>> items;
      for (const auto& [k, val] : v.as_dict().entries()) {
        TESSERA_ASSIGN_OR_RETURN(std::string key, json_key(k));
        items.emplace_back(std::move(key), &val);
      }
      if (o.sort_keys) {
        std::stable_sort(items.begin(), items.end(),
                         [](const auto& a, const auto& b) { return a.first < b.first; });
      }
      if (items.empty()) {
        out += "{}";
        return Status::ok();
      }
      out.push_back('{');
      for (size_t i = 0; i < items.size(); ++i) {
        if (i > 0) out += item_sep;
        newline(level + 1);
        json_escape(out, items[i].first, o.ensure_ascii);
        out += key_sep;
        TESSERA_RETURN_IF_ERROR(json_write(out, *items[i].second, o, level + 1));
      }
      newline(level);
      out.push_back('}');
      return Status::ok();
    }
    default:
      return Status::invalid_argument(
          fmt::format("Object of type {} is not JSON serializable", v.type_name()));
  }
}

Value from_json_node(const nlohmann::ordered_json& j) {
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null: return Value::none();
    case nlohmann::ordered_json::value_t::boolean: return Value::boolean(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer: return Value::integer(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: {
      const auto u = j.get<uint64_t>();
      if (u <= static_cast<uint64_t>(INT64_MAX)) return Value::integer(static_cast<int64_t>(u));
      return Value::number(static_cast<double>(u));
    }
    case nlohmann::ordered_json::value_t::number_float: return Value::number(j.get<double>());
    case nlohmann::ordered_json::value_t::string: return Value::string(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      ValueList items;
      items.reserve(j.size());
      for (const auto& e : j) items.push_back(from_json_node(e));
      return Value::list(std::move(items));
    }
    case nlohmann::ordered_json::value_t::object: {
      ValueDict d;
      for (const auto& [k, e] : j.items()) d.append_new(Value::string(k), from_json_node(e));
      return Value::dict(std::move(d));
    }
    default: return Value::none();
  }
}

}  // namespace

Result<std::string> to_json(const Value& value, const JsonOptions& options) {
  std::string out;
  TESSERA_RETURN_IF_ERROR(json_write(out, value, options, 0));
  return out;
}

Result<Value> value_from_json(std::string_view json_text) {
  try {
    // Parsing depth is bounded by the caller's input size; nlohmann recurses per nesting level,
    // so refuse absurd nesting before it can exhaust the stack.
    int depth = 0;
    int max_depth = 0;
    bool in_string = false;
    for (size_t i = 0; i < json_text.size(); ++i) {
      const char c = json_text[i];
      if (in_string) {
        if (c == '\\') ++i;
        else if (c == '"') in_string = false;
      } else if (c == '"') {
        in_string = true;
      } else if (c == '[' || c == '{') {
        max_depth = std::max(max_depth, ++depth);
      } else if (c == ']' || c == '}') {
        --depth;
      }
    }
    if (max_depth > 256) return Status::invalid_argument("JSON nested more than 256 levels deep");
    return from_json_node(nlohmann::ordered_json::parse(json_text));
  } catch (const nlohmann::json::exception& e) {
    return Status::invalid_argument(fmt::format("invalid JSON: {}", e.what()));
  }
}

}  // namespace tessera::jinja
