// The <think> ... </think> split of a reasoning model's reply (server/reasoning.h): the same
// reasoning and content however the text arrives (whole, cut at every byte, byte by byte).
#include "server/reasoning.h"

#include <gtest/gtest.h>

namespace tessera {
namespace {

struct Split {
  std::string reasoning;
  std::string content;
};

Split split(const std::vector<std::string>& pieces, bool inside) {
  ReasoningSplitter s(inside);
  Split out;
  for (const std::string& p : pieces) {
    ReasoningSplitter::Output o = s.push(p);
    out.reasoning += o.reasoning;
    out.content += o.content;
  }
  ReasoningSplitter::Output o = s.finish();
  out.reasoning += o.reasoning;
  out.content += o.content;
  return out;
}

// Every way of cutting `text` in two, and byte by byte, gives the whole text's split.
void expect_split(const std::string& text, bool inside, const std::string& reasoning, const std::string& content) {
  const Split whole = split({text}, inside);
  EXPECT_EQ(whole.reasoning, reasoning) << text;
  EXPECT_EQ(whole.content, content) << text;
  for (size_t cut = 0; cut <= text.size(); ++cut) {
    const Split two = split({text.substr(0, cut), text.substr(cut)}, inside);
    EXPECT_EQ(two.reasoning, reasoning) << text << " cut at " << cut;
    EXPECT_EQ(two.content, content) << text << " cut at " << cut;
  }
  std::vector<std::string> bytes;
  for (const char c : text) bytes.emplace_back(1, c);
  const Split each = split(bytes, inside);
  EXPECT_EQ(each.reasoning, reasoning) << text;
  EXPECT_EQ(each.content, content) << text;
}

TEST(ReasoningSplitter, ThinkingGoesApartFromTheAnswer) {
  expect_split("<think>First, 2 < 3.</think>\n\nThe answer is 3.", false, "First, 2 < 3.", "The answer is 3.");
  expect_split("\n<think>a</thin></think>{\"x\": 1}", false, "a</thin>", "{\"x\": 1}");
  // The prompt opened the reasoning: the output starts inside it.
  expect_split("I should call the tool.</think><tool_call>{}</tool_call>", true, "I should call the tool.",
               "<tool_call>{}</tool_call>");
  // No reasoning: all content, a "<" that does not open it included.
  expect_split("Hello <b>there</b>", false, "", "Hello <b>there</b>");
  expect_split("<thing>", false, "", "<thing>");
  expect_split("  plain", false, "", "  plain");
  // A reasoning part never closed (max_tokens) stays reasoning; a held "</thi" too.
  expect_split("<think>still going </thi", false, "still going </thi", "");
  expect_split("still going", true, "still going", "");
  // Tags only in the reasoning's middle are text; the answer may mention them.
  expect_split("<think>x</think>say <think> later", false, "x", "say <think> later");
  expect_split("", false, "", "");
}

TEST(ReasoningSplitter, TemplatesAndPrompts) {
  EXPECT_TRUE(template_has_reasoning("{% if x %}<think>\n{% endif %}</think>"));
  EXPECT_FALSE(template_has_reasoning("{{ bos_token }}<start_of_turn>"));
  EXPECT_TRUE(prompt_opens_reasoning("<|im_start|>assistant\n<think>\n"));
  EXPECT_FALSE(prompt_opens_reasoning("<|im_start|>assistant\n<think>\n\n</think>\n\n"));
  EXPECT_TRUE(prompt_closes_reasoning("<|im_start|>assistant\n<think>\n\n</think>\n\n"));
  EXPECT_FALSE(prompt_closes_reasoning("<|im_start|>assistant\n"));
}

}  // namespace
}  // namespace tessera
