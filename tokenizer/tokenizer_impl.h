// Internals shared by the tokenizer loaders (tokenizer_hf.cpp, tokenizer_gguf.cpp): the text
// pipeline steps (normalizers, pre-tokenizers, decoders), the vocabulary, and BpeTokenizer,
// the one Tokenizer implementation. Every loader translates its format into a TokenizerSpec.
//
// Not part of the public API; include tokenizer/tokenizer.h instead.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/status.h"
#include "tokenizer/tokenizer.h"

namespace tessera::tok {

// A compiled PCRE2 pattern (UTF + UCP, JIT when available). Immutable and shareable between
// threads; each match call uses its own match data.
class Regex {
 public:
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Errors name the pattern and PCRE2's message and offset.
  static Result<std::shared_ptr<const Regex>> compile(std::string_view pattern);

  // Appends [begin, end) byte ranges of all non-overlapping matches, left to right.
  // `s` must be valid UTF-8 (the caller validated it once: matching skips the check).
  void find_all(std::string_view s, std::vector<std::pair<size_t, size_t>>& out) const;

 private:
  Regex() = default;
  void* code_ = nullptr;  // pcre2_code_8*
  bool jit_ = false;
};

// Either a literal string or a regex (HF's {"String": ...} / {"Regex": ...}).
struct Pattern {
  std::string literal;
  std::shared_ptr<const Regex> regex;  // set for a regex pattern
  void find_all(std::string_view s, std::vector<std::pair<size_t, size_t>>& out) const;
  std::string replace_all(std::string_view s, std::string_view content) const;
};

// ---- normalizers --------------------------------------------------------------------------

struct Normalizer {
  enum Kind { kNfc, kPrepend, kReplace, kStrip } kind = kNfc;
  std::string text;  // kPrepend: what to prepend; kReplace: the replacement
  Pattern pattern;   // kReplace
  bool strip_left = false, strip_right = false;  // kStrip (whitespace)
};
std::string normalize(const std::vector<Normalizer>& steps, std::string text);

// ---- pre-tokenizers -----------------------------------------------------------------------

enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };
enum class PrependScheme { kAlways, kFirst, kNever };

struct PreTokenizer {
  enum Kind { kSplit, kByteLevel, kMetaspace, kDigits } kind = kSplit;
  Pattern pattern;                                    // kSplit
  SplitBehavior behavior = SplitBehavior::kIsolated;  // kSplit
  bool invert = false;                                // kSplit
  bool add_prefix_space = false;                      // kByteLevel
  bool use_regex = true;                              // kByteLevel: GPT-2 regex split
  std::string replacement = "\xE2\x96\x81";           // kMetaspace ("▁")
  PrependScheme prepend_scheme = PrependScheme::kAlways;  // kMetaspace
  bool split = true;                                  // kMetaspace
  bool individual_digits = false;                     // kDigits
};

// Splits normalized text into words for the model. `at_text_start`: the text begins the input
// (Metaspace's "first" prepend scheme). Appends to `words`.
void pre_tokenize(const std::vector<PreTokenizer>& steps, std::string text, bool at_text_start,
                  std::vector<std::string>& words);

// The GPT-2 pre-tokenization regex (ByteLevel with use_regex).
std::string_view gpt2_split_regex();

// ---- decoders -----------------------------------------------------------------------------

struct Decoder {
  enum Kind { kByteLevel, kReplace, kByteFallback, kFuse, kStrip, kMetaspace } kind = kFuse;
  Pattern pattern;       // kReplace
  std::string content;   // kReplace: replacement; kStrip: the character stripped
  int strip_start = 0;   // kStrip
  int strip_stop = 0;    // kStrip
  std::string replacement = "\xE2\x96\x81";               // kMetaspace
  PrependScheme prepend_scheme = PrependScheme::kAlways;  // kMetaspace
};

