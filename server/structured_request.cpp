#include "server/structured_request.h"

#include <algorithm>

#include <fmt/format.h>

#include "grammar/schema_check.h"

namespace tessera {

using json = nlohmann::json;

Status field_error(std::string_view field, std::string_view what) {
  return Status::invalid_argument(fmt::format("'{}' {}", field, what));
}

Status get_bool(const json& j, const char* key, bool& out) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return Status::ok();
  if (!it->is_boolean()) return field_error(key, "must be a boolean");
  out = it->get<bool>();
  return Status::ok();
}

namespace {

// A schema given as an object, or as a string holding one (vLLM accepts both).
Result<std::string> schema_text(const json& v, const std::string& field) {
  if (v.is_object() || v.is_boolean()) return v.dump();
  if (v.is_string()) {
    json parsed = json::parse(v.get<std::string>(), nullptr, false);
    if (parsed.is_discarded() || !(parsed.is_object() || parsed.is_boolean()))
      return field_error(field, "must be a JSON schema (an object, or a string holding one)");
    return parsed.dump();
  }
  return field_error(field, "must be a JSON schema (an object, or a string holding one)");
}

}  // namespace

// The one structured-output constraint of a request, from whichever field gives it:
// response_format (OpenAI), guided_json / guided_regex / guided_choice / guided_grammar, or
// structured_outputs {json, regex, choice, grammar} (vLLM). Two of them is an error.
Status parse_structured_output(const json& j, std::optional<GrammarSpec>& grammar, std::string& grammar_field) {
  auto set = [&](const std::string& field, GrammarKind kind, std::string source) -> Status {
    if (grammar)
      return field_error(field, fmt::format("a request takes one output constraint; '{}' was given too", grammar_field));
    GrammarSpec spec;
    spec.kind = kind;
    spec.source = std::move(source);
    grammar = std::move(spec);
    grammar_field = field;
    return Status::ok();
  };
  if (auto rf = j.find("response_format"); rf != j.end() && !rf->is_null()) {
    if (!rf->is_object()) return field_error("response_format", "must be an object with a 'type'");
    auto t = rf->find("type");
    const std::string type = t != rf->end() && t->is_string() ? t->get<std::string>() : "";
    if (type == "json_object") {
      TESSERA_RETURN_IF_ERROR(set("response_format", GrammarKind::kJsonObject, ""));
    } else if (type == "json_schema") {
      auto js = rf->find("json_schema");
      if (js == rf->end() || !js->is_object())
        return field_error("response_format", "type 'json_schema' needs a 'json_schema' object with a 'schema'");
      auto schema = js->find("schema");
      if (schema == js->end() || schema->is_null())
        return field_error("response_format", "json_schema.schema is required");
      TESSERA_ASSIGN_OR_RETURN(std::string text, schema_text(*schema, "response_format"));
      TESSERA_RETURN_IF_ERROR(set("response_format", GrammarKind::kJsonSchema, std::move(text)));
      bool strict = false;
      TESSERA_RETURN_IF_ERROR(get_bool(*js, "strict", strict));
      grammar->strict = strict;
    } else if (type != "text") {
      return field_error("response_format",
                         fmt::format("type '{}' is not supported: use \"text\", \"json_object\" or \"json_schema\"", type));
    }
  }
  auto guided = [&](const json& obj, const std::string& prefix, const char* json_key, const char* regex_key,
                    const char* choice_key, const char* grammar_key) -> Status {
    if (auto v = obj.find(json_key); v != obj.end() && !v->is_null()) {
      TESSERA_ASSIGN_OR_RETURN(std::string text, schema_text(*v, prefix + json_key));
      TESSERA_RETURN_IF_ERROR(set(prefix + json_key, GrammarKind::kJsonSchema, std::move(text)));
      grammar->strict = true;  // vLLM's guided JSON: no properties beyond the schema's
    }
    if (auto v = obj.find(regex_key); v != obj.end() && !v->is_null()) {
      if (!v->is_string() || v->get<std::string>().empty())
        return field_error(prefix + regex_key, "must be a non-empty string (a regular expression)");
      TESSERA_RETURN_IF_ERROR(set(prefix + regex_key, GrammarKind::kRegex, v->get<std::string>()));
    }
    if (auto v = obj.find(choice_key); v != obj.end() && !v->is_null()) {
      if (!v->is_array() || v->empty())
        return field_error(prefix + choice_key, "must be a non-empty list of strings");
      for (const json& c : *v)
        if (!c.is_string() || c.get<std::string>().empty())
          return field_error(prefix + choice_key, fmt::format("must hold non-empty strings, not {}", c.dump()));
      TESSERA_RETURN_IF_ERROR(set(prefix + choice_key, GrammarKind::kChoice, v->dump()));
    }
    if (auto v = obj.find(grammar_key); v != obj.end() && !v->is_null()) {
      if (!v->is_string() || v->get<std::string>().empty())
        return field_error(prefix + grammar_key, "must be a non-empty string (an EBNF grammar with a 'root' rule)");
      TESSERA_RETURN_IF_ERROR(set(prefix + grammar_key, GrammarKind::kEbnf, v->get<std::string>()));
    }
    return Status::ok();
  };
  TESSERA_RETURN_IF_ERROR(guided(j, "", "guided_json", "guided_regex", "guided_choice", "guided_grammar"));
  if (auto so = j.find("structured_outputs"); so != j.end() && !so->is_null()) {
    if (!so->is_object()) return field_error("structured_outputs", "must be an object");
    TESSERA_RETURN_IF_ERROR(guided(*so, "structured_outputs.", "json", "regex", "choice", "grammar"));
  }
  return Status::ok();
}

