#include "shard/kv_cache.h"

#include <sys/mman.h>

#include <algorithm>
#include <utility>

#include "common/check.h"

namespace tessera {

size_t KvCache::bytes_per_block(const KvCacheShape& s) {
  return 2 * static_cast<size_t>(s.n_layers * s.block_size * s.n_kv_heads * s.head_dim) *
         static_cast<size_t>(kv_dtype_bytes(s.dtype));
}

Result<KvCache> KvCache::create(const KvCacheShape& shape) {
  if (shape.n_layers <= 0 || shape.n_kv_heads <= 0 || shape.head_dim <= 0 || shape.block_size <= 0 ||
      shape.num_blocks <= 0) {
    return Status::invalid_argument(fmt::format(
        "KV cache shape must be positive: layers {}, kv heads {}, head dim {}, block size {}, blocks {}",
        shape.n_layers, shape.n_kv_heads, shape.head_dim, shape.block_size, shape.num_blocks));
  }
  if (shape.dtype != KvDtype::kF32 && shape.dtype != KvDtype::kF16)
    return Status::unimplemented(
        fmt::format("--kv-dtype {}: the CPU KV cache stores fp32 or fp16", kv_dtype_name(shape.dtype)));
  KvCache cache;
  cache.shape_ = shape;
  cache.bytes_ = bytes_per_block(shape) * static_cast<size_t>(shape.num_blocks);
  void* p = ::mmap(nullptr, cache.bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) {
    return Status::resource_exhausted(fmt::format("KV cache of {} blocks ({} MiB) does not fit in memory",
                                                  shape.num_blocks, cache.bytes_ >> 20));
  }
  cache.storage_ = p;
  return cache;
}

KvCache::KvCache(KvCache&& o) noexcept
    : shape_(o.shape_), storage_(std::exchange(o.storage_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}

KvCache& KvCache::operator=(KvCache&& o) noexcept {
  if (this != &o) {
    if (storage_) ::munmap(storage_, bytes_);
    shape_ = o.shape_;
    storage_ = std::exchange(o.storage_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
  }
  return *this;
}

KvCache::~KvCache() {
  if (storage_) ::munmap(storage_, bytes_);
}

PagedKvLayer KvCache::layer(int64_t l) {
  TESSERA_CHECK(l >= 0 && l < shape_.n_layers, "layer {} of {}", l, shape_.n_layers);
  const size_t per_array = static_cast<size_t>(shape_.num_blocks * shape_.block_size *
                                               shape_.n_kv_heads * shape_.head_dim);
  PagedKvLayer kv;
  if (shape_.f16()) {
    kv.k16 = static_cast<uint16_t*>(storage_) + static_cast<size_t>(2 * l) * per_array;
    kv.v16 = kv.k16 + per_array;
  } else {
    kv.k = static_cast<float*>(storage_) + static_cast<size_t>(2 * l) * per_array;
    kv.v = kv.k + per_array;
  }
  kv.num_blocks = shape_.num_blocks;
  kv.block_size = shape_.block_size;
  kv.n_kv_heads = shape_.n_kv_heads;
  kv.head_dim = shape_.head_dim;
  return kv;
}

Status KvCache::copy_block(int32_t src, int32_t dst) {
  if (src < 0 || dst < 0 || src >= shape_.num_blocks || dst >= shape_.num_blocks)
    return Status::out_of_range(
        fmt::format("block copy {} -> {} outside the cache (0..{})", src, dst, shape_.num_blocks - 1));
  const size_t per_block = static_cast<size_t>(shape_.block_size * shape_.n_kv_heads * shape_.head_dim);
  const auto from = per_block * static_cast<size_t>(src), to = per_block * static_cast<size_t>(dst);
  for (int64_t l = 0; l < shape_.n_layers; ++l) {
    PagedKvLayer kv = layer(l);
    if (shape_.f16()) {
      std::copy_n(kv.k16 + from, per_block, kv.k16 + to);
      std::copy_n(kv.v16 + from, per_block, kv.v16 + to);
    } else {
      std::copy_n(kv.k + from, per_block, kv.k + to);
      std::copy_n(kv.v + from, per_block, kv.v + to);
    }
  }
  return Status::ok();
}

}  // namespace tessera
