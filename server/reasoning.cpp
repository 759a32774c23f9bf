#include "server/reasoning.h"

#include <algorithm>

namespace tessera {
namespace {

constexpr std::string_view kOpen = "<think>";
constexpr std::string_view kClose = "</think>";

bool is_space(char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }

// The length of the longest suffix of `text` that is a proper prefix of `tag`.
size_t partial_tag_suffix(std::string_view text, std::string_view tag) {
  for (size_t n = std::min(text.size(), tag.size() - 1); n > 0; --n)
    if (text.substr(text.size() - n) == tag.substr(0, n)) return n;
  return 0;
}

}  // namespace

ReasoningSplitter::Output ReasoningSplitter::push(std::string_view text) {
  Output out;
  held_ += text;
  for (;;) {
    switch (state_) {
      case State::kStart: {
        const size_t first = held_.find_first_not_of(" \n\r\t");
        if (first == std::string::npos) return out;  // only whitespace so far
        const std::string_view rest = std::string_view(held_).substr(first);
        if (rest.starts_with(kOpen)) {
          held_.erase(0, first + kOpen.size());
          state_ = State::kReasoning;
          continue;
        }
        if (kOpen.starts_with(rest)) return out;  // "<thi": wait for more
        state_ = State::kContent;
        continue;
      }
      case State::kReasoning: {
        const size_t close = held_.find(kClose);
        if (close != std::string::npos) {
          out.reasoning += held_.substr(0, close);
          held_.erase(0, close + kClose.size());
          state_ = State::kAfter;
          continue;
        }
        const size_t keep = partial_tag_suffix(held_, kClose);
        out.reasoning += held_.substr(0, held_.size() - keep);
        held_.erase(0, held_.size() - keep);
        return out;
      }
      case State::kAfter: {  // the whitespace between "</think>" and the answer is neither
        size_t n = 0;
        while (n < held_.size() && is_space(held_[n])) ++n;
        held_.erase(0, n);
        if (held_.empty()) return out;
        state_ = State::kContent;
        continue;
      }
      case State::kContent:
        out.content += held_;
        held_.clear();
        return out;
    }
  }
}

ReasoningSplitter::Output ReasoningSplitter::finish() {
  Output out;
  if (state_ == State::kReasoning)
    out.reasoning = std::move(held_);
  else if (state_ != State::kAfter)
    out.content = std::move(held_);
  held_.clear();
  return out;
}

bool template_has_reasoning(std::string_view template_source) {
  return template_source.find(kOpen) != std::string_view::npos && template_source.find(kClose) != std::string_view::npos;
}

bool prompt_closes_reasoning(std::string_view prompt) {
  while (!prompt.empty() && is_space(prompt.back())) prompt.remove_suffix(1);
  return prompt.ends_with(kClose);
}

bool prompt_opens_reasoning(std::string_view prompt) {
  while (!prompt.empty() && is_space(prompt.back())) prompt.remove_suffix(1);
  return prompt.ends_with(kOpen);
}

}  // namespace tessera
