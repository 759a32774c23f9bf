// Paged attention on CPU: one work item per (query token, query head), split over the pool.
// Each item walks its visible positions through the block table, computes fp32 scores,
// a max-subtracted softmax, and the weighted sum of values. The order of every reduction is
// fixed, so results do not depend on the number of threads.
#include "kernels/paged_attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "common/check.h"
#include "common/thread_pool.h"
#include "kernels/cpu/vec.h"

namespace tessera {
namespace {

inline int64_t slot_offset(const PagedKvLayer& kv, const int32_t* block_table, int64_t pos) {
  const int32_t block = block_table[pos / kv.block_size];
  TESSERA_CHECK(block >= 0 && block < kv.num_blocks, "paged kv: position {} maps to block {} of {}",
                pos, block, kv.num_blocks);
  return (static_cast<int64_t>(block) * kv.block_size + pos % kv.block_size) * kv.n_kv_heads *
         kv.head_dim;
}

float* thread_scratch(size_t n) {
  thread_local std::vector<float> buf;
  if (buf.size() < n) buf.resize(n);
  return buf.data();
}

void attend_one(const PagedKvLayer& kv, const AttentionArgs& args, int64_t t, int64_t h) {
  const int64_t hd = kv.head_dim;
  const int64_t group = args.n_heads / kv.n_kv_heads;
  const int64_t kvh = h / group;
  const int64_t pos = args.start_pos + t;
  const int64_t first =
      args.sliding_window > 0 ? std::max<int64_t>(0, pos - args.sliding_window + 1) : 0;
  const int64_t n_keys = pos - first + 1;
  const float* q = args.q + (t * args.n_heads + h) * hd;
  float* out = args.out + (t * args.n_heads + h) * hd;

  float* scores = thread_scratch(static_cast<size_t>(n_keys));
  float max_score = -INFINITY;
  for (int64_t j = 0; j < n_keys; ++j) {
    const float* k = kv.k + slot_offset(kv, args.block_table, first + j) + kvh * hd;
    scores[j] = cpu::dot_f32(q, k, hd) * args.scale;
    max_score = std::max(max_score, scores[j]);
  }
  float sum = 0.0f;
  for (int64_t j = 0; j < n_keys; ++j) {
    scores[j] = std::exp(scores[j] - max_score);
    sum += scores[j];
  }
  std::memset(out, 0, static_cast<size_t>(hd) * sizeof(float));
  for (int64_t j = 0; j < n_keys; ++j) {
    const float* v = kv.v + slot_offset(kv, args.block_table, first + j) + kvh * hd;
    cpu::axpy_f32(scores[j] / sum, v, out, hd);
  }
}

}  // namespace

void kv_write(const PagedKvLayer& kv, const int32_t* block_table, int64_t start_pos,
              int64_t n_tokens, const float* k, const float* v) {
  TESSERA_CHECK(kv.block_size > 0 && start_pos >= 0, "kv_write: block_size {} start_pos {}",
                kv.block_size, start_pos);
  const int64_t row = kv.n_kv_heads * kv.head_dim;
  const size_t bytes = static_cast<size_t>(row) * sizeof(float);
  for (int64_t t = 0; t < n_tokens; ++t) {
    const int64_t off = slot_offset(kv, block_table, start_pos + t);
    std::memcpy(kv.k + off, k + t * row, bytes);
    std::memcpy(kv.v + off, v + t * row, bytes);
  }
}

void paged_attention(const PagedKvLayer& kv, const AttentionArgs& args, ThreadPool* pool) {
  TESSERA_CHECK(kv.block_size > 0 && kv.n_kv_heads > 0 && kv.head_dim > 0,
                "paged_attention: block_size {} n_kv_heads {} head_dim {}", kv.block_size,
                kv.n_kv_heads, kv.head_dim);
  TESSERA_CHECK(args.n_heads > 0 && args.n_heads % kv.n_kv_heads == 0,
                "paged_attention: n_heads {} not a multiple of n_kv_heads {}", args.n_heads,
                kv.n_kv_heads);
  TESSERA_CHECK(args.start_pos >= 0 && args.n_tokens >= 0, "paged_attention: start_pos {} n_tokens {}",
                args.start_pos, args.n_tokens);
  const int64_t items = args.n_tokens * args.n_heads;
  // Head-major items: a thread's contiguous range covers whole heads, so prefill work (later
  // tokens see more keys) is balanced across threads and each thread reuses its heads' keys.
  auto run = [&](int64_t b, int64_t e, int) {
    for (int64_t i = b; i < e; ++i) attend_one(kv, args, i % args.n_tokens, i / args.n_tokens);
  };
  if (pool == nullptr) {
    run(0, items, 0);
  } else {
    pool->parallel_for(items, 1, run);
  }
}

}  // namespace tessera
