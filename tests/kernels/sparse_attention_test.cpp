// Quest block selection and sparse decode attention (kernels/sparse_attention.h): block summaries
// against brute force, the scores as upper bounds, the selection's shape and ranking, a planted
// "needle" key, and sparse attention against dense paged_attention and a double reference.
#include "kernels/sparse_attention.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "common/thread_pool.h"
#include "kernels/cpu/vec.h"
#include "kernels/paged_attention.h"
#include "tests/kernels/kernel_test_util.h"

namespace tessera {
namespace {

using test::gaussian;
using test::same_bits;

struct SparseShape {
  int64_t block_size, n_heads, n_kv_heads, head_dim;
  KvDtype dtype;
};

constexpr KvDtype kCacheDtypes[] = {KvDtype::kF32, KvDtype::kF16, KvDtype::kInt8};

std::string describe(const SparseShape& c) {
  return std::string(kv_dtype_name(c.dtype)) + " bs " + std::to_string(c.block_size) + " heads " +
         std::to_string(c.n_heads) + "/" + std::to_string(c.n_kv_heads) + " hd " + std::to_string(c.head_dim);
}

// One sequence of up to max_len positions in a cache layer (fp32, fp16 or int8) with a shuffled block
// table and spare blocks, and the layer's summaries. Unwritten K slots hold +-large values (a
// read of one shows in a min, a max or a score), unwritten V slots NaN, summaries NaN until
// computed.
struct SparseCache {
  SparseShape c;
  std::vector<float> k32, v32, kmin, kmax;
  std::vector<uint16_t> k16, v16;
  std::vector<int8_t> k8, v8;
  std::vector<int32_t> table;
  std::vector<float> k_all, v_all;  // [pos][kv head][dim], what kv_write is given
  PagedKvLayer layer;
  KvBlockSummaries sums;

  SparseCache(const SparseShape& shape, int64_t max_len, uint32_t seed) : c(shape) {
    const int64_t blocks = (max_len + c.block_size - 1) / c.block_size, num_blocks = blocks + 3;
    const int64_t row = c.n_kv_heads * c.head_dim;
    const auto elems = static_cast<size_t>(num_blocks * c.block_size * row);
    const float big = c.dtype == KvDtype::kF16 ? 65504.0f : 1e30f;
    auto poison = [&](size_t i) { return (i + i / static_cast<size_t>(row)) % 2 == 0 ? big : -big; };
    if (c.dtype == KvDtype::kInt8) {
      // Rows of [scale][values]: K rows read as +-127 * 1e30, V rows as 0 * NaN.
      const int64_t rb = c.head_dim + kInt8RowLead;
      k8.resize(static_cast<size_t>(num_blocks * c.block_size * c.n_kv_heads * rb));
      v8.assign(k8.size(), 0);
      for (size_t r = 0; r < k8.size(); r += static_cast<size_t>(rb)) {
        const float nan = NAN;
        std::memcpy(&k8[r], &big, sizeof big);
        std::memcpy(&v8[r], &nan, sizeof nan);
        for (int64_t i = 0; i < c.head_dim; ++i)
          k8[r + static_cast<size_t>(kInt8RowLead + i)] = poison(r / static_cast<size_t>(rb) + static_cast<size_t>(i)) > 0 ? 127 : -127;
      }
      layer = PagedKvLayer{nullptr, nullptr, num_blocks, c.block_size, c.n_kv_heads, c.head_dim,
                           nullptr, nullptr, k8.data(), v8.data()};
    } else if (c.dtype == KvDtype::kF16) {
      k16.resize(elems);
      v16.assign(elems, 0x7e00);  // NaN
      for (size_t i = 0; i < elems; ++i) k16[i] = f32_to_fp16(poison(i));
      layer = PagedKvLayer{nullptr, nullptr, num_blocks, c.block_size, c.n_kv_heads, c.head_dim,
                           k16.data(), v16.data()};
    } else {
      k32.resize(elems);
      v32.assign(elems, NAN);
      for (size_t i = 0; i < elems; ++i) k32[i] = poison(i);
      layer = PagedKvLayer{k32.data(), v32.data(), num_blocks, c.block_size, c.n_kv_heads, c.head_dim};
    }
    table.resize(static_cast<size_t>(num_blocks));
    std::iota(table.begin(), table.end(), 0);
    std::shuffle(table.begin(), table.end(), std::mt19937(seed));
    table.resize(static_cast<size_t>(blocks));
    kmin.assign(static_cast<size_t>(num_blocks * row), NAN);
    kmax.assign(kmin.size(), NAN);
    sums = KvBlockSummaries{kmin.data(), kmax.data(), num_blocks, c.n_kv_heads, c.head_dim};
    k_all = gaussian(max_len * row, seed + 1);
    v_all = gaussian(max_len * row, seed + 2);
  }
  SparseCache(const SparseCache&) = delete;  // layer and sums point into the vectors
  SparseCache& operator=(const SparseCache&) = delete;

