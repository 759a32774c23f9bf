// Reasoning models (Qwen3, DeepSeek-R1 style) write their thinking between `<think>` and
// `</think>` before the answer. The OpenAI-style API (vLLM's and SGLang's `reasoning_content`)
// returns that part apart from `content`: ReasoningSplitter cuts a choice's text as it streams.
#pragma once

#include <string>
#include <string_view>

namespace tessera {

class ReasoningSplitter {
 public:
  // `inside`: the prompt opened "<think>" already (the template's generation prompt ends with it),
  // so the output starts in the reasoning; otherwise the reasoning is there only when the output
  // opens it (after leading whitespace).
  explicit ReasoningSplitter(bool inside) : state_(inside ? State::kReasoning : State::kStart) {}

  struct Output {
    std::string reasoning;
    std::string content;
  };
  // The next piece of the output. Text that might be the start of a tag is held back until the
  // next piece (or finish()) shows what it is, so a tag cut across pieces is still found.
  Output push(std::string_view text);
  // The end of the output: what was held back. A reasoning part never closed stays reasoning.
  Output finish();

 private:
  enum class State { kStart, kReasoning, kAfter, kContent };
  State state_;
  std::string held_;
};

// True when a chat template's source writes reasoning tags (the default of `--reasoning-parser`).
bool template_has_reasoning(std::string_view template_source);

// True when the rendered prompt ends inside an opened "<think>" (trailing whitespace aside).
bool prompt_opens_reasoning(std::string_view prompt);
// True when it ends right after "</think>": the template closed the reasoning (thinking off).
bool prompt_closes_reasoning(std::string_view prompt);

}  // namespace tessera
