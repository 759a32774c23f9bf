#include "grammar/schema_check.h"

#include <algorithm>
#include <array>
#include <set>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace tessera {
namespace {

using json = nlohmann::json;

constexpr std::array kUnsupported = {
    UnsupportedKeyword{"not", "a negated schema cannot be generated"},
    UnsupportedKeyword{"if", "conditional schemas are not generated"},
    UnsupportedKeyword{"then", "conditional schemas are not generated"},
    UnsupportedKeyword{"else", "conditional schemas are not generated"},
    UnsupportedKeyword{"dependentRequired", "dependencies between properties are not generated"},
    UnsupportedKeyword{"dependentSchemas", "dependencies between properties are not generated"},
    UnsupportedKeyword{"dependencies", "dependencies between properties are not generated"},
    UnsupportedKeyword{"uniqueItems", "array items are generated independently"},
    UnsupportedKeyword{"contains", "array items are generated independently"},
    UnsupportedKeyword{"minContains", "array items are generated independently"},
    UnsupportedKeyword{"maxContains", "array items are generated independently"},
};

// xgrammar's built-in string formats; any other format would be generated as a plain string.
constexpr std::array<std::string_view, 14> kFormats = {
    "email", "date", "time", "date-time", "duration", "ipv4", "ipv6", "hostname", "uuid", "uri",
    "uri-reference", "uri-template", "json-pointer", "relative-json-pointer"};

Status refuse(const std::string& path, std::string_view keyword, std::string_view why) {
  return Status::invalid_argument(fmt::format("{}.{}: '{}' is not supported ({})", path, keyword, keyword, why));
}

bool has_type(const json& s, std::string_view type) {
  auto it = s.find("type");
  if (it == s.end()) return false;
  if (it->is_string()) return it->get<std::string>() == type;
  if (it->is_array())
    for (const json& t : *it)
      if (t.is_string() && t.get<std::string>() == type) return true;
  return false;
}

Status check(const json& s, const std::string& path, int depth);

Status check_map(const json& s, const char* key, const std::string& path, int depth) {
  auto it = s.find(key);
  if (it == s.end() || !it->is_object()) return Status::ok();
  for (const auto& [name, sub] : it->items())
    TESSERA_RETURN_IF_ERROR(check(sub, fmt::format("{}.{}.{}", path, key, name), depth + 1));
  return Status::ok();
}

Status check_list(const json& s, const char* key, const std::string& path, int depth) {
  auto it = s.find(key);
  if (it == s.end() || !it->is_array()) return Status::ok();
  for (size_t i = 0; i < it->size(); ++i)
    TESSERA_RETURN_IF_ERROR(check((*it)[i], fmt::format("{}.{}[{}]", path, key, i), depth + 1));
  return Status::ok();
}

Status check_one(const json& s, const char* key, const std::string& path, int depth) {
  auto it = s.find(key);
  if (it == s.end()) return Status::ok();
  return check(*it, fmt::format("{}.{}", path, key), depth + 1);
}

Status check(const json& s, const std::string& path, int depth) {
  if (depth > 64) return Status::invalid_argument(fmt::format("{}: the schema nests deeper than 64 levels", path));
  if (s.is_boolean()) return Status::ok();
  if (!s.is_object())
    return Status::invalid_argument(fmt::format("{}: a schema must be an object or a boolean, not {}", path, s.dump()));
  for (const UnsupportedKeyword& k : kUnsupported)
    if (s.contains(k.keyword)) return refuse(path, k.keyword, k.why);
  if (auto it = s.find("multipleOf"); it != s.end()) {
    if (!has_type(s, "integer") || has_type(s, "number"))
      return refuse(path, "multipleOf", "generated for type integer only");
    if (!it->is_number_integer() && !(it->is_number_float() && it->get<double>() == static_cast<int64_t>(it->get<double>())))
      return refuse(path, "multipleOf", "generated for a whole-number divisor only");
  }
  if (auto it = s.find("allOf"); it != s.end() && it->is_array() && it->size() > 1)
    return refuse(path, "allOf", "only a single-entry allOf is generated");
  const bool length = s.contains("minLength") || s.contains("maxLength");
  const char* length_key = s.contains("minLength") ? "minLength" : "maxLength";  // the one to name
  if (auto it = s.find("format"); it != s.end() && it->is_string()) {
    const std::string f = it->get<std::string>();
    bool known = false;
    for (std::string_view k : kFormats) known = known || k == f;
    if (!known)
      return Status::invalid_argument(fmt::format("{}.format: format '{}' is not supported (supported: {})", path, f,
                                                  fmt::join(kFormats, ", ")));
    if (length) return refuse(path, length_key, "not together with a format");
  }
  if (length && s.contains("pattern")) return refuse(path, length_key, "not together with a pattern");
  for (const char* key : {"properties", "patternProperties", "$defs", "definitions"})
    TESSERA_RETURN_IF_ERROR(check_map(s, key, path, depth));
  for (const char* key : {"anyOf", "oneOf", "allOf", "prefixItems"}) TESSERA_RETURN_IF_ERROR(check_list(s, key, path, depth));
  if (auto it = s.find("items"); it != s.end() && it->is_array()) {
    TESSERA_RETURN_IF_ERROR(check_list(s, "items", path, depth));
  } else {
    TESSERA_RETURN_IF_ERROR(check_one(s, "items", path, depth));
  }
  for (const char* key : {"additionalProperties", "unevaluatedProperties", "unevaluatedItems", "additionalItems",
                          "propertyNames"})
    TESSERA_RETURN_IF_ERROR(check_one(s, key, path, depth));
  return Status::ok();
}

// Every object in the schema document with a string length bound: (path, minLength, maxLength;
// -1 where absent).
struct LengthBound {
  std::string path;
  int64_t lo = -1;
  int64_t hi = -1;
};

void collect_bounds(const json& s, const std::string& path, int depth, std::vector<LengthBound>& out) {
  if (depth > 64) return;
  if (s.is_object()) {
    LengthBound b{path};
    if (auto it = s.find("minLength"); it != s.end() && it->is_number_integer()) b.lo = it->get<int64_t>();
    if (auto it = s.find("maxLength"); it != s.end() && it->is_number_integer()) b.hi = it->get<int64_t>();
    if (b.lo > 0 || b.hi >= 0) out.push_back(b);
    for (const auto& [key, sub] : s.items()) collect_bounds(sub, path + "." + key, depth + 1, out);
  } else if (s.is_array()) {
    for (size_t i = 0; i < s.size(); ++i) collect_bounds(s[i], fmt::format("{}[{}]", path, i), depth + 1, out);
  }
}

}  // namespace

