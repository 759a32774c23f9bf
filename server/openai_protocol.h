// The OpenAI HTTP API's request and response shapes (completions and chat completions):
// parsing and validation of request JSON into plain structs, and rendering of responses,
// stream chunks and error objects. The one file of the API layer that uses nlohmann::json.
// Unknown request fields are ignored; invalid values are a 400 naming the field.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/sampling_params.h"
#include "common/status.h"
#include "grammar/grammar.h"
#include "server/structured_request.h"
#include "server/tool_calls.h"

namespace tessera {

// A prompt as given: text, or token ids.
struct PromptInput {
  std::string text;
  std::vector<int32_t> ids;
  bool is_ids = false;
};

struct ChatMessageInput {
  std::string role;
  std::string content;
  // A JSON object of the message's other members the chat template sees: an assistant turn's
  // tool_calls (arguments as objects), a tool result's tool_call_id and name. "" when none.
  std::string extra_json;
};

// What completions and chat share.
struct GenerationParams {
  std::string model;                 // empty: not given
  int64_t max_tokens = -1;           // -1: not given (completions default 16; chat: up to the context)
  SamplingParams sampling;
  std::vector<std::string> stop;
  int32_t n = 1;
  bool ignore_eos = false;
  int64_t min_tokens = 0;
  bool stream = false;
  bool include_usage = false;
  int32_t priority = 0;              // 0: interactive (default), larger: lower priority
  std::string speculation;           // "off" | "auto" | "ngram" | "draft"; empty: the server's setting
  // Structured outputs (response_format json_object / json_schema, or vLLM's guided_* and
  // structured_outputs fields); grammar_field names the field it came from, for errors.
  std::optional<GrammarSpec> grammar;
  std::string grammar_field;
};

struct CompletionRequest {
  std::vector<PromptInput> prompts;  // one choice group per prompt
  GenerationParams params;
  int32_t logprobs = -1;             // -1: none; else top-n (0..20)
  bool echo = false;
};

struct ChatRequest {
  std::vector<ChatMessageInput> messages;
  GenerationParams params;
  bool logprobs = false;
  int32_t top_logprobs = 0;
  ToolRequest tools_request;  // tools, tool_choice, parallel_tool_calls
  // chat_template_kwargs (vLLM's field): more variables for the chat template, a JSON object
  // ("" when absent), e.g. {"enable_thinking": false} for Qwen3.
  std::string template_kwargs_json;
};

// kInvalidArgument with a message naming the field: "'max_tokens' must be >= 0, got -1".
Result<CompletionRequest> parse_completion_request(std::string_view body);
Result<ChatRequest> parse_chat_request(std::string_view body);

// {"error": {"message", "type", "param", "code"}}; type from the HTTP status.
std::string error_body(int http_status, std::string_view message, std::string_view param = "");

struct TokenLogprob {
  std::string token;                 // the token's text
  std::optional<float> logprob;      // none (JSON null) for the first token of an echoed prompt
  std::vector<std::pair<std::string, float>> top;  // text, logprob
};

struct Usage {
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
};

// Completions: a whole response, and one stream chunk (text delta of choice `index`).
struct CompletionChoice {
  int32_t index = 0;
  std::string text;
  std::optional<std::string> finish_reason;
  std::vector<TokenLogprob> logprobs;  // empty and !has_logprobs: "logprobs": null
  bool has_logprobs = false;
  std::vector<int64_t> text_offsets;
};
std::string render_completion(const std::string& id, int64_t created, const std::string& model,
                              const std::vector<CompletionChoice>& choices, const Usage& usage);
std::string render_completion_chunk(const std::string& id, int64_t created, const std::string& model,
                                    const CompletionChoice& choice);

struct ChatChoice {
  int32_t index = 0;
  std::string content;
  std::string reasoning_content;      // a reasoning model's thinking (--reasoning-parser)
  bool content_null = false;          // a whole message with tool calls and no text: "content": null
  std::vector<ToolCall> tool_calls;   // whole: every call; a chunk: the calls completed now
  int32_t first_tool_call_index = 0;  // a chunk: the index of tool_calls[0] among the choice's calls
  std::optional<std::string> finish_reason;
  std::vector<TokenLogprob> logprobs;
  bool has_logprobs = false;
};
std::string render_chat(const std::string& id, int64_t created, const std::string& model,
                        const std::vector<ChatChoice>& choices, const Usage& usage);
// A chat delta chunk: `role` set on the first chunk of a choice; content may be empty.
std::string render_chat_chunk(const std::string& id, int64_t created, const std::string& model,
                              const ChatChoice& delta, bool with_role);
// The final usage chunk: same object type, empty choices.
std::string render_usage_chunk(const std::string& id, int64_t created, const std::string& model, bool chat,
                               const Usage& usage);

// "data: {json}\n\n" and the terminator.
std::string sse_event(const std::string& json);
inline constexpr std::string_view kSseDone = "data: [DONE]\n\n";

}  // namespace tessera
