#include "server/openai_protocol.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "engine/metrics.h"
#include "engine/stop_checker.h"

namespace tessera {
namespace {

TEST(OpenAiProtocolTest, CompletionPromptForms) {
  auto a = parse_completion_request(R"({"prompt": "hi", "max_tokens": 5, "temperature": 0, "unknown_field": {"x": 1}})");
  ASSERT_TRUE(a.is_ok()) << a.status().to_string();
  EXPECT_EQ(a->prompts.size(), 1u);
  EXPECT_EQ(a->params.max_tokens, 5);
  auto b = parse_completion_request(R"({"prompt": ["a", "b"]})");
  ASSERT_TRUE(b.is_ok());
  EXPECT_EQ(b->prompts.size(), 2u);
  EXPECT_EQ(b->params.max_tokens, 16);
  auto c = parse_completion_request(R"({"prompt": [1, 2, 3]})");
  ASSERT_TRUE(c.is_ok());
  EXPECT_TRUE(c->prompts[0].is_ids);
  EXPECT_EQ(c->prompts[0].ids, (std::vector<int32_t>{1, 2, 3}));
  auto d = parse_completion_request(R"({"prompt": [[1, 2], [3]], "n": 2, "stop": ["x", "y"], "seed": 7,
                                       "stream": true, "stream_options": {"include_usage": true}, "logprobs": 3,
                                       "echo": true, "priority": 1, "top_k": 5, "min_p": 0.1,
                                       "speculation": "ngram"})");
  ASSERT_TRUE(d.is_ok()) << d.status().to_string();
  EXPECT_EQ(d->prompts.size(), 2u);
  EXPECT_EQ(d->params.n, 2);
  EXPECT_EQ(d->params.stop.size(), 2u);
  EXPECT_TRUE(d->params.sampling.has_seed);
  EXPECT_TRUE(d->params.include_usage);
  EXPECT_EQ(d->logprobs, 3);
  EXPECT_TRUE(d->echo);
  EXPECT_EQ(d->params.priority, 1);
  EXPECT_EQ(d->params.speculation, "ngram");
  EXPECT_TRUE(c->params.speculation.empty()) << "absent: the server's setting";
  // The chat API's "top_logprobs" is the same count; "user" is a string.
  auto e = parse_completion_request(R"({"prompt": "x", "top_logprobs": 4, "user": "u-1"})");
  ASSERT_TRUE(e.is_ok()) << e.status().to_string();
  EXPECT_EQ(e->logprobs, 4);
  auto f = parse_completion_request(R"({"prompt": "x", "logprobs": 2, "top_logprobs": 2, "user": null})");
  ASSERT_TRUE(f.is_ok()) << f.status().to_string();
  EXPECT_EQ(f->logprobs, 2);
}

TEST(OpenAiProtocolTest, InvalidValuesNameTheField) {
  struct Case {
    const char* body;
    const char* field;
  };
  for (const Case& c : std::vector<Case>{{"{bad json", "JSON"},
                                         {"[1]", "object"},
                                         {R"({"max_tokens": 3})", "'prompt'"},
                                         {R"({"prompt": "x", "max_tokens": -1})", "'max_tokens'"},
                                         {R"({"prompt": "x", "max_tokens": "5"})", "'max_tokens'"},
                                         {R"({"prompt": "x", "temperature": -0.5})", "'temperature'"},
                                         {R"({"prompt": "x", "top_p": 0})", "'top_p'"},
                                         {R"({"prompt": "x", "n": 0})", "'n'"},
                                         {R"({"prompt": "x", "stop": 5})", "'stop'"},
                                         {R"({"prompt": 5})", "'prompt'"},
                                         {R"({"prompt": [1, -2]})", "'prompt'"},
                                         {R"({"prompt": "x", "logprobs": 50})", "'logprobs'"},
                                         {R"({"prompt": "x", "stream_options": 3})", "'stream_options'"},
                                         {R"({"prompt": "x", "speculation": "maybe"})", "'speculation'"},
                                         {R"({"prompt": "x", "speculation": 1})", "'speculation'"},
                                         {R"({"prompt": "x", "user": 7})", "'user'"},
                                         {R"({"prompt": "x", "user": {"id": 1}})", "'user'"},
                                         {R"({"prompt": "x", "top_logprobs": "3"})", "'top_logprobs'"},
                                         {R"({"prompt": "x", "top_logprobs": 30})", "'top_logprobs'"},
                                         {R"({"prompt": "x", "top_logprobs": [1]})", "'top_logprobs'"},
                                         {R"({"prompt": "x", "logprobs": 2, "top_logprobs": 3})", "'top_logprobs'"}}) {
    auto r = parse_completion_request(c.body);
    ASSERT_FALSE(r.is_ok()) << c.body;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find(c.field), std::string::npos) << c.body << " -> " << r.status().message();
  }
}

