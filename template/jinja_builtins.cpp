// Jinja2 builtin filters and tests, and the template globals, for the chat-template interpreter.
#include "template/jinja_builtins.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <ctime>

#include <fmt/format.h>

#include "template/jinja_interpreter.h"

namespace tessera::jinja {
namespace {

// The reference sandbox refuses ranges longer than this.
constexpr int64_t kMaxRange = 100000;

const Value* arg(const CallArgs& a, size_t index, std::string_view name) { return a.get(index, name); }

bool flag(const CallArgs& a, size_t index, std::string_view name, bool fallback) {
  const Value* v = a.get(index, name);
  return v == nullptr ? fallback : v->truthy();
}

Result<int64_t> length_of(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined: return int64_t{0};
    case Value::Kind::kString: return static_cast<int64_t>(utf8_length(v.as_string()));
    case Value::Kind::kList: case Value::Kind::kTuple: return static_cast<int64_t>(v.as_list().size());
    case Value::Kind::kDict: return static_cast<int64_t>(v.as_dict().size());
    default: return Status::invalid_argument(fmt::format("object of type '{}' has no len()", v.type_name()));
  }
}

// Attribute path "a.b" or integer index, as Jinja's make_attrgetter resolves it.
Result<Value> attr_path(const Value& item, const Value& attribute) {
  if (attribute.is_integral()) return get_item(item, attribute);
  std::string path = attribute.to_str();
  Value cur = item;
  size_t start = 0;
  while (true) {
    const size_t dot = path.find('.', start);
    const std::string part = path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    const bool numeric = !part.empty() && std::all_of(part.begin(), part.end(), [](char c) { return c >= '0' && c <= '9'; });
    TESSERA_ASSIGN_OR_RETURN(cur, get_item(cur, numeric ? Value::integer(std::stoll(part)) : Value::string(part)));
    if (dot == std::string::npos) return cur;
    start = dot + 1;
  }
}

// Sort/unique/min/max key: strings compare case-insensitively unless asked otherwise.
Result<Value> sort_key(const Value& item, const Value* attribute, bool case_sensitive) {
  Value key = item;
  if (attribute != nullptr && !attribute->is_none()) {
    TESSERA_ASSIGN_OR_RETURN(key, attr_path(item, *attribute));
  }
  if (!case_sensitive && key.is_string()) return Value::string(py_lower(key.as_string()));
  return key;
}

Result<ValueList> sorted(Interpreter& in, const Value& v, const Value* attribute, bool case_sensitive, bool reverse) {
  TESSERA_ASSIGN_OR_RETURN(ValueList items, in.iterate(v));
  std::vector<std::pair<Value, Value>> keyed;
  for (const Value& item : items) {
    TESSERA_ASSIGN_OR_RETURN(Value key, sort_key(item, attribute, case_sensitive));
    keyed.emplace_back(std::move(key), item);
  }
  Status error;
  std::stable_sort(keyed.begin(), keyed.end(), [&](const auto& a, const auto& b) {
    if (!error.is_ok()) return false;
    auto lt = reverse ? py_less(b.first, a.first) : py_less(a.first, b.first);
    if (!lt.is_ok()) {
      error = lt.status();
      return false;
    }
    return *lt;
  });
  TESSERA_RETURN_IF_ERROR(error);
  ValueList out;
  for (auto& [k, item] : keyed) out.push_back(std::move(item));
  return out;
}

// ---- filters ---------------------------------------------------------------------------------

Result<Value> f_abs(Interpreter&, const Value& v, const CallArgs&) {
  if (v.is_float()) return Value::number(std::fabs(v.as_double()));
  if (v.is_integral()) {
    if (v.as_int() == INT64_MIN) return Status::invalid_argument("integer overflow (more than 64 bits)");
    return Value::integer(std::llabs(v.as_int()));
  }
  return Status::invalid_argument(fmt::format("bad operand type for abs(): '{}'", v.type_name()));
}

Result<Value> f_attr(Interpreter&, const Value& v, const CallArgs& a) {
  const Value* name = arg(a, 0, "name");
  if (name == nullptr || !name->is_string()) return Status::invalid_argument("attr filter needs an attribute name");
  // Python getattr(): dict keys are not attributes (only methods are); namespace members are.
  TESSERA_ASSIGN_OR_RETURN(Value attribute, get_attribute(v, name->as_string()));
  if (v.is_dict() && !attribute.is_callable()) {
    return Value::undefined(fmt::format("'dict object' has no attribute '{}'", name->as_string()));
  }
  return attribute;
}

// batch(value, linecount, fill_with=None): lists of `linecount` items, the last one padded.
Result<Value> f_batch(Interpreter& in, const Value& v, const CallArgs& a) {
  const Value* count = arg(a, 0, "linecount");
  if (count == nullptr || !count->is_integral() || count->as_int() <= 0) {
    return Status::invalid_argument("batch: linecount must be a positive integer");
  }
  const Value* fill = arg(a, 1, "fill_with");
  TESSERA_ASSIGN_OR_RETURN(ValueList items, in.iterate(v));
  const auto n = static_cast<size_t>(count->as_int());
  ValueList out;
  for (size_t i = 0; i < items.size(); i += n) {
    ValueList row(items.begin() + static_cast<std::ptrdiff_t>(i),
                  items.begin() + static_cast<std::ptrdiff_t>(std::min(items.size(), i + n)));
    if (row.size() < n && fill != nullptr && !fill->is_none()) row.resize(n, *fill);
    out.push_back(Value::list(std::move(row)));
  }
  return Value::list(std::move(out));
}

// slice(value, slices, fill_with=None): `slices` columns, the first ones one item longer.
Result<Value> f_slice(Interpreter& in, const Value& v, const CallArgs& a) {
  const Value* count = arg(a, 0, "slices");
  if (count == nullptr || !count->is_integral() || count->as_int() <= 0) {
    return Status::invalid_argument("slice: slices must be a positive integer");
  }
  const Value* fill = arg(a, 1, "fill_with");
  TESSERA_ASSIGN_OR_RETURN(ValueList items, in.iterate(v));
  const auto slices = static_cast<size_t>(count->as_int());
  const size_t per = items.size() / slices;
  const size_t extra = items.size() % slices;
  size_t offset = 0;
  ValueList out;
  for (size_t i = 0; i < slices; ++i) {
    const size_t start = offset + i * per;
    if (i < extra) ++offset;
    const size_t end = offset + (i + 1) * per;
    ValueList col(items.begin() + static_cast<std::ptrdiff_t>(start), items.begin() + static_cast<std::ptrdiff_t>(end));
    if (fill != nullptr && !fill->is_none() && i >= extra) col.push_back(*fill);
    out.push_back(Value::list(std::move(col)));
  }
  return Value::list(std::move(out));
}

Result<Value> f_capitalize(Interpreter&, const Value& v, const CallArgs&) {
  return Value::string(py_capitalize(v.to_str()));
}

Result<Value> f_center(Interpreter&, const Value& v, const CallArgs& a) {
  const Value* w = arg(a, 0, "width");
  const int64_t width = (w != nullptr && w->is_integral()) ? w->as_int() : 80;
  const std::string s = v.to_str();
  const auto len = static_cast<int64_t>(utf8_length(s));
  if (width <= len) return Value::string(s);
  const int64_t total = width - len;
  const int64_t left = total / 2 + (total & width & 1);
  return Value::string(std::string(static_cast<size_t>(left), ' ') + s +
                       std::string(static_cast<size_t>(total - left), ' '));
}

Result<Value> f_length(Interpreter&, const Value& v, const CallArgs&) {
  TESSERA_ASSIGN_OR_RETURN(int64_t n, length_of(v));
  return Value::integer(n);
}

Result<Value> f_default(Interpreter&, const Value& v, const CallArgs& a) {
  const Value* fallback = arg(a, 0, "default_value");
  const bool boolean = flag(a, 1, "boolean", false);
  if (v.is_undefined() || (boolean && !v.truthy())) return fallback != nullptr ? *fallback : Value::string("");
  return v;
}

Result<Value> f_dictsort(Interpreter&, const Value& v, const CallArgs& a) {
  if (!v.is_dict()) return Status::invalid_argument("dictsort: can only sort a mapping");
  const bool case_sensitive = flag(a, 0, "case_sensitive", false);
  const Value* by = arg(a, 1, "by");
  const bool by_value = by != nullptr && by->is_string() && by->as_string() == "value";
  const bool reverse = flag(a, 2, "reverse", false);
  std::vector<std::pair<Value, Value>> keyed;
  for (const auto& [k, val] : v.as_dict().entries()) {
    Value key = by_value ? val : k;
    if (!case_sensitive && key.is_string()) key = Value::string(py_lower(key.as_string()));
    keyed.emplace_back(std::move(key), Value::tuple({k, val}));
  }
  Status error;
  std::stable_sort(keyed.begin(), keyed.end(), [&](const auto& x, const auto& y) {
    auto lt = reverse ? py_less(y.first, x.first) : py_less(x.first, y.first);
    if (!lt.is_ok()) {
      error = lt.status();
      return false;
    }
    return *lt;
  });
  TESSERA_RETURN_IF_ERROR(error);
  ValueList out;
  for (auto& [k, item] : keyed) out.push_back(std::move(item));
  return Value::list(std::move(out));
}

Result<Value> f_escape(Interpreter&, const Value& v, const CallArgs&) {
  std::string out;
  for (char c : v.to_str()) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out.push_back(c);
    }
  }
  return Value::string(std::move(out));
}

