// The CUDA backend of a shard (shard/shard_backend.h): this rank's weights uploaded to its GPU
// (CudaForward), an NCCL communicator over the TP group at TP > 1, the KV pool allocated when
// the coordinator has sized it, and greedy / sampled outputs taken on the device.
#pragma once

#include <memory>
#include <optional>

#include "comm/device_comm.h"
#include "common/shard_options.h"
#include "comm/nccl_comm.h"
#include "decoder/arch.h"
#include "shard/cuda_forward.h"
#include "shard/shard_backend.h"
#include "shard/tp_slice.h"

namespace tessera {

struct CudaBackendOptions {
  int local_rank = 0;              // this rank on its host: device local_rank % devices
  // What the shard was asked to run with: the workspace holds steps of at most
  // max_step_tokens tokens and max_step_seqs sequences; decode steps as CUDA graph replays
  // (cuda_graphs); kv_dtype fp32 or fp16 (others are refused); sparse decode attention of the
  // global layers (CudaForwardOptions::sparse): `measure` (--sparse-attention auto) resolves to
  // off on CUDA, as the crossover is measured only by the CPU backend (measure_sparse_crossover
  // times the CPU kernels); create() logs that, and a CUDA shard turns sparse attention on only
  // with --sparse-attention on (and its threshold).
  ShardRuntimeOptions runtime;
  std::optional<ArchSpec> arch;    // default: describe_architecture(config, weights)
};

class CudaBackend : public ShardBackend {
 public:
  // Uploads `weights` (released when this returns: the device holds them) over `comm`'s group.
  // Unavailable without a CUDA library or device.
  static Result<std::unique_ptr<CudaBackend>> create(const ModelConfig& config, const ShardLayout& layout,
                                                     ShardWeights weights, DeviceComm& comm,
                                                     const CudaBackendOptions& options);

  Result<BackendMemory> memory() const override;
  KvDtype kv_dtype() const override { return options_.runtime.kv_dtype; }  // fp32 or fp16: create() refuses the others
  int64_t kv_window() const override { return forward_->kv_window(); }
  Status configure_kv(int64_t block_size, int64_t num_blocks, int64_t num_window_blocks) override;
  Status copy_block(int32_t src, int32_t dst, KvPool pool) override;
  Status run(std::span<const SequenceInput> batch, std::vector<float>& logits) override;
  bool greedy_on_device() const override { return true; }
  Status run_greedy(std::span<const SequenceInput> batch, std::vector<int32_t>& ids) override;
  bool samples_on_device() const override { return true; }
  bool prepare_device_sampling(std::span<const DeviceSampleRequest> rows) override;
  Status run_sampled(std::span<const SequenceInput> batch, std::vector<SampledToken>& out) override;
  SparseStats sparse_stats() const override;

  CudaForward& forward() { return *forward_; }

 private:
  CudaBackend() = default;
  CudaBackendOptions options_;
  std::unique_ptr<NcclComm> nccl_;  // TP > 1
  std::unique_ptr<CudaForward> forward_;
  // device sampling: the prepared step's rows and penalty entries
  std::vector<TesseraCudaSampleRow> sample_rows_;
  std::vector<TesseraCudaPenalty> penalties_;
};

}  // namespace tessera