  int64_t row() const { return c.n_kv_heads * c.head_dim; }
  size_t index(int64_t pos, int64_t g, int64_t i) const {
    return static_cast<size_t>(pos * row() + g * c.head_dim + i);
  }

  // Writes positions start .. start + n - 1 and updates their blocks' summaries, as a step does.
  void write(int64_t start, int64_t n) {
    kv_write(layer, table.data(), start, n, k_all.data() + start * row(), v_all.data() + start * row());
    kv_summary_update(layer, sums, table.data(), start, n);
  }

  // Key and value elements as the cache holds them (fp16: rounded; int8: on its row's grid of
  // max |x| / 127 steps).
  float held(const std::vector<float>& all, int64_t pos, int64_t g, int64_t i) const {
    const float x = all[index(pos, g, i)];
    if (c.dtype == KvDtype::kF16) return fp16_to_f32(f32_to_fp16(x));
    if (c.dtype != KvDtype::kInt8) return x;
    float amax = 0;
    for (int64_t d = 0; d < c.head_dim; ++d) amax = std::max(amax, std::fabs(all[index(pos, g, d)]));
    const float scale = amax / 127.0f;
    return std::nearbyint(x / scale) * scale;
  }
  float key(int64_t pos, int64_t g, int64_t i) const { return held(k_all, pos, g, i); }
  float value(int64_t pos, int64_t g, int64_t i) const { return held(v_all, pos, g, i); }

  // Before position pos is written: its key in every KV head becomes gain * dir.
  void plant(int64_t pos, const std::vector<float>& dir, float gain) {
    for (int64_t g = 0; g < c.n_kv_heads; ++g)
      for (int64_t i = 0; i < c.head_dim; ++i) k_all[index(pos, g, i)] = gain * dir[static_cast<size_t>(i)];
  }
};

// Every block holding some of positions 0 .. len - 1 has the min and max of their keys; every
// other physical block's summary is untouched (NaN).
::testing::AssertionResult summaries_match(const SparseCache& f, int64_t len) {
  const int64_t bs = f.c.block_size, hd = f.c.head_dim, written = (len + bs - 1) / bs;
  std::vector<bool> touched(static_cast<size_t>(f.layer.num_blocks), false);
  for (int64_t b = 0; b < written; ++b) {
    const int64_t block = f.table[static_cast<size_t>(b)];
    touched[static_cast<size_t>(block)] = true;
    for (int64_t g = 0; g < f.c.n_kv_heads; ++g) {
      for (int64_t i = 0; i < hd; ++i) {
        float lo = INFINITY, hi = -INFINITY;
        for (int64_t p = b * bs; p < std::min(len, (b + 1) * bs); ++p) {
          lo = std::min(lo, f.key(p, g, i));
          hi = std::max(hi, f.key(p, g, i));
        }
        const auto at = static_cast<size_t>((block * f.c.n_kv_heads + g) * hd + i);
        if (f.kmin[at] != lo || f.kmax[at] != hi)
          return ::testing::AssertionFailure() << "logical block " << b << " kv head " << g << " dim " << i << ": ["
                                               << f.kmin[at] << ", " << f.kmax[at] << "], want [" << lo << ", " << hi
                                               << "]";
      }
    }
  }
  for (int64_t block = 0; block < f.layer.num_blocks; ++block) {
    const auto at = static_cast<size_t>(block * f.row());
    if (!touched[static_cast<size_t>(block)] && !(std::isnan(f.kmin[at]) && std::isnan(f.kmax[at])))
      return ::testing::AssertionFailure() << "physical block " << block << " holds none of the positions but changed";
  }
  return ::testing::AssertionSuccess();
}

// Query heads along one direction (GQA: all heads of every group see the needle): head h is
// dir * |d| + 0.3 * noise_h, with dir the unit vector of a gaussian d.
std::vector<float> aligned_query(const SparseShape& c, const std::vector<float>& d, uint32_t seed) {
  const auto noise = gaussian(c.n_heads * c.head_dim, seed, 0.3f);
  std::vector<float> q(noise.size());
  for (size_t i = 0; i < q.size(); ++i) q[i] = d[i % static_cast<size_t>(c.head_dim)] + noise[i];
  return q;
}

std::vector<float> unit(const std::vector<float>& d) {
  double n = 0;
  for (float x : d) n += static_cast<double>(x) * x;
  std::vector<float> u(d);
  for (float& x : u) x = static_cast<float>(x / std::sqrt(n));
  return u;
}

float max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  float m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(a[i] - b[i]));
  return m;
}

