// Fuzz target: a GGUF file, as the shard (GgufFile::open) and the coordinator (open_metadata)
// read it, then everything Tessera takes from its metadata: the model config, the stop ids,
// the tokenizer (with one encode/decode round) and the chat template.
#include <cstddef>
#include <cstdint>
#include <memory>

#include "fuzz/fuzz_input.h"
#include "model/gguf.h"
#include "model/model_config.h"
#include "template/chat_template.h"
#include "tokenizer/tokenizer.h"

using namespace tessera;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = fuzz::input_file(data, size, ".gguf");
  auto meta = GgufFile::open_metadata(path);
  auto full = GgufFile::open(path);
  if (meta.is_ok() != full.is_ok()) __builtin_trap();  // the two readers must agree on validity
  if (!full.is_ok()) return 0;
  const GgufFile& gguf = **full;
  for (const GgufTensorInfo& t : gguf.tensors()) {
    // Every view lies inside the mapping (open() promises it).
    const uint8_t* base = gguf.file_data();
    const auto* p = static_cast<const uint8_t*>(t.view.data);
    if (p != nullptr && (p < base || p + t.view.nbytes() > base + gguf.file_size())) __builtin_trap();
  }
  auto config = config_from_gguf(gguf);
  if (config.is_ok()) (void)gguf_stop_token_ids(gguf, config->vocab);
  if (auto tok = Tokenizer::from_gguf(gguf); tok.is_ok()) {
    const std::vector<int32_t> ids = (*tok)->encode("Hello, world! 12 <b>", true);
    (void)(*tok)->decode(ids);
  }
  if (auto chat = ChatTemplate::from_gguf(gguf); chat.is_ok()) {
    ChatTemplateOptions options;
    options.max_output_bytes = 1 << 20;
    options.max_loop_iterations = 10'000;
    (void)chat->render({{"user", "Hi"}, {"assistant", "Hello"}, {"user", "2+2?"}}, options);
  }
  return 0;
}
