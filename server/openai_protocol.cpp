#include "server/openai_protocol.h"

#include "engine/speculation.h"
#include "server/structured_request.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>

namespace tessera {
namespace {

using json = nlohmann::json;

template <typename Int>
Status get_int(const json& j, const char* key, Int& out, int64_t lo, int64_t hi) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return Status::ok();
  int64_t v = 0;
  if (it->is_number_integer()) {
    v = it->get<int64_t>();
  } else if (it->is_number_float() && std::floor(it->get<double>()) == it->get<double>() &&
             std::abs(it->get<double>()) < 9e15) {
    v = static_cast<int64_t>(it->get<double>());
  } else {
    return field_error(key, "must be an integer");
  }
  if (v < lo || v > hi) return field_error(key, fmt::format("must be in [{}, {}], got {}", lo, hi, v));
  out = static_cast<Int>(v);
  return Status::ok();
}

Status get_float(const json& j, const char* key, float& out, double lo, double hi) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return Status::ok();
  if (!it->is_number()) return field_error(key, "must be a number");
  const double v = it->get<double>();
  if (!std::isfinite(v) || v < lo || v > hi) return field_error(key, fmt::format("must be in [{}, {}], got {}", lo, hi, v));
  out = static_cast<float>(v);
  return Status::ok();
}

Status get_string(const json& j, const char* key, std::string& out) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return Status::ok();
  if (!it->is_string()) return field_error(key, "must be a string");
  out = it->get<std::string>();
  return Status::ok();
}

Result<std::vector<int32_t>> token_list(const json& j, const char* field) {
  std::vector<int32_t> ids;
  for (const json& x : j) {
    if (!x.is_number_integer()) return field_error(field, "must hold only integer token ids");
    const int64_t v = x.get<int64_t>();
    if (v < 0 || v > INT32_MAX) return field_error(field, fmt::format("holds an invalid token id {}", v));
    ids.push_back(static_cast<int32_t>(v));
  }
  return ids;
}

// "logit_bias": {"<token id>": bias in [-100, 100], ...}, at most 1024 entries; sorted by id.
// The ids' range against the vocabulary is the server's check (it knows the tokenizer).
Status parse_logit_bias(const json& j, std::vector<std::pair<int32_t, float>>& out) {
  auto it = j.find("logit_bias");
  if (it == j.end() || it->is_null()) return Status::ok();
  if (!it->is_object()) return field_error("logit_bias", "must be an object mapping token ids to biases");
  if (it->size() > 1024) return field_error("logit_bias", fmt::format("has {} entries; at most 1024", it->size()));
  for (const auto& [key, value] : it->items()) {
    const bool digits = !key.empty() && key.size() <= 10 &&
                        std::all_of(key.begin(), key.end(), [](char c) { return c >= '0' && c <= '9'; });
    const int64_t id = digits ? std::stoll(key) : -1;
    if (id < 0 || id > INT32_MAX) return field_error("logit_bias", fmt::format("key '{}' is not a token id", key));
    if (!value.is_number() || !std::isfinite(value.get<double>()) || value.get<double>() < -100.0 ||
        value.get<double>() > 100.0)
      return field_error("logit_bias",
                         fmt::format("the bias of token {} must be a number in [-100, 100], got {}", id, value.dump()));
    out.emplace_back(static_cast<int32_t>(id), value.get<float>());
  }
  std::sort(out.begin(), out.end());
  for (size_t i = 1; i < out.size(); ++i)
    if (out[i].first == out[i - 1].first)
      return field_error("logit_bias", fmt::format("token {} is given twice", out[i].first));
  return Status::ok();
}