Result<Value> f_first(Interpreter& in, const Value& v, const CallArgs&) {
  if (v.is_generator()) {  // next(): consumes one item
    GeneratorState& g = v.generator_state();
    TESSERA_RETURN_IF_ERROR(g.deferred);
    if (g.pos >= g.items.size()) return Value::undefined("No first item, sequence was empty.");
    return g.items[g.pos++];
  }
  if (v.is_sequence()) return v.as_list().empty() ? Value::undefined("No first item, sequence was empty.") : v.as_list()[0];
  TESSERA_ASSIGN_OR_RETURN(ValueList items, in.iterate(v));
  if (items.empty()) return Value::undefined("No first item, sequence was empty.");
  return items[0];
}

Result<Value> f_last(Interpreter& in, const Value& v, const CallArgs&) {
  if (v.is_generator()) return Status::invalid_argument("'generator' object is not reversible");
  if (v.is_sequence()) return v.as_list().empty() ? Value::undefined("No last item, sequence was empty.") : v.as_list().back();
  TESSERA_ASSIGN_OR_RETURN(ValueList items, in.iterate(v));
  if (items.empty()) return Value::undefined("No last item, sequence was empty.");
  return items.back();
}

// Python float(str): surrounding whitespace allowed, "inf"/"nan" accepted, '_' between digits.
bool parse_py_float(const std::string& text, double* out) {
  std::string s = py_strip(text, nullptr, true, true);
  std::string clean;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '_' && i > 0 && i + 1 < s.size() && std::isdigit(static_cast<unsigned char>(s[i - 1])) &&
        std::isdigit(static_cast<unsigned char>(s[i + 1]))) {
      continue;
    }
    clean.push_back(s[i]);
  }
  if (clean.empty() || clean.find_first_of(" \t\n") != std::string::npos) return false;
  if (clean.size() > 1 && (clean[0] == '0') && (clean[1] == 'x' || clean[1] == 'X')) return false;
  char* end = nullptr;
  errno = 0;
  const double d = std::strtod(clean.c_str(), &end);
  if (end != clean.c_str() + clean.size()) return false;
  *out = d;
  return true;
}

