#include "shard/cuda_backend.h"

#include <algorithm>

#include "common/logging.h"
#include "kernels/cuda/cuda_loader.h"

namespace tessera {

Result<std::unique_ptr<CudaBackend>> CudaBackend::create(const ModelConfig& config, const ShardLayout& layout,
                                                         ShardWeights weights, DeviceComm& comm,
                                                         const CudaBackendOptions& options) {
  if (!kv_dtype_stored(options.runtime.kv_dtype, KvBackend::kCuda))  // the KV dtype table's column
    return Status::unimplemented(fmt::format("--kv-dtype {}: the CUDA backend's KV cache is {}",
                                             kv_dtype_name(options.runtime.kv_dtype),
                                             kv_dtypes_stored_text(KvBackend::kCuda)));
  TESSERA_ASSIGN_OR_RETURN(const CudaApi* api, load_cuda_api_with_device());
  std::unique_ptr<CudaBackend> b(new CudaBackend());
  b->options_ = options;
  const int devices = api->device_count();
  const int device = options.local_rank % devices;
  if (comm.size() > 1) {
    NcclCommOptions no;
    no.device = device;
    TESSERA_ASSIGN_OR_RETURN(b->nccl_, NcclComm::create(comm, no));
  }
  CudaForwardOptions co;
  co.device = device;
  co.max_tokens_per_step = options.runtime.max_step_tokens;
  co.max_seqs_per_step = options.runtime.max_step_seqs;
  co.max_logit_rows = std::min<int64_t>(options.runtime.max_step_tokens, std::max<int64_t>(options.runtime.max_step_seqs, 256));
  co.defer_kv_pool = true;
  co.kv_dtype = options.runtime.kv_dtype;
  co.cuda_graphs = options.runtime.cuda_graphs;
  co.max_graph_batch = options.runtime.max_step_seqs;
  co.sparse = options.runtime.sparse;
  if (co.sparse.measure) {
    co.sparse.measure = false;
    co.sparse.enabled = false;
    TESSERA_LOG_INFO(
        "sparse attention (auto): off on CUDA (the dense/sparse crossover is measured only on the CPU backend); "
        "--sparse-attention on --sparse-threshold N enables it");
  }
  b->options_.runtime.sparse = co.sparse;
  ArchSpec arch = options.arch ? *options.arch : describe_architecture(config, weights.weights);
  TESSERA_ASSIGN_OR_RETURN(b->forward_,
                           CudaForward::create(config, layout, weights.weights, b->nccl_.get(), co, std::move(arch)));
  // The device holds the weights now: the host copies (quantized or converted ones owned by
  // `weights`; a mapped file's pages are released by the OS when not touched again) go here.
  return b;
}

Result<BackendMemory> CudaBackend::memory() const {
  BackendMemory m;
  m.device = forward_->device_name();
  TESSERA_ASSIGN_OR_RETURN(const int64_t free_bytes, forward_->free_device_bytes());
  m.memory_available_bytes = static_cast<uint64_t>(free_bytes);
  m.kv_dtype = kv_dtype();
  m.kv_bytes_per_token = static_cast<uint64_t>(forward_->kv_bytes_per_token());
  m.kv_window = forward_->kv_window();
  m.kv_window_bytes_per_token = static_cast<uint64_t>(forward_->kv_window_bytes_per_token());
  m.kv_summary_bytes_per_block = static_cast<uint64_t>(forward_->kv_summary_bytes_per_block());
  m.weight_bytes = static_cast<uint64_t>(forward_->weight_bytes());
  m.max_step_tokens = options_.runtime.max_step_tokens;
  m.max_step_seqs = options_.runtime.max_step_seqs;
  return m;
}

Status CudaBackend::configure_kv(int64_t block_size, int64_t num_blocks, int64_t num_window_blocks) {
  TESSERA_RETURN_IF_ERROR(forward_->configure_kv(block_size, num_blocks, num_window_blocks));
  TESSERA_LOG_DEBUG("KV pool on {}: {} blocks of {} tokens, window pool {} blocks", forward_->device_name(), num_blocks,
                    block_size, num_window_blocks);
  const SparseAttentionConfig& sp = options_.runtime.sparse;
  if (sp.enabled)
    TESSERA_LOG_INFO("sparse attention: decodes of the global layers from {} tokens of context attend to {} sink + {} "
                     "recent + {} selected blocks of {} tokens (selected on {})",
                     sp.threshold_tokens, sp.select.sink_blocks, sp.select.recent_blocks, sp.select.top_blocks,
                     block_size, forward_->device_name());
  return Status::ok();
}

Status CudaBackend::copy_block(int32_t src, int32_t dst, KvPool pool) { return forward_->copy_block(src, dst, pool); }

Status CudaBackend::run(std::span<const SequenceInput> batch, std::vector<float>& logits) {
  return forward_->run(batch, logits);
}

ShardBackend::SparseStats CudaBackend::sparse_stats() const {
  SparseStats s;
  s.threshold_tokens = options_.runtime.sparse.enabled ? options_.runtime.sparse.threshold_tokens : 0;
  s.sparse = forward_->sparse_attentions();
  s.dense = forward_->dense_global_decodes();
  return s;
}

Status CudaBackend::run_greedy(std::span<const SequenceInput> batch, std::vector<int32_t>& ids) {
  return forward_->run_greedy(batch, ids);
}

// False when the device cannot take the step: more top logprobs than it returns, a logit_bias
// (the host adds it), too many penalty entries (CudaForward::can_sample).
bool CudaBackend::prepare_device_sampling(std::span<const DeviceSampleRequest> rows) {
  sample_rows_.clear();
  penalties_.clear();
  for (const DeviceSampleRequest& r : rows) {
    const SamplingParams& p = r.sampler->params();
    if (p.n_logprobs > TESSERA_CUDA_MAX_TOP_LOGPROBS || !p.logit_bias.empty()) return false;
    sample_rows_.push_back(device_sample_row(*r.sampler, r.banned, penalties_));
  }
  return forward_->can_sample(sample_rows_, penalties_).is_ok();
}

Status CudaBackend::run_sampled(std::span<const SequenceInput> batch, std::vector<SampledToken>& out) {
  return forward_->run_sampled(batch, sample_rows_, penalties_, out);
}

}  // namespace tessera