// tools, tool_choice, parallel_tool_calls.
Status parse_tools(const json& j, ToolRequest& r, const std::optional<GrammarSpec>& grammar,
                   const std::string& grammar_field) {
  TESSERA_RETURN_IF_ERROR(get_bool(j, "parallel_tool_calls", r.parallel_tool_calls));
  auto t = j.find("tools");
  const bool has_tools = t != j.end() && !t->is_null() && !(t->is_array() && t->empty());
  if (has_tools) {
    if (!t->is_array()) return field_error("tools", "must be a list of {\"type\": \"function\", \"function\": {...}}");
    for (size_t i = 0; i < t->size(); ++i) {
      const json& tool = (*t)[i];
      const std::string at = fmt::format("tools[{}]", i);
      if (!tool.is_object() || tool.value("type", "") != "function" || !tool.contains("function") ||
          !tool["function"].is_object())
        return field_error(at, "must be {\"type\": \"function\", \"function\": {\"name\": ..., \"parameters\": ...}}");
      const json& f = tool["function"];
      if (!f.contains("name") || !f["name"].is_string() || f["name"].get<std::string>().empty())
        return field_error(at + ".function.name", "is required (a non-empty string)");
      ToolDef d;
      d.name = f["name"].get<std::string>();
      for (const ToolDef& other : r.tools)
        if (other.name == d.name) return field_error(at + ".function.name", fmt::format("'{}' is given twice", d.name));
      if (auto p = f.find("parameters"); p != f.end() && !p->is_null()) {
        if (!p->is_object()) return field_error(at + ".function.parameters", "must be a JSON Schema object");
        d.parameters_json = p->dump();
        // What the grammar engine would not enforce in the arguments is refused, as in a json_schema.
        if (Status c = check_json_schema(d.parameters_json); !c.is_ok()) {
          // "$.properties.x.uniqueItems: 'uniqueItems' is not ..." -> under this function's parameters.
          const std::string& message = c.message();
          const size_t colon = message.find(": ");
          if (!message.starts_with("$") || colon == std::string::npos)
            return field_error(at + ".function.parameters", message);
          return field_error(at + ".function.parameters" + message.substr(1, colon - 1), message.substr(colon + 2));
        }
      }
      r.tools.push_back(std::move(d));
    }
    r.tools_json = t->dump();
  }
  auto c = j.find("tool_choice");
  if (c == j.end() || c->is_null()) {
    r.tool_choice.mode = has_tools ? ToolChoice::Mode::kAuto : ToolChoice::Mode::kNone;
  } else if (c->is_string()) {
    const std::string mode = c->get<std::string>();
    if (mode == "none") r.tool_choice.mode = ToolChoice::Mode::kNone;
    else if (mode == "auto") r.tool_choice.mode = ToolChoice::Mode::kAuto;
    else if (mode == "required") r.tool_choice.mode = ToolChoice::Mode::kRequired;
    else return field_error("tool_choice", fmt::format("'{}' is not none, auto, required or a function", mode));
  } else if (c->is_object() && c->value("type", "") == "function" && c->contains("function") &&
             (*c)["function"].is_object() && (*c)["function"].contains("name") && (*c)["function"]["name"].is_string()) {
    r.tool_choice.mode = ToolChoice::Mode::kNamed;
    r.tool_choice.name = (*c)["function"]["name"].get<std::string>();
  } else {
    return field_error("tool_choice", "must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", \"function\": {\"name\": ...}}");
  }
  if (!has_tools && r.tool_choice.mode != ToolChoice::Mode::kNone)
    return field_error("tool_choice", "needs 'tools'");
  if (r.tool_choice.mode == ToolChoice::Mode::kNamed &&
      std::none_of(r.tools.begin(), r.tools.end(), [&](const ToolDef& d) { return d.name == r.tool_choice.name; }))
    return field_error("tool_choice", fmt::format("function '{}' is not among the tools", r.tool_choice.name));
  if (r.tool_choice.mode != ToolChoice::Mode::kNone && grammar && grammar->kind != GrammarKind::kJsonSchema &&
      grammar->kind != GrammarKind::kJsonObject)
    return field_error("tool_choice", fmt::format("tool calls together with '{}' are not supported (only a JSON "
                                                  "response_format or guided_json combines with tools); give one of "
                                                  "them (or tool_choice \"none\")", grammar_field));
  return Status::ok();
}

}  // namespace tessera