// Python int(str, base).
bool parse_py_int(const std::string& text, int64_t base, int64_t* out) {
  std::string s = py_strip(text, nullptr, true, true);
  bool negative = false;
  size_t i = 0;
  if (i < s.size() && (s[i] == '+' || s[i] == '-')) negative = s[i++] == '-';
  if (i + 1 < s.size() && s[i] == '0') {
    const char p = static_cast<char>(std::tolower(static_cast<unsigned char>(s[i + 1])));
    if ((p == 'x' && (base == 16 || base == 0)) || (p == 'o' && (base == 8 || base == 0)) ||
        (p == 'b' && (base == 2 || base == 0))) {
      base = p == 'x' ? 16 : p == 'o' ? 8 : 2;
      i += 2;
      if (i < s.size() && s[i] == '_') ++i;
    }
  }
  if (base == 0) base = 10;
  if (i >= s.size()) return false;
  int64_t v = 0;
  bool prev_digit = false;
  for (; i < s.size(); ++i) {
    const char c = s[i];
    if (c == '_' && prev_digit && i + 1 < s.size() && s[i + 1] != '_') {
      prev_digit = false;
      continue;
    }
    int d = std::isdigit(static_cast<unsigned char>(c)) ? c - '0'
            : std::isalpha(static_cast<unsigned char>(c)) ? std::tolower(static_cast<unsigned char>(c)) - 'a' + 10
                                                           : 99;
    if (d >= base) return false;
    if (__builtin_mul_overflow(v, base, &v) || __builtin_add_overflow(v, d, &v)) return false;
    prev_digit = true;
  }
  *out = negative ? -v : v;
  return true;
}

Result<Value> f_float(Interpreter&, const Value& v, const CallArgs& a) {
  if (v.is_undefined()) return Status::invalid_argument(v.undefined_message());
  const Value* fallback = arg(a, 0, "default");
  const Value dflt = fallback != nullptr ? *fallback : Value::number(0.0);
  if (v.is_number()) return Value::number(v.as_double());
  double d = 0;
  if (v.is_string() && parse_py_float(v.as_string(), &d)) return Value::number(d);
  return dflt;
}

Result<Value> f_int(Interpreter&, const Value& v, const CallArgs& a) {
  if (v.is_undefined()) return Status::invalid_argument(v.undefined_message());
  const Value* fallback = arg(a, 0, "default");
  const Value dflt = fallback != nullptr ? *fallback : Value::integer(0);
  const Value* base_arg = arg(a, 1, "base");
  const int64_t base = (base_arg != nullptr && base_arg->is_integral()) ? base_arg->as_int() : 10;
  if (v.is_integral()) return Value::integer(v.as_int());
  if (v.is_float()) {
    const double d = v.as_double();
    if (!std::isfinite(d) || std::fabs(d) >= 9.2e18) return dflt;
    return Value::integer(static_cast<int64_t>(d));
  }
  if (v.is_string()) {
    int64_t i = 0;
    if (parse_py_int(v.as_string(), base, &i)) return Value::integer(i);
    double d = 0;
    if (parse_py_float(v.as_string(), &d) && std::isfinite(d) && std::fabs(d) < 9.2e18) {
      return Value::integer(static_cast<int64_t>(d));
    }
  }
  return dflt;
}

Result<Value> f_format(Interpreter&, const Value& v, const CallArgs& a) {
  if (!a.positional.empty() && !a.keyword.empty()) {
    return Status::invalid_argument("format: can't handle positional and keyword arguments at the same time");
  }
  Value args = Value::tuple(a.positional);
  if (!a.keyword.empty()) {
    ValueDict d;
    for (const auto& [k, val] : a.keyword) d.set(Value::string(k), val);
    args = Value::dict(std::move(d));
  }
  TESSERA_ASSIGN_OR_RETURN(std::string out, py_percent_format(v.to_str(), args));
  return Value::string(std::move(out));
}

Result<Value> f_indent(Interpreter&, const Value& v, const CallArgs& a) {
  if (v.is_undefined()) return Status::invalid_argument(v.undefined_message());
  if (!v.is_string()) {
    return Status::invalid_argument(fmt::format("indent: expected a string, got {}", v.type_name()));
  }
  const Value* w = arg(a, 0, "width");
  std::string indention = w == nullptr ? "    " : w->is_string() ? w->as_string()
                                                               : std::string(static_cast<size_t>(std::max<int64_t>(w->as_int(), 0)), ' ');
  const bool first = flag(a, 1, "first", false);
  const bool blank = flag(a, 2, "blank", false);
  // Jinja appends a newline before splitting into lines, so a trailing newline adds no line.
  std::vector<std::string> parts;
  {
    const std::string s = v.to_str() + "\n";
    size_t start = 0;
    for (size_t i = 0; i < s.size(); ++i) {
      if (s[i] == '\n') {
        parts.push_back(s.substr(start, i - start));
        start = i + 1;
      }
    }
  }
  std::string rv;
  if (blank) {
    for (size_t i = 0; i < parts.size(); ++i) {
      if (i > 0) rv += "\n" + indention;
      rv += parts[i];
    }
  } else {
    rv = parts.empty() ? "" : parts[0];
    for (size_t i = 1; i < parts.size(); ++i) {
      rv += "\n";
      if (!parts[i].empty()) rv += indention;
      rv += parts[i];
    }
  }
  if (first) rv = indention + rv;
  return Value::string(std::move(rv));
}

Result<Value> f_items(Interpreter&, const Value& v, const CallArgs&) {
  if (v.is_undefined()) return Value::list({});
  if (!v.is_dict()) return Status::invalid_argument("Can only get item pairs from a mapping.");
  ValueList out;
  for (const auto& [k, val] : v.as_dict().entries()) out.push_back(Value::tuple({k, val}));
  return Value::list(std::move(out));
}

Result<Value> f_join(Interpreter& in, const Value& v, const CallArgs& a) {
  const Value* sep = arg(a, 0, "d");
  const Value* attribute = arg(a, 1, "attribute");
  TESSERA_ASSIGN_OR_RETURN(ValueList items, in.iterate(v));
  const std::string d = sep != nullptr ? sep->to_str() : "";
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) {
    Value item = items[i];
    if (attribute != nullptr && !attribute->is_none()) {
      TESSERA_ASSIGN_OR_RETURN(item, attr_path(item, *attribute));
    }
    if (i > 0) out += d;
    out += item.to_str();
    TESSERA_RETURN_IF_ERROR(in.check_size(out.size()));
  }
  return Value::string(std::move(out));  // charged by apply_filter
}