// Attention of the decode query at pos over the keys of the given logical blocks (up to pos),
// in double: [n_heads][head_dim].
std::vector<double> reference_over_blocks(const SparseCache& f, const std::vector<float>& q, int64_t pos,
                                          const std::vector<int32_t>& blocks, float scale) {
  const int64_t hd = f.c.head_dim, group = f.c.n_heads / f.c.n_kv_heads, bs = f.c.block_size;
  std::vector<double> out(static_cast<size_t>(f.c.n_heads * hd), 0.0);
  for (int64_t h = 0; h < f.c.n_heads; ++h) {
    const int64_t g = h / group;
    std::vector<double> s;
    std::vector<int64_t> keys;
    for (int32_t b : blocks) {
      for (int64_t p = b * bs; p < std::min(pos + 1, (b + 1) * bs); ++p) {
        double d = 0;
        for (int64_t i = 0; i < hd; ++i) d += static_cast<double>(q[static_cast<size_t>(h * hd + i)]) * f.key(p, g, i);
        s.push_back(d * scale);
        keys.push_back(p);
      }
    }
    const double mx = *std::max_element(s.begin(), s.end());
    double sum = 0;
    for (double& v : s) sum += (v = std::exp(v - mx));
    for (size_t n = 0; n < keys.size(); ++n)
      for (int64_t i = 0; i < hd; ++i) out[static_cast<size_t>(h * hd + i)] += s[n] / sum * f.value(keys[n], g, i);
  }
  return out;
}

// The selection by its definition: all blocks, or sinks + recent + the best middle blocks by
// (score desc, index asc), sorted.
std::vector<int32_t> expected_selection(const std::vector<float>& scores, const SparseSelectOptions& opt) {
  const auto n = static_cast<int64_t>(scores.size());
  std::vector<int32_t> all(static_cast<size_t>(n));
  std::iota(all.begin(), all.end(), 0);
  if (n <= opt.sink_blocks + opt.recent_blocks + opt.top_blocks) return all;
  std::vector<int32_t> middle(all.begin() + opt.sink_blocks, all.end() - opt.recent_blocks);
  std::sort(middle.begin(), middle.end(), [&](int32_t a, int32_t b) {
    return scores[static_cast<size_t>(a)] != scores[static_cast<size_t>(b)]
               ? scores[static_cast<size_t>(a)] > scores[static_cast<size_t>(b)]
               : a < b;
  });
  std::vector<int32_t> out(all.begin(), all.begin() + opt.sink_blocks);
  out.insert(out.end(), middle.begin(), middle.begin() + opt.top_blocks);
  out.insert(out.end(), all.end() - opt.recent_blocks, all.end());
  std::sort(out.begin(), out.end());
  return out;
}

// On every ISA path (fp16 keys are widened by the vectorized decoder where there is one).
TEST(SparseSummaries, MatchBruteForceAfterPrefillChunksAndDecodeTokens) {
  test::IsaGuard guard;
  for (cpu::Isa isa : test::supported_isas()) {
    cpu::set_max_isa(isa);
    for (const KvDtype dtype : kCacheDtypes) {
      for (int64_t bs : {16, 64}) {
        const SparseShape c{bs, 8, 2, 36, dtype};
        const std::string what = describe(c) + " isa " + cpu::isa_name(isa);
        SparseCache f(c, 300, 11);
        int64_t len = 0;
        auto step = [&](int64_t n) {
          f.write(len, n);
          len += n;
          return summaries_match(f, len);
        };
        for (int64_t n : {37, 64, 100}) ASSERT_TRUE(step(n)) << what << " after a prefill chunk to " << len;
        for (int i = 0; i < 20; ++i) ASSERT_TRUE(step(1)) << what << " after decoding position " << len - 1;
        ASSERT_TRUE(step(79)) << what << " after the last chunk";
      }
    }
  }
}

