#include "shard/kv_cache.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstring>
#include <new>
#include <utility>

#include "common/check.h"

namespace tessera {

namespace {

// The K (values = false) or V array of a layer, whatever its element type.
char* array_bytes(const PagedKvLayer& kv, bool values) {
  if (kv.k16 != nullptr) return reinterpret_cast<char*>(values ? kv.v16 : kv.k16);
  if (kv.k8 != nullptr) return reinterpret_cast<char*>(values ? kv.v8 : kv.k8);
  return reinterpret_cast<char*>(values ? kv.v : kv.k);
}

}  // namespace

const char* kv_pool_name(KvPool pool) { return pool == KvPool::kWindow ? "window pool" : "KV cache"; }

int64_t KvCacheShape::pool_layers(KvPool pool) const {
  if (!has_window_pool()) return pool == KvPool::kMain ? n_layers : 0;
  const auto windowed = static_cast<int64_t>(std::count(window_layers.begin(), window_layers.end(), true));
  return pool == KvPool::kWindow ? windowed : n_layers - windowed;
}

uint64_t key_summary_bytes_per_block(int64_t n_global_layers, int64_t n_kv_heads, int64_t head_dim) {
  return 2ull * sizeof(float) * static_cast<uint64_t>(n_global_layers * n_kv_heads * head_dim);
}

uint64_t kv_bytes_per_token(int64_t n_layers, int64_t n_kv_heads, int64_t head_dim, KvDtype dtype) {
  return 2ull * static_cast<uint64_t>(n_layers * n_kv_heads) * kv_row_bytes(dtype, head_dim);
}

int64_t KvWindowLayers::count() const { return static_cast<int64_t>(std::count(layers.begin(), layers.end(), true)); }

KvWindowLayers kv_window_layers(const ModelConfig& config, const ArchSpec& arch) {
  KvWindowLayers w;
  w.layers = windowed_kv_layers(config);
  if (w.layers.size() != arch.layers.size()) return {};
  for (size_t l = 0; l < w.layers.size(); ++l) {
    if (!w.layers[l]) continue;
    // A layer the description lets see every key cannot lose its old blocks.
    if (arch.layers[l].sliding_window <= 0) return {};
    w.window = std::max(w.window, arch.layers[l].sliding_window);
  }
  if (w.window == 0) return {};
  return w;
}

Status validate_window_table(std::span<const int32_t> table, size_t seq, int64_t start_pos, int64_t n_tokens,
                             int64_t window, int64_t block_size, int64_t num_blocks) {
  const int64_t end = start_pos + n_tokens;
  if (static_cast<int64_t>(table.size()) * block_size < end)
    return Status::invalid_argument(fmt::format("sequence {}: window table of {} blocks cannot hold {} tokens", seq,
                                                table.size(), end));
  for (int32_t b : table)
    if (b < -1 || b >= num_blocks)
      return Status::out_of_range(fmt::format("window block id {} outside the window pool (0..{}, or -1: released)",
                                              b, num_blocks - 1));
  const int64_t first = first_read_slot(start_pos, window, block_size), last = (end - 1) / block_size;
  for (int64_t slot = first; slot <= last; ++slot)
    if (table[static_cast<size_t>(slot)] < 0)
      return Status::invalid_argument(fmt::format(
          "sequence {}: window table slot {} is released (-1) but positions [{}, {}) read it (window {})", seq, slot,
          start_pos, end, window));
  return Status::ok();
}

size_t KvCache::bytes_per_block(const KvCacheShape& s, KvPool pool) {
  return static_cast<size_t>(kv_bytes_per_token(s.pool_layers(pool), s.n_kv_heads, s.head_dim, s.dtype)) *
         static_cast<size_t>(s.block_size);
}

Result<KvCache> KvCache::create(const KvCacheShape& shape) {
  if (shape.n_layers <= 0 || shape.n_kv_heads <= 0 || shape.head_dim <= 0 || shape.block_size <= 0 ||
      shape.num_blocks <= 0 || shape.num_window_blocks < 0) {
    return Status::invalid_argument(fmt::format(
        "KV cache shape must be positive: layers {}, kv heads {}, head dim {}, block size {}, blocks {}, window "
        "blocks {}",
        shape.n_layers, shape.n_kv_heads, shape.head_dim, shape.block_size, shape.num_blocks,
        shape.num_window_blocks));
  }
  if (!kv_dtype_stored(shape.dtype, KvBackend::kCpu))
    return Status::unimplemented(fmt::format("--kv-dtype {}: the CPU KV cache stores {}", kv_dtype_name(shape.dtype),
                                                kv_dtypes_stored_text(KvBackend::kCpu)));
  if ((shape.has_window_pool() || !shape.window_layers.empty()) &&
      static_cast<int64_t>(shape.window_layers.size()) != shape.n_layers)
    return Status::invalid_argument(fmt::format("window pool: window_layers has {} entries for {} layers",
                                                shape.window_layers.size(), shape.n_layers));
  if (shape.has_window_pool() && shape.pool_layers(KvPool::kWindow) == 0)
    return Status::invalid_argument(
        fmt::format("a window pool of {} blocks, but no layer is marked windowed", shape.num_window_blocks));
  KvCache cache;
  cache.shape_ = shape;
  cache.bytes_ = bytes_per_block(shape, KvPool::kMain) * static_cast<size_t>(shape.num_blocks) +
                 bytes_per_block(shape, KvPool::kWindow) * static_cast<size_t>(shape.num_window_blocks);
  int64_t next[2] = {0, 0};
  for (int64_t l = 0; l < shape.n_layers; ++l) cache.pool_index_.push_back(next[static_cast<int>(shape.pool_of(l))]++);
  void* p = ::mmap(nullptr, cache.bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) {
    return Status::resource_exhausted(fmt::format("KV cache of {} blocks and {} window blocks ({} MiB) does not fit "
                                                  "in memory",
                                                  shape.num_blocks, shape.num_window_blocks, cache.bytes_ >> 20));
  }
  cache.storage_ = p;
  if (shape.key_summaries) {
    // The global layers only: a windowed layer never selects (also without a window pool).
    int64_t n_sum = 0;
    for (int64_t l = 0; l < shape.n_layers; ++l) {
      const bool windowed = !shape.window_layers.empty() && shape.window_layers[static_cast<size_t>(l)];
      cache.summary_index_.push_back(windowed ? -1 : n_sum++);
    }
    // Large: malloc maps it, and its pages cost nothing until a block's summary is written.
    const size_t n = static_cast<size_t>(2 * n_sum * shape.num_blocks * shape.n_kv_heads * shape.head_dim);
    cache.summaries_.reset(new (std::nothrow) float[n]);
    if (!cache.summaries_)
      return Status::resource_exhausted(fmt::format("KV key summaries ({} MiB) do not fit in memory", (n * 4) >> 20));
  }
  return cache;
}

KvBlockSummaries KvCache::summaries(int64_t l) {
  KvBlockSummaries s;
  if (!summaries_ || summary_index_[static_cast<size_t>(l)] < 0) return s;
  const size_t per_array = static_cast<size_t>(shape_.num_blocks * shape_.n_kv_heads * shape_.head_dim);
  s.kmin = summaries_.get() + static_cast<size_t>(2 * summary_index_[static_cast<size_t>(l)]) * per_array;
  s.kmax = s.kmin + per_array;
  s.num_blocks = shape_.num_blocks;
  s.n_kv_heads = shape_.n_kv_heads;
  s.head_dim = shape_.head_dim;
  return s;
}

KvCache::KvCache(KvCache&& o) noexcept
    : shape_(std::move(o.shape_)), storage_(std::exchange(o.storage_, nullptr)), bytes_(std::exchange(o.bytes_, 0)),
      pool_index_(std::move(o.pool_index_)), summary_index_(std::move(o.summary_index_)),
      summaries_(std::move(o.summaries_)) {}

KvCache& KvCache::operator=(KvCache&& o) noexcept {
  if (this != &o) {
    if (storage_) ::munmap(storage_, bytes_);
    shape_ = std::move(o.shape_);
    storage_ = std::exchange(o.storage_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
    pool_index_ = std::move(o.pool_index_);
    summary_index_ = std::move(o.summary_index_);
    summaries_ = std::move(o.summaries_);
  }
  return *this;
}

KvCache::~KvCache() {
  if (storage_) ::munmap(storage_, bytes_);
}

PagedKvLayer KvCache::layer(int64_t l) {
  TESSERA_CHECK(l >= 0 && l < shape_.n_layers, "layer {} of {}", l, shape_.n_layers);
  const KvPool pool = shape_.pool_of(l);
  const int64_t blocks = shape_.pool_blocks(pool);
  // Bytes of one K (or V) array of the layer: blocks x slots x heads x rows.
  const size_t per_array = static_cast<size_t>(blocks * shape_.block_size * shape_.n_kv_heads) *
                           static_cast<size_t>(kv_row_bytes(shape_.dtype, shape_.head_dim));
  // The window pool follows the main pool's blocks; within a pool, [layer][K|V].
  const size_t pool_bytes =
      pool == KvPool::kWindow ? bytes_per_block(shape_, KvPool::kMain) * static_cast<size_t>(shape_.num_blocks) : 0;
  char* k = static_cast<char*>(storage_) + pool_bytes + static_cast<size_t>(2 * pool_index_[static_cast<size_t>(l)]) * per_array;
  char* v = k + per_array;
  PagedKvLayer kv;
  switch (shape_.dtype) {
    case KvDtype::kF16:
      kv.k16 = reinterpret_cast<uint16_t*>(k);
      kv.v16 = reinterpret_cast<uint16_t*>(v);
      break;
    case KvDtype::kInt8:
      kv.k8 = reinterpret_cast<int8_t*>(k);
      kv.v8 = reinterpret_cast<int8_t*>(v);
      break;
    default:
      kv.k = reinterpret_cast<float*>(k);
      kv.v = reinterpret_cast<float*>(v);
      break;
  }
  kv.num_blocks = blocks;
  kv.block_size = shape_.block_size;
  kv.n_kv_heads = shape_.n_kv_heads;
  kv.head_dim = shape_.head_dim;
  return kv;
}

Status KvCache::copy_block(int32_t src, int32_t dst, KvPool pool) {
  const int64_t blocks = shape_.pool_blocks(pool);
  if (src < 0 || dst < 0 || src >= blocks || dst >= blocks)
    return Status::out_of_range(fmt::format("block copy {} -> {} outside the {} (0..{})", src, dst,
                                            kv_pool_name(pool), blocks - 1));
  // Bytes of one block of one K (or V) array.
  const size_t per_block = static_cast<size_t>(shape_.block_size * shape_.n_kv_heads) *
                           static_cast<size_t>(kv_row_bytes(shape_.dtype, shape_.head_dim));
  const auto from = per_block * static_cast<size_t>(src), to = per_block * static_cast<size_t>(dst);
  for (int64_t l = 0; l < shape_.n_layers; ++l) {
    if (shape_.pool_of(l) != pool) continue;
    PagedKvLayer kv = layer(l);
    for (const bool values : {false, true}) {
      char* bytes = array_bytes(kv, values);
      std::memcpy(bytes + to, bytes + from, per_block);
    }
    if (const KvBlockSummaries s = summaries(l); s.kmin != nullptr) {
      const size_t row = static_cast<size_t>(shape_.n_kv_heads * shape_.head_dim);
      for (float* a : {s.kmin, s.kmax})
        std::copy_n(a + row * static_cast<size_t>(src), row, a + row * static_cast<size_t>(dst));
    }
  }
  return Status::ok();
}

}  // namespace tessera
