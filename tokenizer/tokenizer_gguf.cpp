// GGUF tokenizer metadata (tokenizer.ggml.*) -> BpeTokenizer.
//
// "llama": SentencePiece BPE with scores; spaces become "▁", a "▁" is prepended
// (add_space_prefix, default true), characters outside the vocabulary fall back to <0xNN>.
// "gpt2": byte-level BPE with tokenizer.ggml.merges and a pre-tokenizer regex chosen by
// tokenizer.ggml.pre. Both are expressed as the equivalent Hugging Face pipeline, so GGUF and
// tokenizer.json versions of a model tokenize the same way.
#include <algorithm>

#include <fmt/format.h>

#include "model/gguf.h"
#include "model/model_config.h"
#include "tokenizer/tokenizer_impl.h"

namespace tessera {

namespace {

using tok::Decoder;
using tok::Normalizer;
using tok::PreTokenizer;
using tok::TokenizerSpec;

constexpr const char* kSpace = "\xE2\x96\x81";  // "▁"

// llama.cpp's token types.
enum GgufTokenType : int64_t {
  kTypeNormal = 1, kTypeUnknown = 2, kTypeControl = 3, kTypeUserDefined = 4, kTypeUnused = 5,
  kTypeByte = 6,
};

struct PreTokenizerChoice {
  const char* names[4];
  const char* regex;  // nullptr: the GPT-2 ByteLevel regex
  bool nfc;
  bool ignore_merges;
};

// Split regexes as the corresponding tokenizer.json files give them.
const PreTokenizerChoice kPreTokenizers[] = {
    {{"llama-bpe", "llama3", "llama-v3", nullptr},
     R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)",
     false, true},
    {{"qwen2", nullptr, nullptr, nullptr},
     R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)",
     true, false},
    {{"default", "gpt2", "gpt-2", nullptr}, nullptr, false, false},
};

Status set_gpt2_pre_tokenizer(const std::string& source, const std::string& pre,
                              TokenizerSpec& spec) {
  for (const PreTokenizerChoice& c : kPreTokenizers) {
    bool hit = false;
    for (const char* name : c.names) hit = hit || (name != nullptr && pre == name);
    if (!hit) continue;
    if (c.nfc) spec.normalizers.push_back(Normalizer{Normalizer::kNfc, {}, {}, false, false});
    PreTokenizer byte_level;
    byte_level.kind = PreTokenizer::kByteLevel;
    byte_level.add_prefix_space = false;
    byte_level.use_regex = c.regex == nullptr;
    if (c.regex != nullptr) {
      PreTokenizer split;
      split.kind = PreTokenizer::kSplit;
      auto regex = tok::Regex::compile(c.regex);
      if (!regex.is_ok()) return regex.status().with_context(source);
      split.pattern.regex = std::move(regex).value();
      split.behavior = tok::SplitBehavior::kIsolated;
      spec.pre_tokenizers.push_back(std::move(split));
    }
    spec.pre_tokenizers.push_back(std::move(byte_level));
    spec.ignore_merges = c.ignore_merges;
    return Status::ok();
  }
  return Status::unimplemented(fmt::format(
      "{}: tokenizer.ggml.pre '{}' is not supported (supported: llama-bpe, llama3, qwen2, "
      "default, gpt2)",
      source, pre));
}

}  // namespace

