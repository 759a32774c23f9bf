// GrammarCompiler over a tokenizer's vocabulary: each token's bytes as the grammar engine sees
// them. Apart from grammar.cpp so that code without a tokenizer (the fuzz target of the
// request-to-grammar path) links the grammar alone.
#include <fmt/format.h>

#include "grammar/grammar.h"

namespace tessera {

Result<std::unique_ptr<GrammarCompiler>> GrammarCompiler::create(const Tokenizer& tokenizer, int64_t model_vocab,
                                                                 std::vector<int32_t> stop_ids,
                                                                 const GrammarCompilerOptions& options) {
  if (model_vocab <= 0) return Status::invalid_argument(fmt::format("model vocabulary {}: must be positive", model_vocab));
  // Tokens past the logits (a tokenizer's added tokens the model has no row for, Gemma 3's
  // image token) can never be sampled: only the first model_vocab ids are the grammar's.
  const auto n = static_cast<int32_t>(std::min<int64_t>(tokenizer.vocab_size(), model_vocab));
  // Each token as the bytes it adds to text that already has some (special tokens: none, which
  // the grammar engine never allows inside the output).
  std::vector<std::string> vocab(static_cast<size_t>(n));
  for (int32_t id = 0; id < n; ++id) {
    if (tokenizer.is_special(id)) continue;
    const int32_t one[1] = {id};
    vocab[static_cast<size_t>(id)] = tokenizer.decode_raw(one, /*skip_special=*/false, /*continuation=*/true);
  }
  return create(std::move(vocab), model_vocab, std::move(stop_ids), options);
}

}  // namespace tessera
