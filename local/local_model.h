// A whole model in one process: the weights, the CPU backend (KV cache + forward pass), one
// shard's step executor and the coordinator's block pool, driven by the engine
// (engine/engine.h), the same decode loop `tessera serve` runs. Used by `tessera
// generate` without --tp, by tests and by benchmarks.
//
// Thread-safety: one thread uses a LocalModel.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "comm/device_comm.h"
#include "common/status.h"
#include "common/thread_pool.h"
#include "engine/block_pool.h"
#include "engine/metrics.h"
#include "engine/speculation.h"
#include "kernels/sampling.h"
#include "local/in_process_shard.h"
#include "model/weight_store.h"
#include "shard/cpu_backend.h"
#include "shard/self_draft.h"
#include "shard/shard_executor.h"
#include "shard/tp_slice.h"

namespace tessera {

struct LocalModelOptions {
  std::string path;          // HF directory or .gguf file
  // The in-process shard's options (common/shard_options.h): threads (0: all hardware threads),
  // quant (round-to-nearest conversion of float linear weights at load) and quant_lm_head,
  // kv_dtype (fp16: half the memory), sparse decode attention of the global layers (off unless
  // set), ... (device, imatrix and the CUDA options do not apply: this shard computes on the CPU,
  // and `importance` below carries a loaded imatrix).
  ShardRuntimeOptions runtime;
  int64_t block_size = 16;   // tokens per KV block (common/kv_config.h's range)
  int64_t kv_tokens = 0;     // KV capacity in tokens; 0: the model's context length
  const ImportanceMatrix* importance = nullptr;  // with quant: calibrated (WeightLoadOptions)
  bool keep_unquantizable = true;                // with quant: see WeightLoadOptions
  // Speculation's self-draft (shard/self_draft.h): layers > 0 builds it; generate() then takes
  // GenerateOptions::speculation's "draft" proposer (generate() sets its draft_layers from here).
  SelfDraftConfig draft;
};

struct GenerateOptions {
  int64_t max_tokens = 16;
  SamplingParams sampling;
  bool ignore_eos = false;        // otherwise stop after a token in config().eos_ids
  int64_t prefill_chunk = 0;      // >0: prefill in pieces of this many tokens
  SpeculationConfig speculation;  // engine/speculation.h (default: n-gram drafts, gated)
};

struct GenerateOutput {
  std::vector<int32_t> ids;               // generated tokens
  std::vector<float> prompt_last_logits;  // logits at the last prompt position
  bool stopped_at_eos = false;
};

class LocalModel {
 public:
  static Result<std::unique_ptr<LocalModel>> load(const LocalModelOptions& options);

  const ModelConfig& config() const { return store_->config(); }
  const WeightStore& store() const { return *store_; }
  // The weights the forward pass uses (after --quant conversion and the CPU re-lay).
  const ModelWeights& weights() const { return backend_->weights(); }
  // Direct forward runs (tests, benchmarks) with block tables from ensure_blocks().
  ForwardPass& forward() { return backend_->forward(); }
  int64_t block_size() const { return blocks_->block_size(); }
  // Grows `table` so it covers positions [0, n_tokens) with blocks of the engine's pool; false
  // when blocks ran out. release_blocks() gives them back.
  bool ensure_blocks(std::vector<int32_t>& table, int64_t n_tokens);
  void release_blocks(std::vector<int32_t>& table);

  // What generate() drives.
  BlockPool& blocks() { return *blocks_; }
  ShardExecutor& executor() { return *executor_; }
  InProcessShard& steps() { return *steps_; }
  MetricsRegistry& metrics() { return metrics_; }
  // The CPU threads the forward pass (and the executor's sampling) run on.
  ThreadPool& pool() { return *pool_; }
  // The self-draft's layers (LocalModelOptions::draft; 0: none).
  int32_t draft_layers() const { return draft_layers_; }

 private:
  LocalModel() = default;
  std::unique_ptr<WeightStore> store_;
  ShardLayout layout_;
  std::unique_ptr<DeviceComm> comm_;
  std::unique_ptr<ThreadPool> pool_;
  std::unique_ptr<CpuBackend> backend_;
  std::unique_ptr<ShardExecutor> executor_;
  std::unique_ptr<InProcessShard> steps_;
  std::unique_ptr<BlockPool> blocks_;
  MetricsRegistry metrics_;
  int32_t draft_layers_ = 0;
  uint64_t next_seq_id_ = 1;  // generate() calls each run a new engine over the same shard
  friend Result<GenerateOutput> generate(LocalModel&, const std::vector<int32_t>&, const GenerateOptions&,
                                         const std::function<void(const SampledToken&)>&);
};

// One request through the engine on this thread: prompt prefill (in chunks of prefill_chunk),
// then decoding one token per step, calling on_token after each token. Its KV blocks are free
// again when it returns. Errors: an empty or too long prompt, an id outside the vocabulary
// (OutOfRange), bad sampling parameters, not enough KV blocks.
Result<GenerateOutput> generate(LocalModel& model, const std::vector<int32_t>& prompt,
                                const GenerateOptions& options,
                                const std::function<void(const SampledToken&)>& on_token = {});

}  // namespace tessera
