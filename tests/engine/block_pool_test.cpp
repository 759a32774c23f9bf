// BlockPool: allocation, reference counts, the O(1) free lists, prefix-cache entries and their
// LRU eviction, metrics. Copy-on-write emission is the scheduler's and is tested there.
#include "engine/block_pool.h"

#include <gtest/gtest.h>

#include <numeric>

namespace tessera {
namespace {

BlockPool make_pool(int64_t n, int32_t bs = 16, bool cache = true) {
  auto p = BlockPool::create({n, bs, cache});
  EXPECT_TRUE(p.is_ok()) << p.status().to_string();
  return std::move(p).value();
}

std::vector<int32_t> block_tokens(int32_t first, int32_t bs = 16) {
  std::vector<int32_t> t(static_cast<size_t>(bs));
  std::iota(t.begin(), t.end(), first);
  return t;
}

TEST(BlockPoolTest, ValidatesOptions) {
  struct Case {
    int64_t blocks;
    int32_t bs;
    bool ok;
    const char* needle;
  };
  const Case cases[] = {
      {0, 16, false, "num_blocks"}, {-3, 16, false, "num_blocks"}, {10, 8, false, "block_size is 8"},
      {10, 1025, false, "16..1024"}, {10, 16, true, ""},           {10, 1024, true, ""},
      {1, 100, true, ""},
  };
  for (const Case& c : cases) {
    auto p = BlockPool::create({c.blocks, c.bs, true});
    EXPECT_EQ(p.is_ok(), c.ok) << c.blocks << " " << c.bs;
    if (!c.ok) {
      EXPECT_NE(p.status().message().find(c.needle), std::string::npos) << p.status().to_string();
    }
  }
}

TEST(BlockPoolTest, AllocateReleaseAndRefCounts) {
  BlockPool p = make_pool(4);
  EXPECT_EQ(p.num_free(), 4);
  std::vector<int32_t> got;
  for (int i = 0; i < 4; ++i) got.push_back(*p.allocate());
  EXPECT_EQ(got, (std::vector<int32_t>{0, 1, 2, 3}));
  EXPECT_FALSE(p.allocate().has_value());
  EXPECT_EQ(p.num_used(), 4);
  p.retain(2);
  EXPECT_EQ(p.ref_count(2), 2);
  p.release(2);
  EXPECT_EQ(p.ref_count(2), 1);
  EXPECT_EQ(p.num_free(), 0);
  p.release(2);
  EXPECT_EQ(p.ref_count(2), 0);
  EXPECT_EQ(p.num_free(), 1);
  EXPECT_EQ(*p.allocate(), 2);
  for (int32_t b : got) p.release(b);
  EXPECT_EQ(p.num_used(), 0);
  EXPECT_TRUE(p.check_invariants().is_ok()) << p.check_invariants().to_string();
}

TEST(BlockPoolTest, FreeListTakesBlocksFromTheMiddle) {
  // Cached free blocks sit on an LRU list; a prefix hit takes one out from the middle and the
  // list stays consistent (constant time: unlink of a doubly linked node).
  BlockPool p = make_pool(6);
  std::vector<int32_t> b;
  for (int i = 0; i < 6; ++i) b.push_back(*p.allocate());
  for (int i = 0; i < 6; ++i)
    ASSERT_TRUE(p.register_full_block(b[i], 100 + i, kRootBlockHash, block_tokens(i * 16)));
  for (int i = 0; i < 6; ++i) p.release(b[i]);  // LRU order 0,1,2,3,4,5
  EXPECT_EQ(p.num_cached_free(), 6);
  p.retain(3);  // a hit in the middle
  p.retain(0);  // and at the head
  p.retain(5);  // and at the tail
  EXPECT_TRUE(p.check_invariants().is_ok()) << p.check_invariants().to_string();
  EXPECT_EQ(p.num_cached_free(), 3);
  // Evictions take the least recently released among what is left: 1, 2, 4.
  EXPECT_EQ(*p.allocate(), 1);
  EXPECT_EQ(*p.allocate(), 2);
  EXPECT_EQ(*p.allocate(), 4);
  EXPECT_FALSE(p.allocate().has_value());
  EXPECT_EQ(p.stats().evictions, 3);
  EXPECT_TRUE(p.check_invariants().is_ok()) << p.check_invariants().to_string();
}

TEST(BlockPoolTest, LargePoolChurnStaysConsistent) {
  BlockPool p = make_pool(5000);
  std::vector<int32_t> held;
  for (int round = 0; round < 20; ++round) {
    while (auto b = p.allocate()) held.push_back(*b);
    // Release every other block, register some, then take some back by retain.
    std::vector<int32_t> keep;
    for (size_t i = 0; i < held.size(); ++i) {
      if (i % 2 == 0) {
        if (i % 4 == 0)
          p.register_full_block(held[i], 1000000ull * static_cast<uint64_t>(round) + i, kRootBlockHash,
                                block_tokens(static_cast<int32_t>(i)));
        p.release(held[i]);
      } else {
        keep.push_back(held[i]);
      }
    }
    held = keep;
  }
  EXPECT_TRUE(p.check_invariants().is_ok()) << p.check_invariants().to_string();
  for (int32_t b : held) p.release(b);
  EXPECT_EQ(p.num_used(), 0);
  EXPECT_TRUE(p.check_invariants().is_ok());
}

TEST(BlockPoolTest, UncachedBlocksAreAllocatedBeforeCachedOnes) {
  BlockPool p = make_pool(3);
  const int32_t a = *p.allocate(), b = *p.allocate(), c = *p.allocate();
  ASSERT_TRUE(p.register_full_block(a, 7, kRootBlockHash, block_tokens(0)));
  p.release(a);  // cached
  p.release(b);  // plain
  p.release(c);  // plain
  EXPECT_EQ(*p.allocate(), b);
  EXPECT_EQ(*p.allocate(), c);
  EXPECT_TRUE(p.is_cached(a));
  EXPECT_EQ(p.stats().evictions, 0);
  EXPECT_EQ(*p.allocate(), a);  // only now evicted
  EXPECT_FALSE(p.is_cached(a));
  EXPECT_EQ(p.stats().evictions, 1);
  EXPECT_FALSE(p.find_cached(7, kRootBlockHash, block_tokens(0)).has_value());
}

TEST(BlockPoolTest, HashChainLookupVerifiesContent) {
  BlockPool p = make_pool(8);
  const auto t0 = block_tokens(0), t1 = block_tokens(16);
  const BlockHash h0 = BlockPool::hash_block(kRootBlockHash, t0);
  const BlockHash h1 = BlockPool::hash_block(h0, t1);
  EXPECT_NE(h0, h1);
  EXPECT_NE(h1, BlockPool::hash_block(kRootBlockHash, t1)) << "the parent must be part of the name";
  const int32_t b0 = *p.allocate(), b1 = *p.allocate();
  EXPECT_TRUE(p.register_full_block(b0, h0, kRootBlockHash, t0));
  EXPECT_TRUE(p.register_full_block(b1, h1, h0, t1));
  EXPECT_FALSE(p.register_full_block(b1, h1, h0, t1)) << "registered twice";
  const int32_t dup = *p.allocate();
  EXPECT_FALSE(p.register_full_block(dup, h0, kRootBlockHash, t0)) << "content is cached once";
  EXPECT_FALSE(p.is_cached(dup));
  EXPECT_EQ(p.find_cached(h0, kRootBlockHash, t0), b0);
  EXPECT_EQ(p.find_cached(h1, h0, t1), b1);
  // Same hash, other tokens or parent (a forged collision): a miss, never a wrong block.
  EXPECT_FALSE(p.find_cached(h1, h0, t0).has_value());
  EXPECT_FALSE(p.find_cached(h1, kRootBlockHash, t1).has_value());
  EXPECT_EQ(p.num_cached(), 2);
}

TEST(BlockPoolTest, LruEvictionOrderFollowsReleaseOrder) {
  struct Case {
    std::vector<int> release_order;  // of blocks 0..3, all cached
    std::vector<int> retain;         // hits taken back before allocating
    std::vector<int> expected_evictions;
  };
  const Case cases[] = {
      {{0, 1, 2, 3}, {}, {0, 1, 2, 3}},
      {{3, 2, 1, 0}, {}, {3, 2, 1, 0}},
      {{0, 1, 2, 3}, {1}, {0, 2, 3}},
      {{2, 0, 3, 1}, {2, 1}, {0, 3}},
  };
  for (const Case& c : cases) {
    BlockPool p = make_pool(4);
    for (int i = 0; i < 4; ++i) {
      ASSERT_EQ(*p.allocate(), i);
      ASSERT_TRUE(p.register_full_block(i, 50 + i, kRootBlockHash, block_tokens(i * 16)));
    }
    for (int b : c.release_order) p.release(b);
    for (int b : c.retain) p.retain(b);
    std::vector<int> evicted;
    while (auto b = p.allocate()) evicted.push_back(*b);
    EXPECT_EQ(evicted, c.expected_evictions);
    EXPECT_TRUE(p.check_invariants().is_ok());
  }
}

TEST(BlockPoolTest, DisabledCacheNeverHits) {
  BlockPool p = make_pool(2, 16, /*cache=*/false);
  const int32_t b = *p.allocate();
  EXPECT_FALSE(p.register_full_block(b, 1, kRootBlockHash, block_tokens(0)));
  EXPECT_FALSE(p.find_cached(1, kRootBlockHash, block_tokens(0)).has_value());
  p.release(b);
  EXPECT_EQ(p.num_cached_free(), 0);
}

TEST(BlockPoolTest, ClearFreeCacheKeepsUsedEntries) {
  BlockPool p = make_pool(3);
  const int32_t a = *p.allocate(), b = *p.allocate();
  ASSERT_TRUE(p.register_full_block(a, 1, kRootBlockHash, block_tokens(0)));
  ASSERT_TRUE(p.register_full_block(b, 2, kRootBlockHash, block_tokens(16)));
  p.release(a);
  p.clear_free_cache();
  EXPECT_FALSE(p.is_cached(a));
  EXPECT_TRUE(p.is_cached(b));
  EXPECT_EQ(p.num_cached(), 1);
  EXPECT_TRUE(p.check_invariants().is_ok());
}

TEST(BlockPoolTest, MetricsFragmentationHitRateUsage) {
  BlockPool p = make_pool(10, 16);
  EXPECT_EQ(p.stats().fragmentation, 0.0);
  EXPECT_EQ(p.stats().prefix_hit_rate, 0.0);
  // Two sequences: 20 tokens (blocks 16 + 4) and 5 tokens (one block of 5).
  const int32_t a0 = *p.allocate(), a1 = *p.allocate(), b0 = *p.allocate();
  p.set_fill(a0, 16);
  p.set_fill(a1, 4);
  p.set_fill(b0, 5);
  BlockPoolStats s = p.stats();
  EXPECT_EQ(s.used_blocks, 3);
  EXPECT_EQ(s.free_blocks, 7);
  EXPECT_DOUBLE_EQ(s.usage, 0.3);
  EXPECT_DOUBLE_EQ(s.fragmentation, (48.0 - 25.0) / 48.0);
  // A shared block counts once.
  p.retain(a0);
  EXPECT_DOUBLE_EQ(p.stats().fragmentation, (48.0 - 25.0) / 48.0);
  p.release(a0);
  p.release(b0);
  EXPECT_DOUBLE_EQ(p.stats().fragmentation, (32.0 - 20.0) / 32.0);
  p.set_fill(a1, 16);
  EXPECT_DOUBLE_EQ(p.stats().fragmentation, 0.0);
  // Hit rate is hit tokens over queried tokens, over all queries.
  p.record_prefix_query(100, 0);
  p.record_prefix_query(100, 64);
  s = p.stats();
  EXPECT_EQ(s.prefix_queried_tokens, 200);
  EXPECT_EQ(s.prefix_hit_tokens, 64);
  EXPECT_DOUBLE_EQ(s.prefix_hit_rate, 0.32);
  // A cached block taken back from the free list brings its fill with it.
  ASSERT_TRUE(p.register_full_block(a0, 9, kRootBlockHash, block_tokens(0)));
  p.release(a0);
  p.retain(a0);
  EXPECT_EQ(p.fill(a0), 16);
  EXPECT_TRUE(p.check_invariants().is_ok()) << p.check_invariants().to_string();
}

}  // namespace
}  // namespace tessera
