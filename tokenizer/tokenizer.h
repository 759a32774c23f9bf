// Tokenizers: Hugging Face tokenizer.json (byte-level BPE with a regex pre-tokenizer, and
// SentencePiece-style BPE with "▁" and byte fallback) and GGUF tokenizer metadata (`llama` SPM
// and `gpt2` BPE vocabularies). Added/special tokens are matched in text before the model runs.
//
// Thread-safety: a built Tokenizer is immutable; encode/decode may run on many threads.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace tessera {

class GgufFile;

// Added tokens that mark a tool call in a model's output (server/tool_calls.h). A tokenizer may
// call them special (Mistral's [TOOL_CALLS], Llama 3.1's <|python_tag|>); Tessera keeps them as
// text: decoding shows them (the tool-call parser reads them, and without tools the reply shows
// what the model wrote) and the grammar engine may allow them (a constrained call can use the
// model's own marker token).
inline constexpr std::string_view kToolCallMarkers[] = {"<tool_call>",  "</tool_call>", "<|python_tag|>",
                                                        "[TOOL_CALLS]", "[ARGS]",       "[CALL_ID]"};
bool is_tool_call_marker(std::string_view token);

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  // Reads tokenizer.json; also reads tokenizer_config.json beside it when present (special
  // token strings such as bos/eos; an explicit add_bos_token / add_eos_token decides whether
  // encode(add_special) adds BOS / EOS) and generation_config.json (its eos_token_id values
  // join eos_ids()). Errors name the file and the field; unsupported components are
  // Unimplemented naming the component type.
  static Result<std::unique_ptr<Tokenizer>> from_hf_file(const std::string& tokenizer_json_path);
  // Same, from text already in memory. `source` names it in errors. `config_json` may be empty.
  static Result<std::unique_ptr<Tokenizer>> from_hf_json(std::string_view tokenizer_json,
                                                        std::string_view config_json,
                                                        std::string_view source);
  // From `tokenizer.ggml.*` metadata keys.
  static Result<std::unique_ptr<Tokenizer>> from_gguf(const GgufFile& gguf);

  // add_special: apply the post-processor (BOS and template tokens). Special-token strings
  // that appear in `text` are always recognised as those tokens.
  virtual std::vector<int32_t> encode(std::string_view text, bool add_special) const = 0;
  // Bytes of the decoded text. Invalid UTF-8 inside it (e.g. a lone byte-fallback token) is
  // replaced by U+FFFD; a truncated character at the end is kept raw (see IncrementalDecoder
  // for streaming). skip_special drops special/control tokens.
  virtual std::string decode(std::span<const int32_t> ids, bool skip_special = false) const = 0;
  // Raw decoded bytes without UTF-8 repair (decode() replaces invalid sequences inside the text
  // by U+FFFD and keeps only a truncated tail raw). `continuation`: `ids` follow earlier
  // non-empty output, so start-of-text rules (an SPM decoder stripping the first leading space)
  // do not apply. IncrementalDecoder is built on this; the default forwards to decode().
  virtual std::string decode_raw(std::span<const int32_t> ids, bool skip_special,
                                 bool continuation) const;

  virtual int32_t vocab_size() const = 0;
  virtual std::optional<int32_t> token_to_id(std::string_view token) const = 0;
  virtual std::string id_to_token(int32_t id) const = 0;  // raw vocabulary string
  virtual bool is_special(int32_t id) const = 0;
  virtual int32_t bos_id() const = 0;                     // -1 if none
  virtual std::vector<int32_t> eos_ids() const = 0;       // may be empty
  // The string forms of BOS/EOS for chat templates ("<s>", "<|begin_of_text|>", ...).
  virtual std::string bos_token() const = 0;
  virtual std::string eos_token() const = 0;
  // Up to n ids a text most likely uses, no special tokens: text added tokens (whitespace runs)
  // and single printable ASCII characters first, then by score for a vocabulary with
  // SentencePiece scores (GGUF "llama", Gemma), else by id (BPE vocabularies put earlier
  // merges, the frequent pieces, first). The self-draft's head rows (speculation).
  virtual std::vector<int32_t> frequent_ids(int64_t n) const;
};

// `path`: a Hugging Face model directory (its tokenizer.json), a tokenizer.json file, or a
// .gguf file (its tokenizer.ggml.* metadata). NotFound names the path when there is none.
Result<std::unique_ptr<Tokenizer>> load_tokenizer_for_model(const std::string& path);

// Streaming detokenizer: push ids one by one; each call returns only complete UTF-8 text that
// follows what was returned before (never a broken code point), so concatenating every
// returned piece plus flush() equals decode(all ids).
// Each push re-decodes only the ids since the last settled point (a few tokens: ids whose text
// is fully returned are settled), so the cost per token does not grow with the sequence.
// Holds a reference to `tokenizer`, which must outlive it. Not thread-safe (one per stream).
class IncrementalDecoder {
 public:
  explicit IncrementalDecoder(const Tokenizer& tokenizer, bool skip_special = false);
  std::string push(int32_t id);
  // Returns what is left, with any incomplete UTF-8 tail replaced by U+FFFD.
  std::string flush();

 private:
  const Tokenizer& tokenizer_;
  bool skip_special_;
  std::vector<int32_t> ids_;   // the unsettled window: ids after the last settled point
  size_t emitted_bytes_ = 0;   // raw bytes of decode_raw(ids_) already consumed (returned)
  size_t prefix_start_ = 0;    // ids settled so far (dropped from ids_)
  size_t prefix_bytes_ = 0;    // raw bytes decoded from the settled ids
};

}  // namespace tessera
