#include "server/api_server.h"

#include <nlohmann/json.hpp>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

#include "common/logging.h"
#include "server/openai_protocol.h"
#include "server/reasoning.h"

namespace tessera {
namespace {

using json = nlohmann::json;

int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string random_id(const char* prefix) {
  static std::atomic<uint64_t> counter{0};
  const uint64_t x = (static_cast<uint64_t>(unix_now()) << 20) ^ (++counter * 0x9e3779b97f4a7c15ULL);
  return fmt::format("{}-{:016x}", prefix, x);
}

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

int http_status_for(const Status& s) {
  switch (s.code()) {
    case StatusCode::kInvalidArgument:
    case StatusCode::kOutOfRange: return 400;
    case StatusCode::kNotFound: return 404;
    case StatusCode::kResourceExhausted: return 429;
    case StatusCode::kUnavailable: return 503;
    default: return 500;
  }
}

// Builds one response (streaming or not) from a job's events. Lives as long as the job: the
// engine thread calls on_event; the HTTP side only created it.
class ResponseBuilder : public std::enable_shared_from_this<ResponseBuilder> {
 public:
  struct Choice {
    std::string text;
    std::vector<TokenLogprob> logprobs;
    std::vector<int64_t> offsets;
    std::optional<std::string> finish;
    bool role_sent = false;
    bool echo_first_sent = false;  // the echoed prompt's first token (logprob null) is in `logprobs`
    int64_t echo_offset = 0;       // text offset of the next echoed prompt token
    int64_t prompt_tokens = 0, completion_tokens = 0;
    std::unique_ptr<ToolCallParser> tools;  // tool calling: the model's text -> content and calls
    std::vector<ToolCall> calls;
    std::unique_ptr<ReasoningSplitter> reasoning;  // reasoning models: <think> ... </think> apart
    std::string reasoning_text;
  };

  ResponseBuilder(std::shared_ptr<HttpResponder> responder, const Tokenizer& tok, bool chat, bool stream,
                  bool include_usage, bool logprobs, int32_t top_n, std::string model, size_t n_choices)
      : responder_(std::move(responder)),
        tok_(tok),
        chat_(chat),
        stream_(stream),
        include_usage_(include_usage),
        logprobs_(logprobs),
        top_n_(top_n),
        model_(std::move(model)),
        id_(random_id(chat ? "chatcmpl" : "cmpl")),
        created_(unix_now()),
        choices_(n_choices) {}

  // Tool calling: every choice's text is parsed for calls in `format`.
  void parse_tool_calls(ToolFormat format) {
    for (Choice& c : choices_) c.tools = std::make_unique<ToolCallParser>(format);
  }

  // Reasoning: every choice's <think> part goes to reasoning_content (`inside`: the prompt opened it).
  void parse_reasoning(bool inside) {
    for (Choice& c : choices_) c.reasoning = std::make_unique<ReasoningSplitter>(inside);
  }

  // Echo: the prompt text (and, with logprobs, the prompt tokens) start the choice's output.
  void set_echo(size_t choice, const std::string& text, const std::vector<int32_t>& prompt) {
    echo_prompts_.resize(choices_.size());
    echo_prompts_[choice] = prompt;
    choices_[choice].text = text;
    echo_text_.resize(choices_.size());
    echo_text_[choice] = text;
  }

