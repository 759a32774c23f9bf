// The structured-output part of a request (docs/structured_outputs.md): the one output
// constraint (response_format, guided_*, structured_outputs) and the tools (tools, tool_choice,
// parallel_tool_calls), parsed and checked with errors that name the field. Separate from
// openai_protocol.h so that the fuzz target of the request-to-grammar path links only this, the
// grammar module and the grammar library.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "grammar/grammar.h"
#include "server/tool_calls.h"

namespace tessera {

// A request field's error, the wording of every request error: "'max_tokens' must be >= 0".
Status field_error(std::string_view field, std::string_view what);
// An optional boolean member: absent or null leaves `out` as it is; another type is an error
// naming the field.
Status get_bool(const nlohmann::json& j, const char* key, bool& out);

// response_format (json_object, json_schema {schema, strict}; text is none), guided_json /
// guided_regex / guided_choice / guided_grammar, structured_outputs {json, regex, choice, grammar}:
// at most one. `grammar_field` names the field it came from.
Status parse_structured_output(const nlohmann::json& request, std::optional<GrammarSpec>& grammar,
                               std::string& grammar_field);

struct ToolRequest {
  std::vector<ToolDef> tools;
  std::string tools_json;          // the request's list, as the chat template gets it
  ToolChoice tool_choice;          // default: auto with tools, none without
  bool parallel_tool_calls = true;
};
// tools, tool_choice, parallel_tool_calls of a chat request; every function's parameters are
// checked as a json_schema request's schema would be (an unsupported keyword is refused with its
// path under tools[i].function.parameters). `grammar`: the request's output constraint, if any
// (`grammar_field` names its field): a JSON one (response_format json_schema / json_object,
// guided_json) combines with tools (the reply is calls, or JSON matching it); a regex, choice or
// grammar does not.
Status parse_tools(const nlohmann::json& request, ToolRequest& tools, const std::optional<GrammarSpec>& grammar,
                   const std::string& grammar_field);

}  // namespace tessera