Result<Value> f_list(Interpreter& in, const Value& v, const CallArgs&) {
  TESSERA_ASSIGN_OR_RETURN(ValueList items, in.iterate(v));
  return Value::list(std::move(items));
}

Result<Value> f_lower(Interpreter&, const Value& v, const CallArgs&) { return Value::string(py_lower(v.to_str())); }
Result<Value> f_upper(Interpreter&, const Value& v, const CallArgs&) { return Value::string(py_upper(v.to_str())); }

Result<Value> f_map(Interpreter& in, const Value& v, const CallArgs& a) {
  TESSERA_ASSIGN_OR_RETURN(ValueList items, in.iterate(v));
  TESSERA_RETURN_IF_ERROR(in.charge_iterations(static_cast<int64_t>(items.size())));
  ValueList out;
  const Value* attribute = nullptr;
  const Value* fallback = nullptr;
  for (const auto& [k, val] : a.keyword) {
    if (k == "attribute") attribute = &val;
    if (k == "default") fallback = &val;
  }
  if (attribute != nullptr) {
    for (const Value& item : items) {
      TESSERA_ASSIGN_OR_RETURN(Value r, attr_path(item, *attribute));
      if (r.is_undefined() && fallback != nullptr) r = *fallback;
      out.push_back(std::move(r));
    }
    return Value::list(std::move(out));
  }
  if (a.positional.empty() || !a.positional[0].is_string()) {
    return Status::invalid_argument("map: expected a filter name or attribute=");
  }
  CallArgs rest;
  rest.positional.assign(a.positional.begin() + 1, a.positional.end());
  rest.keyword = a.keyword;
  for (const Value& item : items) {
    TESSERA_ASSIGN_OR_RETURN(Value r, in.apply_filter(a.positional[0].as_string(), item, rest));
    out.push_back(std::move(r));
  }
  return Value::list(std::move(out));
}

Result<Value> min_max(Interpreter& in, const Value& v, const CallArgs& a, bool want_max) {
  const bool case_sensitive = flag(a, 0, "case_sensitive", false);
  const Value* attribute = arg(a, 1, "attribute");
  TESSERA_ASSIGN_OR_RETURN(ValueList items, in.iterate(v));
  if (items.empty()) return Value::undefined(fmt::format("No aggregated item, sequence was empty."));
  size_t best = 0;
  TESSERA_ASSIGN_OR_RETURN(Value best_key, sort_key(items[0], attribute, case_sensitive));
  for (size_t i = 1; i < items.size(); ++i) {
    TESSERA_ASSIGN_OR_RETURN(Value key, sort_key(items[i], attribute, case_sensitive));
    TESSERA_ASSIGN_OR_RETURN(bool better, want_max ? py_less(best_key, key) : py_less(key, best_key));
    if (better) {
      best = i;
      best_key = std::move(key);
    }
  }
  return items[best];
}
Result<Value> f_max(Interpreter& in, const Value& v, const CallArgs& a) { return min_max(in, v, a, true); }
Result<Value> f_min(Interpreter& in, const Value& v, const CallArgs& a) { return min_max(in, v, a, false); }

// select / reject / selectattr / rejectattr.
Result<Value> select_impl(Interpreter& in, const Value& v, const CallArgs& a, bool keep_if, bool by_attr) {
  TESSERA_ASSIGN_OR_RETURN(ValueList items, in.iterate(v));
  TESSERA_RETURN_IF_ERROR(in.charge_iterations(static_cast<int64_t>(items.size())));
  size_t next = 0;
  Value attribute;
  if (by_attr) {
    if (a.positional.empty()) return Status::invalid_argument("selectattr/rejectattr need an attribute name");
    attribute = a.positional[next++];
  }
  std::string test;
  if (next < a.positional.size()) {
    if (!a.positional[next].is_string()) return Status::invalid_argument("select: the test name must be a string");
    test = a.positional[next++].as_string();
    if (find_test(test) == nullptr) return Status::invalid_argument(fmt::format("no test named '{}'", test));
  }
  CallArgs test_args;
  test_args.positional.assign(a.positional.begin() + static_cast<std::ptrdiff_t>(next), a.positional.end());
  test_args.keyword = a.keyword;
  ValueList out;
  for (const Value& item : items) {
    Value subject = item;
    if (by_attr) {
      TESSERA_ASSIGN_OR_RETURN(subject, attr_path(item, attribute));
    }
    bool r = false;
    if (test.empty()) {
      r = subject.truthy();
    } else {
      TESSERA_ASSIGN_OR_RETURN(r, in.apply_test(test, subject, test_args));
    }
    if (r == keep_if) out.push_back(item);
  }
  return Value::list(std::move(out));
}
Result<Value> f_select(Interpreter& in, const Value& v, const CallArgs& a) { return select_impl(in, v, a, true, false); }
Result<Value> f_reject(Interpreter& in, const Value& v, const CallArgs& a) { return select_impl(in, v, a, false, false); }
Result<Value> f_selectattr(Interpreter& in, const Value& v, const CallArgs& a) { return select_impl(in, v, a, true, true); }
Result<Value> f_rejectattr(Interpreter& in, const Value& v, const CallArgs& a) { return select_impl(in, v, a, false, true); }

Result<Value> f_replace(Interpreter& in, const Value& v, const CallArgs& a) {
  const Value* old = arg(a, 0, "old");
  const Value* repl = arg(a, 1, "new");
  const Value* count = arg(a, 2, "count");
  if (old == nullptr || repl == nullptr) return Status::invalid_argument("replace needs 'old' and 'new'");
  std::string out = py_replace(v.to_str(), old->to_str(), repl->to_str(),
                               (count != nullptr && count->is_integral()) ? count->as_int() : -1);
  TESSERA_RETURN_IF_ERROR(in.check_size(out.size()));
  return Value::string(std::move(out));
}