  void on_event(const JobEvent& ev) {
    std::lock_guard<std::mutex> lock(mu_);
    Choice& c = choices_[static_cast<size_t>(ev.choice)];
    if (ev.finish_reason && *ev.finish_reason == "error") {
      fail(ev.error);
      return;
    }
    std::vector<TokenLogprob> lps;
    std::vector<int64_t> offsets;
    const bool echoed = static_cast<size_t>(ev.choice) < echo_prompts_.size() && !echo_prompts_[ev.choice].empty();
    if (logprobs_ && echoed) add_prompt_logprobs(ev, c, lps, offsets);
    if (logprobs_) {
      int64_t off = static_cast<int64_t>(c.text.size());
      for (size_t i = 0; i < ev.token_logprobs.size(); ++i) {
        TokenLogprob t;
        t.token = piece(ev.token_logprobs[i].first);
        t.logprob = ev.token_logprobs[i].second;
        if (i < ev.top_logprobs.size())
          for (const auto& [id, lp] : ev.top_logprobs[i]) t.top.emplace_back(piece(id), lp);
        lps.push_back(std::move(t));
        offsets.push_back(off);
        off += static_cast<int64_t>(lps.back().token.size());
      }
    }
    std::string text = ev.text;
    std::string reasoning;
    if (c.reasoning) {
      ReasoningSplitter::Output split = c.reasoning->push(text);
      if (ev.finish_reason) {
        ReasoningSplitter::Output rest = c.reasoning->finish();
        split.reasoning += rest.reasoning;
        split.content += rest.content;
      }
      reasoning = std::move(split.reasoning);
      text = std::move(split.content);
      c.reasoning_text += reasoning;
    }
    std::vector<ToolCall> calls;
    if (c.tools) {
      ToolCallParser::Output out = c.tools->push(text);
      if (ev.finish_reason) {
        ToolCallParser::Output rest = c.tools->finish();
        out.content += rest.content;
        for (ToolCall& t : rest.calls) out.calls.push_back(std::move(t));
      }
      text = std::move(out.content);
      calls = std::move(out.calls);
    }
    const auto first_call = static_cast<int32_t>(c.calls.size());
    c.calls.insert(c.calls.end(), calls.begin(), calls.end());
    c.text += text;
    c.logprobs.insert(c.logprobs.end(), lps.begin(), lps.end());
    c.offsets.insert(c.offsets.end(), offsets.begin(), offsets.end());
    if (ev.finish_reason) {
      c.finish = *ev.finish_reason == "abort" ? std::string("abort") : *ev.finish_reason;
      if (c.finish == "stop" && !c.calls.empty()) c.finish = "tool_calls";
      c.prompt_tokens = ev.prompt_tokens;
      c.completion_tokens = ev.completion_tokens;
      ++finished_;
    }
    if (stream_) {
      stream_event(ev, c, text, reasoning, calls, first_call, lps, offsets);
    } else if (finished_ == choices_.size()) {
      respond_whole();
    }
  }

 private:
  std::string piece(int32_t id) const { return tok_.decode(std::span<const int32_t>(&id, 1)); }

  // Only completions echo prompts. As in OpenAI's API, the prompt's first token is listed with a
  // null logprob (nothing predicts it), so `tokens` lines up with the prompt; text offsets count
  // from the start of the echoed text across events (a chunked prefill sends several).
  void add_prompt_logprobs(const JobEvent& ev, Choice& c, std::vector<TokenLogprob>& lps, std::vector<int64_t>& offsets) {
    auto add = [&](TokenLogprob t) {
      offsets.push_back(c.echo_offset);
      c.echo_offset += static_cast<int64_t>(t.token.size());
      lps.push_back(std::move(t));
    };
    const auto choice = static_cast<size_t>(ev.choice);
    if (!c.echo_first_sent && choice < echo_prompts_.size() && !echo_prompts_[choice].empty()) {
      c.echo_first_sent = true;
      TokenLogprob first;
      first.token = piece(echo_prompts_[choice][0]);
      add(std::move(first));
    }
    for (const PromptLogprob& p : ev.prompt_logprobs) {
      TokenLogprob t;
      t.token = piece(p.token);
      t.logprob = p.logprob;
      for (const auto& [id, lp] : p.top_logprobs) t.top.emplace_back(piece(id), lp);
      add(std::move(t));
    }
  }

  Usage usage() const {
    Usage u;
    // Prompt tokens count once per distinct prompt; choices of one prompt share it.
    std::vector<int64_t> seen;
    for (const Choice& c : choices_) u.completion_tokens += c.completion_tokens;
    for (size_t i = 0; i < choices_.size(); i += n_per_prompt_) u.prompt_tokens += choices_[i].prompt_tokens;
    return u;
  }

 public:
  size_t n_per_prompt_ = 1;

 private:
  void fail(const std::string& error) {
    if (done_) return;
    done_ = true;
    // One status for a stream's error event and a whole response alike: 400 for a request that
    // can never fit, 503 for a server that cannot serve now (shutting down, lost shards).
    const int status = error.find("could never fit") != std::string::npos ||
                               error.find("more blocks than") != std::string::npos
                           ? 400
                       : error.find("shutting down") != std::string::npos ||
                               error.find("unhealthy") != std::string::npos || error.find("shard") != std::string::npos
                           ? 503
                           : 500;
    if (stream_ && stream_handle_) {
      stream_handle_->write(sse_event(error_body(status, error)));
      stream_handle_->write(std::string(kSseDone));
      stream_handle_->close();
    } else {
      responder_->respond(status, "application/json", error_body(status, error));
    }
  }

  void open_stream() {
    if (!stream_handle_) stream_handle_ = responder_->start_stream(200, "text/event-stream");
  }

