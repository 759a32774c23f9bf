// The KV cache's configuration values that every command and process shares (DESIGN §3): the
// element type of the cache (typed from the command line to the shards' configure message) and
// the one block-size range, checked in one place.
#pragma once

#include <cstdint>
#include <string_view>

#include "common/status.h"

namespace tessera {

// The KV cache's element type. The CPU backend stores fp32 and fp16, the CUDA backend fp32; the
// planner also plans bf16 and fp8 ahead of the runtime.
enum class KvDtype : uint8_t { kF32 = 0, kF16 = 1, kBF16 = 2, kFp8 = 3 };
// fp32|f32, fp16|f16, bf16, fp8|f8|e4m3|fp8_e4m3 (any case); NotFound naming the choices.
Result<KvDtype> parse_kv_dtype(std::string_view name);
int kv_dtype_bytes(KvDtype t);
std::string_view kv_dtype_name(KvDtype t);  // "fp32", "fp16", "bf16", "fp8"

// Tokens per KV block: kMinBlockSize..kMaxBlockSize.
inline constexpr int32_t kMinBlockSize = 16;
inline constexpr int32_t kMaxBlockSize = 1024;

// InvalidArgument "block size must be in 16..1024 tokens, got N" otherwise.
Status validate_block_size(int64_t block_size);

}  // namespace tessera