Result<std::unique_ptr<Tokenizer>> Tokenizer::from_gguf(const GgufFile& gguf) {
  const std::string& source = gguf.path();
  TESSERA_ASSIGN_OR_RETURN(std::string model, gguf.get_string("tokenizer.ggml.model"));
  TESSERA_ASSIGN_OR_RETURN(std::vector<std::string> tokens,
                           gguf.get_string_array("tokenizer.ggml.tokens"));
  const auto n = static_cast<int64_t>(tokens.size());
  std::vector<int64_t> types(tokens.size(), kTypeNormal);
  if (gguf.has("tokenizer.ggml.token_type")) {
    TESSERA_ASSIGN_OR_RETURN(types, gguf.get_int_array("tokenizer.ggml.token_type"));
    if (static_cast<int64_t>(types.size()) != n) {
      return Status::corrupt(fmt::format("{}: tokenizer.ggml.token_type has {} entries, expected {}",
                                         source, types.size(), n));
    }
  }
  auto optional_id = [&](const char* key) -> int32_t {
    if (!gguf.has(key)) return -1;
    auto v = gguf.get_int(key);
    return (v.is_ok() && *v >= 0 && *v < n) ? static_cast<int32_t>(*v) : -1;  // e.g. 0xFFFFFFFF
  };
  auto optional_bool = [&](const char* key, bool fallback) {
    if (!gguf.has(key)) return fallback;
    auto v = gguf.get_bool(key);
    return v.is_ok() ? *v : fallback;
  };

  TokenizerSpec spec;
  spec.source = source;
  spec.unk_id = optional_id("tokenizer.ggml.unknown_token_id");
  for (int64_t id = 0; id < n; ++id) {
    const int64_t t = types[static_cast<size_t>(id)];
    if (t != kTypeControl && t != kTypeUserDefined && t != kTypeUnknown) continue;
    tok::AddedToken a;
    a.content = tokens[static_cast<size_t>(id)];
    a.id = static_cast<int32_t>(id);
    a.special = t != kTypeUserDefined;
    spec.added_tokens.push_back(std::move(a));
  }

  bool add_bos;
  if (model == "llama") {
    TESSERA_ASSIGN_OR_RETURN(std::vector<double> scores, gguf.get_float_array("tokenizer.ggml.scores"));
    if (static_cast<int64_t>(scores.size()) != n) {
      return Status::corrupt(fmt::format("{}: tokenizer.ggml.scores has {} entries, expected {}",
                                         source, scores.size(), n));
    }
    spec.model = tok::ModelKind::kSpmScores;
    spec.scores.assign(scores.begin(), scores.end());
    spec.mergeable.resize(tokens.size());
    for (size_t i = 0; i < tokens.size(); ++i) {
      spec.mergeable[i] = types[i] == kTypeNormal || types[i] == kTypeUserDefined;
    }
    spec.byte_fallback = true;
    const bool space_prefix = optional_bool("tokenizer.ggml.add_space_prefix", true);
    if (space_prefix) spec.normalizers.push_back({Normalizer::kPrepend, kSpace, {}, false, false});
    Normalizer replace{Normalizer::kReplace, kSpace, {}, false, false};
    replace.pattern.literal = " ";
    spec.normalizers.push_back(std::move(replace));
    Decoder to_space;
    to_space.kind = Decoder::kReplace;
    to_space.pattern.literal = kSpace;
    to_space.content = " ";
    spec.decoders.push_back(std::move(to_space));
    spec.decoders.push_back(Decoder{Decoder::kByteFallback});
    spec.decoders.push_back(Decoder{Decoder::kFuse});
    if (space_prefix) {
      Decoder strip;
      strip.kind = Decoder::kStrip;
      strip.content = " ";
      strip.strip_start = 1;
      spec.decoders.push_back(std::move(strip));
    }
    add_bos = optional_bool("tokenizer.ggml.add_bos_token", true);
  } else if (model == "gpt2") {
    std::string pre = "default";
    if (gguf.has("tokenizer.ggml.pre")) {
      TESSERA_ASSIGN_OR_RETURN(pre, gguf.get_string("tokenizer.ggml.pre"));
    }
    TESSERA_RETURN_IF_ERROR(set_gpt2_pre_tokenizer(source, pre, spec));
    spec.model = tok::ModelKind::kBpeRanks;
    spec.decoders.push_back(Decoder{Decoder::kByteLevel});
    add_bos = optional_bool("tokenizer.ggml.add_bos_token", false);
  } else {
    return Status::unimplemented(fmt::format(
        "{}: tokenizer.ggml.model '{}' is not supported (supported: llama, gpt2)", source, model));
  }

  spec.bos_id = optional_id("tokenizer.ggml.bos_token_id");
  if (spec.bos_id < 0 && gguf.has("tokenizer.ggml.bos_token_id")) {  // "none" (-1, 0xFFFFFFFF) or out of range
    auto v = gguf.get_int("tokenizer.ggml.bos_token_id");
    if (v.is_ok() && *v != -1 && *v != 0xFFFFFFFFll)
      return Status::invalid_argument(
          fmt::format("{}: tokenizer.ggml.bos_token_id is {}, outside the vocabulary of {}", source, *v, n));
  }
  const int32_t eos = optional_id("tokenizer.ggml.eos_token_id");
  TESSERA_ASSIGN_OR_RETURN(spec.eos_ids, gguf_stop_token_ids(gguf, n));
  if (spec.bos_id >= 0) spec.bos_token = tokens[static_cast<size_t>(spec.bos_id)];
  if (eos >= 0) spec.eos_token = tokens[static_cast<size_t>(eos)];
  if (add_bos && spec.bos_id >= 0) spec.post_prefix.push_back(spec.bos_id);
  if (optional_bool("tokenizer.ggml.add_eos_token", false) && eos >= 0) {
    spec.post_suffix.push_back(eos);
  }

  std::vector<std::string> merges;
  if (model == "gpt2") {
    TESSERA_ASSIGN_OR_RETURN(merges, gguf.get_string_array("tokenizer.ggml.merges"));
  }
  spec.vocab = std::move(tokens);
  auto tokenizer = std::make_unique<tok::BpeTokenizer>(std::move(spec));
  tokenizer->reserve_merges(merges.size());
  for (const std::string& m : merges) tokenizer->add_merge_line(m);
  return std::unique_ptr<Tokenizer>(std::move(tokenizer));
}

}  // namespace tessera
