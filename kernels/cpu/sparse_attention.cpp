// Quest block selection and sparse decode attention on CPU (kernels/sparse_attention.h).
//
// Plain C++ in the canonical arithmetic of the header: the compiler may vectorize the 8 lanes
// (each lane is still one sequential sum), and the file is built with -ffp-contract=off, so
// scores and therefore selections are the same on every x86-64 and thread count.
#include "kernels/sparse_attention.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <vector>

#include "common/check.h"
#include "common/thread_pool.h"
#include "kernels/quant.h"

namespace tessera {
namespace {

constexpr int kLanes = 8;
// Blocks per pool part when scoring; below 2 parts' worth, one thread scores them all (a pool
// pass costs about a microsecond, one block a few hundred nanoseconds).
constexpr int64_t kScoreGrain = 64;

void check_summaries(const PagedKvLayer& kv, const KvBlockSummaries& s) {
  TESSERA_CHECK(s.kmin != nullptr && s.kmax != nullptr, "sparse attention: summaries without kmin / kmax arrays");
  TESSERA_CHECK(s.num_blocks == kv.num_blocks && s.n_kv_heads == kv.n_kv_heads && s.head_dim == kv.head_dim,
                "sparse attention: summaries [{}][{}][{}] do not match the cache layer [{}][{}][{}]", s.num_blocks,
                s.n_kv_heads, s.head_dim, kv.num_blocks, kv.n_kv_heads, kv.head_dim);
  TESSERA_CHECK(kv.block_size > 0, "sparse attention: block_size {}", kv.block_size);
}

void check_decode_args(const AttentionArgs& args, const SparseSelectOptions& opt) {
  TESSERA_CHECK(args.n_tokens == 1, "sparse attention: one decode token per call, got n_tokens {}", args.n_tokens);
  TESSERA_CHECK(args.sliding_window == 0,
                "sparse attention: sliding_window {} refused (sparse decode is for global-attention layers)",
                args.sliding_window);
  TESSERA_CHECK(args.start_pos >= 0 && args.q != nullptr && args.block_table != nullptr,
                "sparse attention: start_pos {}, q and block_table must be set", args.start_pos);
  TESSERA_CHECK(opt.sink_blocks >= 0 && opt.recent_blocks >= 1 && opt.top_blocks >= 0,
                "sparse attention: sink_blocks {} recent_blocks {} (the current block needs >= 1) top_blocks {}",
                opt.sink_blocks, opt.recent_blocks, opt.top_blocks);
}

// One slot's fp16 key row (all KV heads) widened exactly into buf by the vectorized decoder.
inline const float* key_row(const uint16_t* row, int64_t n, float* buf) {
  dequantize_row(QuantType::kF16, row, buf, n);
  return buf;
}

// Recomputes the summaries of physical block `block` over its first `slots` slots. A block's
// summaries have the layout of one slot's key row ([n_kv_heads][head_dim]), so each slot is
// one element-wise min / max over a row. The keys as attention reads them: fp32 rows as they
// are, fp16 and int8 ones widened (kv_read_slot).
void summarize_block(const PagedKvLayer& kv, const KvBlockSummaries& s, int64_t block, int64_t slots) {
  const int64_t row = kv.n_kv_heads * kv.head_dim;
  thread_local std::vector<float> buf;
  if (static_cast<int64_t>(buf.size()) < row) buf.resize(static_cast<size_t>(row));
  float* kmin = s.kmin + block * row;
  float* kmax = s.kmax + block * row;
  auto slot_keys = [&](int64_t t) -> const float* {
    const int64_t first = (block * kv.block_size + t) * row;
    if (kv.k != nullptr) return kv.k + first;
    if (kv.k16 != nullptr) return key_row(kv.k16 + first, row, buf.data());
    kv_read_slot(kv, false, block, t, buf.data());
    return buf.data();
  };
  const float* k = slot_keys(0);
  std::copy_n(k, row, kmin);
  std::copy_n(k, row, kmax);
  for (int64_t t = 1; t < slots; ++t) {
    k = slot_keys(t);
    for (int64_t i = 0; i < row; ++i) {
      kmin[i] = std::min(kmin[i], k[i]);
      kmax[i] = std::max(kmax[i], k[i]);
    }
  }
}

inline float reduce8(const float* l) {
  return ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]));
}

// The largest bound of query heads q[0 .. n_heads) over one physical block; `group` query heads
// per KV head.
float block_score(const KvBlockSummaries& s, const float* q, int64_t n_heads, int64_t group, int64_t block) {
  const int64_t hd = s.head_dim;
  float best = -INFINITY;
  for (int64_t h = 0; h < n_heads; ++h) {
    const int64_t off = (block * s.n_kv_heads + h / group) * hd;
    const float b = quest_bound(q + h * hd, s.kmin + off, s.kmax + off, hd);
    if (b > best) best = b;  // a NaN bound never wins
  }
  return best;
}

