// The deterministic SentencePiece-style BPE vocabulary of Tessera's synthetic models.
//
// Ids: 0 "<unk>", 1 "<s>", 2 "</s>", 3..258 the byte tokens "<0x00>".."<0xFF>", then the
// merged pieces in merge order (best first: "▁t", "he", "▁the", ...), learnt by BPE from a short
// English text and word list embedded in synthetic_vocab.cpp, then - when the vocabulary is larger
// than those merges - further pieces made by joining existing letter pieces (so every piece is
// reachable through a merge), and last the single characters ("▁" and printable ASCII).
//
// The same vocabulary is written as an HF tokenizer.json (BPE with byte fallback, merges listing
// every split of every piece into two vocabulary pieces, ranked by the piece's id) and as GGUF
// `tokenizer.ggml.*` metadata (model "llama", score = -(id - 259) for pieces, so a higher score
// is an earlier merge), so both files tokenize text identically.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace tessera {

struct SyntheticVocab {
  std::vector<std::string> tokens;   // id -> piece ("▁" marks a space)
  std::vector<float> scores;         // GGUF scores, higher merges first
  std::vector<int32_t> token_types;  // GGUF: 1 normal, 2 unknown, 3 control, 6 byte
  std::vector<std::string> merges;   // HF merges "left right", best first
};

constexpr int32_t kSyntheticUnkId = 0;
constexpr int32_t kSyntheticBosId = 1;
constexpr int32_t kSyntheticEosId = 2;

// The smallest vocabulary that holds the special, byte and single-character tokens.
int64_t synthetic_vocab_min_size();

// Builds a vocabulary of exactly `vocab_size` tokens. Deterministic: depends on nothing else.
// InvalidArgument when vocab_size < synthetic_vocab_min_size() or > 2^24 (scores must stay exact).
Result<SyntheticVocab> build_synthetic_vocab(int64_t vocab_size);

// The chat template written with every synthetic model: Llama-2 style "[INST] ... [/INST]" turns
// with an optional "<<SYS>>" block, BOS at the start and EOS after each assistant turn.
const std::string& synthetic_chat_template();

// Hugging Face files for the vocabulary (texts of tokenizer.json and tokenizer_config.json).
Result<std::string> synthetic_tokenizer_json(const SyntheticVocab& vocab);
Result<std::string> synthetic_tokenizer_config_json(int64_t model_max_length);

}  // namespace tessera
