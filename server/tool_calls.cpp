#include "server/tool_calls.h"

#include <cctype>
#include <random>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace tessera {
namespace {

using json = nlohmann::json;

constexpr std::string_view kHermesOpen = "<tool_call>";
constexpr std::string_view kHermesClose = "</tool_call>";
constexpr std::string_view kPythonTag = "<|python_tag|>";
constexpr std::string_view kMistralCalls = "[TOOL_CALLS]";
constexpr std::string_view kMistralArgs = "[ARGS]";
constexpr std::string_view kMistralCallId = "[CALL_ID]";

std::string call_id() {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  return fmt::format("call_{:016x}{:08x}", rng(), static_cast<uint32_t>(rng()));
}

// The length of the longest suffix of `text` that is a proper prefix of `tag` (text that may be
// the start of the tag, held back until the next delta decides).
size_t partial_suffix(std::string_view text, std::string_view tag) {
  for (size_t n = std::min(text.size(), tag.size() - 1); n > 0; --n)
    if (tag.substr(0, n) == text.substr(text.size() - n)) return n;
  return 0;
}

// The end (one past the closing bracket) of the JSON object or array that starts at text[0]
// ('{' or '['), or npos while it is not closed yet.
size_t object_end(std::string_view text) {
  int depth = 0;
  bool in_string = false, escaped = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
      continue;
    }
    if (c == '"') in_string = true;
    else if (c == '{' || c == '[') ++depth;
    else if ((c == '}' || c == ']') && --depth == 0) return i + 1;
  }
  return std::string_view::npos;
}

// {"name": string, <args_key>: object} -> a call; nullopt when the text is not one.
std::optional<ToolCall> call_from_json(std::string_view text, const char* args_key) {
  json j = json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return std::nullopt;
  auto name = j.find("name");
  auto args = j.find(args_key);
  if (name == j.end() || !name->is_string() || name->get<std::string>().empty()) return std::nullopt;
  if (args != j.end() && !args->is_object()) return std::nullopt;
  return ToolCall{call_id(), name->get<std::string>(), args == j.end() ? "{}" : args->dump()};
}

bool blank(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

size_t skip_blanks(std::string_view text, size_t i = 0) {
  while (i < text.size() && blank(text[i])) ++i;
  return i;
}

// A function name as the newer Mistral format writes it before [ARGS].
bool function_name(std::string_view s) {
  if (s.empty()) return false;
  for (const char c : s)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_' && c != '-' && c != '.') return false;
  return true;
}

// [{"name": ..., "arguments": {...}}, ...] -> the calls; nullopt unless every element is one.
std::optional<std::vector<ToolCall>> calls_from_array(std::string_view text) {
  json j = json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_array() || j.empty()) return std::nullopt;
  std::vector<ToolCall> calls;
  for (const json& e : j) {
    std::optional<ToolCall> c = call_from_json(e.dump(), "arguments");
    if (!c) return std::nullopt;
    calls.push_back(std::move(*c));
  }
  return calls;
}

}  // namespace

const char* tool_format_name(ToolFormat f) {
  switch (f) {
    case ToolFormat::kLlama3Json: return "llama3_json";
    case ToolFormat::kMistral: return "mistral";
    case ToolFormat::kHermes: break;
  }
  return "hermes";
}

ToolFormat tool_format_for_template(std::string_view source) {
  if (source.find(kMistralCalls) != std::string_view::npos) return ToolFormat::kMistral;
  if (source.find("<|start_header_id|>") != std::string_view::npos &&
      source.find("<tool_call>") == std::string_view::npos)
    return ToolFormat::kLlama3Json;
  return ToolFormat::kHermes;
}