Status parse_common(const json& j, GenerationParams& p) {
  TESSERA_RETURN_IF_ERROR(get_string(j, "model", p.model));
  TESSERA_RETURN_IF_ERROR(get_int(j, "max_tokens", p.max_tokens, 0, int64_t{1} << 40));
  SamplingParams& s = p.sampling;
  TESSERA_RETURN_IF_ERROR(get_float(j, "temperature", s.temperature, 0.0, 100.0));
  TESSERA_RETURN_IF_ERROR(get_float(j, "top_p", s.top_p, 0.0, 1.0));
  if (j.contains("top_p") && !j["top_p"].is_null() && s.top_p <= 0.0f) return field_error("top_p", "must be in (0, 1]");
  TESSERA_RETURN_IF_ERROR(get_int(j, "top_k", s.top_k, -1, INT32_MAX));
  TESSERA_RETURN_IF_ERROR(get_float(j, "min_p", s.min_p, 0.0, 1.0));
  TESSERA_RETURN_IF_ERROR(get_float(j, "presence_penalty", s.presence_penalty, -2.0, 2.0));
  TESSERA_RETURN_IF_ERROR(get_float(j, "frequency_penalty", s.frequency_penalty, -2.0, 2.0));
  TESSERA_RETURN_IF_ERROR(get_float(j, "repetition_penalty", s.repetition_penalty, 0.0, 100.0));
  if (s.repetition_penalty <= 0.0f) return field_error("repetition_penalty", "must be > 0");
  if (auto it = j.find("seed"); it != j.end() && !it->is_null()) {
    if (!it->is_number_integer()) return field_error("seed", "must be an integer");
    s.seed = it->is_number_unsigned() ? it->get<uint64_t>() : static_cast<uint64_t>(it->get<int64_t>());
    s.has_seed = true;
  }
  if (auto it = j.find("stop"); it != j.end() && !it->is_null()) {
    if (it->is_string()) {
      p.stop.push_back(it->get<std::string>());
    } else if (it->is_array()) {
      for (const json& x : *it) {
        if (!x.is_string()) return field_error("stop", "must be a string or a list of strings");
        p.stop.push_back(x.get<std::string>());
      }
    } else {
      return field_error("stop", "must be a string or a list of strings");
    }
    if (p.stop.size() > 16) return field_error("stop", "may hold at most 16 strings");
    for (const std::string& st : p.stop)
      if (st.empty()) return field_error("stop", "must not hold an empty string");
  }
  TESSERA_RETURN_IF_ERROR(get_int(j, "n", p.n, 1, 16));
  TESSERA_RETURN_IF_ERROR(get_bool(j, "ignore_eos", p.ignore_eos));
  TESSERA_RETURN_IF_ERROR(get_int(j, "min_tokens", p.min_tokens, 0, int64_t{1} << 40));
  TESSERA_RETURN_IF_ERROR(get_bool(j, "stream", p.stream));
  if (auto it = j.find("stream_options"); it != j.end() && !it->is_null()) {
    if (!it->is_object()) return field_error("stream_options", "must be an object");
    TESSERA_RETURN_IF_ERROR(get_bool(*it, "include_usage", p.include_usage));
  }
  TESSERA_RETURN_IF_ERROR(get_int(j, "priority", p.priority, 0, 7));
  std::string user;  // an end-user id for abuse tracking: checked, not used
  TESSERA_RETURN_IF_ERROR(get_string(j, "user", user));
  TESSERA_RETURN_IF_ERROR(get_string(j, "speculation", p.speculation));
  if (!p.speculation.empty() && !parse_spec_mode(p.speculation).is_ok())
    return field_error("speculation", fmt::format("must be \"off\", \"auto\", \"ngram\" or \"draft\", got \"{}\"",
                                                  p.speculation));
  TESSERA_RETURN_IF_ERROR(parse_logit_bias(j, s.logit_bias));
  TESSERA_RETURN_IF_ERROR(parse_structured_output(j, p.grammar, p.grammar_field));
  return Status::ok();
}

Result<json> parse_object(std::string_view body) {
  json j = json::parse(body.begin(), body.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return Status::invalid_argument("the request body is not valid JSON");
  if (!j.is_object()) return Status::invalid_argument("the request body must be a JSON object");
  return j;
}

}  // namespace

