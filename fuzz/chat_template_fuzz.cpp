// Fuzz target: a Jinja chat template, parsed and rendered with a conversation and (after a
// "\n\0\n" separator) extra context JSON, under tight render bounds: every input must end in
// text or an error, never a crash or a hang.
#include <cstddef>
#include <cstdint>

#include "fuzz/fuzz_input.h"
#include "template/chat_template.h"

using namespace tessera;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto [source, extra] = fuzz::split_input(data, size);
  auto chat = ChatTemplate::parse(source);
  if (!chat.is_ok()) return 0;
  ChatTemplateOptions options;
  options.bos_token = "<s>";
  options.eos_token = "</s>";
  options.extra_context_json = std::string(extra);
  options.now_unix_seconds = 1'700'000'000;
  options.max_output_bytes = 1 << 20;
  options.max_loop_iterations = 20'000;
  const std::vector<ChatMessage> messages = {
      {"system", "Be brief."}, {"user", "Hi {{ x }}"}, {"assistant", "Hello!"}, {"user", "\xe2\x82\xac 2+2?"}};
  (void)chat->render(messages, options);
  options.add_generation_prompt = false;
  (void)chat->render({}, options);
  return 0;
}
