#include "common/kv_config.h"

#include <fmt/format.h>

namespace tessera {

Status validate_block_size(int64_t block_size) {
  if (block_size >= kMinBlockSize && block_size <= kMaxBlockSize) return Status::ok();
  return Status::invalid_argument(
      fmt::format("block size must be in {}..{} tokens, got {}", kMinBlockSize, kMaxBlockSize, block_size));
}

}  // namespace tessera