  void stream_event(const JobEvent& ev, Choice& c, const std::string& text, const std::string& reasoning,
                    std::vector<ToolCall>& calls, int32_t first_call, const std::vector<TokenLogprob>& lps,
                    const std::vector<int64_t>& offsets) {
    if (done_) return;
    open_stream();
    if (chat_) {
      ChatChoice d;
      d.index = ev.choice;
      if (!c.role_sent) {
        c.role_sent = true;
        stream_handle_->write(sse_event(render_chat_chunk(id_, created_, model_, d, true)));
      }
      d.content = text;
      d.reasoning_content = reasoning;
      d.has_logprobs = logprobs_ && !lps.empty();
      d.logprobs = lps;
      if (!d.content.empty() || !d.reasoning_content.empty() || d.has_logprobs)
        stream_handle_->write(sse_event(render_chat_chunk(id_, created_, model_, d, false)));
      if (!calls.empty()) {  // each call whole, in one delta
        ChatChoice t;
        t.index = ev.choice;
        t.tool_calls = std::move(calls);
        t.first_tool_call_index = first_call;
        stream_handle_->write(sse_event(render_chat_chunk(id_, created_, model_, t, false)));
      }
      if (ev.finish_reason) {
        ChatChoice f;
        f.index = ev.choice;
        f.finish_reason = c.finish;
        stream_handle_->write(sse_event(render_chat_chunk(id_, created_, model_, f, false)));
      }
    } else {
      CompletionChoice d;
      d.index = ev.choice;
      // The echoed prompt goes out with the first chunk of the choice.
      if (!echo_text_.empty() && !echo_sent_(ev.choice)) d.text = echo_text_[static_cast<size_t>(ev.choice)];
      d.text += text;
      d.has_logprobs = logprobs_;
      d.logprobs = lps;
      d.text_offsets = offsets;
      d.finish_reason = ev.finish_reason ? c.finish : std::nullopt;
      if (!d.text.empty() || d.finish_reason || !lps.empty())
        stream_handle_->write(sse_event(render_completion_chunk(id_, created_, model_, d)));
    }
    if (finished_ == choices_.size()) {
      if (include_usage_) stream_handle_->write(sse_event(render_usage_chunk(id_, created_, model_, chat_, usage())));
      stream_handle_->write(std::string(kSseDone));
      stream_handle_->close();
      done_ = true;
    }
  }

  bool echo_sent_(int32_t choice) {
    if (echo_flags_.empty()) echo_flags_.assign(choices_.size(), false);
    const bool sent = echo_flags_[static_cast<size_t>(choice)];
    echo_flags_[static_cast<size_t>(choice)] = true;
    return sent;
  }

  void respond_whole() {
    if (done_) return;
    done_ = true;
    if (chat_) {
      std::vector<ChatChoice> out;
      for (size_t i = 0; i < choices_.size(); ++i) {
        ChatChoice c;
        c.index = static_cast<int32_t>(i);
        c.content = choices_[i].text;
        c.reasoning_content = choices_[i].reasoning_text;
        c.tool_calls = choices_[i].calls;
        c.content_null = !c.tool_calls.empty() && c.content.empty();
        c.finish_reason = choices_[i].finish;
        c.has_logprobs = logprobs_;
        c.logprobs = choices_[i].logprobs;
        out.push_back(std::move(c));
      }
      responder_->respond(200, "application/json", render_chat(id_, created_, model_, out, usage()));
    } else {
      std::vector<CompletionChoice> out;
      for (size_t i = 0; i < choices_.size(); ++i) {
        CompletionChoice c;
        c.index = static_cast<int32_t>(i);
        c.text = choices_[i].text;
        c.finish_reason = choices_[i].finish;
        c.has_logprobs = logprobs_;
        c.logprobs = choices_[i].logprobs;
        c.text_offsets = choices_[i].offsets;
        out.push_back(std::move(c));
      }
      responder_->respond(200, "application/json", render_completion(id_, created_, model_, out, usage()));
    }
  }

  std::mutex mu_;
  std::shared_ptr<HttpResponder> responder_;
  std::shared_ptr<HttpStream> stream_handle_;
  const Tokenizer& tok_;
  bool chat_, stream_, include_usage_, logprobs_;
  int32_t top_n_;
  std::string model_, id_;
  int64_t created_;
  std::vector<Choice> choices_;
  size_t finished_ = 0;
  bool done_ = false;
  std::vector<std::vector<int32_t>> echo_prompts_;
  std::vector<std::string> echo_text_;
  std::vector<bool> echo_flags_;
};

}  // namespace

struct ApiServer::Impl {
  ApiServerOptions o;
  Engine* engine = nullptr;
  const Tokenizer* tok = nullptr;
  const ChatTemplate* chat = nullptr;
  MetricsRegistry* metrics = nullptr;
  std::function<std::string()> extra_metrics;
  std::unique_ptr<HttpServer> http;

