// The chat templates Tessera ships (template/builtin_chat_template.h): the Gemma 3 turn format,
// and, with the real default model when present, that its rendered prompt tokenizes to one BOS
// followed by the turn tokens.
#include "template/builtin_chat_template.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "model/gguf.h"
#include "tests/default_model_file.h"
#include "tokenizer/tokenizer.h"

namespace tessera {
namespace {

ChatTemplate gemma() {
  auto t = builtin_chat_template(Architecture::kGemma3);
  EXPECT_TRUE(t.is_ok()) << t.status().to_string();
  return std::move(t).value();
}

ChatTemplateOptions gemma_options(bool add_generation_prompt = true) {
  ChatTemplateOptions o;
  o.add_generation_prompt = add_generation_prompt;
  o.bos_token = "<bos>";
  o.eos_token = "<eos>";
  return o;
}

struct GemmaCase {
  const char* name;
  std::vector<ChatMessage> messages;
  bool add_generation_prompt;
  const char* expected;
};

TEST(BuiltinChatTemplateTest, GemmaTurns) {
  const GemmaCase cases[] = {
      {"one user turn", {{"user", "Hello"}}, true,
       "<bos><start_of_turn>user\nHello<end_of_turn>\n<start_of_turn>model\n"},
      {"no generation prompt", {{"user", "Hello"}}, false, "<bos><start_of_turn>user\nHello<end_of_turn>\n"},
      {"assistant is model",
       {{"user", "Hi"}, {"assistant", "Hello!"}, {"user", "Name a color."}},
       true,
       "<bos><start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\nHello!<end_of_turn>\n"
       "<start_of_turn>user\nName a color.<end_of_turn>\n<start_of_turn>model\n"},
      {"system joins the first user turn",
       {{"system", "Be brief."}, {"user", "Hi"}, {"assistant", "Hello."}, {"user", "Bye"}},
       true,
       "<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\nHello.<end_of_turn>\n"
       "<start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n"},
      {"content is trimmed", {{"user", "  Hi there \n"}}, false, "<bos><start_of_turn>user\nHi there<end_of_turn>\n"},
      {"system alone", {{"system", "Be brief."}}, true,
       "<bos><start_of_turn>user\nBe brief.<end_of_turn>\n<start_of_turn>model\n"},
      {"empty conversation", {}, true, "<bos><start_of_turn>model\n"},
  };
  const ChatTemplate t = gemma();
  for (const GemmaCase& c : cases) {
    SCOPED_TRACE(c.name);
    auto out = t.render(c.messages, gemma_options(c.add_generation_prompt));
    ASSERT_TRUE(out.is_ok()) << out.status().to_string();
    EXPECT_EQ(*out, c.expected);
  }
}

// (A tool result is a turn of its own since tools came: GemmaToolsAndToolResults.)
TEST(BuiltinChatTemplateTest, GemmaRefusesOtherRoles) {
  const ChatTemplate t = gemma();
  for (const std::vector<ChatMessage>& messages :
       {std::vector<ChatMessage>{{"user", "a"}, {"critic", "b"}}, std::vector<ChatMessage>{{"user", "a"}, {"system", "b"}}}) {
    auto out = t.render(messages, gemma_options());
    ASSERT_FALSE(out.is_ok());
    EXPECT_EQ(out.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(out.status().message().find("is not supported"), std::string::npos) << out.status().message();
  }
}

TEST(BuiltinChatTemplateTest, OnlyGemmaHasOne) {
  EXPECT_TRUE(builtin_chat_template_source(Architecture::kGemma3).has_value());
  for (Architecture a : {Architecture::kLlama, Architecture::kMistral, Architecture::kQwen2, Architecture::kQwen3}) {
    EXPECT_FALSE(builtin_chat_template_source(a).has_value());
    EXPECT_EQ(builtin_chat_template(a).status().code(), StatusCode::kNotFound);
  }
}

// The template a row of the architecture table names (model/architecture.h) is compiled in and
// parses; a row that names none has none.
TEST(BuiltinChatTemplateTest, EachArchitectureRowsTemplate) {
  for (const ArchitectureTraits& row : kArchitectureTable) {
    auto t = builtin_chat_template(row.arch);
    if (row.builtin_chat_template.empty()) {
      EXPECT_EQ(t.status().code(), StatusCode::kNotFound) << row.name;
      EXPECT_NE(t.status().message().find(row.name), std::string::npos) << t.status().message();
    } else {
      EXPECT_TRUE(t.is_ok()) << row.name << ": " << t.status().to_string();
      EXPECT_EQ(builtin_chat_template_source(row.arch), builtin_chat_template_source_by_name(row.builtin_chat_template));
    }
  }
  EXPECT_FALSE(builtin_chat_template_source_by_name("").has_value());
  EXPECT_FALSE(builtin_chat_template_source_by_name("no-such-template").has_value());
}

// The real file has no template of its own (so the server falls back to the built-in one), its
// tokenizer reads the rendered turn markers as single tokens, and the prompt starts with exactly
// one BOS (the server encodes rendered conversations without adding special tokens).
TEST(BuiltinChatTemplateTest, RealGemmaPromptTokenizesWithOneBos) {
  const std::string path = testing::default_model_file();
  if (path.empty()) GTEST_SKIP() << "default model absent (scripts/default_model.sh fetches it)";
  auto gguf = GgufFile::open_metadata(path);
  ASSERT_TRUE(gguf.is_ok()) << gguf.status().to_string();
  EXPECT_EQ(ChatTemplate::from_gguf(**gguf).status().code(), StatusCode::kNotFound);
  auto tok = Tokenizer::from_gguf(**gguf);
  ASSERT_TRUE(tok.is_ok()) << tok.status().to_string();
  ChatTemplateOptions o;
  o.bos_token = (*tok)->bos_token();
  o.eos_token = (*tok)->eos_token();
  auto text = gemma().render({{"system", "Be brief."}, {"user", "Hello"}}, o);
  ASSERT_TRUE(text.is_ok()) << text.status().to_string();
  const std::vector<int32_t> ids = (*tok)->encode(*text, /*add_special=*/false);
  ASSERT_GE(ids.size(), 4u);
  const int32_t bos = (*tok)->bos_id();
  EXPECT_EQ(ids[0], bos);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), bos), 1);
  const auto start = (*tok)->token_to_id("<start_of_turn>");
  const auto end = (*tok)->token_to_id("<end_of_turn>");
  ASSERT_TRUE(start && end);
  EXPECT_EQ(ids[1], *start);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), *start), 2);  // the user turn and the model prompt
  EXPECT_EQ(std::count(ids.begin(), ids.end(), *end), 1);
  const std::vector<int32_t> stops = (*tok)->eos_ids();
  EXPECT_NE(std::find(stops.begin(), stops.end(), *end), stops.end()) << "the tokenizer's stop set lacks <end_of_turn>";
}

}  // namespace
}  // namespace tessera

