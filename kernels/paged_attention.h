// Paged KV cache layout and attention over it (ARCHITECTURE.md "KV accounting").
//
// One layer's cache is two arrays, K and V, each [num_blocks][block_size][n_kv_heads][row] of
// one of three element types (exactly one pair of arrays is set):
//  * fp32 (k, v): a row is head_dim floats;
//  * fp16 (k16, v16): head_dim halves, written rounded to nearest even, widened exactly when read;
//  * int8 (k8, v8): a row is kInt8RowLead bytes holding its fp32 scale s (native byte order),
//    then head_dim int8 values q, written as s = max |x| / 127 (0 for a zero row) and
//    q = clamp(round-half-even(x / s), -127, 127); read as the fp32 product float(q) * s.
//    About a quarter of fp32's bytes (head_dim + 4 per row); the error is at most s / 2 per value.
// Attention is in fp32 either way, on the values as read: an fp16 or int8 cache gives exactly the
// results of an fp32 cache holding the values it reads back. A sequence's token at position p lives in
// block block_table[p / block_size], slot p % block_size. Block ids are the coordinator's global
// ids; each shard stores its own heads.
#pragma once

#include <cstdint>
#include <span>

namespace tessera {

class ThreadPool;

struct PagedKvLayer {
  float* k = nullptr;  // fp32 cache (null for an fp16 one)
  float* v = nullptr;
  int64_t num_blocks = 0;
  int64_t block_size = 0;   // tokens per block
  int64_t n_kv_heads = 0;   // heads stored on this shard
  int64_t head_dim = 0;
  uint16_t* k16 = nullptr;  // fp16 cache (null otherwise)
  uint16_t* v16 = nullptr;
  int8_t* k8 = nullptr;     // int8 cache with per-row scales (null otherwise)
  int8_t* v8 = nullptr;
};

// Bytes in front of an int8 row's values: its fp32 scale.
inline constexpr int64_t kInt8RowLead = 4;

// The values of one slot (every KV head: n_kv_heads * head_dim floats) of physical block `block`
// as attention reads them (fp16 widened, int8 times its row's scale) into out; K or V.
void kv_read_slot(const PagedKvLayer& kv, bool values, int64_t block, int64_t slot, float* out);

// Writes k, v ([n_tokens, n_kv_heads, head_dim]) of tokens at positions start_pos .. start_pos +
// n_tokens - 1 into their slots. block_table must cover those positions.
void kv_write(const PagedKvLayer& kv, const int32_t* block_table, int64_t start_pos,
              int64_t n_tokens, const float* k, const float* v);

struct AttentionArgs {
  const float* q = nullptr;       // [n_tokens, n_heads, head_dim], RoPE applied
  float* out = nullptr;           // [n_tokens, n_heads, head_dim]
  int64_t n_tokens = 0;           // query tokens at positions start_pos .. start_pos+n_tokens-1
  int64_t start_pos = 0;
  int64_t n_heads = 0;            // query heads on this shard; n_heads % n_kv_heads == 0 (GQA)
  float scale = 1.0f;             // usually 1/sqrt(head_dim)
  int64_t sliding_window = 0;     // >0: a query at p sees keys in (p - window, p]
  const int32_t* block_table = nullptr;
};

// Causal attention of one sequence's query tokens over its cache (which must already hold the
// keys/values of every position up to start_pos + n_tokens - 1). fp32 softmax.
void paged_attention(const PagedKvLayer& kv, const AttentionArgs& args, ThreadPool* pool);

// paged_attention of several sequences over the same cache layer in one pass over the pool
// (one args per sequence; their outputs must not overlap), the work of all of them split by
// estimated cost. Results are bit-identical to one paged_attention call per sequence, for
// any pool. No heap allocation once the caller thread has seen a batch this large.
void paged_attention_batch(const PagedKvLayer& kv, std::span<const AttentionArgs> batch, ThreadPool* pool);

}  // namespace tessera