  // Structured outputs. The loop thread never compiles or waits: a grammar not in the cache is
  // compiled on the grammar threads (which wait up to --grammar-compile-timeout), which then
  // submit the job or answer 400. The compiler (the vocabulary's token tables, ~1 s for 262k
  // tokens) is made by the first request that needs one.
  std::mutex grammar_mu;  // guards grammar_queue, grammar_stop, grammar_threads, making the compiler
  std::condition_variable grammar_cv;
  std::deque<std::function<void()>> grammar_queue;
  std::vector<std::thread> grammar_threads;
  bool grammar_stop = false;
  std::unique_ptr<GrammarCompiler> grammar_compiler;
  std::atomic<GrammarCompiler*> grammar_ready{nullptr};
  Status grammar_error;
  std::atomic<int64_t> grammar_hits_reported{0};
  static constexpr int kGrammarThreads = 4;

  ~Impl() {
    {
      std::lock_guard<std::mutex> lock(grammar_mu);
      grammar_stop = true;
    }
    grammar_cv.notify_all();
    for (std::thread& t : grammar_threads) t.join();
  }

  void grammar_post(std::function<void()> task) {
    std::lock_guard<std::mutex> lock(grammar_mu);
    if (grammar_threads.empty())
      for (int i = 0; i < kGrammarThreads; ++i)
        grammar_threads.emplace_back([this] {
          for (;;) {
            std::function<void()> t;
            {
              std::unique_lock<std::mutex> l(grammar_mu);
              grammar_cv.wait(l, [this] { return grammar_stop || !grammar_queue.empty(); });
              if (grammar_queue.empty()) return;  // stopping
              t = std::move(grammar_queue.front());
              grammar_queue.pop_front();
            }
            try {
              t();
            } catch (const std::exception& e) {
              TESSERA_LOG_ERROR("structured output task threw: {}", e.what());
            }
          }
        });
    grammar_queue.push_back(std::move(task));
    grammar_cv.notify_one();
  }

  // Grammar threads only: the compiler, made on first use.
  Result<GrammarCompiler*> compiler() {
    if (GrammarCompiler* c = grammar_ready.load()) return c;
    std::lock_guard<std::mutex> lock(grammar_mu);  // the other grammar threads wait for it
    if (!grammar_compiler && grammar_error.is_ok()) {
      GrammarCompilerOptions go = o.grammar;
      MetricsRegistry* m = metrics;
      go.on_compiled = [m](double s) { m->observe("tessera_grammar_compile_seconds", s); };
      const int64_t vocab = o.model_vocab > 0 ? o.model_vocab : tok->vocab_size();
      auto c = GrammarCompiler::create(*tok, vocab, o.eos_ids.empty() ? tok->eos_ids() : o.eos_ids, go);
      if (c.is_ok()) {
        grammar_compiler = std::move(*c);
        grammar_ready = grammar_compiler.get();
      } else {
        grammar_error = c.status();
      }
    }
    if (!grammar_error.is_ok()) return grammar_error;
    return grammar_compiler.get();
  }

  // Submits `job` with the request's grammar: at once when it is cached, else from a grammar
  // thread once compiled; a grammar that cannot be compiled (or not in time) is a 400 naming the
  // field it came from.
  void submit_with_grammar(Job job, const GenerationParams& p, const std::shared_ptr<HttpResponder>& r) {
    if (!p.grammar) return submit(std::move(job), r);
    if (GrammarCompiler* c = grammar_ready.load()) {
      if (auto g = c->cached(*p.grammar)) {
        job.grammar = std::move(g);
        return submit(std::move(job), r);
      }
    }
    auto shared_job = std::make_shared<Job>(std::move(job));
    grammar_post([this, shared_job, spec = *p.grammar, field = p.grammar_field, r] {
      auto c = compiler();
      if (!c.is_ok()) return error(r, 400, "structured outputs: " + c.status().message(), field);
      auto g = (*c)->compile(spec);
      if (!g.is_ok()) {
        metrics->add("tessera_grammar_refused_total");
        return error(r, 400, fmt::format("{}: {}", field, g.status().message()), field);
      }
      shared_job->grammar = std::move(*g);
      submit(std::move(*shared_job), r);
    });
  }

  void error(const std::shared_ptr<HttpResponder>& r, int status, const std::string& message,
             const std::string& param = "") {
    HttpHeaders headers;
    if (status == 429 || status == 503) headers.emplace_back("Retry-After", "1");
    r->respond(status, "application/json", error_body(status, message, param), headers);
  }

