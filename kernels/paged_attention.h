// Paged KV cache layout and attention over it (DESIGN §3).
//
// One layer's cache is two arrays, K and V, each [num_blocks][block_size][n_kv_heads][head_dim]
// of fp32 (k, v) or fp16 (k16, v16: half the memory; written rounded to nearest even, widened
// exactly when read, attention in fp32 either way). A sequence's token at position p lives in
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
  uint16_t* k16 = nullptr;  // fp16 cache (null for an fp32 one)
  uint16_t* v16 = nullptr;
};

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