// Runs the decoder chain over token strings and joins the result. Raw bytes (no UTF-8 repair).
// `continuation`: the tokens follow earlier non-empty output, so start-of-text rules do not
// apply (Strip after Fuse, Metaspace's first token).
std::string run_decoders(const std::vector<Decoder>& steps, std::vector<std::string> tokens,
                         bool continuation);

// ---- vocabulary ---------------------------------------------------------------------------

// id <-> token string. Lookups take string_view without allocating (open addressing over
// the owned strings; a 32-bit hash tag per slot avoids most string compares).
class Vocab {
 public:
  // Ids index `tokens`; empty strings are holes (ids not in the model vocabulary). For a
  // duplicated string the lowest id wins.
  void assign(std::vector<std::string> tokens);
  std::optional<int32_t> find(std::string_view token) const {
    if (slots_.empty()) return std::nullopt;
    const uint64_t h = hash(token);
    const auto tag = static_cast<uint32_t>(h);
    for (size_t i = (h >> 32) & mask_;; i = (i + 1) & mask_) {
      const Slot& s = slots_[i];
      if (s.id < 0) return std::nullopt;
      if (s.tag == tag && tokens_[static_cast<size_t>(s.id)] == token) return s.id;
    }
  }
  int32_t size() const { return static_cast<int32_t>(tokens_.size()); }
  const std::string& token(int32_t id) const { return tokens_[static_cast<size_t>(id)]; }

 private:
  struct Slot {
    uint32_t tag = 0;
    int32_t id = -1;
  };
  static uint64_t hash(std::string_view s) {
    uint64_t h = 0xcbf29ce484222325ull ^ s.size();  // FNV-1a, then a final mix
    for (char c : s) h = (h ^ static_cast<uint8_t>(c)) * 0x100000001b3ull;
    h ^= h >> 29;
    h *= 0xbf58476d1ce4e5b9ull;
    return h ^ (h >> 32);
  }
  std::vector<std::string> tokens_;
  std::vector<Slot> slots_;
  size_t mask_ = 0;
};

// Open-addressing map from an ordered id pair to its BPE merge (rank and resulting id).
class MergeTable {
 public:
  struct Merge {
    int32_t rank;
    int32_t id;
  };
  void reserve(size_t n);
  // Keeps the first (best-ranked) entry for a pair seen twice.
  void insert(int32_t left, int32_t right, Merge merge);
  const Merge* find(int32_t left, int32_t right) const;
  size_t size() const { return size_; }

 private:
  struct Slot {
    uint64_t key = kEmpty;
    Merge merge{};
  };
  static constexpr uint64_t kEmpty = ~uint64_t{0};
  void grow();
  std::vector<Slot> slots_;
  size_t size_ = 0;
};

// ---- the tokenizer ------------------------------------------------------------------------

struct AddedToken {
  std::string content;
  int32_t id = -1;
  bool special = false;
  bool lstrip = false, rstrip = false, single_word = false;
  bool normalized = false;  // matched in normalized text rather than in the raw input
};

enum class ModelKind {
  kBpeRanks,   // HF BPE: merges listed by rank (lower merges first)
  kSpmScores,  // SentencePiece BPE: merge the adjacent pair whose concatenation scores highest
};

// Everything a loader hands to BpeTokenizer. Merges are added to the tokenizer afterwards
// (add_merge) so that huge merge lists need not be copied as strings.
struct TokenizerSpec {
  std::string source;  // file name for messages
  ModelKind model = ModelKind::kBpeRanks;
  std::vector<std::string> vocab;  // model vocabulary by id ("" = hole)
  std::vector<float> scores;       // kSpmScores: by id
  std::vector<uint8_t> mergeable;  // kSpmScores: by id; 0 = never produced by a merge
  bool byte_fallback = false;
  bool fuse_unk = false;
  bool ignore_merges = false;  // a word that is itself a token is not split
  int32_t unk_id = -1;

