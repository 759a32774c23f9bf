#include "common/kv_config.h"

#include <fmt/format.h>

#include <algorithm>
#include <string>

#include "common/strings.h"

namespace tessera {

Result<KvDtype> parse_kv_dtype(std::string_view name) {
  const std::string key = ascii_lower(name);
  if (key == "fp32" || key == "f32") return KvDtype::kF32;
  if (key == "fp16" || key == "f16") return KvDtype::kF16;
  if (key == "bf16") return KvDtype::kBF16;
  if (key == "fp8" || key == "f8" || key == "e4m3" || key == "fp8_e4m3") return KvDtype::kFp8;
  if (key == "int8" || key == "i8" || key == "q8") return KvDtype::kInt8;
  return Status::not_found(fmt::format("unknown KV dtype '{}': choose fp16, int8, bf16, fp8 or fp32", name));
}

int kv_dtype_bytes(KvDtype t) {
  switch (t) {
    case KvDtype::kF32: return 4;
    case KvDtype::kF16: return 2;
    case KvDtype::kBF16: return 2;
    case KvDtype::kFp8: return 1;
    case KvDtype::kInt8: return 1;
  }
  return 2;
}

uint64_t kv_row_bytes(KvDtype t, int64_t head_dim) {
  return static_cast<uint64_t>(head_dim * kv_dtype_bytes(t) + (t == KvDtype::kInt8 ? 4 : 0));
}

std::string_view kv_dtype_name(KvDtype t) {
  switch (t) {
    case KvDtype::kF32: return "fp32";
    case KvDtype::kF16: return "fp16";
    case KvDtype::kBF16: return "bf16";
    case KvDtype::kFp8: return "fp8";
    case KvDtype::kInt8: return "int8";
  }
  return "?";
}


Status validate_block_size(int64_t block_size) {
  if (block_size >= kMinBlockSize && block_size <= kMaxBlockSize) return Status::ok();
  return Status::invalid_argument(
      fmt::format("block size must be in {}..{} tokens, got {}", kMinBlockSize, kMaxBlockSize, block_size));
}

int64_t window_blocks_per_sequence(int64_t window, int64_t block_size) {
  if (window <= 0 || block_size <= 0) return 0;
  return (window - 1 + block_size - 1) / block_size + 1;
}

KvPoolSplit split_kv_budget(uint64_t budget, uint64_t all_block_bytes, uint64_t window_block_bytes,
                            int64_t window_blocks) {
  KvPoolSplit s;
  s.block_bytes = all_block_bytes;
  s.num_blocks = all_block_bytes > 0 ? static_cast<int64_t>(budget / all_block_bytes) : 0;
  const uint64_t full_bytes = all_block_bytes - std::min(all_block_bytes, window_block_bytes);
  if (window_blocks <= 0 || window_block_bytes == 0 || full_bytes == 0 || window_blocks >= s.num_blocks) return s;
  s.num_window_blocks = window_blocks;
  s.window_block_bytes = window_block_bytes;
  s.block_bytes = full_bytes;
  s.num_blocks = static_cast<int64_t>((budget - static_cast<uint64_t>(window_blocks) * window_block_bytes) / full_bytes);
  return s;
}

int64_t window_pool_blocks(int64_t window, int64_t max_step_tokens, int64_t block_size, int64_t max_batch) {
  if (window <= 0 || block_size <= 0 || max_batch <= 0 || max_step_tokens <= 0) return 0;
  return max_batch * (window_blocks_per_sequence(window, block_size) + 2) + (max_step_tokens + block_size - 1) / block_size;
}

}  // namespace tessera
