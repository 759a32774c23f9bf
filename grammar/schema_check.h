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

}  // namespace tessera
