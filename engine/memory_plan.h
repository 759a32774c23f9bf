// The KV memory plan (ARCHITECTURE.md "KV accounting"): how many KV blocks every shard gets, from what each shard
// reports in its hello (memory available after weights and workspace, KV bytes per token, its
// sliding window). The smallest shard decides; the headroom is never planned; caps and the
// window pool (common/kv_config.h) apply. Pure arithmetic: no shard, socket or clock.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "proto/control_messages.h"

namespace tessera {

struct MemoryPlanOptions {
  int64_t block_size = 16;
  double headroom = 0.10;           // fraction of each shard's available memory never planned
  uint64_t max_kv_bytes = 0;        // cap per shard (0: none)
  uint64_t cpu_max_kv_bytes = 0;    // cap when max_kv_bytes is 0 and a shard runs on the CPU (0: none)
  int64_t max_blocks = 0;           // cap on blocks (0: none)
  // The largest step the scheduler will send (0: unchecked); a shard whose workspace is
  // smaller is refused at start-up, naming both numbers.
  int64_t step_tokens = 0;
  int64_t step_seqs = 0;
  // The window pool (common/kv_config.h), when the shards report windowed layers and it leaves
  // room for more blocks than one pool: sized for step_seqs sequences and steps of step_tokens.
  bool window_pool = false;
};

struct MemoryPlan {
  int64_t num_blocks = 0;
  int64_t block_size = 0;
  uint64_t kv_bytes_per_block = 0;       // largest over ranks
  uint64_t min_available_bytes = 0;      // smallest over ranks
  uint64_t planned_kv_bytes = 0;         // per rank
  std::string limited_by;                // "memory", "max_kv_bytes", "max_blocks"
  // The window pool: num_window_blocks > 0 when the windowed layers' KV lives apart. Then
  // kv_bytes_per_block is the other layers' share, and planned_kv_bytes counts both pools.
  int64_t num_window_blocks = 0;
  int64_t window = 0;                    // tokens
  uint64_t window_bytes_per_block = 0;   // largest over ranks
};

// The plan for these shards' hellos. InvalidArgument for a bad block size or headroom, or
// hellos that disagree (window, windowed bytes); ResourceExhausted when not one block fits.
Result<MemoryPlan> plan_kv_memory(const std::vector<ShardHello>& hellos, const MemoryPlanOptions& options);

}  // namespace tessera
