// Structured outputs (ARCHITECTURE.md's module map): what a request constrains its output to
// (a JSON Schema, any JSON object, a regular expression, a list of choices, an EBNF grammar),
// compiled against the model's vocabulary into a token-mask automaton, and the per-sequence
// matcher the engine advances token by token. The grammar engine is xgrammar's C++ core
// (cmake/Xgrammar.cmake); none of its types appear in this header.
//
// Masks are bitmasks over the model's vocabulary: word w bit b (LSB first) is token 32w + b,
// set = allowed. A token id past the tokenizer's vocabulary is never allowed.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "tokenizer/tokenizer.h"

namespace tessera {

enum class GrammarKind : int {
  kJsonObject = 0,  // any JSON object (response_format json_object)
  kJsonSchema,      // source: the schema (response_format json_schema, guided_json)
  kRegex,           // source: the pattern (guided_regex)
  kChoice,          // source: a JSON array of strings, the output is exactly one (guided_choice)
  kEbnf,            // source: the grammar, root rule "root" (guided_grammar)
  kStructuralTag,   // source: xgrammar's structural tag JSON (tool calls: free text and tagged regions)
};
const char* grammar_kind_name(GrammarKind kind);

// Reasoning models (Qwen3, DeepSeek-R1 style) think in `<think>` ... `</think>` before they
// answer: the grammar then lets that part be free text and constrains what follows it.
enum class ReasoningPrefix : int {
  kNone = 0,  // the output is the constrained text from its first token
  kThink,     // the output may open "<think>", reason and close "</think>" before the constrained text
  kInside,    // the prompt opened "<think>" already: free text up to "</think>", then the constrained text
};

// What a request asks its output to match.
struct GrammarSpec {
  GrammarKind kind = GrammarKind::kJsonObject;
  std::string source;
  // JSON: whitespace only where JSON needs none (compact output, no runs of blanks); the
  // OpenAI API's output looks like this and small models cannot stall on whitespace.
  bool compact_json = true;
  // A schema's objects take no properties beyond those it lists, unless it says otherwise
  // (OpenAI's strict mode; false: additionalProperties defaults to true as JSON Schema says).
  bool strict = true;
  // Free reasoning before the constrained text (up to 4 whitespace characters after "</think>").
  ReasoningPrefix reasoning = ReasoningPrefix::kNone;
  // The cache key: kind, options and source.
  std::string key() const;
};

class GrammarMatcher;

// One compiled grammar: immutable, shared by every request that asks for the same spec.
// Thread-safe.
class CompiledGrammar {
 public:
  virtual ~CompiledGrammar() = default;
  virtual const GrammarSpec& spec() const = 0;
  virtual size_t memory_bytes() const = 0;
  // A matcher at the grammar's start, for one sequence.
  virtual std::unique_ptr<GrammarMatcher> matcher() const = 0;
  // The vocabulary it was compiled for (the logits' width) and its masks' length in words.
  virtual int64_t vocab() const = 0;
  int64_t mask_words() const { return (vocab() + 31) / 32; }
  // Tokens that spell `text` exactly (longest token first at each position), for jump-forward:
  // independent of how a tokenizer would cut the text alone (e.g. with a leading space). Stops
  // short where no token continues the text.
  virtual std::vector<int32_t> spell(std::string_view text) const = 0;
};

// One sequence's place in a compiled grammar. Not thread-safe: one owner at a time.
class GrammarMatcher {
 public:
  virtual ~GrammarMatcher() = default;
  // Advances over `token`; false (and no change) when the grammar does not allow it here.
  virtual bool accept(int32_t token) = 0;
  // Writes the next token's mask (mask_words() words). Returns false when every token is
  // allowed (the mask need not be applied).
  virtual bool fill_mask(std::span<uint32_t> mask) = 0;
  // The longest string every continuation starts with (jump-forward), "" when there is a choice.
  virtual std::string forced_string() = 0;
  // Undoes the last n accepted tokens.
  virtual void rollback(int n) = 0;
  // The grammar is complete and a stop token was accepted: nothing more may follow.
  virtual bool terminated() const = 0;
  // The grammar is complete: a stop token may come next (the mask then allows the stop tokens).
  virtual bool completed() const = 0;
};

struct GrammarCompilerOptions {
  // A grammar that takes longer than this to compile is refused (the compilation goes on in the
  // background and its result is cached, so an identical request later does not wait again).
  std::chrono::milliseconds compile_timeout{5000};
  int32_t threads = 2;                  // compilations at once (and xgrammar's own threads)
  int64_t cache_bytes = 256ll << 20;    // compiled grammars kept (least recently used dropped)
  // Called (on a compiler thread) with each finished compilation's time, refused ones included.
  std::function<void(double seconds)> on_compiled;
};

struct GrammarCompileStats {
  int64_t compiled = 0;       // compilations finished
  int64_t cache_hits = 0;     // requests answered from the cache (or from one in flight)
  int64_t refused = 0;        // specs refused (unsupported, invalid, over the time budget)
};

// Compiles specs against one vocabulary. Thread-safe: the HTTP threads compile (and wait) while
// the engine thread only makes matchers.
class GrammarCompiler {
 public:
  virtual ~GrammarCompiler() = default;
  // `model_vocab`: the logits' width (at least the tokenizer's vocabulary); `stop_ids`: the tokens
  // that end a sequence (the grammar allows them once it is complete).
  static Result<std::unique_ptr<GrammarCompiler>> create(const Tokenizer& tokenizer, int64_t model_vocab,
                                                         std::vector<int32_t> stop_ids,
                                                         const GrammarCompilerOptions& options);
  // The same over a vocabulary given as each token's bytes ("" for a special token that never
  // appears in an output); ids from token_bytes.size() to model_vocab are never allowed.
  static Result<std::unique_ptr<GrammarCompiler>> create(std::vector<std::string> token_bytes, int64_t model_vocab,
                                                         std::vector<int32_t> stop_ids,
                                                         const GrammarCompilerOptions& options);
  // InvalidArgument naming the problem (an unsupported keyword and its JSON path, a syntax
  // error) or DeadlineExceeded when compiling takes longer than the budget.
  virtual Result<std::shared_ptr<const CompiledGrammar>> compile(const GrammarSpec& spec) = 0;
  // Never waits: the grammar when it is compiled and cached (a cache hit), else nullptr.
  virtual std::shared_ptr<const CompiledGrammar> cached(const GrammarSpec& spec) = 0;
  virtual int64_t vocab() const = 0;
  int64_t mask_words() const { return (vocab() + 31) / 32; }
  virtual GrammarCompileStats stats() const = 0;
};

// The shard applies a mask with kernels/sampling.h's apply_token_mask.

}  // namespace tessera
