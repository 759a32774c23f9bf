// A whole model in one process: weights, KV cache, forward pass and a block allocator.
// Used by `tessera generate` at TP = 1 without a coordinator, and by tests.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "comm/device_comm.h"
#include "common/thread_pool.h"
#include "kernels/sampling.h"
#include "model/weight_store.h"
#include "shard/forward.h"
#include "shard/kv_cache.h"
#include "shard/tp_slice.h"

namespace tessera {

struct LocalModelOptions {
  std::string path;          // HF directory or .gguf file
  int threads = 0;           // 0: all hardware threads
  int64_t block_size = 16;   // tokens per KV block
  int64_t kv_tokens = 0;     // KV capacity in tokens; 0: the model's context length
  WeightQuant quant = WeightQuant::kNone;  // RTN of float linear weights at load (--quant)
  bool quantize_lm_head = false;           // with quant: the LM head too
  bool kv_f16 = false;                     // an fp16 KV cache (half the memory)
};

class LocalModel {
 public:
  static Result<std::unique_ptr<LocalModel>> load(const LocalModelOptions& options);

  const ModelConfig& config() const { return store_->config(); }
  const WeightStore& store() const { return *store_; }
  // The weights the forward pass uses (after --quant conversion).
  const ModelWeights& weights() const { return weights_.weights; }
  ForwardPass& forward() { return *forward_; }
  SimpleBlockAllocator& allocator() { return *allocator_; }
  int64_t block_size() const { return cache_->shape().block_size; }

 private:
  LocalModel() = default;
  std::unique_ptr<WeightStore> store_;
  ShardLayout layout_;
  ShardWeights weights_;
  std::unique_ptr<DeviceComm> comm_;
  std::unique_ptr<ThreadPool> pool_;
  std::unique_ptr<KvCache> cache_;
  std::unique_ptr<ForwardPass> forward_;
  std::unique_ptr<SimpleBlockAllocator> allocator_;
};

struct GenerateOptions {
  int64_t max_tokens = 16;
  SamplingParams sampling;
  bool ignore_eos = false;        // otherwise stop after a token in config().eos_ids
  int64_t prefill_chunk = 0;      // >0: prefill in pieces of this many tokens
};

struct GenerateOutput {
  std::vector<int32_t> ids;               // generated tokens
  std::vector<float> prompt_last_logits;  // logits at the last prompt position
  bool stopped_at_eos = false;
};

// Runs prompt prefill then decoding one token at a time, calling on_token after each token.
// Frees its KV blocks before returning.
Result<GenerateOutput> generate(LocalModel& model, const std::vector<int32_t>& prompt,
                                const GenerateOptions& options,
                                const std::function<void(const SampledToken&)>& on_token = {});

}  // namespace tessera
