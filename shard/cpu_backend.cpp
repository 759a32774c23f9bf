#include "shard/cpu_backend.h"

#include <algorithm>
#include <fstream>

#include "common/logging.h"
#include "kernels/cpu/cpu_info.h"
#include "kernels/cpu/fgemm_bf16.h"
#include "kernels/cpu/kernel_tune.h"
#include "kernels/gemm.h"
#include "topology/topology.h"

namespace tessera {
namespace {

uint64_t mem_available_bytes() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  uint64_t kb = 0;
  std::string unit;
  while (in >> key >> kb >> unit)
    if (key == "MemAvailable:") return kb * 1024;
  return 0;
}

}  // namespace

CpuBackend::CpuBackend(const ModelConfig& config, const ShardLayout& layout, ShardWeights weights, ThreadPool* pool,
                       DeviceComm* comm, CpuBackendOptions options)
    : config_(config), layout_(layout), weights_(std::move(weights)), pool_(pool), comm_(comm),
      options_(std::move(options)),
      arch_(options_.arch ? *options_.arch : describe_architecture(config_, weights_.weights)),
      window_(kv_window_layers(config_, arch_)) {
  cpu::tune_kernels();  // the measured kernel variants (once per process, cached per CPU)
}

uint64_t CpuBackend::kv_bytes_per_token() const {
  return tessera::kv_bytes_per_token(config_.n_layers, layout_.n_kv_heads, config_.head_dim, options_.runtime.kv_dtype);
}

uint64_t CpuBackend::kv_window_bytes_per_token() const {
  return tessera::kv_bytes_per_token(window_.count(), layout_.n_kv_heads, config_.head_dim, options_.runtime.kv_dtype);
}

Result<BackendMemory> CpuBackend::memory() const {
  BackendMemory m;
  // How the layer matmuls compute (kernels/gemm.h: --matmul-precision), e.g. "matmul F16: bf16 (auto)".
  std::string matmul;
  if (!weights_.weights.layers.empty()) {
    const QuantType t = weights_.weights.layers[0].w_gate.type;
    matmul = fmt::format("; matmul {}: {} ({})", quant_name(t), matmul_compute_for(t),
                         matmul_precision_name(matmul_precision()));
    // Why auto chose what it did for 16-bit weights: the measured bf16 dot product rate.
    if (matmul_precision() == MatmulPrecision::kAuto && (t == QuantType::kF16 || t == QuantType::kBF16) &&
        cpu::has_bf16_dot())
      matmul += fmt::format(", bf16 dot {:.2f}x the fp32 fma rate here, bf16 from {:.1f}x", cpu::bf16_dot_speedup(),
                            cpu::kBf16DotMinSpeedup);
  }
  m.device = fmt::format("cpu ({} threads{}; {}{})", pool_->size(),
                         options_.bound_cpus.empty() ? "" : ", cpus " + format_cpu_list(options_.bound_cpus),
                         cpu::describe_cpu(), matmul);
  m.memory_available_bytes = mem_available_bytes() / static_cast<uint64_t>(std::max(1, options_.local_ranks));
  m.kv_dtype = kv_dtype();
  m.kv_bytes_per_token = kv_bytes_per_token();
  m.kv_window = window_.window;
  m.kv_window_bytes_per_token = kv_window_bytes_per_token();
  // Key summaries: billed when sparse attention is on, or auto and the context can outgrow the
  // selection at the smallest block size (else auto resolves to off and keeps none).
  const SparseAttentionConfig& sp = options_.runtime.sparse;
  const int64_t min_budget = (sp.select.sink_blocks + sp.select.recent_blocks + sp.select.top_blocks) * kMinBlockSize;
  if (global_layers() > 0 && (sp.enabled || (sp.measure && config_.max_positions > min_budget)))
    m.kv_summary_bytes_per_block = key_summary_bytes_per_block(global_layers(), layout_.n_kv_heads, config_.head_dim);
  m.weight_bytes = weights_.bytes;
  return m;
}

