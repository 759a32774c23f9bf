// The OpenAI-compatible HTTP API (ARCHITECTURE.md): /v1/completions, /v1/chat/completions,
// /v1/models, /health, /metrics, /tokenize, /detokenize, /tokenizer_info. Handlers run on the
// HTTP server's thread: they parse, tokenize and hand a Job to the engine; the job's events
// (engine thread) render responses or SSE chunks and write them to the client.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include "common/status.h"
#include "engine/engine.h"
#include "server/http_server.h"
#include "engine/metrics.h"
#include "grammar/grammar.h"
#include "template/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace tessera {

struct ApiServerOptions {
  std::string model_name;          // the id clients send as "model"
  std::string host = "127.0.0.1";
  int port = 8000;                 // 0: ephemeral
  size_t max_body_bytes = 8 << 20;
  int64_t max_positions = 0;       // context length
  // Where the chat template came from ("model", "builtin:gemma3", "--chat-template PATH"; "" when
  // none), reported by /v1/models and /tokenizer_info.
  std::string chat_template_source;
  // Structured outputs: the logits' width and the stop tokens the grammars are compiled for
  // (the compiler is made on the first request that asks for one), and its limits.
  int64_t model_vocab = 0;
  std::vector<int32_t> eos_ids;
  GrammarCompilerOptions grammar;
  // Chat replies: the <think> ... </think> part goes to reasoning_content, and a grammar (schema,
  // tools) constrains what follows it (server/reasoning.h).
  bool reasoning = false;
};

class ApiServer {
 public:
  // Everything passed must outlive the server. `chat_template` may be null (chat requests are
  // then refused with 400). `extra_metrics` is appended to /metrics (scheduler knobs).
  static Result<std::unique_ptr<ApiServer>> start(const ApiServerOptions& options, Engine& engine,
                                                  const Tokenizer& tokenizer, const ChatTemplate* chat_template,
                                                  MetricsRegistry& metrics, std::function<std::string()> extra_metrics);
  ~ApiServer();
  int port() const;
  // HttpServer::stop: with flush > 0 the responses and streams in progress get that long to
  // finish sending (the engine ended or failed their jobs first).
  void stop(std::chrono::milliseconds flush = std::chrono::milliseconds(0));

  struct Impl;

 private:
  explicit ApiServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace tessera