  void json_ok(const std::shared_ptr<HttpResponder>& r, const json& j) { r->respond(200, "application/json", dump(j)); }

  bool check_model(const std::string& model, const std::shared_ptr<HttpResponder>& r) {
    if (model.empty() || model == o.model_name) return true;
    error(r, 404, fmt::format("The model '{}' does not exist; this server serves '{}'", model, o.model_name), "model");
    return false;
  }

  // Context check: the prompt must leave room for at least one token (and for max_tokens when
  // the client set it).
  bool check_length(size_t prompt_len, int64_t max_tokens, bool max_given, const std::shared_ptr<HttpResponder>& r) {
    const auto n = static_cast<int64_t>(prompt_len);
    if (n >= o.max_positions || (max_given && n + max_tokens > o.max_positions)) {
      error(r, 400,
            fmt::format("This model's maximum context length is {} tokens; the request has {} prompt tokens and "
                        "asks for {} more",
                        o.max_positions, n, max_given ? max_tokens : 1),
            "prompt");
      return false;
    }
    return true;
  }

  bool valid_ids(const std::vector<int32_t>& ids, const std::shared_ptr<HttpResponder>& r) {
    for (int32_t id : ids)
      if (id < 0 || id >= tok->vocab_size()) {
        error(r, 400, fmt::format("token id {} is outside the vocabulary (0..{})", id, tok->vocab_size() - 1), "prompt");
        return false;
      }
    return true;
  }

  bool valid_logit_bias(const GenerationParams& p, const std::shared_ptr<HttpResponder>& r) {
    for (const auto& [id, bias] : p.sampling.logit_bias)
      if (id >= tok->vocab_size()) {
        error(r, 400,
              fmt::format("logit_bias: token id {} is outside the vocabulary (0..{})", id, tok->vocab_size() - 1),
              "logit_bias");
        return false;
      }
    return true;
  }

  void submit(Job job, const std::shared_ptr<HttpResponder>& r) {
    auto id = engine->submit(std::move(job));
    if (!id.is_ok()) {
      error(r, http_status_for(id.status()), id.status().message());
      return;
    }
    const uint64_t job_id = *id;
    Engine* e = engine;
    r->on_disconnect([e, job_id] { e->cancel(job_id); });
    if (!r->client_connected()) e->cancel(job_id);
  }

  void completions(const HttpRequest& req, const std::shared_ptr<HttpResponder>& r) {
    auto parsed = parse_completion_request(req.body);
    if (!parsed.is_ok()) return error(r, 400, parsed.status().message());
    CompletionRequest& c = *parsed;
    if (!check_model(c.params.model, r) || !valid_logit_bias(c.params, r)) return;
    const bool logprobs = c.logprobs >= 0;
    auto builder = std::make_shared<ResponseBuilder>(r, *tok, false, c.params.stream, c.params.include_usage, logprobs,
                                                     std::max(0, c.logprobs), o.model_name,
                                                     c.prompts.size() * static_cast<size_t>(c.params.n));
    builder->n_per_prompt_ = static_cast<size_t>(c.params.n);
    Job job;
    for (size_t p = 0; p < c.prompts.size(); ++p) {
      const PromptInput& in = c.prompts[p];
      std::vector<int32_t> ids = in.is_ids ? in.ids : tok->encode(in.text, /*add_special=*/true);
      if (ids.empty()) return error(r, 400, "the prompt is empty after tokenization", "prompt");
      if (!valid_ids(ids, r)) return;
      if (!check_length(ids.size(), c.params.max_tokens, true, r)) return;
      for (int32_t k = 0; k < c.params.n; ++k) {
        const int32_t choice = static_cast<int32_t>(p) * c.params.n + k;
        if (c.echo) builder->set_echo(static_cast<size_t>(choice), in.is_ids ? tok->decode(ids) : in.text, ids);
        job.sequences.push_back({ids, choice});
      }
    }
    fill_job(job, c.params, logprobs, c.logprobs);
    job.want_prompt_logprobs = c.echo && logprobs;
    job.on_event = [builder](const JobEvent& ev) { builder->on_event(ev); };
    submit_with_grammar(std::move(job), c.params, r);
  }

  void fill_job(Job& job, const GenerationParams& p, bool logprobs, int32_t top_n) {
    job.sampling = p.sampling;
    job.sampling.n_logprobs = logprobs ? top_n : 0;
    job.sampling.return_logprob = logprobs;
    job.max_tokens = p.max_tokens;
    job.stop = p.stop;
    job.ignore_eos = p.ignore_eos;
    job.min_tokens = p.min_tokens;
    job.priority = p.priority;
    if (!p.speculation.empty()) job.speculation = *parse_spec_mode(p.speculation);
    job.want_logprobs = logprobs;
  }

