// CudaForward's device memory beside the weights: the workspace (allocate_workspace), the step
// metadata's layout (MetaLayout), the KV pool and the window pool (allocate_kv_pool,
// configure_kv, allocate_kv), the sparse selection's buffers, and copy-on-write block copies
// (copy_block).
//
// Memory, all allocated by create() (the KV pool and what goes with it by configure_kv() with
// options.defer_kv_pool), nothing per step:
//  1. workspace for the largest step (options.max_tokens_per_step tokens, max_seqs_per_step
//     sequences, max_logit_rows logit rows): fp32 activations, one f16 activation buffer for
//     the GEMM inputs, logits, and the per-step metadata (tokens, positions, slots, block tables);
//     with INT8 / INT4 / GGUF-block weights also an f16 buffer for the largest such matrix:
//     INT8 / INT4 GEMMs of more than 256 tokens and GGUF GEMMs of more than 8 dequantize the
//     matrix into it and use cuBLAS (the register-dequantizing kernels re-read the packed
//     weights once per 8 tokens).
//  2. the KV pool as ONE allocation, [layer][K|V][num_blocks][block_size][n_kv_heads][head_dim]
//     of options.kv_dtype, fp32 or fp16 (the CPU layout and rounding per layer), with the block
//     tables' metadata. Either at create() (cudaMemGetInfo's free bytes minus kv_headroom *
//     total, capped at max_kv_blocks when > 0), or, with options.defer_kv_pool, by
//     configure_kv() with the block size and block count the coordinator chose from
//     free_device_bytes() (the shard reports that in its hello).
//     configure_kv() with num_window_blocks > 0 also allocates the window pool (common/
//     kv_config.h): the windowed layers (kv_window_layers) move out of the KV pool into a second
//     allocation of their own, [window layer][K|V][num_window_blocks][...], addressed by the
//     sequences' window tables (a second block-table region and a second set of KV slots in the
//     step metadata, both uploaded every step and at fixed offsets in graphed steps).
//  3. with options.sparse.enabled, beside the KV pool (allocated with it,
//     kv_summary_bytes_per_block() per block): the key summaries of the main pool's layers
//     (those not in kv_window_layers), [summarized layer][min|max][num_blocks][n_kv_heads]
//     [head_dim] fp32, and the selection's buffers: block scores [max_seqs_per_step][max table
//     blocks] (TP > 1: tp_size more for the all-gather) and the compacted tables, sequence
//     lengths and start positions.

#include <algorithm>
#include <tuple>

#include <fmt/format.h>

#include "common/kv_config.h"
#include "shard/cuda_forward_internal.h"
#include "shard/kv_cache.h"

