// Encoding of control messages with Cap'n Proto (the one file that uses the library).
#pragma once

#include <cstddef>
#include <string>

#include "proto/control_messages.h"
#include "common/status.h"

namespace tessera {

// Serialises with the given protocol version (tests pass another to check refusal).
std::string encode_message(const ControlMessage& message, uint32_t version = kProtocolVersion);

// Parses bytes of any alignment (they are copied into an aligned word array first). Errors:
// kInvalidArgument "protocol version 2, expected 1" for a version mismatch; kCorrupt for bytes
// that are not a valid message (never a crash, whatever the bytes).
Result<ControlMessage> decode_message(const void* data, size_t size);

}  // namespace tessera