  void chat_completions(const HttpRequest& req, const std::shared_ptr<HttpResponder>& r) {
    auto parsed = parse_chat_request(req.body);
    if (!parsed.is_ok()) return error(r, 400, parsed.status().message());
    ChatRequest& c = *parsed;
    if (!check_model(c.params.model, r) || !valid_logit_bias(c.params, r)) return;
    if (!chat) return error(r, 400, "this model has no chat template; use /v1/completions");
    std::vector<ChatMessage> messages;
    for (const ChatMessageInput& m : c.messages) messages.push_back({m.role, m.content, m.extra_json});
    ChatTemplateOptions opts;
    opts.add_generation_prompt = true;
    opts.bos_token = tok->bos_token();
    opts.eos_token = tok->eos_token();
    // Tools: the template gets them (also with tool_choice "none"); a call's arguments follow the
    // function's schema (the grammar), and the reply's calls are parsed in the family's format.
    const ToolFormat tool_format = tool_format_for_template(chat->source());
    const ToolRequest& tr = c.tools_request;
    json context = c.template_kwargs_json.empty() ? json::object() : json::parse(c.template_kwargs_json);
    if (!tr.tools.empty()) context["tools"] = json::parse(tr.tools_json);
    if (!context.empty()) opts.extra_context_json = context.dump();
    if (tr.tool_choice.mode != ToolChoice::Mode::kNone) {
      // A JSON response_format with tools (auto): the reply is calls, or JSON matching it.
      std::optional<std::string> content_schema;
      if (c.params.grammar) content_schema = c.params.grammar->kind == GrammarKind::kJsonSchema ? c.params.grammar->source
                                                                                                : R"({"type": "object"})";
      auto tag = tool_call_structural_tag(tool_format, tr.tools, tr.tool_choice, tr.parallel_tool_calls, content_schema);
      if (!tag.is_ok()) return error(r, 400, tag.status().message(), "tool_choice");
      c.params.grammar = GrammarSpec{GrammarKind::kStructuralTag, *tag};
      c.params.grammar_field = "tools";
    }
    auto text = chat->render(messages, opts);
    if (!text.is_ok()) return error(r, 400, "chat template: " + text.status().message(), "messages");
    // Reasoning: the prompt may have opened the reasoning already (or closed it: thinking off). A
    // JSON answer or a tool call is constrained after the reasoning, not instead of it; a regex,
    // choice or grammar the client wrote is the whole output (it may spell the <think> part).
    const bool reasoning_inside = o.reasoning && prompt_opens_reasoning(*text);
    const bool reasoning_closed = o.reasoning && prompt_closes_reasoning(*text);
    if (o.reasoning && c.params.grammar && !reasoning_closed &&
        (c.params.grammar->kind == GrammarKind::kJsonSchema || c.params.grammar->kind == GrammarKind::kJsonObject ||
         c.params.grammar->kind == GrammarKind::kStructuralTag))
      c.params.grammar->reasoning = reasoning_inside ? ReasoningPrefix::kInside : ReasoningPrefix::kThink;
    std::vector<int32_t> ids = tok->encode(*text, /*add_special=*/false);
    if (ids.empty()) return error(r, 400, "the conversation is empty after tokenization", "messages");
    const bool max_given = c.params.max_tokens >= 0;
    if (!check_length(ids.size(), c.params.max_tokens, max_given, r)) return;
    if (!max_given) c.params.max_tokens = o.max_positions - static_cast<int64_t>(ids.size());
    auto builder = std::make_shared<ResponseBuilder>(r, *tok, true, c.params.stream, c.params.include_usage,
                                                     c.logprobs, c.top_logprobs, o.model_name,
                                                     static_cast<size_t>(c.params.n));
    builder->n_per_prompt_ = static_cast<size_t>(c.params.n);
    if (c.tools_request.tool_choice.mode != ToolChoice::Mode::kNone) builder->parse_tool_calls(tool_format);
    if (o.reasoning && !reasoning_closed) builder->parse_reasoning(reasoning_inside);
    Job job;
    for (int32_t k = 0; k < c.params.n; ++k) job.sequences.push_back({ids, k});
    fill_job(job, c.params, c.logprobs, c.top_logprobs);
    job.on_event = [builder](const JobEvent& ev) { builder->on_event(ev); };
    submit_with_grammar(std::move(job), c.params, r);
  }