// Does block a deserve a top slot before block b? Higher score first, then lower index: a
// strict total order, so the selection does not depend on how nth_element visits the blocks.
struct ScoreOrder {
  const float* scores;
  bool operator()(int32_t a, int32_t b) const {
    return scores[a] != scores[b] ? scores[a] > scores[b] : a < b;
  }
};

// Appends to scratch.selected the `top` best of logical blocks lo .. hi - 1, in index order.
void select_top(const float* scores, int64_t lo, int64_t hi, int64_t top, SparseScratch& scratch) {
  std::vector<int32_t>& c = scratch.candidates;
  c.resize(static_cast<size_t>(hi - lo));
  for (int64_t i = lo; i < hi; ++i) c[static_cast<size_t>(i - lo)] = static_cast<int32_t>(i);
  const auto mid = c.begin() + top;
  std::nth_element(c.begin(), mid, c.end(), ScoreOrder{scores});
  std::sort(c.begin(), mid);
  scratch.selected.insert(scratch.selected.end(), c.begin(), mid);
}

}  // namespace

void kv_summary_update(const PagedKvLayer& kv, const KvBlockSummaries& s, const int32_t* block_table,
                       int64_t start_pos, int64_t n_tokens) {
  check_summaries(kv, s);
  TESSERA_CHECK((kv.k != nullptr) + (kv.k16 != nullptr) + (kv.k8 != nullptr) == 1,
                "kv_summary_update: the layer needs exactly one of fp32, fp16 or int8 K arrays");
  TESSERA_CHECK(start_pos >= 0 && n_tokens >= 0, "kv_summary_update: start_pos {} n_tokens {}", start_pos, n_tokens);
  if (n_tokens == 0) return;
  const int64_t end = start_pos + n_tokens;  // positions below are written
  for (int64_t b = start_pos / kv.block_size; b * kv.block_size < end; ++b) {
    const int64_t block = block_table[b];
    TESSERA_CHECK(block >= 0 && block < kv.num_blocks,
                  "kv_summary_update: block id {} of logical block {} not in [0, {})", block, b, kv.num_blocks);
    const int64_t slots = std::min(kv.block_size, end - b * kv.block_size);
    summarize_block(kv, s, block, slots);
  }
}

float quest_bound(const float* q, const float* kmin, const float* kmax, int64_t head_dim) {
  float l[kLanes] = {};
  const int64_t full = head_dim / kLanes * kLanes;
  for (int64_t d = 0; d < full; d += kLanes)
    for (int i = 0; i < kLanes; ++i) l[i] += std::max(q[d + i] * kmin[d + i], q[d + i] * kmax[d + i]);
  for (int64_t d = full; d < head_dim; ++d) l[d - full] += std::max(q[d] * kmin[d], q[d] * kmax[d]);
  return reduce8(l);
}

void sparse_block_scores(const KvBlockSummaries& s, const AttentionArgs& args, std::span<float> scores,
                         ThreadPool* pool) {
  TESSERA_CHECK(s.kmin != nullptr && s.kmax != nullptr && s.head_dim > 0, "sparse_block_scores: no summaries");
  TESSERA_CHECK(s.n_kv_heads > 0 && args.n_heads > 0 && args.n_heads % s.n_kv_heads == 0,
                "sparse_block_scores: n_heads {} not a multiple of n_kv_heads {}", args.n_heads, s.n_kv_heads);
  const int64_t n = static_cast<int64_t>(scores.size()), group = args.n_heads / s.n_kv_heads;
  for (int64_t i = 0; i < n; ++i)
    TESSERA_CHECK(args.block_table[i] >= 0 && args.block_table[i] < s.num_blocks,
                  "sparse_block_scores: block id {} of logical block {} not in [0, {})", args.block_table[i], i,
                  s.num_blocks);
  auto run = [&](int64_t b, int64_t e, int) {
    for (int64_t i = b; i < e; ++i)
      scores[static_cast<size_t>(i)] = block_score(s, args.q, args.n_heads, group, args.block_table[i]);
  };
  if (pool == nullptr || pool->size() <= 1 || n < 2 * kScoreGrain) {
    run(0, n, 0);
    return;
  }
  // One reference in the closure: std::function keeps it inline, no allocation per call.
  auto* job = &run;
  pool->parallel_for(n, kScoreGrain, [job](int64_t b, int64_t e, int t) { (*job)(b, e, t); });
}

