#include "grammar/grammar.h"

#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <future>
#include <list>
#include <map>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <variant>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <xgrammar/xgrammar.h>

#include "common/logging.h"
#include "common/sha256.h"
#include "grammar/bounded_strings.h"
#include "grammar/digit_runs.h"
#include "grammar/pattern_regexes.h"
#include "grammar/schema_check.h"

namespace tessera {

const char* grammar_kind_name(GrammarKind kind) {
  switch (kind) {
    case GrammarKind::kJsonObject: return "json_object";
    case GrammarKind::kJsonSchema: return "json_schema";
    case GrammarKind::kRegex: return "regex";
    case GrammarKind::kChoice: return "choice";
    case GrammarKind::kEbnf: return "grammar";
    case GrammarKind::kStructuralTag: return "tool-call grammar";
  }
  return "?";
}

std::string GrammarSpec::key() const {
  return fmt::format("{}/{}{}{}/{}", grammar_kind_name(kind), compact_json ? 'c' : 'w', strict ? 's' : 'l',
                     static_cast<int>(reasoning), sha256_hex(source));
}

namespace {

constexpr int kCompileNice = 10;  // the compile threads' nice value (Linux: per thread)

// The regex that matches exactly `text`: every character that is not a letter, a digit or a
// byte of a multi-byte UTF-8 character is escaped.
// An IPv4 address as PyPI's jsonschema (Python's ipaddress) and RFC 2673's dotted quad take it:
// no leading zeros. xgrammar's own `ipv4` format lets "026" through.
constexpr const char* kStrictIpv4 =
    "^((25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])\\.){3}(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])$";

// Formats xgrammar writes wider than JSON Schema validators take them, replaced by patterns:
// `format: ipv4` (on a string schema without a pattern) becomes kStrictIpv4. Values (const, enum,
// default, examples) are left alone. Whether anything changed.
bool narrow_formats(nlohmann::ordered_json& schema, int depth = 0) {
  if (depth > 64) return false;
  bool changed = false;
  if (schema.is_object()) {
    if (auto f = schema.find("format"); f != schema.end() && *f == "ipv4" && !schema.contains("pattern")) {
      schema.erase("format");
      schema["pattern"] = kStrictIpv4;
      changed = true;
    }
    for (auto& [key, value] : schema.items())
      if (key != "const" && key != "enum" && key != "default" && key != "examples")
        changed |= narrow_formats(value, depth + 1);
  } else if (schema.is_array()) {
    for (auto& value : schema) changed |= narrow_formats(value, depth + 1);
  }
  return changed;
}

std::string regex_literal(const std::string& text) {
  std::string out;
  for (const char ch : text) {
    const auto c = static_cast<unsigned char>(ch);
    if (std::isalnum(c) || c >= 0x80 || c == ' ') {
      out += ch;
    } else if (c < 0x20) {
      out += fmt::format("\\x{:02x}", c);
    } else {
      out += '\\';
      out += ch;
    }
  }
  return out;
}

class XgMatcher final : public GrammarMatcher {
 public:
  XgMatcher(const xgrammar::CompiledGrammar& g, int64_t vocab)
      : matcher_(g), vocab_(vocab) {}
  bool accept(int32_t token) override {
    if (token < 0 || token >= vocab_) return false;
    return matcher_.AcceptToken(token);
  }
  bool fill_mask(std::span<uint32_t> mask) override {
    int64_t shape = static_cast<int64_t>(mask.size());
    DLTensor t{};
    t.data = mask.data();
    t.device = DLDevice{kDLCPU, 0};
    t.ndim = 1;
    t.dtype = DLDataType{kDLInt, 32, 1};
    t.shape = &shape;
    t.strides = nullptr;
    t.byte_offset = 0;
    return matcher_.FillNextTokenBitmask(&t);
  }
  std::string forced_string() override { return matcher_.FindJumpForwardString(); }
  void rollback(int n) override { matcher_.Rollback(n); }
  bool terminated() const override { return matcher_.IsTerminated(); }
  bool completed() const override { return matcher_.IsCompleted(); }