Result<CompletionRequest> parse_completion_request(std::string_view body) {
  TESSERA_ASSIGN_OR_RETURN(json j, parse_object(body));
  CompletionRequest r;
  auto it = j.find("prompt");
  if (it == j.end() || it->is_null()) return field_error("prompt", "is required");
  if (it->is_string()) {
    r.prompts.push_back({it->get<std::string>(), {}, false});
  } else if (it->is_array()) {
    if (it->empty()) return field_error("prompt", "must not be empty");
    if ((*it)[0].is_number_integer()) {
      TESSERA_ASSIGN_OR_RETURN(auto ids, token_list(*it, "prompt"));
      r.prompts.push_back({"", std::move(ids), true});
    } else {
      for (const json& x : *it) {
        if (x.is_string()) {
          r.prompts.push_back({x.get<std::string>(), {}, false});
        } else if (x.is_array()) {
          TESSERA_ASSIGN_OR_RETURN(auto ids, token_list(x, "prompt"));
          if (ids.empty()) return field_error("prompt", "must not hold an empty token list");
          r.prompts.push_back({"", std::move(ids), true});
        } else {
          return field_error("prompt", "must be a string, a list of strings, a token list, or a list of token lists");
        }
      }
    }
  } else {
    return field_error("prompt", "must be a string, a list of strings, a token list, or a list of token lists");
  }
  if (r.prompts.size() > 64) return field_error("prompt", "may hold at most 64 prompts");
  TESSERA_RETURN_IF_ERROR(parse_common(j, r.params));
  if (auto lp = j.find("logprobs"); lp != j.end() && !lp->is_null()) {
    if (lp->is_boolean()) return field_error("logprobs", "must be an integer for completions");
    TESSERA_RETURN_IF_ERROR(get_int(j, "logprobs", r.logprobs, 0, 20));
  }
  // The chat API's name for the same count: taken where "logprobs" is absent, and it must
  // agree where both are given.
  if (auto tl = j.find("top_logprobs"); tl != j.end() && !tl->is_null()) {
    int64_t top = 0;
    TESSERA_RETURN_IF_ERROR(get_int(j, "top_logprobs", top, 0, 20));
    if (auto lp = j.find("logprobs"); lp == j.end() || lp->is_null())
      r.logprobs = static_cast<int32_t>(top);
    else if (top != r.logprobs)
      return field_error("top_logprobs", fmt::format("is {} but 'logprobs' is {}: completions take one count, "
                                                     "'logprobs'", top, r.logprobs));
  }
  TESSERA_RETURN_IF_ERROR(get_bool(j, "echo", r.echo));
  if (r.params.max_tokens < 0) r.params.max_tokens = 16;  // the API's default
  // Fields that would change the answer are refused, never ignored.
  if (auto b = j.find("best_of"); b != j.end() && !b->is_null()) {
    if (!b->is_number_integer() || b->get<int64_t>() != r.params.n)
      return field_error("best_of", fmt::format("is supported only equal to n ({}); got {}", r.params.n, b->dump()));
  }
  if (auto s = j.find("suffix"); s != j.end() && !s->is_null() && !(s->is_string() && s->get<std::string>().empty()))
    return field_error("suffix", "is not supported (no fill-in-the-middle)");
  return r;
}

Result<ChatRequest> parse_chat_request(std::string_view body) {
  TESSERA_ASSIGN_OR_RETURN(json j, parse_object(body));
  ChatRequest r;
  auto it = j.find("messages");
  if (it == j.end() || !it->is_array()) return field_error("messages", "is required and must be a list");
  if (it->empty()) return field_error("messages", "must not be empty");
  for (size_t i = 0; i < it->size(); ++i) {
    const json& m = (*it)[i];
    const std::string where = fmt::format("messages[{}]", i);
    if (!m.is_object()) return field_error(where, "must be an object");
    ChatMessageInput msg;
    if (!m.contains("role") || !m["role"].is_string()) return field_error(where + ".role", "is required (a string)");
    msg.role = m["role"].get<std::string>();
    static constexpr std::string_view kRoles[] = {"system", "developer", "user", "assistant", "tool"};
    if (std::find(std::begin(kRoles), std::end(kRoles), msg.role) == std::end(kRoles))
      return field_error(where + ".role", fmt::format("'{}' is not one of system, developer, user, assistant, tool",
                                                      msg.role));
    // Only an assistant turn may come without text (OpenAI allows it beside tool calls).
    if (msg.role != "assistant" && (!m.contains("content") || m["content"].is_null()))
      return field_error(where + ".content", "is required for role '" + msg.role + "'");
    json extra = json::object();
    if (auto calls = m.find("tool_calls"); calls != m.end() && !calls->is_null()) {
      if (msg.role != "assistant" || !calls->is_array())
        return field_error(where + ".tool_calls", "must be a list, on an assistant message");
      json out = json::array();
      for (size_t k = 0; k < calls->size(); ++k) {
        const json& c = (*calls)[k];
        const std::string at = fmt::format("{}.tool_calls[{}]", where, k);
        if (!c.is_object() || !c.contains("function") || !c["function"].is_object())
          return field_error(at, "must be {\"id\": ..., \"type\": \"function\", \"function\": {\"name\": ..., \"arguments\": ...}}");
        const json& f = c["function"];
        if (!f.contains("name") || !f["name"].is_string()) return field_error(at + ".function.name", "is required (a string)");
        json call = c;
        // Templates print the arguments as an object (| tojson): a JSON string is parsed.
        if (auto a = f.find("arguments"); a != f.end() && a->is_string()) {
          json parsed = json::parse(a->get<std::string>(), nullptr, false);
          if (!parsed.is_discarded()) call["function"]["arguments"] = parsed;
        }
        out.push_back(std::move(call));
      }
      extra["tool_calls"] = std::move(out);
    }
    for (const char* key : {"tool_call_id", "name"})
      if (auto v = m.find(key); v != m.end() && !v->is_null()) {
        if (!v->is_string()) return field_error(where + "." + key, "must be a string");
        extra[key] = *v;
      }
    if (!extra.empty()) msg.extra_json = extra.dump();
    if (auto c = m.find("content"); c != m.end() && !c->is_null()) {
      if (c->is_string()) {
        msg.content = c->get<std::string>();
      } else if (c->is_array()) {  // [{"type": "text", "text": ...}]
        for (const json& part : *c) {
          if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") || !part["text"].is_string())
            return field_error(where + ".content", "parts must be {\"type\": \"text\", \"text\": ...}");
          msg.content += part["text"].get<std::string>();
        }
      } else {
        return field_error(where + ".content", "must be a string or a list of text parts");
      }
    }
    r.messages.push_back(std::move(msg));
  }
  TESSERA_RETURN_IF_ERROR(parse_common(j, r.params));
  int64_t mct = -1;
  TESSERA_RETURN_IF_ERROR(get_int(j, "max_completion_tokens", mct, 0, int64_t{1} << 40));
  if (mct >= 0) r.params.max_tokens = mct;
  TESSERA_RETURN_IF_ERROR(get_bool(j, "logprobs", r.logprobs));
  TESSERA_RETURN_IF_ERROR(get_int(j, "top_logprobs", r.top_logprobs, 0, 20));
  if (r.top_logprobs > 0 && !r.logprobs) return field_error("top_logprobs", "needs 'logprobs': true");
  TESSERA_RETURN_IF_ERROR(parse_tools(j, r.tools_request, r.params.grammar, r.params.grammar_field));
  if (auto k = j.find("chat_template_kwargs"); k != j.end() && !k->is_null()) {
    if (!k->is_object()) return field_error("chat_template_kwargs", "must be an object of template variables");
    if (k->contains("messages") || k->contains("tools") || k->contains("add_generation_prompt"))
      return field_error("chat_template_kwargs", "must not set messages, tools or add_generation_prompt");
    r.template_kwargs_json = k->dump();
  }
  // Fields that would change the answer are refused, never ignored.
  if (auto f = j.find("functions"); f != j.end() && !f->is_null() && !(f->is_array() && f->empty()))
    return field_error("functions", "the legacy 'functions' field is not supported; use 'tools'");
  return r;
}