// For every block and query head, the bound is >= q . k for every key of the block (up to the
// rounding of the sums), and equal to it for a block holding one key; a block's score is the
// largest bound over the heads.
TEST(SparseScores, QuestBoundIsAnUpperBoundOfEveryKeyInTheBlock) {
  uint32_t seed = 70;
  for (const KvDtype dtype : kCacheDtypes) {
    for (int64_t bs : {16, 64}) {
      for (int64_t hd : {36, 64}) {
        const SparseShape c{bs, 8, 2, hd, dtype};
        const int64_t len = 3 * 64 + 1;  // the last block holds one key
        SparseCache f(c, len, ++seed);
        for (size_t i = 0; i < f.k_all.size(); ++i) f.k_all[i] *= 0.25f + static_cast<float>(i % 4);
        f.write(0, len);
        const auto q = gaussian(c.n_heads * hd, seed + 100, 2.0f);
        const int64_t n_blocks = (len + bs - 1) / bs, group = c.n_heads / c.n_kv_heads;
        std::vector<float> scores(static_cast<size_t>(n_blocks));
        const AttentionArgs args{q.data(), nullptr, 1, len - 1, c.n_heads, 1.0f, 0, f.table.data()};
        sparse_block_scores(f.sums, args, scores, nullptr);
        for (int64_t b = 0; b < n_blocks; ++b) {
          const int64_t block = f.table[static_cast<size_t>(b)], last = std::min(len, (b + 1) * bs);
          float best = -INFINITY;
          for (int64_t h = 0; h < c.n_heads; ++h) {
            const int64_t g = h / group;
            const auto at = static_cast<size_t>((block * c.n_kv_heads + g) * hd);
            const float bound = quest_bound(q.data() + h * hd, &f.kmin[at], &f.kmax[at], hd);
            double top = -INFINITY, l1 = 0;
            for (int64_t p = b * bs; p < last; ++p) {
              double dot = 0, mag = 0;
              for (int64_t i = 0; i < hd; ++i) {
                const double x = static_cast<double>(q[static_cast<size_t>(h * hd + i)]) * f.key(p, g, i);
                dot += x;
                mag += std::fabs(x);
              }
              top = std::max(top, dot);
              l1 = std::max(l1, mag);
            }
            const std::string at_what = describe(c) + " block " + std::to_string(b) + " head " + std::to_string(h);
            ASSERT_GE(bound, top - 2e-6 * l1) << at_what;
            if (last - b * bs == 1) {
              ASSERT_NEAR(bound, top, 2e-6 * l1) << at_what << ": one key, the bound is its score";
            }
            best = std::max(best, bound);
          }
          ASSERT_EQ(scores[static_cast<size_t>(b)], best) << describe(c) << " block " << b;
        }
      }
    }
  }
}

// Sorted, the right size, sinks and recent blocks included, the rest the best by (score desc,
// index asc); the same with and without a pool (200 blocks: scoring is split over it).
TEST(SparseSelect, KeepsSinksAndRecentAndRanksTheRestByScore) {
  ThreadPool pool(ThreadPoolOptions{.num_threads = 3});
  const SparseShape c{16, 8, 2, 64, KvDtype::kF32};
  const int64_t max_len = 3200;
  SparseCache f(c, max_len, 5);
  f.write(0, max_len);
  const auto q = gaussian(c.n_heads * c.head_dim, 106, 2.0f);
  const SparseSelectOptions opts[] = {{1, 2, 16}, {0, 1, 3}, {2, 3, 1}, {4, 1, 0}, {3, 2, 50}};
  for (int64_t len : {1, 16, 17, 100, 300, 333, 700, 3200}) {
    const int64_t n = (len + 15) / 16;
    std::vector<float> scores(static_cast<size_t>(n));
    const AttentionArgs args{q.data(), nullptr, 1, len - 1, c.n_heads, 0.125f, 0, f.table.data()};
    sparse_block_scores(f.sums, args, scores, nullptr);
    for (const SparseSelectOptions& opt : opts) {
      const std::string what = "len " + std::to_string(len) + " sink " + std::to_string(opt.sink_blocks) + " recent " +
                               std::to_string(opt.recent_blocks) + " top " + std::to_string(opt.top_blocks);
      SparseScratch s1, s2;
      const auto span1 = sparse_select_blocks(f.layer, f.sums, args, opt, nullptr, s1);
      const std::vector<int32_t> sel(span1.begin(), span1.end());
      const auto span2 = sparse_select_blocks(f.layer, f.sums, args, opt, &pool, s2);
      ASSERT_EQ(sel, std::vector<int32_t>(span2.begin(), span2.end())) << what << ": the pool changed the selection";
      ASSERT_EQ(static_cast<int64_t>(sel.size()), std::min(n, opt.sink_blocks + opt.recent_blocks + opt.top_blocks))
          << what;
      ASSERT_TRUE(std::adjacent_find(sel.begin(), sel.end(), std::greater_equal<>()) == sel.end()) << what;
      for (int64_t b = 0; b < n; ++b) {
        if (b < opt.sink_blocks || b >= n - opt.recent_blocks) {
          ASSERT_TRUE(std::binary_search(sel.begin(), sel.end(), static_cast<int32_t>(b))) << what << " lacks " << b;
        }
      }
      ASSERT_EQ(sel, expected_selection(scores, opt)) << what;
    }
  }
}

