// The KV cache's configuration values that every command and process shares (ARCHITECTURE.md "KV accounting"): the
// element type of the cache (typed from the command line to the shards' configure message) and
// the one block-size range, checked in one place.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace tessera {

// The KV cache's element type. Which backend stores which, the sizes and the names are rows of
// one table (kv_dtype_traits, common/kv_config.cpp): the CPU backend stores fp32, fp16 and int8,
// the CUDA backend fp32 and fp16; the planner also plans bf16 and fp8 ahead of the runtime.
// int8: every (token, KV head) row of head_dim values is stored as int8 with one fp32 scale
// (kernels/paged_attention.h). The values are the control protocol's (comm/control_codec.cpp).
enum class KvDtype : uint8_t { kF32 = 0, kF16 = 1, kBF16 = 2, kFp8 = 3, kInt8 = 4 };

// The backends whose KV caches store (some of) them.
enum class KvBackend : uint8_t { kCpu, kCuda };
std::string_view kv_backend_name(KvBackend b);  // "CPU", "CUDA"

// Every per-KV-dtype fact, one row per KvDtype: the parser, the byte counts, the backends'
// checks, the planner and the command lines read it. A new KV type is a row here (and its
// kernels).
struct KvDtypeTraits {
  KvDtype dtype;
  std::string_view name;     // "fp32": as printed, and as --kv-dtype and ":kv-" take it
  std::string_view aliases;  // the other names parse_kv_dtype takes, '|'-separated ("f32")
  int elem_bytes;            // bytes of one element
  int row_extra_bytes;       // bytes after the head_dim elements of a (token, KV head) row: int8's
                             // fp32 scale (4), else 0
  bool cpu;                  // the CPU backend's KV cache stores it (shard/kv_cache.cpp)
  bool cuda;                 // the CUDA backend's stores it (shard/cuda_forward.cpp)
};
// The rows, those some backend stores first: fp32, fp16, int8, then bf16, fp8.
std::span<const KvDtypeTraits> all_kv_dtypes();
const KvDtypeTraits& kv_dtype_traits(KvDtype t);

// fp32|f32, fp16|f16, bf16, fp8|f8|e4m3|fp8_e4m3, int8|i8|q8 (any case); NotFound naming the choices.
Result<KvDtype> parse_kv_dtype(std::string_view name);
int kv_dtype_bytes(KvDtype t);  // of one element (int8: 1, its row's scale apart)
std::string_view kv_dtype_name(KvDtype t);  // "fp32", "fp16", "bf16", "fp8", "int8"
// Bytes of one (token, KV head) row of head_dim elements: head_dim * kv_dtype_bytes, plus the
// 4-byte scale of an int8 row. Every KV byte count (caches, planner, hello) is built from it.
uint64_t kv_row_bytes(KvDtype t, int64_t head_dim);

// Whether backend `b`'s KV cache stores `t`.
bool kv_dtype_stored(KvDtype t, KvBackend b);
// What backend `b` stores, for messages: "fp32, fp16 or int8" (CPU), "fp32 or fp16" (CUDA);
// `last` joins the last two ("or"; ", " gives "fp32, fp16, int8").
std::string kv_dtypes_stored_text(KvBackend b, std::string_view last = " or ");
// --kv-dtype of the runtime commands: the names some backend stores ("fp32", "fp16", "int8").
std::vector<std::string> kv_dtype_runtime_names();
// --kv-dtype of `tessera plan` (without "auto"): every name ("fp32", "fp16", "int8", "bf16", "fp8").
std::vector<std::string> kv_dtype_names();

// Tokens per KV block: kMinBlockSize..kMaxBlockSize.
inline constexpr int32_t kMinBlockSize = 16;
inline constexpr int32_t kMaxBlockSize = 1024;

// InvalidArgument "block size must be in 16..1024 tokens, got N" otherwise.
Status validate_block_size(int64_t block_size);

// The window pool (ARCHITECTURE.md "KV accounting"). A model whose layers are partly sliding-window (Gemma 3: 5 local
// layers to 1 global) keeps the windowed layers' KV in a second pool with a second block table
// per sequence: a block of it is released once every position in it is behind the window of
// every query the sequence will still make, so those layers hold about window + one piece of
// tokens per sequence instead of the whole context.
//
// Between steps a sequence whose next query is at position c holds the window blocks of
// positions [c - window + 1, c - 1]: at most window_blocks_per_sequence = ceil((window - 1) /
// block) + 1 blocks. A step adds, per piece of n tokens, at most ceil(n / block) <= n / block + 1
// new blocks and one copy-on-write copy; the pieces of a step hold at most max_step_tokens
// tokens. So max_batch sequences never need more than window_pool_blocks = max_batch *
// (window_blocks_per_sequence + 2) + ceil(max_step_tokens / block): sized so, the window pool
// never runs out and never causes a preemption.
int64_t window_blocks_per_sequence(int64_t window, int64_t block_size);
int64_t window_pool_blocks(int64_t window, int64_t max_step_tokens, int64_t block_size, int64_t max_batch);

// The first slot of a block table that a piece of queries from start_pos reads when its
// layers see `window` keys (0: all keys, slot 0): every slot before it may have been released
// (-1 in a window table); every slot from it to the piece's last position must be live.
inline int64_t first_read_slot(int64_t start_pos, int64_t window, int64_t block_size) {
  return window > 0 && start_pos - window + 1 > 0 ? (start_pos - window + 1) / block_size : 0;
}

// How a KV budget (bytes per rank) is split, the one rule of the coordinator's memory plan and
// of `tessera plan`: with window_blocks (window_pool_blocks) > 0, the window pool gets them, in
// blocks of window_block_bytes, and the other layers (all_block_bytes - window_block_bytes a
// block) the rest, when that holds more blocks than one pool of all_block_bytes would;
// otherwise one pool of budget / all_block_bytes blocks and num_window_blocks 0.
struct KvPoolSplit {
  int64_t num_blocks = 0;
  uint64_t block_bytes = 0;  // of the main pool
  int64_t num_window_blocks = 0;
  uint64_t window_block_bytes = 0;  // 0 without a window pool
};
KvPoolSplit split_kv_budget(uint64_t budget, uint64_t all_block_bytes, uint64_t window_block_bytes,
                            int64_t window_blocks);

}  // namespace tessera