  std::vector<AddedToken> added_tokens;
  std::vector<Normalizer> normalizers;
  std::vector<PreTokenizer> pre_tokenizers;
  std::vector<Decoder> decoders;
  std::vector<int32_t> post_prefix;  // added around the ids when add_special
  std::vector<int32_t> post_suffix;

  int32_t bos_id = -1;
  std::vector<int32_t> eos_ids;
  std::string bos_token, eos_token;
};

class BpeTokenizer final : public Tokenizer {
 public:
  explicit BpeTokenizer(TokenizerSpec spec);

  // kBpeRanks: merges in rank order. Returns false when a, b or a+b is not in the vocabulary
  // (such merges can never apply and are skipped).
  bool add_merge(std::string_view a, std::string_view b);
  // "a b" form: tries each space as the separator until both halves are tokens.
  bool add_merge_line(std::string_view line);
  size_t merge_count() const { return merges_.size(); }
  void reserve_merges(size_t n) { merges_.reserve(n); }
  const Vocab& vocab() const { return vocab_; }

  std::vector<int32_t> encode(std::string_view text, bool add_special) const override;
  std::string decode(std::span<const int32_t> ids, bool skip_special) const override;
  std::string decode_raw(std::span<const int32_t> ids, bool skip_special,
                         bool continuation) const override;

  int32_t vocab_size() const override { return vocab_size_; }
  std::optional<int32_t> token_to_id(std::string_view token) const override;
  std::string id_to_token(int32_t id) const override;
  bool is_special(int32_t id) const override;
  std::vector<int32_t> frequent_ids(int64_t n) const override;
  int32_t bos_id() const override { return spec_.bos_id; }
  std::vector<int32_t> eos_ids() const override { return spec_.eos_ids; }
  std::string bos_token() const override { return spec_.bos_token; }
  std::string eos_token() const override { return spec_.eos_token; }

 private:
  struct Scratch;
  struct Match {
    size_t begin, end;  // bytes of the text, whitespace absorbed by lstrip/rstrip included
    int32_t id;
  };
  // Leftmost-longest matches of the added tokens with the given `normalized` flag.
  void find_added(std::string_view text, bool normalized, std::vector<Match>& out) const;
  void encode_segment(std::string_view raw, bool at_text_start, Scratch& scratch,
                      std::vector<int32_t>& out) const;
  void encode_normalized(std::string text, bool at_text_start, Scratch& scratch,
                         std::vector<int32_t>& out) const;
  void encode_word(std::string_view word, Scratch& scratch, std::vector<int32_t>& out) const;
  void bpe_ranks(std::string_view word, Scratch& scratch, std::vector<int32_t>& out) const;
  void bpe_scores(std::string_view word, Scratch& scratch, std::vector<int32_t>& out) const;
  void emit_char_fallback(std::string_view ch, Scratch& scratch, std::vector<int32_t>& out) const;

  // A byte trie over added-token contents; edges keyed by (node << 8 | byte).
  struct Trie {
    std::unordered_map<uint64_t, int32_t> edges;
    std::vector<int32_t> token_at;  // node -> index into spec_.added_tokens, or -1
    bool first_byte[256] = {};
    bool empty() const { return token_at.size() <= 1; }
  };
  void build_trie(bool normalized, Trie& trie) const;

  TokenizerSpec spec_;
  Vocab vocab_;
  MergeTable merges_;
  std::string merge_buffer_;  // add_merge's scratch (loading is single-threaded)
  int32_t vocab_size_ = 0;
  int32_t byte_ids_[256];                               // "<0xNN>" ids, -1 when absent
  std::unordered_map<std::string, int32_t> added_by_content_;
  std::unordered_map<int32_t, size_t> added_by_id_;    // id -> index into spec_.added_tokens
  std::vector<uint8_t> special_;                        // by id
  Trie raw_trie_, normalized_trie_;
};

}  // namespace tessera::tok
