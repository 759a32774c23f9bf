// What a shard's step executor (shard/shard_executor.h) needs from the device it runs on: the
// memory it reports in its hello, the KV pool the coordinator sizes, block copies, and the
// forward pass with the outputs the device can produce. Two implementations: the CPU backend
// (shard/cpu_backend.h: the KV cache in host memory and ForwardPass) and the CUDA backend
// (shard/cuda_backend.h: CudaForward on one GPU). The executor never asks which one it has; it
// asks what the backend can do (greedy_on_device, prepare_device_sampling).
//
// Thread-safety: one thread (the shard's worker loop, or the engine thread of an in-process
// shard) calls every method.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "common/status.h"
#include "kernels/sampling.h"
#include "shard/forward.h"
#include "shard/self_draft.h"

namespace tessera {

class ThreadPool;

// The figures a shard reports in its hello.
struct BackendMemory {
  std::string device;                 // "cpu (2 threads, cpus 0-1)", "cuda:0 (NVIDIA H200, sm_90)"
  uint64_t memory_available_bytes = 0;  // what a KV pool may take before the coordinator's headroom
  KvDtype kv_dtype = KvDtype::kF32;    // what its KV cache stores
  uint64_t kv_bytes_per_token = 0;    // every layer, K and V, this rank's KV heads, in kv_dtype
  // The window pool (common/kv_config.h): the window of the layers whose KV may go there
  // (kv_window_layers: the largest of their windows) and their share of kv_bytes_per_token.
  // 0 and 0 when the model has no such layers (one pool only).
  int64_t kv_window = 0;
  uint64_t kv_window_bytes_per_token = 0;
  // Key summaries of sparse decode attention (shard/kv_cache.h), per block of the main pool: 0
  // unless the backend may keep them (--sparse-attention on, or auto where it may enable).
  uint64_t kv_summary_bytes_per_block = 0;
  uint64_t weight_bytes = 0;          // this rank's weights where they are computed from
  int64_t max_step_tokens = 0;        // the largest step its workspace holds (0: no limit)
  int64_t max_step_seqs = 0;
};

// One row the device may sample itself: the sequence's host sampler state (parameters, seeded
// position, token counts) and the ids banned at this step.
struct DeviceSampleRequest {
  const Sampler* sampler = nullptr;
  std::span<const int32_t> banned;
};

class ShardBackend {
 public:
  virtual ~ShardBackend() = default;

  virtual Result<BackendMemory> memory() const = 0;
  // What its KV cache stores (BackendMemory::kv_dtype).
  virtual KvDtype kv_dtype() const = 0;
  // The window of the layers that may keep their KV in a window pool (BackendMemory::kv_window);
  // 0: none, configure_kv() takes no window pool.
  virtual int64_t kv_window() const = 0;
  // Allocates the KV pools the coordinator planned (once): num_blocks blocks of block_size
  // tokens, and with num_window_blocks > 0 the window pool of that many blocks for the windowed
  // layers (InvalidArgument when kv_window() is 0). The weights may be re-laid for the device's
  // kernels here (the CPU backend does), so the executor calls it before any step.
  virtual Status configure_kv(int64_t block_size, int64_t num_blocks, int64_t num_window_blocks) = 0;
  // Copy-on-write of a shared block of `pool`: the K and V of every layer stored there, of
  // block src into dst. OutOfRange for ids outside the pool.
  virtual Status copy_block(int32_t src, int32_t dst, KvPool pool) = 0;

  // ForwardPass::run's contract: fp32 logits of the full vocabulary, one row per token of an
  // all_logits piece and one per want_logits piece, in batch order.
  virtual Status run(std::span<const SequenceInput> batch, std::vector<float>& logits) = 0;

  // True when run_greedy() takes the argmax on the device (no logits cross to the host).
  virtual bool greedy_on_device() const { return false; }
  // Each logit row's greedy token (ties to the lowest id), rows in run()'s order.
  virtual Status run_greedy(std::span<const SequenceInput> batch, std::vector<int32_t>& ids);
  // True when the backend can sample on the device at all (the executor then asks per step).
  virtual bool samples_on_device() const { return false; }
  // True when the device can sample every row of the coming step itself with these samplers
  // (one per sequence that wants a token, batch order); it keeps what run_sampled() needs.
  virtual bool prepare_device_sampling(std::span<const DeviceSampleRequest> rows) { return false; }
  // The tokens the device drew for the rows of the last successful prepare_device_sampling().
  virtual Status run_sampled(std::span<const SequenceInput> batch, std::vector<SampledToken>& out);

  // Speculation's self-draft (shard/self_draft.h), after configure_kv: builds the drafter that
  // fills the shard drafts of speculative pieces. Unimplemented where the backend has none (the
  // CUDA backend today); InvalidArgument for a config validate_self_draft refuses.
  virtual Status configure_draft(const SelfDraftConfig& config);
  // The drafter configure_draft built; nullptr before or without one.
  virtual ShardDrafter* drafter() { return nullptr; }

  // Microseconds spent in collectives outside the device's stream (CPU ranks), accumulated.
  virtual uint64_t comm_micros() const { return 0; }
  // Sparse decode attention (kernels/sparse_attention.h) once configured: the threshold in
  // effect (0: off) and, accumulated, the decode pieces x global layers that attended sparsely
  // and densely.
  struct SparseStats {
    int64_t threshold_tokens = 0;
    uint64_t sparse = 0;
    uint64_t dense = 0;
  };
  virtual SparseStats sparse_stats() const { return {}; }
  // Host threads idle between steps that the executor's sampling may use (the CPU backend's
  // pool); nullptr: sample on the calling thread.
  virtual ThreadPool* host_pool() { return nullptr; }
};

}  // namespace tessera