// Strings reverse to strings; lists, tuples, dicts (and undefined) to a reverse iterator; other
// iterables (generators) to a list, as Jinja's do_reverse falls back to list(value) reversed.
Result<Value> f_reverse(Interpreter& in, const Value& v, const CallArgs&) {
  if (v.is_string()) {
    std::u32string cps = decode_utf8(v.as_string());
    std::reverse(cps.begin(), cps.end());
    return Value::string(encode_utf8(cps));
  }
  TESSERA_ASSIGN_OR_RETURN(ValueList items, in.iterate(v));
  std::reverse(items.begin(), items.end());
  if (v.is_sequence() || v.is_dict() || v.is_undefined()) return Value::generator("reverse", std::move(items));
  return Value::list(std::move(items));
}

Result<Value> f_round(Interpreter&, const Value& v, const CallArgs& a) {
  if (!v.is_number()) return Status::invalid_argument(fmt::format("round: '{}' is not a number", v.type_name()));
  const Value* p = arg(a, 0, "precision");
  const int64_t precision = (p != nullptr && p->is_integral()) ? p->as_int() : 0;
  const Value* m = arg(a, 1, "method");
  const std::string method = m != nullptr ? m->to_str() : "common";
  const double scale = std::pow(10.0, static_cast<double>(precision));
  const double x = v.as_double() * scale;
  double r = 0;
  if (method == "common") {
    if (v.is_integral() && precision >= 0) return Value::integer(v.as_int());
    r = std::nearbyint(x);  // round-half-even, as Python's round()
  } else if (method == "ceil") {
    r = std::ceil(x);
  } else if (method == "floor") {
    r = std::floor(x);
  } else {
    return Status::invalid_argument("method must be common, ceil or floor");
  }
  return Value::number(r / scale);
}

Result<Value> f_safe(Interpreter&, const Value& v, const CallArgs&) { return Value::string(v.to_str()); }
Result<Value> f_string(Interpreter&, const Value& v, const CallArgs&) {
  return v.is_string() ? v : Value::string(v.to_str());
}

Result<Value> f_sort(Interpreter& in, const Value& v, const CallArgs& a) {
  const bool reverse = flag(a, 0, "reverse", false);
  const bool case_sensitive = flag(a, 1, "case_sensitive", false);
  TESSERA_ASSIGN_OR_RETURN(ValueList items, sorted(in, v, arg(a, 2, "attribute"), case_sensitive, reverse));
  return Value::list(std::move(items));
}

Result<Value> f_sum(Interpreter& in, const Value& v, const CallArgs& a) {
  const Value* attribute = arg(a, 0, "attribute");
  const Value* start = arg(a, 1, "start");
  TESSERA_ASSIGN_OR_RETURN(ValueList items, in.iterate(v));
  Value total = start != nullptr ? *start : Value::integer(0);
  for (const Value& item : items) {
    Value x = item;
    if (attribute != nullptr && !attribute->is_none()) {
      TESSERA_ASSIGN_OR_RETURN(x, attr_path(item, *attribute));
    }
    if (!x.is_number() || !total.is_number()) {
      return Status::invalid_argument(fmt::format("unsupported operand type(s) for +: '{}' and '{}'",
                                                  total.type_name(), x.type_name()));
    }
    if (total.is_float() || x.is_float()) {
      total = Value::number(total.as_double() + x.as_double());
    } else {
      int64_t r = 0;
      if (__builtin_add_overflow(total.as_int(), x.as_int(), &r)) {
        return Status::invalid_argument("integer overflow (more than 64 bits)");
      }
      total = Value::integer(r);
    }
  }
  return total;
}

// Jinja's title(): words begin after whitespace or one of -({[<.
Result<Value> f_title(Interpreter&, const Value& v, const CallArgs&) {
  const std::u32string cps = decode_utf8(v.to_str());
  std::u32string word;
  std::string out;
  auto is_sep = [](char32_t c) { return is_py_space(c) || c == '-' || c == '(' || c == '{' || c == '[' || c == '<'; };
  bool word_start = true;
  for (char32_t c : cps) {
    if (is_sep(c)) {
      append_utf8(out, c);
      word_start = true;
      continue;
    }
    std::string one;
    append_utf8(one, c);
    out += word_start ? py_upper(one) : py_lower(one);
    word_start = false;
  }
  return Value::string(std::move(out));
}

// transformers' tojson: json.dumps(x, ensure_ascii=False, indent=None, separators=None,
// sort_keys=False), no HTML escaping.
Result<Value> f_tojson(Interpreter&, const Value& v, const CallArgs& a) {
  JsonOptions o;
  o.ensure_ascii = flag(a, 0, "ensure_ascii", false);
  if (const Value* indent = arg(a, 1, "indent"); indent != nullptr && indent->is_integral()) {
    o.indent = static_cast<int>(std::clamp<int64_t>(indent->as_int(), 0, 64));
  }
  if (const Value* sep = arg(a, 2, "separators"); sep != nullptr && sep->is_sequence()) {
    if (sep->as_list().size() != 2) return Status::invalid_argument("tojson: separators must be a pair");
    o.has_separators = true;
    o.item_separator = sep->as_list()[0].to_str();
    o.key_separator = sep->as_list()[1].to_str();
  }
  o.sort_keys = flag(a, 3, "sort_keys", false);
  TESSERA_ASSIGN_OR_RETURN(std::string s, to_json(v, o));
  return Value::string(std::move(s));
}

Result<Value> f_trim(Interpreter&, const Value& v, const CallArgs& a) {
  return Value::string(py_strip(v.to_str(), arg(a, 0, "chars"), true, true));
}

