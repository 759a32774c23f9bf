// Chat templates: an interpreter for the subset of Jinja2 that the chat templates of Llama 3,
// Qwen 3 (ChatML), Mistral and Gemma 3 use, reading `chat_template` from tokenizer_config.json
// or GGUF metadata (`tokenizer.chat_template`).
#pragma once

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
};

struct ChatTemplateOptions {
  bool add_generation_prompt = true;
  std::string bos_token;  // the tokenizer's string forms, bound as template variables
  std::string eos_token;
};

class ChatTemplate {
 public:
  ~ChatTemplate();
  ChatTemplate(ChatTemplate&&) noexcept;
  ChatTemplate& operator=(ChatTemplate&&) noexcept;

  // Parses the template once; syntax errors name the line and column.
  static Result<ChatTemplate> parse(std::string_view source);
  // Reads `chat_template` (a string, or the "default" entry of a list) from tokenizer_config.json.
  static Result<ChatTemplate> from_tokenizer_config(const std::string& path);
  static Result<ChatTemplate> from_gguf(const GgufFile& gguf);

  // Renders the conversation. Template `raise_exception(...)` calls become InvalidArgument
  // errors carrying the template's message.
  Result<std::string> render(const std::vector<ChatMessage>& messages,
                             const ChatTemplateOptions& options) const;

 private:
  ChatTemplate();
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tessera
