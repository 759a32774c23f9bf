// The CPU backend of a shard (shard/shard_backend.h): the KV cache in host memory, the CPU
// forward pass (shard/forward.h), logits sampled on the host.
#pragma once

#include <memory>
#include <optional>
#include <vector>

#include "comm/device_comm.h"
#include "common/shard_options.h"
#include "common/thread_pool.h"
#include "decoder/arch.h"
#include "shard/forward.h"
#include "shard/kv_cache.h"
#include "shard/shard_backend.h"
#include "shard/tp_slice.h"

namespace tessera {

struct CpuBackendOptions {
  // What the shard was asked to run with: kv_dtype (fp16: half the memory; int8), sparse decode
  // attention for the global layers (enabled: the KV cache keeps key summaries; measure:
  // configure_kv measures the threshold, kernels/sparse_attention.h), ...
  ShardRuntimeOptions runtime;
  int local_ranks = 1;          // ranks sharing this host's memory (each reports its share)
  std::vector<int> bound_cpus;  // the cores this rank is bound to (for the device name)
  // The layers' description; default: describe_architecture(config, weights).
  std::optional<ArchSpec> arch;
};

class CpuBackend : public ShardBackend {
 public:
  // `config`, `pool` and `comm` must outlive the backend; it owns `weights` (re-laid
  // for the SIMD kernels by configure_kv, see relayout_for_cpu_kernels).
  CpuBackend(const ModelConfig& config, const ShardLayout& layout, ShardWeights weights, ThreadPool* pool,
             DeviceComm* comm, CpuBackendOptions options);

  Result<BackendMemory> memory() const override;
  KvDtype kv_dtype() const override { return options_.runtime.kv_dtype; }
  int64_t kv_window() const override { return window_.window; }
  Status configure_kv(int64_t block_size, int64_t num_blocks, int64_t num_window_blocks) override;
  Status copy_block(int32_t src, int32_t dst, KvPool pool) override;
  Status run(std::span<const SequenceInput> batch, std::vector<float>& logits) override;
  Status configure_draft(const SelfDraftConfig& config) override;
  ShardDrafter* drafter() override { return drafter_.get(); }
  uint64_t comm_micros() const override { return forward_ ? forward_->comm_micros : 0; }
  SparseStats sparse_stats() const override;
  ThreadPool* host_pool() override { return pool_; }

  // After configure_kv: the forward pass (direct runs for tests and benchmarks) and its cache.
  ForwardPass& forward() { return *forward_; }
  KvCache& cache() { return *cache_; }
  // The weights the forward pass uses (after --quant conversion; re-laid once configured).
  const ModelWeights& weights() const { return weights_.weights; }
  uint64_t kv_bytes_per_token() const;
  // Of kv_bytes_per_token(), the windowed layers' (0 when the model has none).
  uint64_t kv_window_bytes_per_token() const;
  // The sparse decode attention in effect once configured (auto resolved).
  const SparseAttentionConfig& sparse_attention() const { return options_.runtime.sparse; }

 private:
  const ModelConfig& config_;
  const ShardLayout layout_;
  ShardWeights weights_;
  ThreadPool* pool_;
  DeviceComm* comm_;
  // Auto sparse attention: measure, then enable from the shortest context where it makes a
  // layer's decode attention this many times as fast.
  static constexpr double kSparseMinSpeedup = 2.0;
  Status resolve_sparse(int64_t block_size);
  int64_t global_layers() const;  // layers without a sliding window shorter than the context

  CpuBackendOptions options_;
  ArchSpec arch_;
  KvWindowLayers window_;  // the layers a window pool would hold, from arch_
  std::unique_ptr<KvCache> cache_;
  std::unique_ptr<ForwardPass> forward_;
  std::unique_ptr<SelfDrafter> drafter_;
};

}  // namespace tessera