namespace tessera {

using cuda_forward_detail::kMaxSplits;
using cuda_forward_detail::kSplitBelowBlocks;
using cuda_forward_detail::kSplitKeys;

CudaForward::MetaLayout::MetaLayout(int64_t T, int64_t S, int64_t table_cap, bool with_window_tables) {
  tokens = 0;
  positions = tokens + T;
  out_rows = positions + T;
  query_begin = out_rows + T;
  query_len = query_begin + S;
  start_pos = query_len + S;
  seq_lens = start_pos + S;
  tables = seq_lens + S;
  window_tables = tables + S * table_cap;
  total = window_tables + (with_window_tables ? S * table_cap : 0);
}

Status CudaForward::allocate_workspace() {
  const int64_t T = options_.max_tokens_per_step;
  options_.max_logit_rows = std::min(options_.max_logit_rows, T);
  const int64_t R = options_.max_logit_rows, S = options_.max_seqs_per_step;
  const int64_t hd = config_.head_dim, hidden = config_.hidden;
  const int64_t q_dim = layout_.n_heads * hd, kv_dim = layout_.n_kv_heads * hd, ffn = layout_.ffn;
  const int64_t local_vocab = lm_head_->rows;
  auto alloc_f32 = [&](float** out, int64_t n, const char* what) -> Status {
    void* p = nullptr;
    TESSERA_ASSIGN_OR_RETURN(p, device_alloc(n * 4, what));
    *out = static_cast<float*>(p);
    workspace_bytes_ += n * 4;
    return Status::ok();
  };
  TESSERA_RETURN_IF_ERROR(alloc_f32(&x_, T * hidden, "the residual stream"));
  TESSERA_RETURN_IF_ERROR(alloc_f32(&h_, T * hidden, "normed activations"));
  TESSERA_RETURN_IF_ERROR(alloc_f32(&proj_, T * hidden, "projection outputs"));
  TESSERA_RETURN_IF_ERROR(alloc_f32(&q_, T * q_dim, "queries"));
  TESSERA_RETURN_IF_ERROR(alloc_f32(&attn_, T * q_dim, "attention outputs"));
  TESSERA_RETURN_IF_ERROR(alloc_f32(&k_, T * kv_dim, "keys"));
  TESSERA_RETURN_IF_ERROR(alloc_f32(&v_, T * kv_dim, "values"));
  TESSERA_RETURN_IF_ERROR(alloc_f32(&gate_, T * ffn, "MLP gate"));
  TESSERA_RETURN_IF_ERROR(alloc_f32(&up_, T * ffn, "MLP up"));
  // At TP > 1 the all-gather sends n_out * vocab_per_rank floats (>= this rank's rows).
  TESSERA_RETURN_IF_ERROR(
      alloc_f32(&logits_, R * std::max<int64_t>({local_vocab, layout_.vocab_per_rank, 1}), "logits"));
  if (layout_.tp_size > 1)
    TESSERA_RETURN_IF_ERROR(
        alloc_f32(&gathered_, layout_.tp_size * R * layout_.vocab_per_rank, "gathered logits"));
  void* p = nullptr;
  // Split decode attention for contexts longer than 2 pieces (options.decode_split_keys).
  const int64_t piece = options_.decode_split_keys > 0 ? options_.decode_split_keys : kSplitKeys;
  if (options_.decode_split_keys >= 0 && config_.max_positions > 2 * piece) {
    decode_splits_ = std::min<int64_t>(kMaxSplits, (config_.max_positions + piece - 1) / piece);
    decode_split_keys_ = (config_.max_positions + decode_splits_ - 1) / decode_splits_;
    const int64_t seqs = std::min<int64_t>(S, (kSplitBelowBlocks + layout_.n_heads - 1) / layout_.n_heads);
    TESSERA_RETURN_IF_ERROR(alloc_f32(&decode_partial_, seqs * layout_.n_heads * decode_splits_ * (hd + 2),
                                      "split decode attention"));
  }
  // Device sampling: the weights' scratch, the unsharded logits at TP > 1, per-row parameters,
  // penalty entries and results.
  TESSERA_RETURN_IF_ERROR(alloc_f32(&sample_scratch_, R * config_.vocab, "sampling weights"));
  if (layout_.tp_size > 1) TESSERA_RETURN_IF_ERROR(alloc_f32(&full_logits_, R * config_.vocab, "unsharded logits"));
  const int64_t sample_rows = std::max(R, S);
  TESSERA_ASSIGN_OR_RETURN(
      p, device_alloc(sample_rows * static_cast<int64_t>(sizeof(TesseraCudaSampleRow)), "sampling parameters"));
  sample_rows_ = static_cast<TesseraCudaSampleRow*>(p);
  h_sample_rows_.assign(static_cast<size_t>(sample_rows), TesseraCudaSampleRow{});
  const int64_t penalty_bytes =
      std::max<int64_t>(1, options_.max_penalty_entries) * static_cast<int64_t>(sizeof(TesseraCudaPenalty));
  TESSERA_ASSIGN_OR_RETURN(p, device_alloc(penalty_bytes, "sampling penalty entries"));
  penalties_ = static_cast<TesseraCudaPenalty*>(p);
  const int64_t sampled_ints = R * (2 + 2 * TESSERA_CUDA_MAX_TOP_LOGPROBS);
  TESSERA_ASSIGN_OR_RETURN(p, device_alloc(sampled_ints * 4, "sampled tokens"));
  sampled_ = static_cast<int32_t*>(p);
  workspace_bytes_ +=
      sample_rows * static_cast<int64_t>(sizeof(TesseraCudaSampleRow)) + penalty_bytes + sampled_ints * 4;
  TESSERA_ASSIGN_OR_RETURN(p, device_alloc(R * 8, "greedy ids and values"));
  greedy_ = static_cast<int32_t*>(p);
  TESSERA_ASSIGN_OR_RETURN(p, device_alloc(layout_.tp_size * R * 8, "gathered greedy ids and values"));
  greedy_gathered_ = static_cast<int32_t*>(p);
  workspace_bytes_ += (layout_.tp_size + 1) * R * 8;
  const int64_t act_cols = std::max({hidden, q_dim, ffn});
  TESSERA_ASSIGN_OR_RETURN(p, device_alloc(T * act_cols * 2, "f16 activations"));
  act16_ = static_cast<uint16_t*>(p);
  if (dequant_elems_ > 0) {
    TESSERA_ASSIGN_OR_RETURN(p, device_alloc(dequant_elems_ * 2, "a dequantized weight matrix"));
    dequant_ = static_cast<uint16_t*>(p);
    workspace_bytes_ += dequant_elems_ * 2;
  }
  TESSERA_ASSIGN_OR_RETURN(p, device_alloc(T * 8, "KV slots"));
  slots_ = static_cast<int64_t*>(p);
  workspace_bytes_ += T * act_cols * 2 + T * 8;
  h_slots_.assign(static_cast<size_t>(T), 0);
  set_cuda_graphs(options_.cuda_graphs);
  return Status::ok();
}

int64_t CudaForward::kv_bytes_per_token() const {  // K and V of every layer
  return static_cast<int64_t>(
      tessera::kv_bytes_per_token(config_.n_layers, layout_.n_kv_heads, config_.head_dim, options_.kv_dtype));
}

int64_t CudaForward::kv_summary_bytes_per_block() const {
  return static_cast<int64_t>(key_summary_bytes_per_block(n_summarized_, layout_.n_kv_heads, config_.head_dim));
}

namespace {

// Device bytes of the sparse selection's buffers for tables of table_blocks entries: block
// scores, every rank's scores (TP > 1), compacted tables, their lengths and start positions.
int64_t sparse_buffer_bytes(int64_t max_seqs, int64_t table_blocks, int64_t tp_size) {
  const int64_t cells = max_seqs * table_blocks;
  return (cells * (2 + (tp_size > 1 ? tp_size : 0)) + 2 * max_seqs) * 4;
}

}  // namespace

int64_t CudaForward::kv_window_bytes_per_token() const {
  return static_cast<int64_t>(
      tessera::kv_bytes_per_token(window_.count(), layout_.n_kv_heads, config_.head_dim, options_.kv_dtype));
}

Result<int64_t> CudaForward::free_device_bytes() const {
  int64_t free_bytes = 0, total_bytes = 0;
  TESSERA_CUDA_TRY(api_->set_device(options_.device), "select the CUDA device");
  TESSERA_CUDA_TRY(api_->mem_get_info(&free_bytes, &total_bytes), "query device memory");
  return free_bytes;
}

Status CudaForward::allocate_kv_pool() {
  int64_t free_bytes = 0, total_bytes = 0;
  TESSERA_CUDA_TRY(api_->mem_get_info(&free_bytes, &total_bytes), "query device memory");
  const int64_t bytes_per_block = options_.block_size * kv_bytes_per_token() + kv_summary_bytes_per_block();
  // The block tables' metadata (and the sparse selection's buffers) come out of the same free
  // memory (tables of max_positions).
  const int64_t table_blocks = (config_.max_positions + options_.block_size - 1) / options_.block_size;
  const int64_t meta_bytes =
      MetaLayout(options_.max_tokens_per_step, options_.max_seqs_per_step, table_blocks, /*window_tables=*/false)
              .total *
          4 +
      (n_summarized_ > 0 ? sparse_buffer_bytes(options_.max_seqs_per_step, table_blocks, layout_.tp_size) : 0);
  const auto headroom = static_cast<int64_t>(options_.kv_headroom * static_cast<double>(total_bytes));
  const int64_t usable = free_bytes - headroom - meta_bytes;
  int64_t blocks = usable > 0 ? usable / bytes_per_block : 0;
  if (options_.max_kv_blocks > 0) blocks = std::min(blocks, options_.max_kv_blocks);
  blocks = std::min<int64_t>(blocks, 0x7fffffff);  // block ids are int32
  if (blocks < 1)
    return Status::resource_exhausted(fmt::format(
        "CUDA device {}: {} bytes free after {} bytes of weights and {} of workspace; keeping {:.0f}% of {} "
        "bytes free leaves no room for one KV block of {} bytes",
        options_.device, free_bytes, weight_bytes_, workspace_bytes_, options_.kv_headroom * 100.0, total_bytes,
        bytes_per_block));
  return allocate_kv(options_.block_size, blocks, 0);
}

Status CudaForward::configure_kv(int64_t block_size, int64_t num_blocks, int64_t num_window_blocks) {
  if (kv_ready_)
    return Status::invalid_argument(fmt::format("CUDA device {}: the KV pool is already allocated ({} blocks of {})",
                                                options_.device, num_blocks_, options_.block_size));
  if (block_size <= 0 || num_blocks <= 0 || num_blocks > 0x7fffffff || num_window_blocks < 0 ||
      num_window_blocks > 0x7fffffff)
    return Status::invalid_argument(fmt::format(
        "CUDA device {}: KV pool of {} blocks (window pool {}) of {} tokens: blocks and tokens must be > 0, window "
        "blocks >= 0 (and both < 2^31)",
        options_.device, num_blocks, num_window_blocks, block_size));
  if (num_window_blocks > 0 && window_.window == 0)
    return Status::invalid_argument(fmt::format(
        "CUDA device {}: a window pool of {} blocks, but the model has no sliding-window layers that could use it",
        options_.device, num_window_blocks));
  TESSERA_CUDA_TRY(api_->set_device(options_.device), "select the CUDA device");
  return allocate_kv(block_size, num_blocks, num_window_blocks);
}

Status CudaForward::allocate_kv(int64_t block_size, int64_t num_blocks, int64_t num_window_blocks) {
  options_.block_size = block_size;
  max_table_blocks_ = (config_.max_positions + block_size - 1) / block_size;
  const bool window_pool = num_window_blocks > 0;
  // Sized for the largest step; each step packs its regions at the front (MetaLayout of its own
  // sizes), so only what it uses is uploaded.
  const MetaLayout meta(options_.max_tokens_per_step, options_.max_seqs_per_step, max_table_blocks_, window_pool);
  void* p = nullptr;
  TESSERA_ASSIGN_OR_RETURN(p, device_alloc(meta.total * 4, "step metadata"));
  meta_ = static_cast<int32_t*>(p);
  workspace_bytes_ += meta.total * 4;
  h_meta_.assign(static_cast<size_t>(meta.total), 0);
  if (window_pool) {
    TESSERA_ASSIGN_OR_RETURN(p, device_alloc(options_.max_tokens_per_step * 8, "window-pool KV slots"));
    window_slots_ = static_cast<int64_t*>(p);
    workspace_bytes_ += options_.max_tokens_per_step * 8;
    h_window_slots_.assign(static_cast<size_t>(options_.max_tokens_per_step), -1);
  }
  // Each layer's place in its pool: [its pool's layers in layer order][K|V].
  int64_t n_window = 0;
  pool_index_.clear();
  for (int64_t l = 0; l < config_.n_layers; ++l) {
    const bool windowed = window_pool && window_.layers[static_cast<size_t>(l)];
    pool_index_.push_back(windowed ? n_window++ : l - n_window);
  }
  kv_elem_bytes_ = kv_dtype_bytes(options_.kv_dtype);
  const int64_t block_bytes = block_size * layout_.n_kv_heads * config_.head_dim * kv_elem_bytes_;
  const int64_t layer_block_bytes = 2 * block_bytes;  // K and V of one layer
  const int64_t bytes = num_blocks * (config_.n_layers - n_window) * layer_block_bytes;
  const int64_t window_bytes = num_window_blocks * n_window * layer_block_bytes;
  for (const auto& [pool_bytes, blocks, what, out] :
       {std::tuple{bytes, num_blocks, "KV pool", &kv_pool_},
        std::tuple{window_bytes, num_window_blocks, "window pool", &window_pool_}}) {
    if (pool_bytes == 0) continue;
    const int rc = api_->device_malloc(&p, pool_bytes);
    if (rc != 0)
      return Status::resource_exhausted(fmt::format(
          "CUDA device {}: cannot allocate the {} of {} blocks of {} tokens ({} bytes) after {} bytes of weights "
          "and {} of workspace: {}",
          options_.device, what, blocks, block_size, pool_bytes, weight_bytes_, workspace_bytes_, api_->last_error()));
    allocations_.push_back(p);
    *out = static_cast<uint8_t*>(p);
  }
  if (n_summarized_ > 0) {
    // Key summaries (billed per block: kv_summary_bytes_per_block) and the selection's buffers.
    summary_bytes_ = num_blocks * kv_summary_bytes_per_block();
    TESSERA_ASSIGN_OR_RETURN(p, device_alloc(summary_bytes_, "key summaries (sparse attention)"));
    summaries_ = static_cast<float*>(p);
    const int64_t cells = options_.max_seqs_per_step * max_table_blocks_;
    TESSERA_ASSIGN_OR_RETURN(p, device_alloc(cells * 4, "sparse attention block scores"));
    sparse_scores_ = static_cast<float*>(p);
    if (layout_.tp_size > 1) {
      TESSERA_ASSIGN_OR_RETURN(p, device_alloc(layout_.tp_size * cells * 4, "gathered sparse attention scores"));
      sparse_gathered_ = static_cast<float*>(p);
    }
    TESSERA_ASSIGN_OR_RETURN(p, device_alloc((cells + 2 * options_.max_seqs_per_step) * 4, "compacted block tables"));
    sparse_meta_ = static_cast<int32_t*>(p);
    workspace_bytes_ += sparse_buffer_bytes(options_.max_seqs_per_step, max_table_blocks_, layout_.tp_size);
  }
  num_blocks_ = num_blocks;
  num_window_blocks_ = num_window_blocks;
  layer_kv_bytes_ = num_blocks * block_bytes;
  window_layer_kv_bytes_ = num_window_blocks * block_bytes;
  kv_bytes_ = bytes + window_bytes;
  kv_ready_ = true;
  return Status::ok();
}

Status CudaForward::copy_block(int32_t src, int32_t dst, KvPool pool) {
  if (!kv_ready_) return Status::invalid_argument("CudaForward: block copy before the KV pool exists");
  const bool window = pool == KvPool::kWindow;
  if (window && num_window_blocks_ == 0)
    return Status::invalid_argument(fmt::format("window block copy {} -> {} without a window pool", src, dst));
  const int64_t blocks = window ? num_window_blocks_ : num_blocks_;
  if (src < 0 || dst < 0 || src >= blocks || dst >= blocks)
    return Status::out_of_range(
        fmt::format("block copy {} -> {} outside the {} (0..{})", src, dst, kv_pool_name(pool), blocks - 1));
  const int64_t block_bytes = options_.block_size * layout_.n_kv_heads * config_.head_dim * kv_elem_bytes_;
  const int64_t layers = window ? window_.count() : config_.n_layers - (num_window_blocks_ > 0 ? window_.count() : 0);
  uint8_t* const pool_base = window ? window_pool_ : kv_pool_;
  const int64_t layer_bytes = window ? window_layer_kv_bytes_ : layer_kv_bytes_;
  TESSERA_CUDA_TRY(api_->set_device(options_.device), "select the CUDA device");
  for (int64_t part = 0; part < 2 * layers; ++part) {  // [the pool's layer][K|V]
    uint8_t* base = pool_base + part * layer_bytes;
    TESSERA_CUDA_TRY(
        api_->device_memcpy_async(base + dst * block_bytes, base + src * block_bytes, block_bytes, stream_),
        fmt::format("copy {} block {} -> {}", kv_pool_name(pool), src, dst));
  }
  if (window || !summaries_) return Status::ok();
  // The key summaries go with the keys (as the CPU's KvCache::copy_block).
  const int64_t row = layout_.n_kv_heads * config_.head_dim;
  for (int64_t part = 0; part < 2 * n_summarized_; ++part) {  // [summarized layer][min|max]
    float* base = summaries_ + part * num_blocks_ * row;
    TESSERA_CUDA_TRY(api_->device_memcpy_async(base + dst * row, base + src * row, row * 4, stream_),
                     fmt::format("copy the key summaries of block {} -> {}", src, dst));
  }
  return Status::ok();
}

}  // namespace tessera