namespace tessera {
namespace {

// Tools on the built-in Gemma 3 template (Tessera's convention): the functions join the system
// text, a call is written <tool_call>{...}</tool_call>, a tool result is a user turn. The
// expected text is what Python's jinja2 3.1 renders from the same template file.
TEST(BuiltinChatTemplateTest, GemmaToolsAndToolResults) {
  auto t = builtin_chat_template(Architecture::kGemma3);
  ASSERT_TRUE(t.is_ok()) << t.status().to_string();
  ChatTemplateOptions o;
  o.bos_token = "<bos>";
  o.extra_context_json =
      R"({"tools": [{"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {"zone": {"type": "string"}}}}}]})";
  std::vector<ChatMessage> messages = {
      {"system", "Be brief.", ""},
      {"user", "Time?", ""},
      {"assistant", "",
       R"({"tool_calls": [{"id": "c1", "type": "function", "function": {"name": "get_time", "arguments": {"zone": "utc"}}}]})"},
      {"tool", "12:00", R"({"tool_call_id": "c1"})"}};
  auto text = t->render(messages, o);
  ASSERT_TRUE(text.is_ok()) << text.status().to_string();
  EXPECT_EQ(*text,
            "<bos><start_of_turn>user\nBe brief.\n\nYou can call these functions. To call one, reply with "
            "<tool_call>{\"name\": <function name>, \"arguments\": <arguments object>}</tool_call> (one per call) and "
            "nothing else.\n\n{\"type\": \"function\", \"function\": {\"name\": \"get_time\", \"parameters\": {\"type\": "
            "\"object\", \"properties\": {\"zone\": {\"type\": \"string\"}}}}}\n\nTime?<end_of_turn>\n<start_of_turn>model\n"
            "<tool_call>{\"name\": \"get_time\", \"arguments\": {\"zone\": \"utc\"}}</tool_call><end_of_turn>\n"
            "<start_of_turn>user\n<tool_response>\n12:00\n</tool_response><end_of_turn>\n<start_of_turn>model\n");
}

}  // namespace
}  // namespace tessera
