// Tool calling (docs/structured_outputs.md): how each model family writes a call, the grammar
// that holds a call to the function's parameter schema, and the parser that turns the model's
// text into OpenAI tool calls, streamed or whole (the whole answer is the streamed one run to
// the end, so the two always agree).
//
// Formats, chosen from the chat template's text:
//   * kHermes: <tool_call>{"name": ..., "arguments": {...}}</tool_call> (Qwen 2.5 / 3, Hermes;
//     and the convention of Tessera's built-in Gemma 3 template, which has no tool tokens);
//   * kLlama3Json: {"name": ..., "parameters": {...}} as the whole reply (Llama 3.1 / 3.2 / 3.3;
//     calls separated by "; "), after an optional <|python_tag|>;
//   * kMistral: [TOOL_CALLS][{"name": ..., "arguments": {...}}, ...] (Mistral 7B v0.3, Mixtral,
//     Mistral Nemo / Small), or [TOOL_CALLS]name[ARGS]{...} (the newer tokenizers; an optional
//     [CALL_ID]id before [ARGS]); the grammar writes the first.
// The tokenizers keep these markers as text (tokenizer/tokenizer.h kToolCallMarkers), so the
// grammar can allow the model's own marker token and the parser sees it.
// A call whose text does not parse as one stays in the content: it never vanishes.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace tessera {

enum class ToolFormat : int { kHermes = 0, kLlama3Json, kMistral };
const char* tool_format_name(ToolFormat f);
// The format a chat template's model writes calls in: kMistral for a template with [TOOL_CALLS],
// kLlama3Json for one with Llama 3's header tokens (and no <tool_call>), else kHermes.
ToolFormat tool_format_for_template(std::string_view template_source);

struct ToolDef {
  std::string name;
  std::string parameters_json = R"({"type": "object"})";  // a JSON Schema
};

// tool_choice: "none", "auto", "required", or {"type": "function", "function": {"name": ...}}.
struct ToolChoice {
  enum class Mode { kNone, kAuto, kRequired, kNamed } mode = Mode::kAuto;
  std::string name;  // kNamed
};

struct ToolCall {
  std::string id;         // "call_..." (unique per call)
  std::string name;
  std::string arguments;  // JSON text of the arguments object
};

// The grammar engine's structural tag (xgrammar's JSON format) for these tools: free text with
// calls whose arguments follow each function's schema (auto), at least one call and no text
// before it (required), or one call of the named function. parallel: more than one call.
// `content_schema` (a JSON Schema, with auto: the request's JSON response_format): the reply is
// calls, or instead of free text a JSON value matching it. InvalidArgument for a named function
// that is not among the tools.
Result<std::string> tool_call_structural_tag(ToolFormat format, const std::vector<ToolDef>& tools,
                                             const ToolChoice& choice, bool parallel,
                                             const std::optional<std::string>& content_schema = std::nullopt);

// Turns text deltas into content deltas and complete calls. Text that may begin a call is held
// back until the call is complete (or proves not to be one).
class ToolCallParser {
 public:
  explicit ToolCallParser(ToolFormat format) : format_(format) {}
  struct Output {
    std::string content;          // text to show now
    std::vector<ToolCall> calls;  // calls completed by this text
  };
  Output push(std::string_view text);
  // The end of the output: whatever is held back is content (an unfinished call included).
  Output finish();

 private:
  void scan(Output& out, bool at_end);
  void scan_hermes(Output& out, bool at_end);
  void scan_llama3(Output& out, bool at_end);
  void scan_mistral(Output& out, bool at_end);
  // Moves the text before `marker` into the content, holding back a suffix that may begin it
  // (unless at_end); true when pending_ now starts with the marker.
  bool content_until(Output& out, std::string_view marker, bool at_end);
  // Drops the blanks after a call; false when nothing else is pending yet.
  bool skip_blanks_after_call();
  ToolFormat format_;
  std::string pending_;
  bool after_call_ = false; // kHermes, kMistral: a call just ended (its trailing blanks are dropped)
  bool started_ = false;  // kLlama3Json: the reply's first non-blank character was seen
  bool in_calls_ = false; // kLlama3Json: the reply is calls
};

// The whole output at once (what push + finish give).
ToolCallParser::Output parse_tool_calls(ToolFormat format, std::string_view text);

}  // namespace tessera