Result<Value> f_truncate(Interpreter&, const Value& v, const CallArgs& a) {
  const Value* len_arg = arg(a, 0, "length");
  const int64_t length = (len_arg != nullptr && len_arg->is_integral()) ? len_arg->as_int() : 255;
  const bool killwords = flag(a, 1, "killwords", false);
  const Value* end_arg = arg(a, 2, "end");
  const std::u32string end = decode_utf8(end_arg != nullptr ? end_arg->to_str() : "...");
  const Value* leeway_arg = arg(a, 3, "leeway");
  const int64_t leeway = (leeway_arg != nullptr && leeway_arg->is_integral()) ? leeway_arg->as_int() : 5;
  if (!v.is_string()) {
    // Python measures the object itself: short lists come back unchanged, numbers have no len().
    TESSERA_ASSIGN_OR_RETURN(int64_t n, length_of(v));
    if (n <= length + leeway) return v;
    return Status::invalid_argument(fmt::format("truncate: expected a string, got {}", v.type_name()));
  }
  const std::u32string s = decode_utf8(v.to_str());
  if (length < static_cast<int64_t>(end.size())) {
    return Status::invalid_argument(fmt::format("expected length >= {}, got {}", end.size(), length));
  }
  if (static_cast<int64_t>(s.size()) <= length + leeway) return Value::string(encode_utf8(s));
  std::u32string head = s.substr(0, static_cast<size_t>(length) - end.size());
  if (!killwords) {
    const size_t sp = head.rfind(U' ');
    if (sp != std::u32string::npos) head = head.substr(0, sp);
  }
  return Value::string(encode_utf8(head + end));
}

Result<Value> f_unique(Interpreter& in, const Value& v, const CallArgs& a) {
  const bool case_sensitive = flag(a, 0, "case_sensitive", false);
  const Value* attribute = arg(a, 1, "attribute");
  TESSERA_ASSIGN_OR_RETURN(ValueList items, in.iterate(v));
  TESSERA_RETURN_IF_ERROR(in.charge_iterations(static_cast<int64_t>(items.size())));
  ValueList out;
  ValueList seen;
  for (const Value& item : items) {
    TESSERA_ASSIGN_OR_RETURN(Value key, sort_key(item, attribute, case_sensitive));
    const bool dup = std::any_of(seen.begin(), seen.end(), [&](const Value& s) { return py_equal(s, key); });
    if (dup) continue;
    seen.push_back(std::move(key));
    out.push_back(item);
  }
  return Value::list(std::move(out));
}