// A key equal to a large multiple of the query direction in a middle block: that block scores
// highest, so top_blocks = 1 picks it.
TEST(SparseSelect, FindsTheBlockOfAPlantedNeedle) {
  for (const KvDtype dtype : kCacheDtypes) {
    const SparseShape c{16, 8, 2, 64, dtype};
    for (int64_t needle : {277, 16 * 20 + 15, 16 * 2}) {
      const int64_t len = 637;  // 40 blocks
      SparseCache f(c, len, 80);
      const auto d = gaussian(c.head_dim, 181);
      f.plant(needle, unit(d), 30.0f);
      f.write(0, len);
      const auto q = aligned_query(c, d, 182);
      const AttentionArgs args{q.data(), nullptr, 1, len - 1, c.n_heads, 0.125f, 0, f.table.data()};
      SparseScratch scratch;
      const auto sel = sparse_select_blocks(f.layer, f.sums, args, SparseSelectOptions{1, 2, 1}, nullptr, scratch);
      const std::vector<int32_t> want = {0, static_cast<int32_t>(needle / 16), 38, 39};
      EXPECT_EQ(std::vector<int32_t>(sel.begin(), sel.end()), want) << describe(c) << " needle at " << needle;
    }
  }
}

// Blocks with the same summaries tie: the lower logical blocks win, with and without a pool
// (scoring split over it).
TEST(SparseSelect, TiesGoToLowerBlocks) {
  ThreadPool pool(ThreadPoolOptions{.num_threads = 3});
  const SparseShape c{16, 8, 2, 64, KvDtype::kF32};
  const int64_t len = 16 * 150 + 7;  // 151 blocks
  SparseCache f(c, len, 95);
  for (int64_t p = 1; p < len; ++p)  // every block holds the keys of block 0
    std::copy_n(f.k_all.begin() + (p % 16) * f.row(), f.row(), f.k_all.begin() + p * f.row());
  f.write(0, len);
  const auto q = gaussian(c.n_heads * c.head_dim, 96, 2.0f);
  const AttentionArgs args{q.data(), nullptr, 1, len - 1, c.n_heads, 0.125f, 0, f.table.data()};
  for (ThreadPool* p : {static_cast<ThreadPool*>(nullptr), &pool}) {
    SparseScratch scratch;
    const auto sel = sparse_select_blocks(f.layer, f.sums, args, SparseSelectOptions{1, 2, 3}, p, scratch);
    const std::vector<int32_t> want = {0, 1, 2, 3, 149, 150};
    EXPECT_EQ(std::vector<int32_t>(sel.begin(), sel.end()), want) << (p != nullptr ? "pool" : "no pool");
  }
}

