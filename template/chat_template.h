// Chat templates: an interpreter for the subset of Jinja2 that the chat templates of Llama 3,
// Qwen 3 (ChatML), Mistral and Gemma 3 use, reading `chat_template` from tokenizer_config.json
// or GGUF metadata (`tokenizer.chat_template`).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace tessera {

class GgufFile;

struct ChatMessage {
  std::string role;     // "system", "user", "assistant", "tool"
  std::string content;
  // A JSON object whose members the message's dict also gets (tool_calls, tool_call_id, name).
  std::string extra_json;
};

struct ChatTemplateOptions {
  bool add_generation_prompt = true;
  std::string bos_token;  // the tokenizer's string forms, bound as template variables
  std::string eos_token;
  // A JSON object whose members become further template variables, overriding the ones above:
  // e.g. {"enable_thinking": false} or {"tools": [...]}. Empty: none.
  std::string extra_context_json;
  // strftime_now()'s clock in seconds since the Unix epoch (formatted in local time); < 0: now.
  int64_t now_unix_seconds = -1;
  // Bounds on one render; exceeding one is a ResourceExhausted error, never a hang.
  int64_t max_output_bytes = int64_t{32} << 20;
  int64_t max_loop_iterations = 1'000'000;
};

class ChatTemplate {
 public:
  ~ChatTemplate();
  ChatTemplate(ChatTemplate&&) noexcept;
  ChatTemplate& operator=(ChatTemplate&&) noexcept;

  // Parses the template once; syntax errors name the line and column.
  static Result<ChatTemplate> parse(std::string_view source);
  // Reads `chat_template` (a string, or the "default" entry of a list of {name, template}) from
  // tokenizer_config.json; when the field is absent, reads chat_template.jinja beside it (where
  // newer transformers versions save the template).
  static Result<ChatTemplate> from_tokenizer_config(const std::string& path);
  static Result<ChatTemplate> from_gguf(const GgufFile& gguf);

  // Renders the conversation. The template sees `messages` (dicts with role and content),
  // `add_generation_prompt`, `bos_token`, `eos_token`, `tools` and `documents` (None, as
  // transformers passes them when absent) and the members of extra_context_json.
  // Template `raise_exception(...)` calls become InvalidArgument errors carrying exactly the
  // template's message; other template errors are InvalidArgument "chat template: line N: ...".
  // Thread-safe: one parsed template may render on several threads at once.
  Result<std::string> render(const std::vector<ChatMessage>& messages,
                             const ChatTemplateOptions& options) const;
  // The template's text.
  const std::string& source() const;

 private:
  ChatTemplate();
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tessera
