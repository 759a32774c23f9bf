// The KV cache's configuration values that every command and process shares (DESIGN §3): the
// one block-size range, checked in one place.
#pragma once

#include <cstdint>

#include "common/status.h"

namespace tessera {

// Tokens per KV block: kMinBlockSize..kMaxBlockSize.
inline constexpr int32_t kMinBlockSize = 16;
inline constexpr int32_t kMaxBlockSize = 1024;

// InvalidArgument "block size must be in 16..1024 tokens, got N" otherwise.
Status validate_block_size(int64_t block_size);

}  // namespace tessera
