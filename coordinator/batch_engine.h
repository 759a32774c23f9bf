// A batch generator over a ShardGroup: every request is admitted at once, prefilled in chunks,
// then decoded together until each one stops. It drives `tessera generate --tp N` and the
// step benchmarks; the serving scheduler (continuous batching, priorities, preemption, prefix
// caching) is a separate component.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "comm/control_messages.h"
#include "common/status.h"
#include "coordinator/shard_group.h"

namespace tessera {

struct BatchRequest {
  std::vector<int32_t> prompt;
  int64_t max_tokens = 16;
  SamplingParams sampling;
  bool ignore_eos = false;
};

struct BatchEngineOptions {
  int64_t prefill_chunk = 512;       // tokens of one prompt per step
  std::vector<int32_t> eos_ids;
  int64_t max_positions = 0;         // context length
};

struct BatchOutput {
  std::vector<int32_t> ids;
  std::vector<std::vector<std::pair<int32_t, float>>> top_logprobs;
  bool stopped_at_eos = false;
};

// Called after every sampled token: request index and the token.
using TokenCallback = std::function<void(size_t, const StepToken&)>;

// Errors: a request that does not fit (prompt too long, not enough KV blocks), or a shard
// failure (the error names the rank; the outputs so far are lost).
Result<std::vector<BatchOutput>> run_batch(ShardGroup& shards, const std::vector<BatchRequest>& requests,
                                           const BatchEngineOptions& options, const TokenCallback& on_token = {});

}  // namespace tessera
