// Fuzz target: a tokenizer.json (and, after a "\n\0\n" separator, a tokenizer_config.json),
// then encode and decode of fixed texts with the tokenizer it builds, and the streaming
// detokenizer over the ids.
#include <cstddef>
#include <cstdint>

#include "fuzz/fuzz_input.h"
#include "tokenizer/tokenizer.h"

using namespace tessera;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto [json, config] = fuzz::split_input(data, size);
  auto tok = Tokenizer::from_hf_json(json, config, "fuzz/tokenizer.json");
  if (!tok.is_ok()) return 0;
  const Tokenizer& t = **tok;
  for (std::string_view text : {std::string_view("Once upon a time, there was a dog."),
                                std::string_view(" \t\n  <s>x</s> \xe2\x96\x81\xf0\x9f\x98\x80\xff 123")}) {
    const std::vector<int32_t> ids = t.encode(text, true);
    for (int32_t id : ids)
      if (id < 0 || id >= t.vocab_size()) __builtin_trap();  // encode never makes an id outside the vocabulary
    const std::string whole = t.decode(ids);
    IncrementalDecoder stream(t);
    std::string pieces;
    for (int32_t id : ids) pieces += stream.push(id);
    pieces += stream.flush();
    if (pieces != whole) __builtin_trap();  // the streamed text is the whole text (tokenizer.h)
  }
  (void)t.frequent_ids(64);
  return 0;
}