Result<Value> f_wordcount(Interpreter&, const Value& v, const CallArgs&) {
  int64_t n = 0;
  bool in_word = false;
  for (char32_t c : decode_utf8(v.to_str())) {
    // Python's \w, approximately: outside ASCII, anything but spaces, punctuation, symbols,
    // combining marks and emoji.
    const bool non_word_above_ascii =
        is_py_space(c) || (c >= 0x80 && c <= 0xBF && c != 0xAA && c != 0xB2 && c != 0xB3 && c != 0xB5 &&
                           c != 0xB9 && c != 0xBA && c != 0xBC && c != 0xBD && c != 0xBE) ||
        c == 0xD7 || c == 0xF7 || (c >= 0x300 && c <= 0x36F) || (c >= 0x2000 && c <= 0x2BFF) ||
        (c >= 0x3000 && c <= 0x303F) || (c >= 0xFE00 && c <= 0xFE0F) || (c >= 0x1F000 && c <= 0x1FAFF);
    const bool word = c == '_' || (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                      (c >= 0x80 && !non_word_above_ascii);
    if (word && !in_word) ++n;
    in_word = word;
  }
  return Value::integer(n);
}

// The reference's filters of these names are generator functions: see GeneratorState.
Result<Value> to_generator(std::string_view name, Result<Value> r) {
  if (!r.is_ok()) {
    if (r.status().code() == StatusCode::kResourceExhausted) return r.status();
    return Value::generator(std::string(name), {}, r.status());
  }
  return Value::generator(std::string(name), r->as_list());
}

#define TESSERA_JINJA_LAZY(fn, name) \
  [](Interpreter& in, const Value& v, const CallArgs& a) { return to_generator(name, fn(in, v, a)); }

// A missing required argument fails at the call, before the generator body would run.
#define TESSERA_JINJA_LAZY_NEEDS_ARG(fn, name, arg_name)                                   \
  [](Interpreter& in, const Value& v, const CallArgs& a) -> Result<Value> {                \
    if (a.get(0, arg_name) == nullptr) {                                                   \
      return Status::invalid_argument(name "() missing 1 required positional argument: '" \
                                      arg_name "'");                                       \
    }                                                                                      \
    return to_generator(name, fn(in, v, a));                                               \
  }

struct FilterEntry {
  std::string_view name;
  FilterFn fn;
};

constexpr FilterEntry kFilters[] = {
    {"abs", f_abs},           {"attr", f_attr},           {"batch", TESSERA_JINJA_LAZY_NEEDS_ARG(f_batch, "do_batch", "linecount")},
    {"capitalize", f_capitalize},
    {"center", f_center},     {"count", f_length},        {"d", f_default},
    {"default", f_default},   {"dictsort", f_dictsort},   {"e", f_escape},
    {"escape", f_escape},     {"first", f_first},         {"float", f_float},
    {"forceescape", f_escape}, {"format", f_format},      {"indent", f_indent},
    {"int", f_int},           {"items", TESSERA_JINJA_LAZY(f_items, "do_items")},         {"join", f_join},
    {"last", f_last},         {"length", f_length},       {"list", f_list},
    {"lower", f_lower},       {"map", TESSERA_JINJA_LAZY(f_map, "sync_do_map")},             {"max", f_max},
    {"min", f_min},           {"reject", TESSERA_JINJA_LAZY(f_reject, "select_or_reject")},       {"rejectattr", TESSERA_JINJA_LAZY(f_rejectattr, "select_or_reject")},
    {"replace", f_replace},   {"reverse", f_reverse},     {"round", f_round},
    {"safe", f_safe},         {"select", TESSERA_JINJA_LAZY(f_select, "select_or_reject")},       {"selectattr", TESSERA_JINJA_LAZY(f_selectattr, "select_or_reject")},
    {"slice", TESSERA_JINJA_LAZY_NEEDS_ARG(f_slice, "sync_do_slice", "slices")},
    {"sort", f_sort},         {"string", f_string},       {"sum", f_sum},
    {"title", f_title},       {"tojson", f_tojson},       {"trim", f_trim},
    {"truncate", f_truncate}, {"unique", TESSERA_JINJA_LAZY(f_unique, "sync_do_unique")},       {"upper", f_upper},
    {"wordcount", f_wordcount},
};

// ---- tests -----------------------------------------------------------------------------------

const Value& test_operand(const CallArgs& a, size_t index = 0) {
  static const Value kUndefined;
  return index < a.positional.size() ? a.positional[index] : (a.keyword.empty() ? kUndefined : a.keyword[0].second);
}

Result<bool> t_defined(Interpreter&, const Value& v, const CallArgs&) { return !v.is_undefined(); }
Result<bool> t_undefined(Interpreter&, const Value& v, const CallArgs&) { return v.is_undefined(); }
Result<bool> t_none(Interpreter&, const Value& v, const CallArgs&) { return v.is_none(); }
Result<bool> t_boolean(Interpreter&, const Value& v, const CallArgs&) { return v.is_bool(); }
Result<bool> t_true(Interpreter&, const Value& v, const CallArgs&) { return v.is_bool() && v.as_bool(); }
Result<bool> t_false(Interpreter&, const Value& v, const CallArgs&) { return v.is_bool() && !v.as_bool(); }
Result<bool> t_integer(Interpreter&, const Value& v, const CallArgs&) { return v.is_int(); }
Result<bool> t_float(Interpreter&, const Value& v, const CallArgs&) { return v.is_float(); }
Result<bool> t_number(Interpreter&, const Value& v, const CallArgs&) { return v.is_number(); }
Result<bool> t_string(Interpreter&, const Value& v, const CallArgs&) { return v.is_string(); }
Result<bool> t_mapping(Interpreter&, const Value& v, const CallArgs&) { return v.is_dict(); }
Result<bool> t_iterable(Interpreter&, const Value& v, const CallArgs&) {
  return v.is_undefined() || v.is_string() || v.is_sequence() || v.is_dict() || v.is_generator();
}
Result<bool> t_sequence(Interpreter&, const Value& v, const CallArgs&) {
  return v.is_undefined() || v.is_string() || v.is_sequence() || v.is_dict();
}
// Python's Undefined defines __call__ (to raise), so callable(undefined) holds.
Result<bool> t_callable(Interpreter&, const Value& v, const CallArgs&) { return v.is_callable() || v.is_undefined(); }
Result<bool> t_escaped(Interpreter&, const Value&, const CallArgs&) { return false; }
Result<bool> t_sameas(Interpreter&, const Value& v, const CallArgs& a) { return v.same_as(test_operand(a)); }
Result<bool> t_eq(Interpreter&, const Value& v, const CallArgs& a) { return py_equal(v, test_operand(a)); }
Result<bool> t_ne(Interpreter&, const Value& v, const CallArgs& a) { return !py_equal(v, test_operand(a)); }
Result<bool> t_lt(Interpreter&, const Value& v, const CallArgs& a) { return py_less(v, test_operand(a)); }
Result<bool> t_gt(Interpreter&, const Value& v, const CallArgs& a) { return py_less(test_operand(a), v); }
Result<bool> t_le(Interpreter&, const Value& v, const CallArgs& a) {
  TESSERA_ASSIGN_OR_RETURN(bool gt, py_less(test_operand(a), v));
  return !gt;
}
Result<bool> t_ge(Interpreter&, const Value& v, const CallArgs& a) {
  TESSERA_ASSIGN_OR_RETURN(bool lt, py_less(v, test_operand(a)));
  return !lt;
}

Result<bool> t_in(Interpreter& in, const Value& v, const CallArgs& a) {
  const Value& container = test_operand(a);
  switch (container.kind()) {
    case Value::Kind::kGenerator: {
      TESSERA_ASSIGN_OR_RETURN(ValueList items, in.iterate(container));
      return std::any_of(items.begin(), items.end(), [&](const Value& x) { return py_equal(x, v); });
    }
    case Value::Kind::kUndefined: return false;
    case Value::Kind::kString:
      if (!v.is_string()) {
        return Status::invalid_argument(
            fmt::format("'in <string>' requires string as left operand, not {}", v.type_name()));
      }
      return container.as_string().find(v.as_string()) != std::string::npos;
    case Value::Kind::kList: case Value::Kind::kTuple:
      return std::any_of(container.as_list().begin(), container.as_list().end(),
                         [&](const Value& x) { return py_equal(x, v); });
    case Value::Kind::kDict:
      if (v.kind() == Value::Kind::kList || v.is_dict() || v.is_namespace()) {
        return Status::invalid_argument(fmt::format("unhashable type: '{}'", v.type_name()));
      }
      return container.as_dict().find(v) != nullptr;
    default:
      return Status::invalid_argument(fmt::format("argument of type '{}' is not iterable", container.type_name()));
  }
}

// Python `value % n` for the parity and divisibility tests (floats allowed, as in Python).
Result<Value> py_mod(const Value& v, const Value& n) {
  if (v.is_undefined()) return Status::invalid_argument(v.undefined_message());
  if (!v.is_number() || !n.is_number()) {
    return Status::invalid_argument(fmt::format("unsupported operand type(s) for %: '{}' and '{}'", v.type_name(), n.type_name()));
  }
  if (n.as_double() == 0.0) return Status::invalid_argument("integer division or modulo by zero");
  if (v.is_float() || n.is_float()) {
    double m = std::fmod(v.as_double(), n.as_double());
    if (m != 0 && ((m < 0) != (n.as_double() < 0))) m += n.as_double();
    return Value::number(m);
  }
  int64_t r = v.as_int() % n.as_int();
  if (r != 0 && ((r < 0) != (n.as_int() < 0))) r += n.as_int();
  return Value::integer(r);
}
Result<bool> t_odd(Interpreter&, const Value& v, const CallArgs&) {
  TESSERA_ASSIGN_OR_RETURN(Value m, py_mod(v, Value::integer(2)));
  return py_equal(m, Value::integer(1));
}
Result<bool> t_even(Interpreter&, const Value& v, const CallArgs&) {
  TESSERA_ASSIGN_OR_RETURN(Value m, py_mod(v, Value::integer(2)));
  return py_equal(m, Value::integer(0));
}
Result<bool> t_divisibleby(Interpreter&, const Value& v, const CallArgs& a) {
  TESSERA_ASSIGN_OR_RETURN(Value m, py_mod(v, test_operand(a)));
  return py_equal(m, Value::integer(0));
}
Result<bool> t_lower(Interpreter&, const Value& v, const CallArgs&) {
  const std::string s = v.to_str();
  return py_lower(s) == s && py_upper(s) != s;
}
Result<bool> t_upper(Interpreter&, const Value& v, const CallArgs&) {
  const std::string s = v.to_str();
  return py_upper(s) == s && py_lower(s) != s;
}
Result<bool> t_filter(Interpreter&, const Value& v, const CallArgs&) {
  return v.is_string() && find_filter(v.as_string()) != nullptr;
}
Result<bool> t_test(Interpreter&, const Value& v, const CallArgs&) {
  return v.is_string() && find_test(v.as_string()) != nullptr;
}

struct TestEntry {
  std::string_view name;
  TestFn fn;
};

constexpr TestEntry kTests[] = {
    {"boolean", t_boolean},   {"callable", t_callable}, {"defined", t_defined},
    {"divisibleby", t_divisibleby}, {"eq", t_eq},       {"equalto", t_eq},
    {"escaped", t_escaped},   {"even", t_even},         {"false", t_false},
    {"filter", t_filter},     {"float", t_float},       {"ge", t_ge},
    {"greaterthan", t_gt},    {"gt", t_gt},             {"in", t_in},
    {"integer", t_integer},   {"iterable", t_iterable}, {"le", t_le},
    {"lessthan", t_lt},       {"lower", t_lower},       {"lt", t_lt},
    {"mapping", t_mapping},   {"ne", t_ne},             {"none", t_none},
    {"number", t_number},     {"odd", t_odd},           {"sameas", t_sameas},
    {"sequence", t_sequence}, {"string", t_string},     {"test", t_test},
    {"true", t_true},         {"undefined", t_undefined}, {"upper", t_upper},
};

// ---- globals ---------------------------------------------------------------------------------

Result<Value> g_range(Interpreter& in, const CallArgs& a) {
  if (!a.keyword.empty()) return Status::invalid_argument("range() takes no keyword arguments");
  if (a.positional.empty() || a.positional.size() > 3) {
    return Status::invalid_argument(fmt::format("range expected 1 to 3 arguments, got {}", a.positional.size()));
  }
  for (const Value& v : a.positional) {
    if (!v.is_integral()) {
      return Status::invalid_argument(fmt::format("'{}' object cannot be interpreted as an integer", v.type_name()));
    }
  }
  int64_t start = 0;
  int64_t stop = 0;
  int64_t step = 1;
  if (a.positional.size() == 1) {
    stop = a.positional[0].as_int();
  } else {
    start = a.positional[0].as_int();
    stop = a.positional[1].as_int();
    if (a.positional.size() == 3) step = a.positional[2].as_int();
  }
  if (step == 0) return Status::invalid_argument("range() arg 3 must not be zero");
  const double count = std::max(0.0, std::ceil((static_cast<double>(stop) - static_cast<double>(start)) /
                                               static_cast<double>(step)));
  if (count > static_cast<double>(kMaxRange)) {
    return Status::invalid_argument(fmt::format("range too big: more than {} items", kMaxRange));
  }
  TESSERA_RETURN_IF_ERROR(in.charge_iterations(static_cast<int64_t>(count)));
  ValueList items;
  for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) items.push_back(Value::integer(i));
  return Value::list(std::move(items));
}