std::span<float> sparse_score_blocks(const PagedKvLayer& kv, const KvBlockSummaries& s, const AttentionArgs& args,
                                     const SparseSelectOptions& opt, ThreadPool* pool, SparseScratch& scratch) {
  check_summaries(kv, s);
  check_decode_args(args, opt);
  const int64_t n_blocks = args.start_pos / kv.block_size + 1;
  if (n_blocks <= opt.sink_blocks + opt.recent_blocks + opt.top_blocks) return {};
  // Only the blocks between the sinks and the recent ones compete.
  const int64_t lo = opt.sink_blocks, hi = n_blocks - opt.recent_blocks;
  scratch.scores.resize(static_cast<size_t>(n_blocks));
  AttentionArgs middle = args;
  middle.block_table = args.block_table + lo;
  const std::span<float> scores(scratch.scores.data() + lo, static_cast<size_t>(hi - lo));
  sparse_block_scores(s, middle, scores, pool);
  return scores;
}

std::span<const int32_t> sparse_select_scored(int64_t pos, int64_t block_size, const SparseSelectOptions& opt,
                                              SparseScratch& scratch) {
  const int64_t n_blocks = pos / block_size + 1;
  std::vector<int32_t>& sel = scratch.selected;
  sel.clear();
  if (n_blocks <= opt.sink_blocks + opt.recent_blocks + opt.top_blocks) {
    for (int64_t b = 0; b < n_blocks; ++b) sel.push_back(static_cast<int32_t>(b));
    return sel;
  }
  const int64_t lo = opt.sink_blocks, hi = n_blocks - opt.recent_blocks;
  TESSERA_CHECK(static_cast<int64_t>(scratch.scores.size()) >= n_blocks,
                "sparse_select_scored: {} scores for {} blocks (sparse_score_blocks first)", scratch.scores.size(),
                n_blocks);
  for (int64_t b = 0; b < lo; ++b) sel.push_back(static_cast<int32_t>(b));
  select_top(scratch.scores.data(), lo, hi, opt.top_blocks, scratch);
  for (int64_t b = hi; b < n_blocks; ++b) sel.push_back(static_cast<int32_t>(b));
  return sel;
}

std::span<const int32_t> sparse_select_blocks(const PagedKvLayer& kv, const KvBlockSummaries& s,
                                              const AttentionArgs& args, const SparseSelectOptions& opt,
                                              ThreadPool* pool, SparseScratch& scratch) {
  sparse_score_blocks(kv, s, args, opt, pool, scratch);
  return sparse_select_scored(args.start_pos, kv.block_size, opt, scratch);
}

int64_t sparse_compact_block_table(std::span<const int32_t> selected, const int32_t* block_table, int64_t pos,
                                   int64_t block_size, int32_t* compact_table) {
  TESSERA_CHECK(block_size > 0 && pos >= 0 && !selected.empty() && selected.back() == pos / block_size,
                "sparse_compact_block_table: the selection ({} blocks) must end with block {} of position {}",
                selected.size(), pos / std::max<int64_t>(block_size, 1), pos);
  for (size_t i = 0; i < selected.size(); ++i) {
    TESSERA_CHECK(selected[i] >= 0 && (i == 0 || selected[i] > selected[i - 1]),
                  "sparse_compact_block_table: selection not strictly increasing at {}", i);
    compact_table[i] = block_table[selected[i]];
  }
  return (static_cast<int64_t>(selected.size()) - 1) * block_size + pos % block_size;
}

AttentionArgs sparse_decode_args(const PagedKvLayer& kv, const KvBlockSummaries& s, const AttentionArgs& args,
                                 const SparseSelectOptions& opt, ThreadPool* pool, SparseScratch& scratch) {
  sparse_score_blocks(kv, s, args, opt, pool, scratch);
  return sparse_args_from_scores(kv, args, opt, scratch);
}

AttentionArgs sparse_args_from_scores(const PagedKvLayer& kv, const AttentionArgs& args,
                                      const SparseSelectOptions& opt, SparseScratch& scratch) {
  const std::span<const int32_t> selected = sparse_select_scored(args.start_pos, kv.block_size, opt, scratch);
  scratch.table.resize(selected.size());
  AttentionArgs compact = args;
  compact.start_pos =
      sparse_compact_block_table(selected, args.block_table, args.start_pos, kv.block_size, scratch.table.data());
  compact.block_table = scratch.table.data();
  return compact;
}

void sparse_decode_attention(const PagedKvLayer& kv, const KvBlockSummaries& s, const AttentionArgs& args,
                             const SparseSelectOptions& opt, ThreadPool* pool, SparseScratch& scratch) {
  paged_attention(kv, sparse_decode_args(kv, s, args, opt, pool, scratch), pool);
}

}  // namespace tessera
