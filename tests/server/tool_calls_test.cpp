// Tool calling: the parser per family (streamed in any split equals whole; a call that does not
// parse stays in the content) and the call grammar (a walk through it on Gemma 3's vocabulary
// gives a call whose arguments match the function's schema).
#include "server/tool_calls.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "grammar/grammar.h"
#include "tests/testdata.h"
#include "tokenizer/tokenizer.h"

namespace tessera {
namespace {

using json = nlohmann::json;

// Every split of `text` into two deltas, and one character at a time, give the whole answer.
void expect_split_invariant(ToolFormat f, const std::string& text) {
  const ToolCallParser::Output whole = parse_tool_calls(f, text);
  auto same = [&](const ToolCallParser::Output& o, const std::string& how) {
    EXPECT_EQ(o.content, whole.content) << how;
    ASSERT_EQ(o.calls.size(), whole.calls.size()) << how;
    for (size_t i = 0; i < o.calls.size(); ++i) {
      EXPECT_EQ(o.calls[i].name, whole.calls[i].name) << how;
      EXPECT_EQ(o.calls[i].arguments, whole.calls[i].arguments) << how;
    }
  };
  auto run = [&](const std::vector<std::string>& deltas) {
    ToolCallParser p(f);
    ToolCallParser::Output all;
    auto take = [&](ToolCallParser::Output o) {
      all.content += o.content;
      for (auto& c : o.calls) all.calls.push_back(std::move(c));
    };
    for (const std::string& d : deltas) take(p.push(d));
    take(p.finish());
    return all;
  };
  for (size_t cut = 0; cut <= text.size(); ++cut) same(run({text.substr(0, cut), text.substr(cut)}), "cut " + std::to_string(cut));
  std::vector<std::string> chars;
  for (char c : text) chars.emplace_back(1, c);
  same(run(chars), "one character at a time");
}

TEST(ToolCalls, HermesCallsAndContent) {
  const std::string text =
      "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n"
      "<tool_call>{\"name\": \"get_time\", \"arguments\": {}}</tool_call>";
  auto out = parse_tool_calls(ToolFormat::kHermes, text);
  EXPECT_EQ(out.content, "Let me check.\n");
  ASSERT_EQ(out.calls.size(), 2u);
  EXPECT_EQ(out.calls[0].name, "get_weather");
  EXPECT_EQ(json::parse(out.calls[0].arguments), json({{"city", "Paris"}}));
  EXPECT_EQ(out.calls[1].name, "get_time");
  EXPECT_NE(out.calls[0].id, out.calls[1].id);
  EXPECT_EQ(out.calls[0].id.rfind("call_", 0), 0u);
  expect_split_invariant(ToolFormat::kHermes, text);
}

TEST(ToolCalls, WhatDoesNotParseStaysInTheContent) {
  const std::string broken = "a <tool_call>{\"name\": \"f\", \"arguments\": [1]}</tool_call> b <tool_call>{\"nam";
  auto out = parse_tool_calls(ToolFormat::kHermes, broken);
  EXPECT_TRUE(out.calls.empty());
  EXPECT_EQ(out.content, broken);
  expect_split_invariant(ToolFormat::kHermes, broken);
  // Text that only looks like the start of a tag is content once the next delta says so.
  expect_split_invariant(ToolFormat::kHermes, "x <tool_ca y <tool_callz>");
  EXPECT_EQ(parse_tool_calls(ToolFormat::kHermes, "x <tool_ca").content, "x <tool_ca");
}

TEST(ToolCalls, Llama3JsonCalls) {
  const std::string text = R"({"name": "get_weather", "parameters": {"city": "Oslo"}}; {"name": "f", "parameters": {"s": "}{"}})";
  auto out = parse_tool_calls(ToolFormat::kLlama3Json, text);
  EXPECT_EQ(out.content, "");
  ASSERT_EQ(out.calls.size(), 2u);
  EXPECT_EQ(json::parse(out.calls[1].arguments), json({{"s", "}{"}}));
  expect_split_invariant(ToolFormat::kLlama3Json, text);
  // A reply that does not start with an object is plain text, braces and all.
  const std::string prose = "Sure: {\"name\": \"f\"} is a call.";
  EXPECT_EQ(parse_tool_calls(ToolFormat::kLlama3Json, prose).content, prose);
  expect_split_invariant(ToolFormat::kLlama3Json, prose);
  expect_split_invariant(ToolFormat::kLlama3Json, "{\"not\": \"a call\"} then text");
  EXPECT_EQ(parse_tool_calls(ToolFormat::kLlama3Json, "{\"not\": \"a call\"} then text").content, "{\"not\": \"a call\"} then text");
}

TEST(ToolCalls, Llama3PythonTag) {
  const std::string text = "<|python_tag|>{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Oslo\"}}";
  auto out = parse_tool_calls(ToolFormat::kLlama3Json, text);
  EXPECT_EQ(out.content, "");
  ASSERT_EQ(out.calls.size(), 1u);
  EXPECT_EQ(out.calls[0].name, "get_weather");
  expect_split_invariant(ToolFormat::kLlama3Json, text);
  expect_split_invariant(ToolFormat::kLlama3Json, " <|python_tag|> " + text.substr(14) + "; <|python_tag|>{\"name\": \"f\"}");
  EXPECT_EQ(parse_tool_calls(ToolFormat::kLlama3Json, " <|python_tag|> " + text.substr(14) + "; {\"name\": \"f\"}").calls.size(), 2u);
  // Built-in tools' Python after the tag is not a JSON call: content, tag and all.
  const std::string python = "<|python_tag|>brave_search.call(query=\"x\")";
  EXPECT_EQ(parse_tool_calls(ToolFormat::kLlama3Json, python).content, python);
  expect_split_invariant(ToolFormat::kLlama3Json, python);
  // A call that does not parse keeps its tag in the content.
  const std::string broken = "<|python_tag|>{\"nam\": 1}";
  EXPECT_EQ(parse_tool_calls(ToolFormat::kLlama3Json, broken).content, broken);
  expect_split_invariant(ToolFormat::kLlama3Json, broken);
  expect_split_invariant(ToolFormat::kLlama3Json, "<|python_ta");
  EXPECT_EQ(parse_tool_calls(ToolFormat::kLlama3Json, "<|python_ta").content, "<|python_ta");
}

TEST(ToolCalls, MistralCalls) {
  // Mistral 7B v0.3 / Nemo: one array per [TOOL_CALLS].
  const std::string text = "Checking. [TOOL_CALLS] [{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}, "
                           "{\"name\": \"get_time\", \"arguments\": {}}]";
  auto out = parse_tool_calls(ToolFormat::kMistral, text);
  EXPECT_EQ(out.content, "Checking. ");
  ASSERT_EQ(out.calls.size(), 2u);
  EXPECT_EQ(out.calls[0].name, "get_weather");
  EXPECT_EQ(json::parse(out.calls[0].arguments), json({{"city", "Paris"}}));
  EXPECT_EQ(out.calls[1].name, "get_time");
  expect_split_invariant(ToolFormat::kMistral, text);
  // The newer tokenizers: name[ARGS]{...}, an optional [CALL_ID].
  const std::string v11 = "[TOOL_CALLS]get_weather[ARGS]{\"city\": \"]{\"}[TOOL_CALLS]get_time[CALL_ID]a1b2[ARGS]{}";
  out = parse_tool_calls(ToolFormat::kMistral, v11);
  EXPECT_EQ(out.content, "");
  ASSERT_EQ(out.calls.size(), 2u);
  EXPECT_EQ(json::parse(out.calls[0].arguments), json({{"city", "]{"}}));
  EXPECT_EQ(out.calls[1].name, "get_time");
  expect_split_invariant(ToolFormat::kMistral, v11);
  // What does not parse stays content.
  for (const std::string bad : {"a [TOOL_CALLS] [{\"name\": 3}] b", "[TOOL_CALLS]not a name[ARGS]{}",
                                "[TOOL_CALLS]f[ARGS]nope", "x [TOOL_CALLS][{\"name\": \"f\"", "[TOOL_CA",
                                "[TOOL_CALLS]f[ARGS]{\"a\": 1", "[TOOL_CALLS]"}) {
    EXPECT_EQ(parse_tool_calls(ToolFormat::kMistral, bad).content, bad);
    EXPECT_TRUE(parse_tool_calls(ToolFormat::kMistral, bad).calls.empty()) << bad;
    expect_split_invariant(ToolFormat::kMistral, bad);
  }
}

TEST(ToolCalls, FormatFromTheTemplate) {
  EXPECT_EQ(tool_format_for_template("{{ '<|im_start|>' }}<tool_call>"), ToolFormat::kHermes);
  EXPECT_EQ(tool_format_for_template("[AVAILABLE_TOOLS]{{ tools }}[/AVAILABLE_TOOLS] [TOOL_CALLS]"), ToolFormat::kMistral);
  EXPECT_EQ(tool_format_for_template("<|start_header_id|>ipython<|end_header_id|>"), ToolFormat::kLlama3Json);
  EXPECT_EQ(tool_format_for_template("<start_of_turn>user"), ToolFormat::kHermes);
}

TEST(ToolCalls, RequiredCallGrammarGivesAValidCall) {
  const std::string path = testdata_dir() + "/tokenizers/gemma3/tokenizer.json";
  TESSERA_REQUIRE_TESTDATA(path);
  auto tok = Tokenizer::from_hf_file(path);
  ASSERT_TRUE(tok.is_ok());
  auto compiler = GrammarCompiler::create(**tok, 262144, (*tok)->eos_ids(), {});
  ASSERT_TRUE(compiler.is_ok()) << compiler.status().to_string();
  const std::vector<ToolDef> tools = {
      {"get_weather", R"({"type": "object", "properties": {"unit": {"enum": ["c", "f"]}}, "required": ["unit"], "additionalProperties": false})"},
      {"get_time", R"({"type": "object", "properties": {}, "additionalProperties": false})"}};
  for (ToolFormat f : {ToolFormat::kHermes, ToolFormat::kLlama3Json, ToolFormat::kMistral}) {
    for (ToolChoice choice : {ToolChoice{ToolChoice::Mode::kRequired, ""}, ToolChoice{ToolChoice::Mode::kNamed, "get_weather"}}) {
      auto tag = tool_call_structural_tag(f, tools, choice, false);
      ASSERT_TRUE(tag.is_ok()) << tag.status().to_string();
      auto g = (*compiler)->compile(GrammarSpec{GrammarKind::kStructuralTag, *tag});
      ASSERT_TRUE(g.is_ok()) << g.status().to_string();
      // The walk: the allowed token with the longest text, a stop token once complete.
      auto m = (*g)->matcher();
      std::vector<uint32_t> mask(static_cast<size_t>((*g)->mask_words()));
      std::vector<int32_t> ids;
      for (int step = 0; step < 300 && !m->terminated(); ++step) {
        m->fill_mask(mask);
        int32_t pick = -1;
        size_t best = 0;
        if (m->completed())
          for (int32_t e : (*tok)->eos_ids())
            if ((mask[static_cast<size_t>(e) / 32] >> (e % 32)) & 1u) pick = e;
        for (int32_t id = 0; pick < 0 || best > 0 ? id < 262144 : false; ++id) {
          if (!((mask[static_cast<size_t>(id) / 32] >> (id % 32)) & 1u) || (*tok)->is_special(id)) continue;
          const int32_t one[1] = {id};
          const size_t n = (*tok)->decode_raw(one, false, true).size();
          if (n > best) best = n, pick = id;
        }
        ASSERT_GE(pick, 0);
        ASSERT_TRUE(m->accept(pick));
        if (!m->terminated()) ids.push_back(pick);
      }
      ASSERT_TRUE(m->terminated()) << (*tok)->decode(ids);
      auto out = parse_tool_calls(f, (*tok)->decode(ids));
      ASSERT_EQ(out.calls.size(), 1u) << (*tok)->decode(ids);
      if (choice.mode == ToolChoice::Mode::kNamed) {
        EXPECT_EQ(out.calls[0].name, "get_weather");
      }
      if (out.calls[0].name == "get_weather") {
        const json args = json::parse(out.calls[0].arguments);
        EXPECT_TRUE(args["unit"] == "c" || args["unit"] == "f") << out.calls[0].arguments;
      }
    }
  }
  EXPECT_FALSE(tool_call_structural_tag(ToolFormat::kHermes, tools, {ToolChoice::Mode::kNamed, "nope"}, true).is_ok());
}

}  // namespace
}  // namespace tessera