  // The "model" of a /tokenize or /detokenize body: absent or null is "", anything but a string a 400.
  bool body_model_ok(const json& j, const std::shared_ptr<HttpResponder>& r) {
    auto m = j.find("model");
    if (m == j.end() || m->is_null()) return check_model("", r);
    if (!m->is_string()) {
      error(r, 400, "'model' must be a string", "model");
      return false;
    }
    return check_model(m->get<std::string>(), r);
  }

  void tokenize(const HttpRequest& req, const std::shared_ptr<HttpResponder>& r) {
    json j = json::parse(req.body, nullptr, false);
    if (j.is_discarded() || !j.is_object()) return error(r, 400, "the request body must be a JSON object");
    if (!body_model_ok(j, r)) return;
    bool add_special = true;
    if (j.contains("add_special_tokens")) {
      if (!j["add_special_tokens"].is_boolean()) return error(r, 400, "'add_special_tokens' must be a boolean");
      add_special = j["add_special_tokens"].get<bool>();
    }
    std::vector<int32_t> ids;
    if (j.contains("prompt") && j["prompt"].is_string()) {
      ids = tok->encode(j["prompt"].get<std::string>(), add_special);
    } else if (j.contains("messages")) {
      json wrapped = {{"messages", j["messages"]}};
      auto chat_req = parse_chat_request(wrapped.dump());
      if (!chat_req.is_ok()) return error(r, 400, chat_req.status().message());
      if (!chat) return error(r, 400, "this model has no chat template");
      std::vector<ChatMessage> messages;
      for (const auto& m : chat_req->messages) messages.push_back({m.role, m.content, m.extra_json});
      ChatTemplateOptions opts;
      opts.add_generation_prompt = true;
      if (auto g = j.find("add_generation_prompt"); g != j.end() && !g->is_null()) {
        if (!g->is_boolean())
          return error(r, 400, "'add_generation_prompt' must be a boolean", "add_generation_prompt");
        opts.add_generation_prompt = g->get<bool>();
      }
      opts.bos_token = tok->bos_token();
      opts.eos_token = tok->eos_token();
      auto text = chat->render(messages, opts);
      if (!text.is_ok()) return error(r, 400, "chat template: " + text.status().message());
      ids = tok->encode(*text, false);
    } else {
      return error(r, 400, "'prompt' (a string) or 'messages' is required", "prompt");
    }
    json_ok(r, {{"tokens", ids}, {"count", ids.size()}, {"max_model_len", o.max_positions}});
  }

  void detokenize(const HttpRequest& req, const std::shared_ptr<HttpResponder>& r) {
    json j = json::parse(req.body, nullptr, false);
    if (j.is_discarded() || !j.is_object()) return error(r, 400, "the request body must be a JSON object");
    if (!body_model_ok(j, r)) return;
    if (!j.contains("tokens") || !j["tokens"].is_array()) return error(r, 400, "'tokens' (a list of ids) is required", "tokens");
    std::vector<int32_t> ids;
    for (const json& x : j["tokens"]) {
      if (!x.is_number_integer()) return error(r, 400, "'tokens' must hold integers", "tokens");
      const int64_t v = x.get<int64_t>();
      if (v < 0 || v >= tok->vocab_size())
        return error(r, 400, fmt::format("token id {} is outside the vocabulary", v), "tokens");
      ids.push_back(static_cast<int32_t>(v));
    }
    json_ok(r, {{"prompt", tok->decode(ids)}});
  }

  void health(const HttpRequest&, const std::shared_ptr<HttpResponder>& r) {
    if (engine->draining()) {  // shutting down: send traffic elsewhere
      r->respond(503, "application/json", dump({{"status", "draining"}, {"open_requests", engine->open_jobs()}}));
      return;
    }
    if (engine->healthy()) return json_ok(r, {{"status", "ok"}});
    // restarting: the shards failed and a new group is starting; failed: recovery gave up.
    const RecoveryState rs = engine->recovery();
    const char* status = rs == RecoveryState::kRestarting ? "restarting"
                         : rs == RecoveryState::kFailed   ? "failed"
                                                          : "unhealthy";
    r->respond(503, "application/json", dump({{"status", status}, {"error", engine->failure()}}));
  }

  void models(const HttpRequest&, const std::shared_ptr<HttpResponder>& r) {
    json_ok(r, {{"object", "list"},
                {"data",
                 {{{"id", o.model_name},
                   {"object", "model"},
                   {"created", unix_now()},
                   {"owned_by", "tessera"},
                   {"max_model_len", o.max_positions},
                   {"chat_template", o.chat_template_source}}}}});
  }