std::string error_body(int http_status, std::string_view message, std::string_view param) {
  // Any other 4xx (405 wrong method, 408, 411, 415, 422, ...) is the request's fault too.
  const char* type = http_status == 404                        ? "not_found_error"
                     : http_status == 429                      ? "rate_limit_error"
                     : http_status == 503                      ? "service_unavailable"
                     : http_status >= 400 && http_status < 500 ? "invalid_request_error"
                                                               : "internal_error";
  json e = {{"error",
             {{"message", std::string(message)},
              {"type", type},
              {"param", param.empty() ? json(nullptr) : json(std::string(param))},
              {"code", http_status}}}};
  return e.dump();
}

namespace {

json completion_logprobs(const CompletionChoice& c) {
  if (!c.has_logprobs) return nullptr;
  json tokens = json::array(), lps = json::array(), tops = json::array(), offs = json::array();
  for (size_t i = 0; i < c.logprobs.size(); ++i) {
    const TokenLogprob& t = c.logprobs[i];
    tokens.push_back(t.token);
    lps.push_back(t.logprob ? json(*t.logprob) : json(nullptr));
    json top = json::object();
    for (const auto& [tok, lp] : t.top) top[tok] = lp;
    tops.push_back(t.logprob ? top : json(nullptr));
    offs.push_back(i < c.text_offsets.size() ? c.text_offsets[i] : 0);
  }
  return {{"tokens", tokens}, {"token_logprobs", lps}, {"top_logprobs", tops}, {"text_offset", offs}};
}

json bytes_of(const std::string& s) {
  json b = json::array();
  for (unsigned char ch : s) b.push_back(static_cast<int>(ch));
  return b;
}

json chat_logprobs(const ChatChoice& c) {
  if (!c.has_logprobs) return nullptr;
  json content = json::array();
  for (const TokenLogprob& t : c.logprobs) {
    json top = json::array();
    for (const auto& [tok, lp] : t.top) top.push_back({{"token", tok}, {"logprob", lp}, {"bytes", bytes_of(tok)}});
    content.push_back({{"token", t.token},
                       {"logprob", t.logprob ? json(*t.logprob) : json(nullptr)},
                       {"bytes", bytes_of(t.token)},
                       {"top_logprobs", top}});
  }
  return {{"content", content}};
}

json usage_json(const Usage& u) {
  return {{"prompt_tokens", u.prompt_tokens},
          {"completion_tokens", u.completion_tokens},
          {"total_tokens", u.prompt_tokens + u.completion_tokens}};
}

json finish(const std::optional<std::string>& f) { return f ? json(*f) : json(nullptr); }

// Text from the model may hold invalid UTF-8 (byte tokens); never let the JSON writer throw.
std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

}  // namespace