TEST(OpenAiProtocolTest, ChatRequest) {
  auto r = parse_chat_request(R"({"messages": [{"role": "system", "content": "be brief"},
                                  {"role": "user", "content": [{"type": "text", "text": "hi"}]}],
                                  "max_completion_tokens": 7, "logprobs": true, "top_logprobs": 2})");
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_EQ(r->messages.size(), 2u);
  EXPECT_EQ(r->messages[1].content, "hi");
  EXPECT_EQ(r->params.max_tokens, 7);
  EXPECT_EQ(r->top_logprobs, 2);
  EXPECT_FALSE(parse_chat_request(R"({"messages": []})").is_ok());
  EXPECT_FALSE(parse_chat_request(R"({"messages": [{"content": "x"}]})").is_ok());
  EXPECT_FALSE(parse_chat_request(R"({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2})").is_ok());
  // A role outside the API's, or a turn without text that needs one, is named.
  auto wizard = parse_chat_request(R"({"messages": [{"role": "wizard", "content": "x"}]})");
  ASSERT_FALSE(wizard.is_ok());
  EXPECT_NE(wizard.status().message().find("messages[0].role"), std::string::npos) << wizard.status().message();
  EXPECT_NE(wizard.status().message().find("'wizard'"), std::string::npos) << wizard.status().message();
  auto empty = parse_chat_request(R"({"messages": [{"role": "system", "content": "a"}, {"role": "user"}]})");
  ASSERT_FALSE(empty.is_ok());
  EXPECT_NE(empty.status().message().find("messages[1].content"), std::string::npos) << empty.status().message();
  EXPECT_TRUE(parse_chat_request(R"({"messages": [{"role": "developer", "content": "a"}, {"role": "user", "content": "b"},
                                                  {"role": "assistant", "content": null}, {"role": "tool", "content": "c"}]})")
                  .is_ok());
}

TEST(OpenAiProtocolTest, RenderedShapes) {
  CompletionChoice c;
  c.text = "hello";
  c.finish_reason = "length";
  const auto j = nlohmann::json::parse(render_completion("cmpl-1", 5, "m", {c}, {3, 1}));
  EXPECT_EQ(j["object"], "text_completion");
  EXPECT_EQ(j["choices"][0]["text"], "hello");
  EXPECT_TRUE(j["choices"][0]["logprobs"].is_null());
  EXPECT_EQ(j["usage"]["total_tokens"], 4);
  ChatChoice d;
  d.content = "";
  const auto first = nlohmann::json::parse(render_chat_chunk("chatcmpl-1", 5, "m", d, true));
  EXPECT_EQ(first["choices"][0]["delta"]["role"], "assistant");
  EXPECT_EQ(first["object"], "chat.completion.chunk");
  d.finish_reason = "stop";
  const auto last = nlohmann::json::parse(render_chat_chunk("chatcmpl-1", 5, "m", d, false));
  EXPECT_EQ(last["choices"][0]["finish_reason"], "stop");
  EXPECT_TRUE(last["choices"][0]["delta"].empty());
  const auto usage = nlohmann::json::parse(render_usage_chunk("chatcmpl-1", 5, "m", true, {2, 3}));
  EXPECT_TRUE(usage["choices"].empty());
  EXPECT_EQ(usage["usage"]["completion_tokens"], 3);
  EXPECT_EQ(sse_event("{}"), "data: {}\n\n");
  const auto err = nlohmann::json::parse(error_body(400, "'n' must be >= 1", "n"));
  EXPECT_EQ(err["error"]["type"], "invalid_request_error");
  EXPECT_EQ(err["error"]["param"], "n");
  // A wrong method is the request's fault, not the server's.
  EXPECT_EQ(nlohmann::json::parse(error_body(405, "use POST", ""))["error"]["type"], "invalid_request_error");
  EXPECT_EQ(nlohmann::json::parse(error_body(500, "boom", ""))["error"]["type"], "internal_error");
  // Invalid UTF-8 from byte tokens never throws.
  c.text = std::string("\xff\xfe", 2);
  EXPECT_NO_THROW(render_completion("x", 1, "m", {c}, {}));
}

