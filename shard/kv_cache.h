// A shard's KV storage: for every layer, K and V arrays of
// [num_blocks][block_size][n_kv_heads][head_dim] fp32 (ARCHITECTURE.md "KV accounting"), or fp16 (half the memory;
// KvCacheShape::dtype, `--kv-dtype fp16`), or int8 rows with their scales (`--kv-dtype int8`,
// head_dim + 4 bytes a row; kernels/paged_attention.h). Block ids are assigned by the
// coordinator's BlockPool; this class
// only owns the memory, allocated once at start-up.
//
// Two pools (common/kv_config.h, "the window pool"): with num_window_blocks > 0 the layers that
// window_layers marks keep their K and V in a second pool of num_window_blocks blocks (same
// block size), addressed by each sequence's window table; the other layers use the main pool of
// num_blocks. Each pool is [its layers, in layer order][K|V][its blocks][block_size][heads][dim].
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "common/kv_config.h"
#include "common/status.h"
#include "decoder/arch.h"
#include "kernels/paged_attention.h"
#include "kernels/sparse_attention.h"

namespace tessera {

// Which of a shard's two KV pools (block ids of the two are unrelated).
enum class KvPool : uint8_t {
  kMain = 0,    // every layer without a window pool; the full-attention layers with one
  kWindow = 1,  // the windowed layers, when the window pool is configured
};
const char* kv_pool_name(KvPool pool);  // "KV cache", "window pool" (for messages)

struct KvCacheShape {
  int64_t n_layers = 0;
  int64_t n_kv_heads = 0;   // heads stored on this shard
  int64_t head_dim = 0;
  int64_t block_size = 16;  // tokens per block
  int64_t num_blocks = 0;
  KvDtype dtype = KvDtype::kF32;  // fp32, fp16 or int8 elements (create() refuses the others)
  // The window pool: n_layers entries (true: the layer's KV lives there) or empty, and its
  // block count. Both needed: without num_window_blocks > 0 every layer is in the main pool.
  std::vector<bool> window_layers;
  int64_t num_window_blocks = 0;
  // Per block of the main pool and each of its global layers (those window_layers does not
  // mark, with or without a window pool), the element-wise min and max of the block's keys
  // (kernels/sparse_attention.h): what sparse decode attention selects blocks by.
  // key_summary_bytes_per_block() bytes per block.
  bool key_summaries = false;

  bool f16() const { return dtype == KvDtype::kF16; }
  bool has_window_pool() const { return num_window_blocks > 0; }
  KvPool pool_of(int64_t layer) const {
    return has_window_pool() && window_layers[static_cast<size_t>(layer)] ? KvPool::kWindow : KvPool::kMain;
  }
  int64_t pool_layers(KvPool pool) const;  // layers stored in `pool`
  int64_t pool_blocks(KvPool pool) const { return pool == KvPool::kWindow ? num_window_blocks : num_blocks; }
};

// Key summaries' bytes per block of the main pool for n_global_layers layers (fp32 min and max).
uint64_t key_summary_bytes_per_block(int64_t n_global_layers, int64_t n_kv_heads, int64_t head_dim);

// K and V bytes of one token over n_layers layers of n_kv_heads heads of head_dim elements.
uint64_t kv_bytes_per_token(int64_t n_layers, int64_t n_kv_heads, int64_t head_dim, KvDtype dtype);

// What a model's windowed layers need from the window pool: the layers (windowed_kv_layers of
// the config) and the largest window among them in `arch`, the windows the attention kernels
// use. Empty layers and window 0 when no window pool is possible: windowed_kv_layers is
// empty, or `arch` gives one of those layers no window (it would read every key).
struct KvWindowLayers {
  std::vector<bool> layers;  // n_layers entries, or empty
  int64_t window = 0;        // tokens; > 0 exactly when `layers` is not empty
  int64_t count() const;     // layers marked
};
KvWindowLayers kv_window_layers(const ModelConfig& config, const ArchSpec& arch);

// first_read_slot (common/kv_config.h): the first window-table slot a piece reads.

// InvalidArgument / OutOfRange naming sequence `seq` (its index in the batch) unless `table`
// is a window table a piece of n_tokens queries from start_pos can use: it covers the piece's
// positions, its entries are -1 or ids of a pool of num_blocks, and none of the slots from
// first_read_slot(start_pos, window, block_size) on is -1. (ForwardPass and CudaForward check
// every window table with it.)
Status validate_window_table(std::span<const int32_t> table, size_t seq, int64_t start_pos, int64_t n_tokens,
                             int64_t window, int64_t block_size, int64_t num_blocks);

class KvCache {
 public:
  // Allocates 2 * n_layers * num_blocks * block_size * n_kv_heads rows of kv_row_bytes (with a
  // window pool: the main pool's layers * num_blocks + the window layers * num_window_blocks).
  // The memory is mapped anonymously: pages are zero and cost nothing until first written.
  // InvalidArgument for non-positive sizes, or a window pool with window_layers not n_layers
  // long or marking no layer.
  static Result<KvCache> create(const KvCacheShape& shape);
  KvCache() = default;
  KvCache(KvCache&& other) noexcept;
  KvCache& operator=(KvCache&& other) noexcept;
  ~KvCache();
  // Bytes of one block of `pool`: K and V of every layer stored there.
  static size_t bytes_per_block(const KvCacheShape& shape, KvPool pool = KvPool::kMain);

  const KvCacheShape& shape() const { return shape_; }
  // Layer l's K and V in the pool that holds it (num_blocks: that pool's count).
  PagedKvLayer layer(int64_t l);
  // Copy-on-write of a shared block of `pool`: the K and V of every layer stored there (and
  // their key summaries), of block src into block dst. OutOfRange for ids outside the pool.
  Status copy_block(int32_t src, int32_t dst, KvPool pool = KvPool::kMain);
  // Layer l's key summaries (shape().key_summaries, a layer not marked in window_layers); null
  // arrays otherwise.
  // Their pages cost nothing until written (kv_summary_update after each kv_write).
  KvBlockSummaries summaries(int64_t l);

 private:
  KvCacheShape shape_;
  void* storage_ = nullptr;
  size_t bytes_ = 0;
  std::vector<int64_t> pool_index_;  // per layer: its index among its pool's layers
  std::vector<int64_t> summary_index_;  // per layer: its index among the summarized layers, -1: none
  std::unique_ptr<float[]> summaries_;  // [summarized layer][min|max][num_blocks][n_kv_heads][head_dim]
};

}  // namespace tessera