 private:
  xgrammar::GrammarMatcher matcher_;
  int64_t vocab_;
};

// Token bytes -> id, for spelling forced text (CompiledGrammar::spell).
struct TokenTable {
  explicit TokenTable(const std::vector<std::string>& vocab) {
    ids.reserve(vocab.size());
    for (size_t id = 0; id < vocab.size(); ++id) {
      if (vocab[id].empty()) continue;
      ids.emplace(vocab[id], static_cast<int32_t>(id));  // the first id of a duplicate wins
      longest = std::max(longest, vocab[id].size());
    }
  }
  std::vector<int32_t> spell(std::string_view text) const {
    std::vector<int32_t> out;
    size_t pos = 0;
    while (pos < text.size()) {
      size_t n = std::min(longest, text.size() - pos);
      for (; n > 0; --n) {
        auto it = ids.find(std::string(text.substr(pos, n)));
        if (it != ids.end()) {
          out.push_back(it->second);
          break;
        }
      }
      if (n == 0) break;
      pos += n;
    }
    return out;
  }
  std::unordered_map<std::string, int32_t> ids;
  size_t longest = 0;
};

class XgCompiledGrammar final : public CompiledGrammar {
 public:
  XgCompiledGrammar(GrammarSpec spec, xgrammar::CompiledGrammar compiled, int64_t vocab,
                    std::shared_ptr<const TokenTable> table)
      : spec_(std::move(spec)), compiled_(std::move(compiled)), vocab_(vocab), table_(std::move(table)) {}
  std::vector<int32_t> spell(std::string_view text) const override { return table_->spell(text); }
  const GrammarSpec& spec() const override { return spec_; }
  size_t memory_bytes() const override { return compiled_.MemorySizeBytes(); }
  std::unique_ptr<GrammarMatcher> matcher() const override { return std::make_unique<XgMatcher>(compiled_, vocab_); }
  int64_t vocab() const override { return vocab_; }

 private:
  GrammarSpec spec_;
  xgrammar::CompiledGrammar compiled_;
  int64_t vocab_;
  std::shared_ptr<const TokenTable> table_;
};

class XgCompiler final : public GrammarCompiler {
 public:
  XgCompiler(xgrammar::TokenizerInfo info, int64_t vocab, std::shared_ptr<const TokenTable> table,
             const GrammarCompilerOptions& options)
      : info_(info),
        compiler_(info, std::max(1, options.threads), /*cache_enabled=*/false),
        vocab_(vocab),
        table_(std::move(table)),
        options_(options) {
    for (int32_t i = 0; i < std::max(1, options.threads); ++i) workers_.emplace_back([this] { work(); });
  }
  ~XgCompiler() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (std::thread& t : workers_) t.join();
  }

  Result<std::shared_ptr<const CompiledGrammar>> compile(const GrammarSpec& spec) override {
    const std::string key = spec.key();
    std::shared_future<Outcome> future;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = cache_.find(key);
      if (it != cache_.end()) {
        ++stats_.cache_hits;
        lru_.splice(lru_.begin(), lru_, it->second.lru);
        future = it->second.future;
      } else {
        // A schema whose bounded strings could never compile in the budget is refused at once
        // (not cached: the same request is refused the same way), without a compile thread.
        if (spec.kind == GrammarKind::kJsonSchema) {
          if (Status s = check_compile_cost(spec.source, vocab_, static_cast<double>(options_.compile_timeout.count()));
              !s.is_ok()) {
            ++stats_.refused;
            return s;
          }
        }
        auto task = std::make_shared<std::packaged_task<Outcome()>>([this, spec] { return build(spec); });
        future = task->get_future().share();
        lru_.push_front(key);
        cache_.emplace(key, Entry{future, lru_.begin(), 0});
        queue_.push_back([this, task, key] {
          (*task)();
          settle(key);
        });
        cv_.notify_one();
      }
    }
    if (future.wait_for(options_.compile_timeout) != std::future_status::ready) {
      std::lock_guard<std::mutex> lock(mu_);
      ++stats_.refused;
      return Status::deadline_exceeded(fmt::format(
          "compiling the {} took longer than the {} ms budget (--grammar-compile-timeout); it goes on in the "
          "background and a later request with the same {} will not wait for it",
          grammar_kind_name(spec.kind), options_.compile_timeout.count(), grammar_kind_name(spec.kind)));
    }
    const Outcome& o = future.get();
    if (!o.error.is_ok()) {
      std::lock_guard<std::mutex> lock(mu_);
      ++stats_.refused;
      return o.error;
    }
    return std::shared_ptr<const CompiledGrammar>(o.grammar);
  }