  void prometheus(const HttpRequest&, const std::shared_ptr<HttpResponder>& r) {
    if (GrammarCompiler* c = grammar_ready.load()) {
      const int64_t hits = c->stats().cache_hits;
      const int64_t before = grammar_hits_reported.exchange(hits);
      if (hits > before) metrics->add("tessera_grammar_cache_hits_total", static_cast<double>(hits - before));
    }
    r->respond(200, "text/plain; version=0.0.4", metrics->render() + (extra_metrics ? extra_metrics() : ""));
  }

  void tokenizer_info(const HttpRequest&, const std::shared_ptr<HttpResponder>& r) {
    json_ok(r, {{"vocab_size", tok->vocab_size()},
                {"bos_token", tok->bos_token()},
                {"eos_token", tok->eos_token()},
                {"bos_token_id", tok->bos_id()},
                {"eos_token_ids", tok->eos_ids()},
                {"has_chat_template", chat != nullptr},
                {"chat_template", o.chat_template_source},
                {"tool_call_format", chat != nullptr ? json(tool_format_name(tool_format_for_template(chat->source())))
                                                     : json(nullptr)},
                {"max_model_len", o.max_positions}});
  }

  // The routes: one row each (path, method, handler). A known path with another method is 405,
  // an unknown path 404.
  struct Route {
    std::string_view path;
    std::string_view method;
    void (Impl::*handle)(const HttpRequest&, const std::shared_ptr<HttpResponder>&);
  };
  static constexpr Route kRoutes[] = {
      {"/health", "GET", &Impl::health},
      {"/v1/models", "GET", &Impl::models},
      {"/metrics", "GET", &Impl::prometheus},
      {"/tokenizer_info", "GET", &Impl::tokenizer_info},
      {"/v1/completions", "POST", &Impl::completions},
      {"/v1/chat/completions", "POST", &Impl::chat_completions},
      {"/tokenize", "POST", &Impl::tokenize},
      {"/detokenize", "POST", &Impl::detokenize},
  };

  void route(const HttpRequest& req, std::shared_ptr<HttpResponder> r) {
    for (const Route& route : kRoutes) {
      if (route.path != req.path) continue;
      if (route.method != req.method) return error(r, 405, fmt::format("use {}", route.method));
      return (this->*route.handle)(req, r);
    }
    error(r, 404, "no route for " + req.method + " " + req.path);
  }
};

ApiServer::ApiServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ApiServer::~ApiServer() { stop(); }

Result<std::unique_ptr<ApiServer>> ApiServer::start(const ApiServerOptions& options, Engine& engine,
                                                    const Tokenizer& tokenizer, const ChatTemplate* chat_template,
                                                    MetricsRegistry& metrics,
                                                    std::function<std::string()> extra_metrics) {
  auto impl = std::make_unique<Impl>();
  impl->o = options;
  impl->engine = &engine;
  impl->tok = &tokenizer;
  impl->chat = chat_template;
  impl->metrics = &metrics;
  impl->extra_metrics = std::move(extra_metrics);
  metrics.declare_histogram("tessera_grammar_compile_seconds",
                            "Structured outputs: time to compile a schema, regex or grammar (cache misses)",
                            {1e-3, 3e-3, 1e-2, 3e-2, 0.1, 0.3, 1.0, 3.0, 10.0});
  metrics.declare_counter("tessera_grammar_cache_hits_total",
                          "Structured-output requests whose grammar was compiled already (or being compiled)");
  metrics.declare_counter("tessera_grammar_refused_total",
                          "Structured-output requests refused by the compiler (unsupported, invalid, over the time budget)");
  HttpServerOptions ho;
  ho.host = options.host;
  ho.port = options.port;
  ho.max_body_bytes = options.max_body_bytes;
  Impl* raw = impl.get();
  TESSERA_ASSIGN_OR_RETURN(impl->http, HttpServer::start(ho, [raw](const HttpRequest& req,
                                                                   std::shared_ptr<HttpResponder> r) {
    try {
      raw->route(req, std::move(r));
    } catch (const std::exception& e) {  // a bug must not take the server down
      TESSERA_LOG_ERROR("handler for {} {} threw: {}", req.method, req.path, e.what());
    }
  }));
  return std::unique_ptr<ApiServer>(new ApiServer(std::move(impl)));
}

int ApiServer::port() const { return impl_->http ? impl_->http->port() : 0; }

void ApiServer::stop(std::chrono::milliseconds flush) {
  if (impl_ && impl_->http) impl_->http->stop(flush);
}

}  // namespace tessera
