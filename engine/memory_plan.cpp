#include "engine/memory_plan.h"

#include <fmt/format.h>

#include <algorithm>

#include "common/kv_config.h"

namespace tessera {

Result<MemoryPlan> plan_kv_memory(const std::vector<ShardHello>& hellos, const MemoryPlanOptions& o) {
  TESSERA_RETURN_IF_ERROR(validate_block_size(o.block_size));
  if (o.headroom < 0.0 || o.headroom >= 1.0)
    return Status::invalid_argument(fmt::format("headroom must be in [0, 1), got {}", o.headroom));
  MemoryPlan p;
  p.block_size = o.block_size;
  p.min_available_bytes = UINT64_MAX;
  const auto block = static_cast<uint64_t>(o.block_size);
  for (const ShardHello& h : hellos) {
    // A block of the main pool also costs its key summaries (sparse attention).
    p.kv_bytes_per_block =
        std::max<uint64_t>(p.kv_bytes_per_block, h.kv_bytes_per_token * block + h.kv_summary_bytes_per_block);
    p.min_available_bytes = std::min(p.min_available_bytes, h.memory_available_bytes);
    if (h.kv_window_bytes_per_token > h.kv_bytes_per_token)
      return Status::invalid_argument(fmt::format("rank {} reports {} windowed KV bytes per token of {} in all", h.rank,
                                                  h.kv_window_bytes_per_token, h.kv_bytes_per_token));
    if (h.kv_window != hellos.front().kv_window)
      return Status::invalid_argument(fmt::format("rank {} reports a KV window of {} tokens, rank {} of {}", h.rank,
                                                  h.kv_window, hellos.front().rank, hellos.front().kv_window));
    p.window_bytes_per_block = std::max<uint64_t>(p.window_bytes_per_block, h.kv_window_bytes_per_token * block);
  }
  if (p.kv_bytes_per_block == 0) return Status::invalid_argument("shards report 0 KV bytes per token");
  // Never plan to 100%: the headroom stays free for fragmentation, workspace growth, the OS.
  uint64_t budget = static_cast<uint64_t>(static_cast<double>(p.min_available_bytes) * (1.0 - o.headroom));
  p.limited_by = "memory";
  uint64_t cap = o.max_kv_bytes;
  if (cap == 0) {
    for (const ShardHello& h : hellos)
      if (h.device.rfind("cpu", 0) == 0) cap = o.cpu_max_kv_bytes;
  }
  if (cap > 0 && cap < budget) {
    budget = cap;
    p.limited_by = "max_kv_bytes";
  }
  // The window pool, when it leaves room for more blocks than one pool would.
  const int64_t window = hellos.empty() ? 0 : hellos.front().kv_window;
  const KvPoolSplit split = split_kv_budget(
      budget, p.kv_bytes_per_block, p.window_bytes_per_block,
      o.window_pool ? window_pool_blocks(window, o.step_tokens, o.block_size, o.step_seqs) : 0);
  p.num_blocks = split.num_blocks;
  p.kv_bytes_per_block = split.block_bytes;
  p.num_window_blocks = split.num_window_blocks;
  p.window_bytes_per_block = split.window_block_bytes;
  p.window = split.num_window_blocks > 0 ? window : 0;
  if (o.max_blocks > 0 && o.max_blocks < p.num_blocks) {
    p.num_blocks = o.max_blocks;
    p.limited_by = "max_blocks";
  }
  if (p.num_blocks < 1)
    return Status::resource_exhausted(fmt::format(
        "no room for a single KV block of {} bytes: {} bytes available on the smallest shard, {:.0f}% headroom",
        p.kv_bytes_per_block, p.min_available_bytes, o.headroom * 100));
  p.planned_kv_bytes = static_cast<uint64_t>(p.num_blocks) * p.kv_bytes_per_block +
                      static_cast<uint64_t>(p.num_window_blocks) * p.window_bytes_per_block;
  return p;
}

}  // namespace tessera
