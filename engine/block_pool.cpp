#include "engine/block_pool.h"

#include <fmt/format.h>

#include <algorithm>
#include <limits>

#include "common/check.h"

namespace tessera {
namespace {

uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

}  // namespace

Result<BlockPool> BlockPool::create(const BlockPoolOptions& o) {
  if (o.num_blocks < 1)
    return Status::invalid_argument(fmt::format("KV block pool: num_blocks is {}; it must be at least 1", o.num_blocks));
  // Nodes include two sentinels and ids are int32 on the wire.
  if (o.num_blocks > std::numeric_limits<int32_t>::max() - 2)
    return Status::invalid_argument(fmt::format("KV block pool: num_blocks {} is too large", o.num_blocks));
  if (!validate_block_size(o.block_size).is_ok())
    return Status::invalid_argument(fmt::format("KV block pool: block_size is {}; it must be in {}..{}", o.block_size,
                                                kMinBlockSize, kMaxBlockSize));
  BlockPool p;
  p.block_size_ = o.block_size;
  p.prefix_cache_ = o.enable_prefix_cache;
  const auto n = static_cast<size_t>(o.num_blocks);
  p.ref_.assign(n, 0);
  p.fill_.assign(n, 0);
  p.entry_.resize(n);
  p.prev_.resize(n + 2);
  p.next_.resize(n + 2);
  p.list_.assign(n + 2, List::kNone);
  p.uncached_head_ = static_cast<int32_t>(n);
  p.cached_head_ = static_cast<int32_t>(n + 1);
  for (int32_t s : {p.uncached_head_, p.cached_head_}) p.prev_[s] = p.next_[s] = s;
  // Ascending order, so a fresh pool hands out 0, 1, 2, ... (predictable in tests and logs).
  for (int32_t b = 0; b < static_cast<int32_t>(n); ++b) p.link_tail(b, List::kUncached);
  return p;
}

void BlockPool::check_id(int32_t block) const {
  TESSERA_CHECK(block >= 0 && block < num_blocks(), "block id {} outside 0..{}", block, num_blocks() - 1);
}

int32_t BlockPool::head(List list) const { return list == List::kUncached ? uncached_head_ : cached_head_; }

void BlockPool::link_tail(int32_t block, List list) {
  const int32_t s = head(list);
  const int32_t last = prev_[s];
  prev_[block] = last;
  next_[block] = s;
  next_[last] = block;
  prev_[s] = block;
  list_[block] = list;
  (list == List::kUncached ? num_uncached_free_ : num_cached_free_) += 1;
}

void BlockPool::unlink(int32_t block) {
  const List list = list_[block];
  TESSERA_CHECK(list != List::kNone, "block {} is not on a free list", block);
  next_[prev_[block]] = next_[block];
  prev_[next_[block]] = prev_[block];
  prev_[block] = next_[block] = block;
  list_[block] = List::kNone;
  (list == List::kUncached ? num_uncached_free_ : num_cached_free_) -= 1;
}

void BlockPool::drop_cache_entry(int32_t block) {
  Entry& e = entry_[block];
  if (e.tokens.empty()) return;
  by_hash_.erase(e.hash);
  e.tokens.clear();
  e.tokens.shrink_to_fit();
}

std::optional<int32_t> BlockPool::allocate() {
  int32_t b = -1;
  if (num_uncached_free_ > 0) {
    b = next_[uncached_head_];
  } else if (num_cached_free_ > 0) {
    b = next_[cached_head_];  // least recently released
    ++evictions_;
  } else {
    return std::nullopt;
  }
  unlink(b);
  drop_cache_entry(b);
  ref_[b] = 1;
  fill_[b] = 0;
  return b;
}

void BlockPool::retain(int32_t block) {
  check_id(block);
  if (ref_[block] == 0) {
    unlink(block);
    used_fill_slots_ += fill_[block];
  }
  ++ref_[block];
}

void BlockPool::release(int32_t block) {
  check_id(block);
  TESSERA_CHECK(ref_[block] > 0, "release of free block {}", block);
  if (--ref_[block] > 0) return;
  used_fill_slots_ -= fill_[block];
  link_tail(block, entry_[block].tokens.empty() ? List::kUncached : List::kCached);
}

int32_t BlockPool::ref_count(int32_t block) const {
  check_id(block);
  return ref_[block];
}

BlockHash BlockPool::hash_block(BlockHash parent, std::span<const int32_t> tokens) {
  uint64_t h = mix64(parent ^ 0x51ed27cb3a9f4c15ULL) + tokens.size();
  for (int32_t t : tokens) h = mix64(h ^ (static_cast<uint64_t>(static_cast<uint32_t>(t)) + 0x9e3779b97f4a7c15ULL));
  return h;
}

std::optional<int32_t> BlockPool::find_cached(BlockHash hash, BlockHash parent, std::span<const int32_t> tokens) const {
  if (!prefix_cache_) return std::nullopt;
  auto it = by_hash_.find(hash);
  if (it == by_hash_.end()) return std::nullopt;
  const Entry& e = entry_[it->second];
  if (e.parent != parent || !std::equal(e.tokens.begin(), e.tokens.end(), tokens.begin(), tokens.end()))
    return std::nullopt;
  return it->second;
}

bool BlockPool::register_full_block(int32_t block, BlockHash hash, BlockHash parent,
                                    std::span<const int32_t> tokens) {
  check_id(block);
  TESSERA_CHECK(ref_[block] > 0, "register of free block {}", block);
  TESSERA_CHECK(static_cast<int32_t>(tokens.size()) == block_size_, "block {}: {} tokens, block size {}", block,
                tokens.size(), block_size_);
  if (!prefix_cache_ || !entry_[block].tokens.empty()) return false;
  if (!by_hash_.emplace(hash, block).second) return false;
  Entry& e = entry_[block];
  e.hash = hash;
  e.parent = parent;
  e.tokens.assign(tokens.begin(), tokens.end());
  return true;
}

bool BlockPool::is_cached(int32_t block) const {
  check_id(block);
  return !entry_[block].tokens.empty();
}

void BlockPool::clear_free_cache() {
  while (num_cached_free_ > 0) {
    const int32_t b = next_[cached_head_];
    unlink(b);
    drop_cache_entry(b);
    link_tail(b, List::kUncached);
  }
}

void BlockPool::set_fill(int32_t block, int32_t slots) {
  check_id(block);
  TESSERA_CHECK(slots >= 0 && slots <= block_size_, "block {}: fill {} outside 0..{}", block, slots, block_size_);
  if (ref_[block] > 0) used_fill_slots_ += slots - fill_[block];
  fill_[block] = slots;
}

int32_t BlockPool::fill(int32_t block) const {
  check_id(block);
  return fill_[block];
}

void BlockPool::record_prefix_query(int64_t queried, int64_t hit) {
  TESSERA_CHECK(queried >= 0 && hit >= 0 && hit <= queried, "prefix query {} hit {}", queried, hit);
  queried_tokens_ += queried;
  hit_tokens_ += hit;
}

BlockPoolStats BlockPool::stats() const {
  BlockPoolStats s;
  s.num_blocks = num_blocks();
  s.block_size = block_size_;
  s.used_blocks = num_used();
  s.free_blocks = num_free();
  s.cached_blocks = num_cached();
  s.cached_free_blocks = num_cached_free_;
  s.evictions = evictions_;
  s.prefix_queried_tokens = queried_tokens_;
  s.prefix_hit_tokens = hit_tokens_;
  s.prefix_hit_rate = queried_tokens_ > 0 ? static_cast<double>(hit_tokens_) / static_cast<double>(queried_tokens_) : 0.0;
  const int64_t slots = s.used_blocks * block_size_;
  s.fragmentation = slots > 0 ? static_cast<double>(slots - used_fill_slots_) / static_cast<double>(slots) : 0.0;
  s.usage = static_cast<double>(s.used_blocks) / static_cast<double>(s.num_blocks);
  return s;
}

Status BlockPool::check_invariants() const {
  const int32_t n = static_cast<int32_t>(num_blocks());
  int64_t counted[3] = {0, 0, 0};
  for (List list : {List::kUncached, List::kCached}) {
    const int32_t s = head(list);
    int64_t guard = 0;
    for (int32_t b = next_[s]; b != s; b = next_[b]) {
      if (b < 0 || b >= n) return Status::internal(fmt::format("free list holds node {}", b));
      if (list_[b] != list) return Status::internal(fmt::format("block {} on the wrong list", b));
      if (ref_[b] != 0) return Status::internal(fmt::format("free block {} has ref {}", b, ref_[b]));
      if ((list == List::kCached) == entry_[b].tokens.empty())
        return Status::internal(fmt::format("block {}: cached list membership disagrees with its entry", b));
      if (next_[prev_[b]] != b) return Status::internal(fmt::format("block {}: broken links", b));
      ++counted[static_cast<int>(list)];
      if (++guard > n) return Status::internal("free list loops");
    }
  }
  if (counted[1] != num_uncached_free_ || counted[2] != num_cached_free_)
    return Status::internal(fmt::format("free counts {}/{} but lists hold {}/{}", num_uncached_free_, num_cached_free_,
                                        counted[1], counted[2]));
  int64_t fill_sum = 0, registered = 0;
  for (int32_t b = 0; b < n; ++b) {
    if (ref_[b] < 0) return Status::internal(fmt::format("block {} has ref {}", b, ref_[b]));
    if ((ref_[b] == 0) == (list_[b] == List::kNone))
      return Status::internal(fmt::format("block {}: ref {} but list membership {}", b, ref_[b], int(list_[b])));
    if (ref_[b] > 0) fill_sum += fill_[b];
    if (!entry_[b].tokens.empty()) {
      ++registered;
      auto it = by_hash_.find(entry_[b].hash);
      if (it == by_hash_.end() || it->second != b)
        return Status::internal(fmt::format("block {}: its hash is not mapped to it", b));
    }
  }
  if (registered != static_cast<int64_t>(by_hash_.size()))
    return Status::internal(fmt::format("{} registered blocks, {} hashes", registered, by_hash_.size()));
  if (fill_sum != used_fill_slots_)
    return Status::internal(fmt::format("fill of used blocks is {}, counter says {}", fill_sum, used_fill_slots_));
  return Status::ok();
}

}  // namespace tessera