Status CpuBackend::configure_kv(int64_t block_size, int64_t num_blocks, int64_t num_window_blocks) {
  if (cache_) return Status::invalid_argument("the KV cache is configured already");
  if (num_window_blocks > 0 && window_.window == 0)
    return Status::invalid_argument(fmt::format(
        "a window pool of {} blocks, but this model ({}) has no sliding-window layers that could use it",
        num_window_blocks, arch_.name));
  KvCacheShape shape{config_.n_layers, layout_.n_kv_heads, config_.head_dim, block_size, num_blocks, options_.runtime.kv_dtype};
  // window_layers also tells the key summaries which layers are global (without a window pool too).
  shape.window_layers = window_.layers;
  shape.num_window_blocks = num_window_blocks;
  TESSERA_RETURN_IF_ERROR(resolve_sparse(block_size));
  shape.key_summaries = options_.runtime.sparse.enabled;
  TESSERA_ASSIGN_OR_RETURN(KvCache cache, KvCache::create(shape));
  cache_ = std::make_unique<KvCache>(std::move(cache));
  const int64_t relaid = relayout_for_cpu_kernels(weights_, pool_);
  if (relaid > 0) TESSERA_LOG_DEBUG("{} matrices re-laid in 16-row groups for the AVX-512 kernels", relaid);
  ArchSpec arch = options_.arch ? *options_.arch : describe_architecture(config_, weights_.weights);
  TESSERA_RETURN_IF_ERROR(arch.validate(config_, &weights_.weights));
  forward_ = std::make_unique<ForwardPass>(config_, layout_, weights_.weights, pool_, cache_.get(), comm_,
                                           std::move(arch));
  TESSERA_RETURN_IF_ERROR(forward_->set_sparse_attention(options_.runtime.sparse));
  if (options_.runtime.sparse.enabled)
    TESSERA_LOG_INFO("sparse attention: decodes of the global layers from {} tokens of context attend to {} sink + {} "
                     "recent + {} selected blocks of {} tokens",
                     options_.runtime.sparse.threshold_tokens, options_.runtime.sparse.select.sink_blocks,
                     options_.runtime.sparse.select.recent_blocks, options_.runtime.sparse.select.top_blocks, block_size);
  if (num_window_blocks > 0)
    TESSERA_LOG_DEBUG("KV cache: {} blocks of {} tokens; window pool: {} blocks for {} layers (window {})", num_blocks,
                      block_size, num_window_blocks, window_.count(), window_.window);
  else
    TESSERA_LOG_DEBUG("KV cache: {} blocks of {} tokens", num_blocks, block_size);
  return Status::ok();
}

ShardBackend::SparseStats CpuBackend::sparse_stats() const {
  SparseStats s;
  if (!forward_) return s;
  s.threshold_tokens = options_.runtime.sparse.enabled ? options_.runtime.sparse.threshold_tokens : 0;
  s.sparse = forward_->sparse_attentions;
  s.dense = forward_->dense_global_decodes;
  return s;
}

int64_t CpuBackend::global_layers() const { return config_.n_layers - window_.count(); }

Status CpuBackend::resolve_sparse(int64_t block_size) {
  SparseAttentionConfig& sp = options_.runtime.sparse;
  if (!sp.measure) return Status::ok();
  sp.measure = false;
  sp.enabled = false;
  const int64_t budget = (sp.select.sink_blocks + sp.select.recent_blocks + sp.select.top_blocks) * block_size;
  if (global_layers() == 0 || config_.max_positions <= budget) {
    TESSERA_LOG_DEBUG("sparse attention (auto): off, {}", global_layers() == 0
                                                             ? std::string("no global-attention layer")
                                                             : fmt::format("the context ({} tokens) fits the selection "
                                                                           "({} tokens)",
                                                                           config_.max_positions, budget));
    return Status::ok();
  }
  // Rank 0 measures and the others take its threshold: every rank attends to the same blocks
  // of its heads (and their own measurements, taken side by side on shared cores, would differ).
  int64_t threshold = 0;
  if (!comm_ || comm_->rank() == 0) {
    SparseCrossoverShape shape{layout_.n_heads, layout_.n_kv_heads, config_.head_dim, block_size,
                               options_.runtime.kv_dtype};
    const SparseCrossover c = measure_sparse_crossover(
        shape, sp.select, std::min<int64_t>(config_.max_positions, 32768), kSparseMinSpeedup, 5, pool_);
    TESSERA_LOG_INFO("sparse attention (auto): one global layer's decode attention, dense/sparse: {}",
                     describe_sparse_crossover(c));
    threshold = c.threshold_tokens;
  }
  if (comm_ && comm_->size() > 1)
    TESSERA_RETURN_IF_ERROR(comm_->broadcast(&threshold, sizeof threshold, 0));
  if (threshold > 0) {
    sp.enabled = true;
    sp.threshold_tokens = threshold;
  }
  return Status::ok();
}

Status CpuBackend::copy_block(int32_t src, int32_t dst, KvPool pool) {
  if (!cache_) return Status::invalid_argument("block copy before the KV cache exists");
  if (pool == KvPool::kWindow && !cache_->shape().has_window_pool())
    return Status::invalid_argument(fmt::format("window block copy {} -> {} without a window pool", src, dst));
  return cache_->copy_block(src, dst, pool);
}

Status CpuBackend::configure_draft(const SelfDraftConfig& config) {
  if (!forward_) return Status::invalid_argument("the self-draft needs the KV cache configured first");
  if (drafter_) return Status::invalid_argument("the self-draft is configured already");
  TESSERA_RETURN_IF_ERROR(validate_self_draft(config, config_));
  drafter_ = std::make_unique<SelfDrafter>(config, config_, layout_, weights_.weights, *forward_, pool_, comm_);
  TESSERA_LOG_DEBUG("self-draft: the first {} of {} layers, a head of {} fixed rows on this rank plus the context's ids",
                    config.layers, config_.n_layers, drafter_->head_rows());
  return Status::ok();
}

Status CpuBackend::run(std::span<const SequenceInput> batch, std::vector<float>& logits) {
  if (!forward_) return Status::invalid_argument("a step before the KV cache exists");
  return forward_->run(batch, logits);
}

}  // namespace tessera
