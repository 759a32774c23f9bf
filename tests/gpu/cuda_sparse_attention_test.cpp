// Quest sparse decode attention on the device (kernels/cuda/sparse_attention.cu) against the CPU
// reference (kernels/sparse_attention.h): key summaries (kv_summary_update) and block scores
// (sparse_block_scores) bit for bit, the selection and compacted tables (sparse_select_scored,
// sparse_compact_block_table) exactly, also across two "ranks" holding half the heads each;
// then the paged decode attention over the compacted tables: equal to dense attention when the
// selection covers every block, and to sparse_decode_attention with a real selection. Over a
// grid of shapes with GQA groups, odd head_dim, ties between blocks, and fp32 / fp16 caches.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "kernels/paged_attention.h"
#include "kernels/sparse_attention.h"
#include "tests/gpu/gpu_test_util.h"

namespace tessera {
namespace {

using gpu_test::from_f16;
using gpu_test::gaussian;
using gpu_test::to_f16;
using CudaSparse = gpu_test::GpuTest;

bool same_bits(float a, float b) { return std::memcmp(&a, &b, 4) == 0; }

struct Shape {
  int64_t n_heads, n_kv_heads, head_dim, block_size, num_blocks;
};

const Shape kShapes[] = {
    {4, 2, 64, 16, 40}, {6, 3, 13, 4, 70}, {8, 1, 128, 8, 33}, {3, 3, 7, 1, 50}, {32, 8, 64, 16, 24},
};

std::string describe(const Shape& c, bool f16) {
  return std::string(f16 ? "fp16" : "fp32") + " heads=" + std::to_string(c.n_heads) + "/" +
         std::to_string(c.n_kv_heads) + " head_dim=" + std::to_string(c.head_dim) +
         " block_size=" + std::to_string(c.block_size);
}

// A random cache (K and V of every slot) in fp32 and its fp16 rounding.
struct Cache {
  std::vector<float> k, v;
  std::vector<uint16_t> k16, v16;
  PagedKvLayer layer(const Shape& c, bool f16) {
    if (f16) return {nullptr, nullptr, c.num_blocks, c.block_size, c.n_kv_heads, c.head_dim, k16.data(), v16.data()};
    return {k.data(), v.data(), c.num_blocks, c.block_size, c.n_kv_heads, c.head_dim};
  }
};
Cache random_cache(const Shape& c, uint32_t seed) {
  Cache m;
  const int64_t n = c.num_blocks * c.block_size * c.n_kv_heads * c.head_dim;
  m.k = gaussian(n, seed);
  m.v = gaussian(n, seed + 1);
  m.k16 = to_f16(m.k);
  m.v16 = to_f16(m.v);
  return m;
}

// The device summaries after kv_summary_update_f32 over `slots` match the CPU's
// kv_summary_update over the same (sequence, positions) writes, bit for bit; blocks no token
// wrote keep their sentinel.
TEST_F(CudaSparse, KeySummariesMatchCpu) {
  for (const bool f16 : {false, true})
    for (const Shape& c : kShapes) {
      const std::string what = describe(c, f16);
      Cache cache = random_cache(c, 21);
      const PagedKvLayer kv = cache.layer(c, f16);
      const int64_t row = c.n_kv_heads * c.head_dim, sum_floats = c.num_blocks * row;
      std::mt19937 rng(5);
      std::vector<int32_t> ids(static_cast<size_t>(c.num_blocks));
      std::iota(ids.begin(), ids.end(), 0);
      std::shuffle(ids.begin(), ids.end(), rng);
      // Two sequences on disjoint blocks: A writes a prefill piece [3, 3 + 2 * block_size + 1),
      // B one decode token; a padding row (slot -1) between them.
      const int64_t per_seq = c.num_blocks / 2;
      const std::vector<int32_t> table_a(ids.begin(), ids.begin() + per_seq), table_b(ids.begin() + per_seq, ids.end());
      const int64_t a_start = std::min<int64_t>(3, per_seq * c.block_size - 1);
      const int64_t a_len = std::min<int64_t>(2 * c.block_size + 1, per_seq * c.block_size - a_start);
      const int64_t b_pos = std::min<int64_t>(5 * c.block_size / 2, (c.num_blocks - per_seq) * c.block_size - 1);
      std::vector<int64_t> slots;
      auto slot = [&](const std::vector<int32_t>& t, int64_t p) {
        return static_cast<int64_t>(t[static_cast<size_t>(p / c.block_size)]) * c.block_size + p % c.block_size;
      };
      for (int64_t p = a_start; p < a_start + a_len; ++p) slots.push_back(slot(table_a, p));
      slots.push_back(-1);
      slots.push_back(slot(table_b, b_pos));

      std::vector<float> want_min(static_cast<size_t>(sum_floats), 99.0f), want_max = want_min;
      const KvBlockSummaries sums{want_min.data(), want_max.data(), c.num_blocks, c.n_kv_heads, c.head_dim};
      kv_summary_update(kv, sums, table_a.data(), a_start, a_len);
      kv_summary_update(kv, sums, table_b.data(), b_pos, 1);

      TesseraCudaKvSummaryArgs a{};
      a.k_cache = f16 ? static_cast<const void*>(to_device(cache.k16)) : to_device(cache.k);
      a.kmin = to_device(std::vector<float>(static_cast<size_t>(sum_floats), 99.0f));
      a.kmax = to_device(std::vector<float>(static_cast<size_t>(sum_floats), 99.0f));
      a.slots = to_device(slots);
      a.n_tokens = static_cast<int64_t>(slots.size());
      a.n_kv_heads = c.n_kv_heads;
      a.head_dim = c.head_dim;
      a.block_size = c.block_size;
      a.num_blocks = c.num_blocks;
      a.kv_dtype = f16 ? TESSERA_CUDA_F16 : TESSERA_CUDA_F32;
      ASSERT_EQ(api_->kv_summary_update_f32(&a, nullptr), 0) << api_->last_error();
      const std::vector<float> got_min = to_host(a.kmin, sum_floats), got_max = to_host(a.kmax, sum_floats);
      for (int64_t i = 0; i < sum_floats; ++i) {
        ASSERT_TRUE(same_bits(got_min[static_cast<size_t>(i)], want_min[static_cast<size_t>(i)]))
            << what << " kmin " << i << ": " << got_min[static_cast<size_t>(i)] << " vs "
            << want_min[static_cast<size_t>(i)];
        ASSERT_TRUE(same_bits(got_max[static_cast<size_t>(i)], want_max[static_cast<size_t>(i)]))
            << what << " kmax " << i;
      }
    }
}

// One step's sequences for the selection tests: a decode query each (row s), its length, its
// table. Tables repeat some physical blocks, so some blocks tie exactly (the lower index wins).
struct Step {
  std::vector<float> q;             // [n_seqs, n_heads, head_dim]
  std::vector<int32_t> seq_lens, query_len, query_begin, tables;  // tables [n_seqs, stride]
  int64_t stride = 0;
};
Step random_step(const Shape& c, const std::vector<int64_t>& lens, uint32_t seed) {
  Step st;
  std::mt19937 rng(seed);
  st.stride = 0;
  for (int64_t n : lens) st.stride = std::max(st.stride, (n + c.block_size - 1) / c.block_size);
  st.q = gaussian(static_cast<int64_t>(lens.size()) * c.n_heads * c.head_dim, seed + 7);
  for (size_t s = 0; s < lens.size(); ++s) {
    st.seq_lens.push_back(static_cast<int32_t>(lens[s]));
    st.query_len.push_back(1);
    st.query_begin.push_back(static_cast<int32_t>(s));
    for (int64_t b = 0; b < st.stride; ++b) {
      // Mostly distinct blocks; every 5th logical block reuses block 0's id (a tie).
      const auto id = static_cast<int32_t>(b % 5 == 4 ? (s * 3) % c.num_blocks : rng() % c.num_blocks);
      st.tables.push_back(id);
    }
  }
  return st;
}

// Summaries with kmin <= kmax (a random pair, ordered).
void random_summaries(const Shape& c, uint32_t seed, std::vector<float>& kmin, std::vector<float>& kmax) {
  const int64_t n = c.num_blocks * c.n_kv_heads * c.head_dim;
  kmin = gaussian(n, seed);
  kmax = gaussian(n, seed + 1);
  for (int64_t i = 0; i < n; ++i)
    if (kmin[static_cast<size_t>(i)] > kmax[static_cast<size_t>(i)])
      std::swap(kmin[static_cast<size_t>(i)], kmax[static_cast<size_t>(i)]);
}

struct DeviceSelect {
  TesseraCudaSparseArgs args{};
  float* scores = nullptr;
  int32_t *compact = nullptr, *lens = nullptr, *starts = nullptr;
};

class CudaSparseSelect : public CudaSparse {
 protected:
  // Device arguments for `st` with the heads [head0, head0 + n_heads) of q (a rank's share).
  DeviceSelect device_args(const Shape& c, const Step& st, const std::vector<float>& kmin,
                           const std::vector<float>& kmax, const SparseAttentionConfig& cfg, int64_t head0,
                           int64_t n_heads, int64_t n_kv_heads, int64_t kv_head0) {
    const auto n_seqs = static_cast<int64_t>(st.seq_lens.size());
    const int64_t hd = c.head_dim;
    // This rank's q rows and summaries (its KV heads).
    std::vector<float> q(static_cast<size_t>(n_seqs * n_heads * hd));
    for (int64_t s = 0; s < n_seqs; ++s)
      std::copy_n(&st.q[static_cast<size_t>((s * c.n_heads + head0) * hd)], n_heads * hd,
                  &q[static_cast<size_t>(s * n_heads * hd)]);
    std::vector<float> mn(static_cast<size_t>(c.num_blocks * n_kv_heads * hd)), mx = mn;
    for (int64_t b = 0; b < c.num_blocks; ++b) {
      std::copy_n(&kmin[static_cast<size_t>((b * c.n_kv_heads + kv_head0) * hd)], n_kv_heads * hd,
                  &mn[static_cast<size_t>(b * n_kv_heads * hd)]);
      std::copy_n(&kmax[static_cast<size_t>((b * c.n_kv_heads + kv_head0) * hd)], n_kv_heads * hd,
                  &mx[static_cast<size_t>(b * n_kv_heads * hd)]);
    }
    DeviceSelect d;
    TesseraCudaSparseArgs& a = d.args;
    a.q = to_device(q);
    a.kmin = to_device(mn);
    a.kmax = to_device(mx);
    a.block_tables = to_device(st.tables);
    a.query_begin = to_device(st.query_begin);
    a.query_len = to_device(st.query_len);
    a.seq_lens = to_device(st.seq_lens);
    d.scores = to_device(std::vector<float>(static_cast<size_t>(n_seqs * st.stride), -7.0f));
    a.scores = d.scores;
    d.compact = alloc<int32_t>(n_seqs * st.stride);
    d.lens = alloc<int32_t>(n_seqs);
    d.starts = alloc<int32_t>(n_seqs);
    a.compact_tables = d.compact;
    a.compact_seq_lens = d.lens;
    a.compact_start_pos = d.starts;
    a.n_seqs = n_seqs;
    a.n_heads = n_heads;
    a.n_kv_heads = n_kv_heads;
    a.head_dim = hd;
    a.block_size = c.block_size;
    a.max_blocks_per_seq = st.stride;
    a.num_blocks = c.num_blocks;
    a.n_ranks = 1;
    a.threshold_tokens = cfg.threshold_tokens;
    a.sink_blocks = cfg.select.sink_blocks;
    a.recent_blocks = cfg.select.recent_blocks;
    a.top_blocks = cfg.select.top_blocks;
    return d;
  }