// With top_blocks covering every block (and with the defaults at exactly 1 + 2 + 16 blocks),
// sparse attention is dense attention, bit for bit, with and without a pool.
TEST(SparseDecode, EqualsDenseWhenEveryBlockIsSelected) {
  ThreadPool pool(ThreadPoolOptions{.num_threads = 3});
  for (const KvDtype dtype : kCacheDtypes) {
    const SparseShape c{16, 8, 2, 64, dtype};
    for (int64_t len : {1, 15, 16, 17, 300}) {
      SparseCache f(c, len, 20 + static_cast<uint32_t>(len));
      if (len > 1) f.write(0, len - 1);  // the prompt, then the decode token writes its own key
      f.write(len - 1, 1);
      const auto q = gaussian(c.n_heads * c.head_dim, 30 + static_cast<uint32_t>(len), 2.0f);
      std::vector<float> dense(q.size(), NAN);
      AttentionArgs args{q.data(), dense.data(), 1, len - 1, c.n_heads, 0.125f, 0, f.table.data()};
      paged_attention(f.layer, args, &pool);
      for (const SparseSelectOptions& opt : {SparseSelectOptions{1, 2, 1000}, SparseSelectOptions{}}) {
        for (ThreadPool* p : {static_cast<ThreadPool*>(nullptr), &pool}) {
          std::vector<float> sparse(q.size(), NAN);
          args.out = sparse.data();
          SparseScratch scratch;
          sparse_decode_attention(f.layer, f.sums, args, opt, p, scratch);
          ASSERT_EQ(static_cast<int64_t>(scratch.selected.size()), (len + 15) / 16) << describe(c) << " len " << len;
          ASSERT_TRUE(same_bits(sparse, dense)) << describe(c) << " len " << len << " top " << opt.top_blocks;
        }
      }
    }
  }
}

// With blocks left out, the output is attention over exactly the selected blocks' keys (the
// compacted table and the remapped position lose or add none; the current block may hold one key).
TEST(SparseDecode, MatchesReferenceOverTheSelectedKeys) {
  ThreadPool pool(ThreadPoolOptions{.num_threads = 3});
  for (const KvDtype dtype : kCacheDtypes) {
    const SparseShape c{16, 8, 2, 64, dtype};
    for (int64_t len : {97, 320, 321}) {
      SparseCache f(c, len, 40 + static_cast<uint32_t>(len));
      f.write(0, len);
      const auto q = gaussian(c.n_heads * c.head_dim, 50 + static_cast<uint32_t>(len), 2.0f);
      std::vector<float> out(q.size(), NAN);
      const AttentionArgs args{q.data(), out.data(), 1, len - 1, c.n_heads, 0.125f, 0, f.table.data()};
      SparseScratch scratch;
      sparse_decode_attention(f.layer, f.sums, args, SparseSelectOptions{1, 2, 3}, &pool, scratch);
      ASSERT_EQ(scratch.selected.size(), 6u) << describe(c) << " len " << len;
      const auto ref = reference_over_blocks(f, q, len - 1, scratch.selected, 0.125f);
      for (size_t i = 0; i < out.size(); ++i)
        ASSERT_NEAR(out[i], ref[i], 4e-6) << describe(c) << " len " << len << " i " << i;
    }
  }
}

// All attention mass on a planted needle: sparse attention with top_blocks = 1 gives the dense
// output, while a selection without the needle's block does not come close.
TEST(SparseDecode, NeedleOutputMatchesDenseOnlyWhenItsBlockIsSelected) {
  for (const KvDtype dtype : kCacheDtypes) {
    const SparseShape c{16, 8, 2, 64, dtype};
    const int64_t len = 637, needle = 277, pos = len - 1;
    SparseCache f(c, len, 90);
    const auto d = gaussian(c.head_dim, 191);
    f.plant(needle, unit(d), 30.0f);
    f.write(0, len);
    const auto q = aligned_query(c, d, 192);
    std::vector<float> dense(q.size(), NAN), sparse(q.size(), NAN), without(q.size(), NAN), needle_v(q.size());
    for (int64_t h = 0; h < c.n_heads; ++h)
      for (int64_t i = 0; i < c.head_dim; ++i)
        needle_v[static_cast<size_t>(h * c.head_dim + i)] = f.value(needle, h / (c.n_heads / c.n_kv_heads), i);
    AttentionArgs args{q.data(), dense.data(), 1, pos, c.n_heads, 0.125f, 0, f.table.data()};
    paged_attention(f.layer, args, nullptr);
    ASSERT_LT(max_abs_diff(dense, needle_v), 1e-4f) << describe(c) << ": the mass should be on the needle";
    args.out = sparse.data();
    SparseScratch scratch;
    sparse_decode_attention(f.layer, f.sums, args, SparseSelectOptions{1, 2, 1}, nullptr, scratch);
    EXPECT_LT(max_abs_diff(sparse, dense), 1e-5f) << describe(c);
    // The same number of blocks, block 5 instead of the needle's.
    const std::vector<int32_t> sel = {0, 5, 38, 39};
    std::vector<int32_t> table(sel.size());
    args.out = without.data();
    args.start_pos = sparse_compact_block_table(sel, f.table.data(), pos, c.block_size, table.data());
    ASSERT_EQ(args.start_pos, 3 * 16 + pos % 16);
    args.block_table = table.data();
    paged_attention(f.layer, args, nullptr);
    EXPECT_GT(max_abs_diff(without, dense), 0.5f) << describe(c);
  }
}