TEST(StopCheckerTest, HoldsBackPartialStopsAndCuts) {
  StopChecker s({"\n\n", "END"});
  EXPECT_EQ(s.push("Hello"), "Hello");
  EXPECT_EQ(s.push(" wor"), " wor");
  EXPECT_EQ(s.push("ld E"), "ld ");  // "E" may start "END"
  EXPECT_EQ(s.push("x"), "Ex");
  EXPECT_EQ(s.push("\n"), "");       // may start "\n\n"
  EXPECT_EQ(s.push("\nmore"), "");
  EXPECT_TRUE(s.stopped());
  EXPECT_EQ(s.flush(), "");
  StopChecker t({"EN"});
  EXPECT_EQ(t.push("abcE"), "abc");
  EXPECT_EQ(t.flush(), "E");
  StopChecker none({});
  EXPECT_EQ(none.push("a\n\n"), "a\n\n");
}

TEST(MetricsTest, RendersPrometheusText) {
  MetricsRegistry m;
  m.declare_counter("tessera_requests_total", "Requests by outcome");
  m.declare_gauge("tessera_running", "Running sequences");
  m.declare_histogram("tessera_ttft_seconds", "Time to first token", {0.1, 1});
  m.add("tessera_requests_total", 1, "outcome=\"ok\"");
  m.set("tessera_running", 3);
  m.observe("tessera_ttft_seconds", 0.05);
  m.observe("tessera_ttft_seconds", 0.5);
  const std::string text = m.render();
  EXPECT_NE(text.find("# TYPE tessera_requests_total counter"), std::string::npos);
  EXPECT_NE(text.find("tessera_requests_total{outcome=\"ok\"} 1"), std::string::npos) << text;
  EXPECT_NE(text.find("tessera_running 3"), std::string::npos);
  EXPECT_NE(text.find("tessera_ttft_seconds_bucket{le=\"0.1\"} 1"), std::string::npos) << text;
  EXPECT_NE(text.find("tessera_ttft_seconds_bucket{le=\"+Inf\"} 2"), std::string::npos);
  EXPECT_NE(text.find("tessera_ttft_seconds_count 2"), std::string::npos);
  EXPECT_EQ(m.count("tessera_ttft_seconds"), 2u);
  // Several series of one gauge in one update.
  m.declare_gauge("tessera_kv_blocks", "KV blocks by state");
  m.set_series("tessera_kv_blocks", {{"state=\"used\"", 2}, {"state=\"free\"", 5}});
  EXPECT_EQ(m.value("tessera_kv_blocks", "state=\"used\""), 2);
  EXPECT_EQ(m.value("tessera_kv_blocks", "state=\"free\""), 5);
  EXPECT_NE(m.render().find("tessera_kv_blocks{state=\"free\"} 5"), std::string::npos);
}

}  // namespace
}  // namespace tessera