  // The CPU's selection of sequence s: compacted table and position (pos itself when dense).
  int64_t sparse_seqs_ = 0;  // sequences expect_selection saw attend to fewer blocks than they have

  struct Want {
    std::vector<float> scores;  // the competing blocks' (empty when dense)
    std::vector<int32_t> table;
    int64_t pos = 0;
  };
  Want cpu_select(const Shape& c, const Step& st, int64_t s, const std::vector<float>& kmin,
                  const std::vector<float>& kmax, const SparseAttentionConfig& cfg) {
    std::vector<float> mn = kmin, mx = kmax;
    const PagedKvLayer kv{nullptr, nullptr, c.num_blocks, c.block_size, c.n_kv_heads, c.head_dim};
    const KvBlockSummaries sums{mn.data(), mx.data(), c.num_blocks, c.n_kv_heads, c.head_dim};
    AttentionArgs args;
    args.q = &st.q[static_cast<size_t>(s * c.n_heads * c.head_dim)];
    args.n_tokens = 1;
    args.start_pos = st.seq_lens[static_cast<size_t>(s)] - 1;
    args.n_heads = c.n_heads;
    args.block_table = &st.tables[static_cast<size_t>(s * st.stride)];
    Want w;
    const int64_t n_blocks = args.start_pos / c.block_size + 1;
    if (args.start_pos + 1 < cfg.threshold_tokens) {
      w.table.assign(args.block_table, args.block_table + n_blocks);
      w.pos = args.start_pos;
      return w;
    }
    SparseScratch scratch;
    const std::span<float> scores = sparse_score_blocks(kv, sums, args, cfg.select, nullptr, scratch);
    w.scores.assign(scores.begin(), scores.end());
    const std::span<const int32_t> sel = sparse_select_scored(args.start_pos, c.block_size, cfg.select, scratch);
    w.table.resize(sel.size());
    w.pos = sparse_compact_block_table(sel, args.block_table, args.start_pos, c.block_size, w.table.data());
    return w;
  }

