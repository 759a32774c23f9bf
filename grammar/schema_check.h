// What the grammar engine cannot enforce, refused before compiling: xgrammar ignores some JSON
// Schema keywords (with at most a log line), so an output that matches its grammar could still
// fail the schema. A request that uses one gets a 400 naming the keyword and its JSON path,
// never an output that does not validate.
#pragma once

#include <string>
#include <span>
#include <string_view>

#include "common/status.h"

namespace tessera {

// The keywords refused wherever a schema uses them (each with why), for docs and errors.
struct UnsupportedKeyword {
  const char* keyword;
  const char* why;
};
std::span<const UnsupportedKeyword> unsupported_schema_keywords();

// InvalidArgument "<path>: '<keyword>' is not supported (<why>)" for the first thing in `schema`
// (a JSON Schema as text) the grammar engine would not enforce, or for text that is not JSON;
// OK otherwise. Paths are JSONPath-like: "$.properties.tags.uniqueItems".
Status check_json_schema(std::string_view schema);

// What compiling a schema's length-bounded strings is expected to cost: every character count
// of such a string is a grammar state, and each state is a pass over the vocabulary (measured on
// Gemma 3's 262,144 tokens: about 14 ms a state for the bounds up to 31 that grammar/
// bounded_strings.h writes as shared chains, about 25 ms a state for longer ones, which xgrammar
// expands itself and each distinct bound separately; scaled by the vocabulary's size).
inline constexpr double kChainStateMs = 14.0;
inline constexpr double kRepeatStateMs = 25.0;
inline constexpr int64_t kCostVocabulary = 262144;

// InvalidArgument naming the largest bound and its JSON path when the expected cost of `schema`'s
// bounded strings passes `budget_ms`, so a schema that could never compile in time is refused at
// once instead of occupying a compile thread; OK otherwise (and for text that is not JSON: the
// compilation reports that).
Status check_compile_cost(std::string_view schema, int64_t vocab, double budget_ms);

}  // namespace tessera