Status check_compile_cost(std::string_view schema, int64_t vocab, double budget_ms) {
  json j = json::parse(schema, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return Status::ok();
  std::vector<LengthBound> bounds;
  collect_bounds(j, "$", 0, bounds);
  const double scale = static_cast<double>(std::max<int64_t>(vocab, 1)) / static_cast<double>(kCostVocabulary);
  // Short bounds share one chain of states (as many as the longest such bound, plus the states
  // that still need characters); each distinct long bound is expanded on its own.
  int64_t chain = 0, need = 0;
  std::set<std::pair<int64_t, int64_t>> long_bounds;
  const LengthBound* largest = nullptr;
  for (const LengthBound& b : bounds) {
    const int64_t states = std::max(b.hi, b.lo);
    if (b.hi >= 0 && b.hi <= 31) {
      chain = std::max(chain, b.hi);
      need = std::max(need, b.lo);
    } else {
      long_bounds.insert({b.lo, b.hi});
    }
    if (largest == nullptr || states > std::max(largest->hi, largest->lo)) largest = &b;
  }
  double ms = static_cast<double>(chain + need) * kChainStateMs * scale;
  for (const auto& [lo, hi] : long_bounds) ms += static_cast<double>(std::max(lo, hi)) * kRepeatStateMs * scale;
  if (ms <= budget_ms || largest == nullptr) return Status::ok();
  const bool by_max = largest->hi >= largest->lo;
  return Status::invalid_argument(fmt::format(
      "{}.{}: a string bounded to {} characters is expected to take about {:.1f} s to compile on this {}-token "
      "vocabulary (a grammar state per character; this schema's bounded strings: about {:.1f} s), past the {:.0f} ms "
      "budget (--grammar-compile-timeout); a shorter bound or a pattern compiles faster",
      largest->path, by_max ? "maxLength" : "minLength", by_max ? largest->hi : largest->lo,
      static_cast<double>(by_max ? largest->hi : largest->lo) * (by_max && largest->hi <= 31 ? kChainStateMs : kRepeatStateMs) *
          scale / 1000.0,
      vocab, ms / 1000.0, budget_ms));
}

std::span<const UnsupportedKeyword> unsupported_schema_keywords() { return kUnsupported; }

Status check_json_schema(std::string_view schema) {
  json j = json::parse(schema, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return Status::invalid_argument("the JSON schema is not valid JSON");
  return check(j, "$", 0);
}

}  // namespace tessera