Result<Value> g_dict(Interpreter&, const CallArgs& a) {
  ValueDict d;
  if (!a.positional.empty()) {
    if (a.positional.size() > 1 || !a.positional[0].is_dict()) {
      return Status::invalid_argument("dict() takes a mapping and keyword arguments");
    }
    d = a.positional[0].as_dict();
  }
  for (const auto& [k, v] : a.keyword) d.set(Value::string(k), v);
  return Value::dict(std::move(d));
}

Result<Value> g_namespace(Interpreter& in, const CallArgs& a) {
  ValueDict d;
  if (!a.positional.empty()) {
    if (a.positional.size() > 1 || !a.positional[0].is_dict()) {
      return Status::invalid_argument("namespace() takes a mapping and keyword arguments");
    }
    d = a.positional[0].as_dict();
  }
  for (const auto& [k, v] : a.keyword) d.set(Value::string(k), v);
  Value ns = Value::make_namespace(std::move(d));
  in.track_namespace(ns);
  return ns;
}

Result<Value> g_raise_exception(Interpreter& in, const CallArgs& a) {
  const Value* message = a.get(0, "message");
  return in.raise(message != nullptr ? message->to_str() : std::string());
}

Result<Value> g_strftime_now(Interpreter& in, const CallArgs& a) {
  const Value* format = a.get(0, "format");
  if (format == nullptr || !format->is_string()) return Status::invalid_argument("strftime_now() needs a format string");
  const std::time_t t = static_cast<std::time_t>(in.now_unix_seconds());
  std::tm tm{};
  localtime_r(&t, &tm);
  if (format->as_string().empty()) return Value::string("");
  std::string buf(256, '\0');
  for (int attempt = 0; attempt < 6; ++attempt) {
    const size_t n = std::strftime(buf.data(), buf.size(), format->as_string().c_str(), &tm);
    if (n > 0) return Value::string(buf.substr(0, n));
    buf.resize(buf.size() * 4);
  }
  return Status::invalid_argument("strftime_now(): the formatted date is too long");
}

}  // namespace

FilterFn find_filter(std::string_view name) {
  for (const auto& f : kFilters) {
    if (f.name == name) return f.fn;
  }
  return nullptr;
}

TestFn find_test(std::string_view name) {
  for (const auto& t : kTests) {
    if (t.name == name) return t.fn;
  }
  return nullptr;
}

void add_global_functions(ValueDict& globals) {
  globals.set(Value::string("range"), Value::callable("range", g_range));
  globals.set(Value::string("dict"), Value::callable("dict", g_dict));
  globals.set(Value::string("namespace"), Value::callable("namespace", g_namespace));
  globals.set(Value::string("raise_exception"), Value::callable("raise_exception", g_raise_exception));
  globals.set(Value::string("strftime_now"), Value::callable("strftime_now", g_strftime_now));
}

}  // namespace tessera::jinja