  void expect_selection(const Shape& c, const Step& st, const DeviceSelect& d, const std::vector<float>& kmin,
                        const std::vector<float>& kmax, const SparseAttentionConfig& cfg, const std::string& what,
                        bool check_scores) {
    const auto n_seqs = static_cast<int64_t>(st.seq_lens.size());
    const std::vector<float> scores = to_host(d.scores, n_seqs * st.stride);
    const std::vector<int32_t> compact = to_host(d.compact, n_seqs * st.stride);
    const std::vector<int32_t> lens = to_host(d.lens, n_seqs), starts = to_host(d.starts, n_seqs);
    for (int64_t s = 0; s < n_seqs; ++s) {
      const std::string at = what + " seq " + std::to_string(s) + " len " + std::to_string(st.seq_lens[s]);
      const Want w = cpu_select(c, st, s, kmin, kmax, cfg);
      if (check_scores)
        for (size_t i = 0; i < w.scores.size(); ++i) {
          const float got = scores[static_cast<size_t>(s * st.stride + cfg.select.sink_blocks) + i];
          ASSERT_TRUE(same_bits(got, w.scores[i])) << at << " score " << i << ": " << got << " vs " << w.scores[i];
        }
      ASSERT_EQ(lens[static_cast<size_t>(s)], w.pos + 1) << at;
      sparse_seqs_ += w.pos + 1 < st.seq_lens[static_cast<size_t>(s)] ? 1 : 0;
      ASSERT_EQ(starts[static_cast<size_t>(s)], w.pos) << at;
      for (size_t i = 0; i < w.table.size(); ++i)
        ASSERT_EQ(compact[static_cast<size_t>(s * st.stride) + i], w.table[i]) << at << " entry " << i;
    }
  }
};

SparseAttentionConfig config(int64_t threshold, int64_t sink, int64_t recent, int64_t top) {
  SparseAttentionConfig cfg;
  cfg.enabled = true;
  cfg.threshold_tokens = threshold;
  cfg.select = {sink, recent, top};
  return cfg;
}

// Scores bit for bit, selection and compaction exactly, for sequences below the threshold,
// within the selection budget (dense), and past it, with several selection options.
TEST_F(CudaSparseSelect, ScoresAndSelectionMatchCpu) {
  const SparseAttentionConfig configs[] = {config(40, 1, 2, 4), config(1, 0, 1, 1), config(64, 2, 3, 0),
                                           config(16, 1, 2, 9)};
  for (const Shape& c : kShapes)
    for (const SparseAttentionConfig& cfg : configs) {
      const std::string what = describe(c, false) + " sink/recent/top " + std::to_string(cfg.select.sink_blocks) +
                               "/" + std::to_string(cfg.select.recent_blocks) + "/" +
                               std::to_string(cfg.select.top_blocks);
      const int64_t cap = c.num_blocks * c.block_size;
      const std::vector<int64_t> lens = {std::min<int64_t>(cap, 300), 1, std::min<int64_t>(cap, 39),
                                         std::min<int64_t>(cap, 17 * c.block_size + 3), std::min<int64_t>(cap, 161)};
      const Step st = random_step(c, lens, 31);
      std::vector<float> kmin, kmax;
      random_summaries(c, 41, kmin, kmax);
      DeviceSelect d = device_args(c, st, kmin, kmax, cfg, 0, c.n_heads, c.n_kv_heads, 0);
      ASSERT_EQ(api_->sparse_block_scores_f32(&d.args, nullptr), 0) << api_->last_error();
      ASSERT_EQ(api_->sparse_select_blocks(&d.args, nullptr), 0) << api_->last_error();
      expect_selection(c, st, d, kmin, kmax, cfg, what, true);
    }
  EXPECT_GT(sparse_seqs_, 20);
}

// Two ranks, each with half the query heads (and half the KV heads when they divide): each
// scores with its heads, the selection takes the element-wise max of both: the selection of
// every head at once (the CPU at TP 1).
TEST_F(CudaSparseSelect, TwoRanksSelectAsOne) {
  const Shape shapes[] = {{4, 2, 64, 16, 40}, {8, 1, 128, 8, 33}, {6, 2, 13, 4, 70}};
  const SparseAttentionConfig cfg = config(20, 1, 2, 3);
  for (const Shape& c : shapes) {
    const std::string what = describe(c, false) + " TP 2";
    const int64_t cap = c.num_blocks * c.block_size;
    const Step st = random_step(c, {std::min<int64_t>(cap, 250), std::min<int64_t>(cap, 90), 7}, 51);
    std::vector<float> kmin, kmax;
    random_summaries(c, 61, kmin, kmax);
    const bool split_kv = c.n_kv_heads % 2 == 0;
    const int64_t heads = c.n_heads / 2, kv_heads = split_kv ? c.n_kv_heads / 2 : c.n_kv_heads;
    DeviceSelect r0 = device_args(c, st, kmin, kmax, cfg, 0, heads, kv_heads, 0);
    DeviceSelect r1 = device_args(c, st, kmin, kmax, cfg, heads, heads, kv_heads, split_kv ? kv_heads : 0);
    ASSERT_EQ(api_->sparse_block_scores_f32(&r0.args, nullptr), 0) << api_->last_error();
    ASSERT_EQ(api_->sparse_block_scores_f32(&r1.args, nullptr), 0) << api_->last_error();
    const int64_t n = static_cast<int64_t>(st.seq_lens.size()) * st.stride;
    std::vector<float> gathered = to_host(r0.scores, n);
    const std::vector<float> second = to_host(r1.scores, n);
    gathered.insert(gathered.end(), second.begin(), second.end());
    r0.args.gathered_scores = to_device(gathered);
    r0.args.n_ranks = 2;
    ASSERT_EQ(api_->sparse_select_blocks(&r0.args, nullptr), 0) << api_->last_error();
    expect_selection(c, st, r0, kmin, kmax, cfg, what, true);  // scores: combined back into r0's
  }
  EXPECT_GE(sparse_seqs_, 4);
}

// Bad selection options fail the call with a message.
TEST_F(CudaSparseSelect, RefusesBadOptions) {
  const Shape c{4, 2, 8, 4, 8};
  const Step st = random_step(c, {20}, 3);
  std::vector<float> kmin, kmax;
  random_summaries(c, 4, kmin, kmax);
  DeviceSelect d = device_args(c, st, kmin, kmax, config(8, 1, 2, 1), 0, c.n_heads, c.n_kv_heads, 0);
  d.args.recent_blocks = 0;
  EXPECT_NE(api_->sparse_select_blocks(&d.args, nullptr), 0);
  EXPECT_NE(std::string(api_->last_error()), "");
  d.args.recent_blocks = 1;
  d.args.threshold_tokens = 0;
  EXPECT_NE(api_->sparse_block_scores_f32(&d.args, nullptr), 0);
}

// Decode attention over the compacted tables: equal to the dense kernel when the selection holds
// every block (top_blocks large), and to the CPU's sparse_decode_attention with a real
// selection, for fp32 and fp16 caches.
TEST_F(CudaSparseSelect, AttentionOverSelectionMatchesCpu) {
  for (const bool f16 : {false, true})
    for (const Shape& c : kShapes) {
      const std::string what = describe(c, f16);
      Cache cache = random_cache(c, 71);
      const PagedKvLayer kv = cache.layer(c, f16);
      const int64_t cap = c.num_blocks * c.block_size;
      const std::vector<int64_t> lens = {std::min<int64_t>(cap, 200), std::min<int64_t>(cap, 45), 3};
      // Distinct blocks per sequence here (a real cache never repeats one within a table).
      Step st = random_step(c, lens, 81);
      std::mt19937 rng(9);
      for (size_t s = 0; s < lens.size(); ++s) {
        std::vector<int32_t> ids(static_cast<size_t>(c.num_blocks));
        std::iota(ids.begin(), ids.end(), 0);
        std::shuffle(ids.begin(), ids.end(), rng);
        std::copy_n(ids.begin(), st.stride, st.tables.begin() + static_cast<std::ptrdiff_t>(s * st.stride));
      }
      // Summaries of every block over all its slots (the cache is full).
      std::vector<float> kmin(static_cast<size_t>(c.num_blocks * c.n_kv_heads * c.head_dim)), kmax = kmin;
      const KvBlockSummaries sums{kmin.data(), kmax.data(), c.num_blocks, c.n_kv_heads, c.head_dim};
      std::vector<int32_t> all(static_cast<size_t>(c.num_blocks));
      std::iota(all.begin(), all.end(), 0);
      kv_summary_update(kv, sums, all.data(), 0, cap);
      const float scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
      const void* k_dev = f16 ? static_cast<const void*>(to_device(cache.k16)) : to_device(cache.k);
      const void* v_dev = f16 ? static_cast<const void*>(to_device(cache.v16)) : to_device(cache.v);
      const auto n_seqs = static_cast<int64_t>(lens.size());
      const int64_t q_floats = n_seqs * c.n_heads * c.head_dim;

      for (const SparseAttentionConfig& cfg : {config(1, 1, 2, 1 << 20), config(30, 1, 2, 3), config(1, 0, 1, 2)}) {
        const bool covers = cfg.select.top_blocks >= c.num_blocks;
        DeviceSelect d = device_args(c, st, kmin, kmax, cfg, 0, c.n_heads, c.n_kv_heads, 0);
        ASSERT_EQ(api_->sparse_block_scores_f32(&d.args, nullptr), 0) << api_->last_error();
        ASSERT_EQ(api_->sparse_select_blocks(&d.args, nullptr), 0) << api_->last_error();
        auto attend = [&](const int32_t* tables, const int32_t* seq_lens) {
          TesseraCudaDecodeAttentionArgs a{};
          a.q = d.args.q;
          a.out = alloc<float>(q_floats);
          a.k_cache = k_dev;
          a.v_cache = v_dev;
          a.block_tables = tables;
          a.seq_lens = seq_lens;
          a.n_seqs = n_seqs;
          a.n_heads = c.n_heads;
          a.n_kv_heads = c.n_kv_heads;
          a.head_dim = c.head_dim;
          a.block_size = c.block_size;
          a.max_blocks_per_seq = st.stride;
          a.scale = scale;
          a.kv_dtype = f16 ? TESSERA_CUDA_F16 : TESSERA_CUDA_F32;
          EXPECT_EQ(api_->paged_decode_attention_f32(&a, nullptr), 0) << api_->last_error();
          return to_host(a.out, q_floats);
        };
        const std::vector<float> sparse = attend(d.compact, d.lens);
        if (covers) {
          const std::vector<float> dense = attend(d.args.block_tables, d.args.seq_lens);
          for (int64_t i = 0; i < q_floats; ++i)
            ASSERT_TRUE(same_bits(sparse[static_cast<size_t>(i)], dense[static_cast<size_t>(i)]))
                << what << " covering selection differs from dense at " << i;
          continue;
        }
        for (int64_t s = 0; s < n_seqs; ++s) {
          std::vector<float> want(static_cast<size_t>(c.n_heads * c.head_dim));
          AttentionArgs args;
          args.q = &st.q[static_cast<size_t>(s * c.n_heads * c.head_dim)];
          args.out = want.data();
          args.n_tokens = 1;
          args.start_pos = lens[static_cast<size_t>(s)] - 1;
          args.n_heads = c.n_heads;
          args.scale = scale;
          args.block_table = &st.tables[static_cast<size_t>(s * st.stride)];
          SparseScratch scratch;
          if (args.start_pos + 1 >= cfg.threshold_tokens)
            sparse_decode_attention(kv, sums, args, cfg.select, nullptr, scratch);
          else
            paged_attention(kv, args, nullptr);
          for (size_t i = 0; i < want.size(); ++i)
            ASSERT_NEAR(sparse[static_cast<size_t>(s * c.n_heads * c.head_dim) + i], want[i],
                        2e-5f + 2e-5f * std::fabs(want[i]))
                << what << " seq " << s << " element " << i;
        }
      }
    }
}

}  // namespace
}  // namespace tessera