std::string render_completion(const std::string& id, int64_t created, const std::string& model,
                              const std::vector<CompletionChoice>& choices, const Usage& usage) {
  json cs = json::array();
  for (const CompletionChoice& c : choices)
    cs.push_back({{"index", c.index}, {"text", c.text}, {"logprobs", completion_logprobs(c)},
                  {"finish_reason", finish(c.finish_reason)}});
  return dump({{"id", id}, {"object", "text_completion"}, {"created", created}, {"model", model}, {"choices", cs},
               {"usage", usage_json(usage)}});
}

std::string render_completion_chunk(const std::string& id, int64_t created, const std::string& model,
                                    const CompletionChoice& c) {
  json choice = {{"index", c.index}, {"text", c.text}, {"logprobs", completion_logprobs(c)},
                 {"finish_reason", finish(c.finish_reason)}};
  return dump({{"id", id}, {"object", "text_completion"}, {"created", created}, {"model", model},
               {"choices", json::array({choice})}});
}

// OpenAI's tool_calls list: whole calls in a message; in a chunk, each with its index among the
// choice's calls (a call goes out whole, in one delta: the streamed calls equal the whole ones).
static json tool_calls_json(const ChatChoice& c, bool chunk) {
  json out = json::array();
  for (size_t i = 0; i < c.tool_calls.size(); ++i) {
    const ToolCall& t = c.tool_calls[i];
    json call = {{"id", t.id}, {"type", "function"}, {"function", {{"name", t.name}, {"arguments", t.arguments}}}};
    if (chunk) call["index"] = c.first_tool_call_index + static_cast<int32_t>(i);
    out.push_back(std::move(call));
  }
  return out;
}

std::string render_chat(const std::string& id, int64_t created, const std::string& model,
                        const std::vector<ChatChoice>& choices, const Usage& usage) {
  json cs = json::array();
  for (const ChatChoice& c : choices) {
    json message = {{"role", "assistant"}, {"content", c.content_null ? json(nullptr) : json(c.content)}};
    if (!c.reasoning_content.empty()) message["reasoning_content"] = c.reasoning_content;
    if (!c.tool_calls.empty()) message["tool_calls"] = tool_calls_json(c, false);
    cs.push_back({{"index", c.index}, {"message", message}, {"logprobs", chat_logprobs(c)},
                  {"finish_reason", finish(c.finish_reason)}});
  }
  return dump({{"id", id}, {"object", "chat.completion"}, {"created", created}, {"model", model}, {"choices", cs},
               {"usage", usage_json(usage)}});
}

std::string render_chat_chunk(const std::string& id, int64_t created, const std::string& model, const ChatChoice& d,
                              bool with_role) {
  json delta = json::object();
  if (with_role) delta["role"] = "assistant";
  if (!d.content.empty() || (!d.finish_reason && !with_role)) delta["content"] = d.content;
  if (with_role && d.content.empty() && !d.finish_reason) delta["content"] = "";
  if (!d.tool_calls.empty()) {
    delta.erase("content");
    delta["tool_calls"] = tool_calls_json(d, true);
  }
  if (!d.reasoning_content.empty()) {
    if (d.content.empty()) delta.erase("content");
    delta["reasoning_content"] = d.reasoning_content;
  }
  json choice = {{"index", d.index}, {"delta", delta}, {"logprobs", chat_logprobs(d)},
                 {"finish_reason", finish(d.finish_reason)}};
  return dump({{"id", id}, {"object", "chat.completion.chunk"}, {"created", created}, {"model", model},
               {"choices", json::array({choice})}});
}

std::string render_usage_chunk(const std::string& id, int64_t created, const std::string& model, bool chat,
                               const Usage& usage) {
  return dump({{"id", id}, {"object", chat ? "chat.completion.chunk" : "text_completion"}, {"created", created},
               {"model", model}, {"choices", json::array()}, {"usage", usage_json(usage)}});
}

std::string sse_event(const std::string& j) { return "data: " + j + "\n\n"; }

}  // namespace tessera
