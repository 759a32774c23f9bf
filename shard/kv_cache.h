// A shard's KV storage: for every layer, K and V arrays of
// [num_blocks][block_size][n_kv_heads][head_dim] fp32 (DESIGN §3), or fp16 (half the memory;
// KvCacheShape::dtype, `--kv-dtype fp16`). Block ids are assigned by the
// coordinator's BlockPool; this class
// only owns the memory, allocated once at start-up.
#pragma once

#include <cstdint>
#include <vector>

#include "common/kv_config.h"
#include "common/status.h"
#include "kernels/paged_attention.h"

namespace tessera {

struct KvCacheShape {
  int64_t n_layers = 0;
  int64_t n_kv_heads = 0;   // heads stored on this shard
  int64_t head_dim = 0;
  int64_t block_size = 16;  // tokens per block
  int64_t num_blocks = 0;
  KvDtype dtype = KvDtype::kF32;  // fp32 or fp16 elements (create() refuses the others)
  bool f16() const { return dtype == KvDtype::kF16; }
};

class KvCache {
 public:
  // Allocates 2 * n_layers * num_blocks * block_size * n_kv_heads * head_dim elements.
  // The memory is mapped anonymously: pages are zero and cost nothing until first written.
  static Result<KvCache> create(const KvCacheShape& shape);
  KvCache() = default;
  KvCache(KvCache&& other) noexcept;
  KvCache& operator=(KvCache&& other) noexcept;
  ~KvCache();
  static size_t bytes_per_block(const KvCacheShape& shape);

  const KvCacheShape& shape() const { return shape_; }
  PagedKvLayer layer(int64_t l);
  // Copy-on-write of a shared block: every layer's K and V of block src into block dst.
  // OutOfRange for ids outside the cache.
  Status copy_block(int32_t src, int32_t dst);

 private:
  KvCacheShape shape_;
  void* storage_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace tessera
