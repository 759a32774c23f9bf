// Fuzz target: a control-plane message (Cap'n Proto) as a peer's socket delivers it, at any
// alignment. A message that decodes must encode again to bytes that decode to the same
// encoding (nothing is lost or invented in the round trip).
#include <cstddef>
#include <cstdint>
#include <string>

#include "comm/control_codec.h"

using namespace tessera;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // Unaligned on purpose: ZeroMQ frames have no alignment promise (decode copies).
  std::string shifted(1, '\0');
  shifted.append(reinterpret_cast<const char*>(data), size);
  auto message = decode_message(shifted.data() + 1, size);
  if (!message.is_ok()) return 0;
  const std::string once = encode_message(*message);
  auto again = decode_message(once.data(), once.size());
  if (!again.is_ok()) __builtin_trap();
  if (encode_message(*again) != once) __builtin_trap();
  return 0;
}