  std::shared_ptr<const CompiledGrammar> cached(const GrammarSpec& spec) override {
    const std::string key = spec.key();
    std::lock_guard<std::mutex> lock(mu_);
    auto it = cache_.find(key);
    if (it == cache_.end() || it->second.future.wait_for(std::chrono::seconds(0)) != std::future_status::ready)
      return nullptr;
    const Outcome& o = it->second.future.get();
    if (!o.error.is_ok()) return nullptr;
    ++stats_.cache_hits;
    lru_.splice(lru_.begin(), lru_, it->second.lru);
    return o.grammar;
  }
  int64_t vocab() const override { return vocab_; }
  GrammarCompileStats stats() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return stats_;
  }

 private:
  struct Outcome {
    Status error;
    std::shared_ptr<const XgCompiledGrammar> grammar;
  };
  struct Entry {
    std::shared_future<Outcome> future;
    std::list<std::string>::iterator lru;
    size_t bytes = 0;
  };

  Outcome build(const GrammarSpec& spec) {
    const auto t0 = std::chrono::steady_clock::now();
    Outcome o = build_timed(spec);
    if (options_.on_compiled)
      options_.on_compiled(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    return o;
  }

  // The reasoning part of a reasoning model's output: free text up to "</think>" (opened by the
  // output or by the prompt), then at most 4 whitespace characters.
  xgrammar::Grammar reasoning_grammar(ReasoningPrefix prefix) const {
    nlohmann::json tag = {{"type", "tag"},
                          {"begin", prefix == ReasoningPrefix::kThink ? "<think>" : ""},
                          {"content", {{"type", "any_text"}}},
                          {"end", "</think>"}};
    nlohmann::json ws = {{"type", "regex"}, {"pattern", "\\s{0,4}"}};
    nlohmann::json st = {{"type", "structural_tag"}, {"format", {{"type", "sequence"}, {"elements", {tag, ws}}}}};
    auto g = xgrammar::Grammar::FromStructuralTag(st.dump(), info_);
    if (auto* grammar = std::get_if<xgrammar::Grammar>(&g)) return *grammar;
    throw std::runtime_error("the reasoning prefix's structural tag does not compile");
  }

  // `source` (JSON: a schema, or a structural tag holding schemas) with narrow_formats applied.
  static std::string with_narrow_formats(const std::string& source) {
    nlohmann::ordered_json j = nlohmann::ordered_json::parse(source, nullptr, false);
    return !j.is_discarded() && narrow_formats(j) ? j.dump() : source;
  }

  // xgrammar's JSON Schema grammar, rewritten where it is wrong or slow: patterns through the
  // regex expansion (grammar/pattern_regexes.h: its automaton accepts strings the pattern does
  // not match), runs of digits bounded (grammar/digit_runs.h: every number ends), length-bounded
  // strings with JSON's characters and as chains of rules (grammar/bounded_strings.h: valid
  // JSON, cheap masks).
  static Result<xgrammar::Grammar> rewritten(xgrammar::Grammar grammar) {
    std::string text = grammar.ToString();
    bool changed = false;
    if (std::optional<std::string> expanded = expand_pattern_regexes(text, [](const std::string& pattern) {
          try {
            return std::optional<std::string>(xgrammar::Grammar::FromRegex(pattern).ToString());
          } catch (const std::exception&) {
            return std::optional<std::string>();
          }
        })) {
      text = std::move(*expanded);
      changed = true;
    }
    if (std::optional<std::string> capped = cap_digit_runs(text)) {
      text = std::move(*capped);
      changed = true;
    }
    if (std::optional<std::string> unrolled = unroll_bounded_strings(text)) {
      text = std::move(*unrolled);
      changed = true;
    }
    if (!changed) return grammar;
    try {
      return xgrammar::Grammar::FromEBNF(text, "root");
    } catch (const std::exception& e) {
      return Status::internal(fmt::format("the rewritten grammar does not parse: {}", e.what()));
    }
  }

  // The spec as an xgrammar grammar (not yet compiled against the vocabulary).
  Result<xgrammar::Grammar> grammar_of(const GrammarSpec& spec) {
    const std::optional<int> no_indent;
    switch (spec.kind) {
      case GrammarKind::kJsonObject:
        return xgrammar::Grammar::FromJSONSchema(R"({"type": "object"})", !spec.compact_json, no_indent, std::nullopt,
                                                 /*strict_mode=*/false);
      case GrammarKind::kJsonSchema:
        return rewritten(xgrammar::Grammar::FromJSONSchema(with_narrow_formats(spec.source), !spec.compact_json,
                                                           no_indent, std::nullopt, spec.strict));
      case GrammarKind::kRegex:
        return xgrammar::Grammar::FromRegex(spec.source);
      case GrammarKind::kChoice: {
        nlohmann::json choices = nlohmann::json::parse(spec.source, nullptr, false);
        if (!choices.is_array() || choices.empty())
          return Status::invalid_argument("the choices must be a non-empty list of strings");
        std::string regex;
        for (size_t i = 0; i < choices.size(); ++i) {
          if (!choices[i].is_string())
            return Status::invalid_argument(fmt::format("choice [{}] is not a string: {}", i, choices[i].dump()));
          regex += (i ? "|" : "") + std::string("(") + regex_literal(choices[i].get<std::string>()) + ")";
        }
        return xgrammar::Grammar::FromRegex(regex);
      }
      case GrammarKind::kEbnf:
        return xgrammar::Grammar::FromEBNF(spec.source, "root");
      case GrammarKind::kStructuralTag: {
        // Its JSON Schemas (tool arguments, a response format) get what a json_schema request's get.
        auto g = xgrammar::Grammar::FromStructuralTag(with_narrow_formats(spec.source), info_);
        if (auto* grammar = std::get_if<xgrammar::Grammar>(&g)) return rewritten(std::move(*grammar));
        return Status::invalid_argument(
            std::visit([](const auto& e) { return std::string(e.what()); }, std::get<xgrammar::StructuralTagError>(g)));
      }
    }
    return Status::invalid_argument("unknown grammar kind");
  }

  Outcome build_timed(const GrammarSpec& spec) {
    const char* what = grammar_kind_name(spec.kind);
    // What xgrammar would not enforce is refused first (once per spec: refusals are not cached,
    // compiled grammars are, so a cache hit skips this).
    if (spec.kind == GrammarKind::kJsonSchema)
      if (Status s = check_json_schema(spec.source); !s.is_ok()) return {s, nullptr};
    try {
      Result<xgrammar::Grammar> built = grammar_of(spec);
      if (!built.is_ok())
        return {Status::invalid_argument(fmt::format("the {} cannot be compiled: {}", what, built.status().message())),
                nullptr};
      xgrammar::Grammar grammar = std::move(built).value();
      if (spec.reasoning == ReasoningPrefix::kInside)
        grammar = xgrammar::Grammar::Concat({reasoning_grammar(spec.reasoning), grammar});
      else if (spec.reasoning == ReasoningPrefix::kThink)  // reasoning first, or the answer at once
        grammar = xgrammar::Grammar::Union({xgrammar::Grammar::Concat({reasoning_grammar(spec.reasoning), grammar}), grammar});
      std::optional<xgrammar::CompiledGrammar> g = compiler_.CompileGrammar(grammar);
      auto out = std::make_shared<XgCompiledGrammar>(spec, std::move(*g), vocab_, table_);
      std::lock_guard<std::mutex> lock(mu_);
      ++stats_.compiled;
      return {Status::ok(), std::move(out)};
    } catch (const std::exception& e) {
      std::string msg = e.what();
      // xgrammar's messages may carry a source location and a trailing newline.
      while (!msg.empty() && (msg.back() == '\n' || msg.back() == ' ')) msg.pop_back();
      return {Status::invalid_argument(fmt::format("the {} cannot be compiled: {}", what, msg)), nullptr};
    }
  }

  // A finished compilation: its size counts against the cache; errors are not kept (the same
  // request gets the same error again, and a fixed one compiles).
  void settle(const std::string& key) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = cache_.find(key);
    if (it == cache_.end()) return;
    const Outcome& o = it->second.future.get();
    if (!o.error.is_ok()) {
      lru_.erase(it->second.lru);
      cache_.erase(it);
      return;
    }
    it->second.bytes = o.grammar->memory_bytes();
    bytes_ += it->second.bytes;
    while (bytes_ > static_cast<size_t>(std::max<int64_t>(0, options_.cache_bytes)) && lru_.size() > 1) {
      auto victim = cache_.find(lru_.back());
      if (victim != cache_.end()) {
        if (victim->second.future.wait_for(std::chrono::seconds(0)) != std::future_status::ready) break;
        bytes_ -= victim->second.bytes;
        cache_.erase(victim);
      }
      lru_.pop_back();
    }
  }

  void work() {
    // Compilations yield the CPU to serving: this thread (and the threads xgrammar starts from it
    // for one compilation, which inherit it) runs at a lower priority than the engine and the
    // shards, so a long compilation slows the streams in flight as little as the cores allow.
    (void)::setpriority(PRIO_PROCESS, static_cast<id_t>(::syscall(SYS_gettid)), kCompileNice);
    for (;;) {
      std::function<void()> job;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
        if (stop_ && queue_.empty()) return;
        job = std::move(queue_.front());
        queue_.pop_front();
      }
      job();
    }
  }

  xgrammar::TokenizerInfo info_;
  xgrammar::GrammarCompiler compiler_;
  int64_t vocab_;
  std::shared_ptr<const TokenTable> table_;
  GrammarCompilerOptions options_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  std::unordered_map<std::string, Entry> cache_;
  std::list<std::string> lru_;  // most recently used first
  size_t bytes_ = 0;
  GrammarCompileStats stats_;
  bool stop_ = false;
  std::vector<std::thread> workers_;
};

}  // namespace

Result<std::unique_ptr<GrammarCompiler>> GrammarCompiler::create(std::vector<std::string> vocab, int64_t model_vocab,
                                                                 std::vector<int32_t> stop_ids,
                                                                 const GrammarCompilerOptions& options) {
  if (model_vocab <= 0 || static_cast<int64_t>(vocab.size()) > model_vocab)
    return Status::invalid_argument(
        fmt::format("model vocabulary {}: must be positive and hold the {} tokens", model_vocab, vocab.size()));
  std::erase_if(stop_ids, [&](int32_t id) { return id < 0 || id >= model_vocab; });
  if (stop_ids.empty()) return Status::invalid_argument("structured outputs need an end-of-sequence token");
  try {
    xgrammar::TokenizerInfo info(vocab, xgrammar::VocabType::RAW, static_cast<int>(model_vocab), stop_ids, false);
    auto table = std::make_shared<const TokenTable>(vocab);
    return std::unique_ptr<GrammarCompiler>(new XgCompiler(std::move(info), model_vocab, std::move(table), options));
  } catch (const std::exception& e) {
    return Status::internal(fmt::format("the grammar engine refused the vocabulary: {}", e.what()));
  }
}

}  // namespace tessera
