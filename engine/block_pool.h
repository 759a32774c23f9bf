// The coordinator's KV block pool (ARCHITECTURE.md "KV accounting"): the accounting of the paged KV cache that every
// shard stores. Only ids and counts live here; the KV bytes live on the shards.
//
// * Blocks are integer ids in [0, num_blocks), each holding `block_size` token slots.
// * Each block has a reference count: the number of sequences whose block table holds it (plus
//   short holds by the scheduler while it builds a step). ref 0 = free.
// * Free blocks sit on two intrusive doubly linked lists, so every operation is O(1):
//     - uncached: free blocks with no content worth keeping; allocation takes these first;
//     - cached:   free blocks that still hold a FULL block of a known token sequence (a prefix
//                 cache entry), in LRU order (head = least recently released). They are
//                 evicted (their hash dropped) only when allocation finds no uncached block,
//                 and can be taken back out of the middle of the list when a prefix hits them.
// * Prefix caching: a full block is named by a hash chain, hash(parent hash, the block's token
//   ids), starting from kRootBlockHash. register_full_block() makes a block content-addressed;
//   find_cached() looks a hash up and verifies the parent hash and the token ids, so a 64-bit
//   hash collision is a miss, never wrong KV.
// * Copy-on-write is the caller's policy (the scheduler): a block with ref > 1, or one that
//   is registered in the cache, must not be written; the writer allocates a new block and has
//   the shards copy the old one (StepPlan::block_copies).
// * Fragmentation: each used block carries a fill (how many of its slots hold reserved token
//   positions, set by the owner with set_fill); stats() reports the unused fraction of the
//   slots of used blocks.
//
// Ownership / thread-safety: plain value type, owned and used by the engine thread only.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/kv_config.h"
#include "common/status.h"

namespace tessera {

using BlockHash = uint64_t;
inline constexpr BlockHash kRootBlockHash = 0x7e55e7a0b10c0001ULL;

struct BlockPoolOptions {
  int64_t num_blocks = 0;           // > 0
  int32_t block_size = 16;          // tokens per block, kMinBlockSize..kMaxBlockSize
  bool enable_prefix_cache = true;  // false: find_cached() always misses, nothing is registered
};

struct BlockPoolStats {
  int64_t num_blocks = 0;
  int32_t block_size = 0;
  int64_t used_blocks = 0;         // ref > 0
  int64_t free_blocks = 0;         // ref == 0 (uncached + cached_free): what allocation can take
  int64_t cached_blocks = 0;       // registered in the prefix cache (used or free)
  int64_t cached_free_blocks = 0;  // free but holding a cache entry (evictable)
  int64_t evictions = 0;           // cache entries dropped to satisfy allocations (total)
  int64_t prefix_queried_tokens = 0;  // prompt tokens looked up at admission (total)
  int64_t prefix_hit_tokens = 0;      // of those, tokens whose KV came from the cache
  double prefix_hit_rate = 0.0;       // hit / queried; 0 before any query
  double fragmentation = 0.0;  // unused slots of used blocks / (used_blocks * block_size); 0 if none
  double usage = 0.0;          // used_blocks / num_blocks
};

class BlockPool {
 public:
  // InvalidArgument naming the field for num_blocks < 1, num_blocks > 2^31-1 or a block size
  // outside 16..1024.
  static Result<BlockPool> create(const BlockPoolOptions& options);

  int64_t num_blocks() const { return static_cast<int64_t>(ref_.size()); }
  int32_t block_size() const { return block_size_; }
  bool prefix_cache_enabled() const { return prefix_cache_; }

  int64_t num_free() const { return num_uncached_free_ + num_cached_free_; }
  int64_t num_used() const { return num_blocks() - num_free(); }
  int64_t num_cached() const { return static_cast<int64_t>(by_hash_.size()); }
  int64_t num_cached_free() const { return num_cached_free_; }

  // Takes a free block (an uncached one first, else the least recently released cached one,
  // whose cache entry is dropped) and returns it with ref 1 and fill 0; nullopt when no block
  // is free. O(1).
  std::optional<int32_t> allocate();
  // ref += 1. A free block (ref 0) is taken off its free list (O(1), from anywhere in it);
  // used to take a prefix-cache hit, or to hold a block for the length of a step.
  void retain(int32_t block);
  // ref -= 1 (precondition: ref > 0). At 0 a registered block goes to the MRU end of the cached
  // list (it stays in the cache); an unregistered one to the uncached list. Release a
  // sequence's blocks last-to-first, so that a prefix's first blocks are evicted last.
  void release(int32_t block);
  int32_t ref_count(int32_t block) const;

  // Hash of a full block whose predecessor's hash is `parent` (kRootBlockHash for block 0).
  static BlockHash hash_block(BlockHash parent, std::span<const int32_t> tokens);

  // The block holding exactly these tokens after `parent`, if cached (used or free). Does not
  // retain it. Always nullopt when the prefix cache is disabled.
  std::optional<int32_t> find_cached(BlockHash hash, BlockHash parent, std::span<const int32_t> tokens) const;
  // Makes a used, full block content-addressed by `hash`. Returns false (and changes nothing)
  // when the cache is disabled, the block is already registered, or another block already
  // holds this hash (the content is cached once; this block stays private).
  // Precondition: ref > 0, tokens.size() == block_size.
  bool register_full_block(int32_t block, BlockHash hash, BlockHash parent, std::span<const int32_t> tokens);
  bool is_cached(int32_t block) const;
  // Drops every free block's cache entry (e.g. after a weights reload). Used blocks keep theirs.
  void clear_free_cache();

  // Slots of `block` that hold reserved token positions (0..block_size); for fragmentation.
  void set_fill(int32_t block, int32_t slots);
  int32_t fill(int32_t block) const;

  // Counts one admission's prefix lookup: `queried` prompt tokens, `hit` of them from the cache.
  void record_prefix_query(int64_t queried, int64_t hit);

  BlockPoolStats stats() const;
  // Internal consistency (list lengths and membership, counters, hash map): for tests.
  Status check_invariants() const;

 private:
  enum class List : uint8_t { kNone, kUncached, kCached };
  BlockPool() = default;
  void check_id(int32_t block) const;
  void link_tail(int32_t block, List list);
  void unlink(int32_t block);
  int32_t head(List list) const;
  void drop_cache_entry(int32_t block);

  int32_t block_size_ = 16;
  bool prefix_cache_ = true;
  std::vector<int32_t> ref_;
  std::vector<int32_t> fill_;
  // Intrusive lists: node i < num_blocks is block i; the last two nodes are the sentinels.
  std::vector<int32_t> prev_, next_;
  std::vector<List> list_;
  int32_t uncached_head_ = 0, cached_head_ = 0;  // sentinel node ids
  int64_t num_uncached_free_ = 0, num_cached_free_ = 0;
  // Prefix cache.
  struct Entry {
    BlockHash hash = 0;
    BlockHash parent = 0;
    std::vector<int32_t> tokens;  // empty: not registered
  };
  std::vector<Entry> entry_;
  std::unordered_map<BlockHash, int32_t> by_hash_;
  // Metrics.
  int64_t used_fill_slots_ = 0;  // sum of fill over used blocks
  int64_t evictions_ = 0;
  int64_t queried_tokens_ = 0, hit_tokens_ = 0;
};

}  // namespace tessera