Result<std::string> tool_call_structural_tag(ToolFormat format, const std::vector<ToolDef>& tools,
                                             const ToolChoice& choice, bool parallel,
                                             const std::optional<std::string>& content_schema) {
  json tags = json::array();
  for (const ToolDef& t : tools) {
    if (choice.mode == ToolChoice::Mode::kNamed && t.name != choice.name) continue;
    json params = json::parse(t.parameters_json, nullptr, false);
    if (params.is_discarded()) params = json::object({{"type", "object"}});
    const std::string name = json(t.name).dump();
    json tag;
    tag["type"] = "tag";
    if (format == ToolFormat::kHermes) {
      tag["begin"] = fmt::format("{}\n{{\"name\": {}, \"arguments\": ", kHermesOpen, name);
      tag["end"] = fmt::format("}}\n{}", kHermesClose);
    } else if (format == ToolFormat::kMistral) {
      tag["begin"] = fmt::format("{}[{{\"name\": {}, \"arguments\": ", kMistralCalls, name);
      tag["end"] = "}]";
    } else {
      tag["begin"] = fmt::format("{{\"name\": {}, \"parameters\": ", name);
      tag["end"] = "}";
    }
    // At most one blank between JSON tokens: a model cannot fill a call with whitespace.
    tag["content"] = {{"type", "json_schema"}, {"json_schema", params}, {"max_whitespace_cnt", 1}};
    tags.push_back(std::move(tag));
  }
  if (tags.empty())
    return Status::invalid_argument(fmt::format("tool_choice names function '{}', which is not among the tools", choice.name));
  const bool json_reply = content_schema.has_value() && choice.mode == ToolChoice::Mode::kAuto;
  const bool required = choice.mode != ToolChoice::Mode::kAuto || json_reply;
  const bool one = !parallel || choice.mode == ToolChoice::Mode::kNamed;
  json format_json;
  if (required) {
    // Calls only: no text before, between or after them.
    format_json = {{"type", "tags_with_separator"},
                   {"tags", tags},
                   {"separator", format == ToolFormat::kHermes ? "\n" : format == ToolFormat::kMistral ? "" : "; "},
                   {"at_least_one", true},
                   {"stop_after_first", one}};
  } else {
    // Free text; once the model opens a call, the call follows the function's schema.
    format_json = {{"type", "triggered_tags"},
                   {"triggers", json::array({format == ToolFormat::kHermes    ? std::string(kHermesOpen)
                                             : format == ToolFormat::kMistral ? std::string(kMistralCalls)
                                                                              : std::string("{\"name\": ")})},
                   {"tags", tags},
                   {"at_least_one", false},
                   {"stop_after_first", one}};
  }
  if (json_reply) {
    // Calls, or a JSON reply: no free text either way.
    json schema = json::parse(*content_schema, nullptr, false);
    if (schema.is_discarded()) return Status::invalid_argument("the response format's schema is not JSON");
    format_json = {{"type", "or"},
                   {"elements", json::array({format_json, {{"type", "json_schema"},
                                                           {"json_schema", schema},
                                                           {"max_whitespace_cnt", 1}}})}};  // as the arguments
  }
  return json({{"type", "structural_tag"}, {"format", format_json}}).dump();
}

void ToolCallParser::scan(Output& out, bool at_end) {
  switch (format_) {
    case ToolFormat::kHermes: return scan_hermes(out, at_end);
    case ToolFormat::kLlama3Json: return scan_llama3(out, at_end);
    case ToolFormat::kMistral: return scan_mistral(out, at_end);
  }
}

bool ToolCallParser::content_until(Output& out, std::string_view marker, bool at_end) {
  const size_t open = pending_.find(marker);
  const size_t take = open != std::string::npos ? open
                      : at_end                  ? pending_.size()
                                                : pending_.size() - partial_suffix(pending_, marker);
  out.content += pending_.substr(0, take);
  pending_.erase(0, take);
  return open != std::string::npos;
}

bool ToolCallParser::skip_blanks_after_call() {
  if (!after_call_) return true;
  pending_.erase(0, skip_blanks(pending_));
  if (pending_.empty()) return false;
  after_call_ = false;
  return true;
}

void ToolCallParser::scan_hermes(Output& out, bool at_end) {
  for (;;) {
    // The blanks a model puts after a call (between calls, before its last words) are not content.
    if (!skip_blanks_after_call()) return;
    if (!content_until(out, kHermesOpen, at_end)) return;
    const size_t close = pending_.find(kHermesClose);
    if (close == std::string::npos) {
      if (at_end) {
        out.content += pending_;
        pending_.clear();
      }
      return;
    }
    const std::string_view body = std::string_view(pending_).substr(kHermesOpen.size(), close - kHermesOpen.size());
    if (auto call = call_from_json(body, "arguments")) {
      out.calls.push_back(std::move(*call));
      after_call_ = true;
    } else {
      out.content += pending_.substr(0, close + kHermesClose.size());
    }
    pending_.erase(0, close + kHermesClose.size());
  }
}