TEST(SparseDecodeDeathTest, RefusesSlidingWindowsPrefillAndNoRecentBlock) {
  const SparseShape c{16, 2, 1, 8, KvDtype::kF32};
  SparseCache f(c, 40, 3);
  f.write(0, 40);
  const auto q = gaussian(2 * c.n_heads * c.head_dim, 40);
  std::vector<float> out(q.size());
  AttentionArgs args{q.data(), out.data(), 1, 39, c.n_heads, 0.35f, 8, f.table.data()};
  SparseScratch scratch;
  EXPECT_DEATH(sparse_decode_attention(f.layer, f.sums, args, {}, nullptr, scratch), "sliding_window 8 refused");
  args.sliding_window = 0;
  args.n_tokens = 2;
  args.start_pos = 38;
  EXPECT_DEATH(sparse_decode_attention(f.layer, f.sums, args, {}, nullptr, scratch), "one decode token");
  args.n_tokens = 1;
  args.start_pos = 39;
  EXPECT_DEATH(sparse_decode_attention(f.layer, f.sums, args, SparseSelectOptions{1, 0, 4}, nullptr, scratch),
               "recent_blocks 0");
}

}  // namespace
}  // namespace tessera

namespace tessera {
namespace {

// measure_sparse_crossover: the contexts it measures and the rule that picks the threshold
// (the first context where sparse * min_speedup <= dense; 0 when none), not the timings.
TEST(SparseCrossover, MeasuresUpToTheFirstContextThatPaysAndStopsThere) {
  ThreadPool pool(ThreadPoolOptions{.num_threads = 2});
  for (const KvDtype dtype : kCacheDtypes) {
    const SparseCrossoverShape shape{4, 1, 64, 16, dtype};
    SparseSelectOptions opt;
    opt.top_blocks = 8;
    // Never pays at a million times: every context up to max_context, the last one max_context.
    SparseCrossover c = measure_sparse_crossover(shape, opt, 5000, 1e6, 1, &pool);
    ASSERT_EQ(c.points.size(), 4u);
    EXPECT_EQ(c.points[0].context, 1024);
    EXPECT_EQ(c.points[2].context, 4096);
    EXPECT_EQ(c.points[3].context, 5000);
    EXPECT_EQ(c.threshold_tokens, 0);
    for (const SparseCrossoverPoint& p : c.points) {
      EXPECT_GT(p.dense_us, 0.0);
      EXPECT_GT(p.sparse_us, 0.0);
    }
    EXPECT_NE(describe_sparse_crossover(c).find("never"), std::string::npos);
    // Always pays at a millionth: the first context.
    c = measure_sparse_crossover(shape, opt, 5000, 1e-6, 3, &pool);
    ASSERT_EQ(c.points.size(), 1u);
    EXPECT_EQ(c.threshold_tokens, 1024);
    EXPECT_NE(describe_sparse_crossover(c).find("from 1024 tokens"), std::string::npos);
    // The rule in between: the threshold is the first point that meets it.
    c = measure_sparse_crossover(shape, opt, 8192, 1.5, 3, &pool);
    for (size_t i = 0; i + 1 < c.points.size(); ++i)
      EXPECT_GT(c.points[i].sparse_us * 1.5, c.points[i].dense_us) << c.points[i].context;
    if (c.threshold_tokens > 0) {
      EXPECT_EQ(c.threshold_tokens, c.points.back().context);
      EXPECT_LE(c.points.back().sparse_us * 1.5, c.points.back().dense_us);
    } else {
      EXPECT_EQ(c.points.back().context, 8192);
    }
    // A context shorter than the first step: measured at itself.
    c = measure_sparse_crossover(shape, opt, 600, 1e6, 1, &pool);
    ASSERT_EQ(c.points.size(), 1u);
    EXPECT_EQ(c.points[0].context, 600);
  }
}

}  // namespace
}  // namespace tessera