void ToolCallParser::scan_llama3(Output& out, bool at_end) {
  // The reply is calls when its first non-blank character opens an object, after an optional
  // <|python_tag|> (Llama 3.1's mark for a call; built-in tools' Python after it stays content).
  if (!started_) {
    const size_t i = skip_blanks(pending_);
    const std::string_view rest = std::string_view(pending_).substr(i);
    if (!at_end && rest.size() < kPythonTag.size() && kPythonTag.starts_with(rest)) return;  // maybe the tag
    size_t body = i;
    if (rest.starts_with(kPythonTag)) {
      body = skip_blanks(pending_, i + kPythonTag.size());
      if (body == pending_.size() && !at_end) return;
    }
    if (body == pending_.size()) {
      out.content += pending_;
      pending_.clear();
      return;
    }
    started_ = true;
    in_calls_ = pending_[body] == '{';
    if (in_calls_) pending_.erase(0, i);  // the tag stays until its call parses (else it is content)
  }
  if (!in_calls_) {
    out.content += pending_;
    pending_.clear();
    return;
  }
  for (;;) {
    size_t i = 0;
    for (bool more = true; more;) {
      more = false;
      while (i < pending_.size() && (blank(pending_[i]) || pending_[i] == ';')) ++i;
      if (pending_.compare(i, kPythonTag.size(), kPythonTag) == 0) i += kPythonTag.size(), more = true;
    }
    if (i == pending_.size()) {
      if (at_end) pending_.clear();
      return;
    }
    if (!at_end && kPythonTag.starts_with(std::string_view(pending_).substr(i))) return;  // maybe the tag
    if (pending_[i] != '{') break;  // text after the calls
    const size_t end = object_end(std::string_view(pending_).substr(i));
    if (end == std::string_view::npos) {
      if (!at_end) return;
      break;
    }
    auto call = call_from_json(std::string_view(pending_).substr(i, end), "parameters");
    if (!call) call = call_from_json(std::string_view(pending_).substr(i, end), "arguments");
    if (!call) break;
    out.calls.push_back(std::move(*call));
    pending_.erase(0, i + end);
  }
  // What does not parse as calls is content, from here on.
  in_calls_ = false;
  out.content += pending_;
  pending_.clear();
}

void ToolCallParser::scan_mistral(Output& out, bool at_end) {
  for (;;) {
    if (!skip_blanks_after_call()) return;
    if (!content_until(out, kMistralCalls, at_end)) return;
    const auto wait_or_content = [&] {  // the block is not complete yet
      if (at_end) {
        out.content += pending_;
        pending_.clear();
      }
    };
    const size_t body = skip_blanks(pending_, kMistralCalls.size());
    if (body == pending_.size()) return wait_or_content();
    const std::string_view rest = std::string_view(pending_).substr(body);
    if (rest[0] == '[') {  // [TOOL_CALLS][{...}, ...]
      const size_t end = object_end(rest);
      if (end == std::string_view::npos) return wait_or_content();
      if (auto calls = calls_from_array(rest.substr(0, end))) {
        for (ToolCall& c : *calls) out.calls.push_back(std::move(c));
        after_call_ = true;
      } else {
        out.content += pending_.substr(0, body + end);
      }
      pending_.erase(0, body + end);
      continue;
    }
    // [TOOL_CALLS]name[CALL_ID]id[ARGS]{...}, the [CALL_ID] part optional.
    const size_t args = rest.find(kMistralArgs);
    if (args == std::string_view::npos) {
      if (at_end) return wait_or_content();
      // Still the name (and call id): wait while it can be one.
      std::string_view name = rest.substr(0, rest.size() - partial_suffix(rest, kMistralArgs));
      if (const size_t id_mark = name.find(kMistralCallId); id_mark != std::string_view::npos)
        name = name.substr(0, id_mark);
      else
        name = name.substr(0, name.size() - partial_suffix(name, kMistralCallId));
      if (name.empty() || function_name(name)) return;
      // Not a call: the marker is content; what follows it is scanned again.
      out.content += pending_.substr(0, kMistralCalls.size());
      pending_.erase(0, kMistralCalls.size());
      continue;
    }
    std::string_view name = rest.substr(0, args);
    if (const size_t id_mark = name.find(kMistralCallId); id_mark != std::string_view::npos) name = name.substr(0, id_mark);
    const std::string_view object = rest.substr(args + kMistralArgs.size());
    const size_t start = skip_blanks(object);
    if (start == object.size()) return wait_or_content();
    size_t consumed = body + args + kMistralArgs.size();
    std::optional<ToolCall> call;
    if (object[start] == '{') {
      const size_t end = object_end(object.substr(start));
      if (end == std::string_view::npos) return wait_or_content();
      consumed += start + end;
      json a = json::parse(object.substr(start, end), nullptr, false);
      if (function_name(name) && !a.is_discarded() && a.is_object()) call = ToolCall{call_id(), std::string(name), a.dump()};
    } else {
      consumed += start;
    }
    if (call) {
      out.calls.push_back(std::move(*call));
      after_call_ = true;
    } else {
      out.content += pending_.substr(0, consumed);
    }
    pending_.erase(0, consumed);
  }
}

ToolCallParser::Output ToolCallParser::push(std::string_view text) {
  Output out;
  pending_ += text;
  scan(out, false);
  return out;
}

ToolCallParser::Output ToolCallParser::finish() {
  Output out;
  scan(out, true);
  return out;
}

ToolCallParser::Output parse_tool_calls(ToolFormat format, std::string_view text) {
  ToolCallParser p(format);
  ToolCallParser::Output a = p.push(text);
  ToolCallParser::Output b = p.finish();
  a.content += b.content;
  for (ToolCall& c : b.calls) a.calls.push_back(std::move(c));
  return a;
}

}  // namespace tessera
