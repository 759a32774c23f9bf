// CudaForward's lifetime and step driver: create() / init() (options, device, stream, cuBLAS,
// then the weights, workspace and KV pool of the other files), device_alloc(), validate(), and
// run() / run_greedy() / run_sampled(), which pack the step's metadata and enqueue it eagerly
// (run_step) or as a graph replay (cuda_graphs.cpp).

#include "shard/cuda_forward.h"

#include <algorithm>
#include <chrono>
#include <string>

#include <fmt/format.h>

#include "comm/device_comm.h"
#include "comm/nccl_comm.h"
#include "kernels/cuda/cuda_loader.h"
#include "shard/cuda_forward_internal.h"

namespace tessera {

using cuda_forward_detail::micros_since;

CudaForward::CudaForward(const ModelConfig& config, const ShardLayout& layout, DeviceComm* comm,
                         const CudaForwardOptions& options)
    : config_(config), layout_(layout), comm_(comm), options_(options) {}

CudaForward::~CudaForward() {
  if (!api_) return;
  api_->set_device(options_.device);
  if (stream_) api_->stream_synchronize(stream_);
  for (auto& [bucket, graph] : graphs_) api_->graph_destroy(graph);
  for (void* p : allocations_) api_->device_free(p);
  if (blas_) api_->blas_destroy(blas_);
  if (owns_stream_ && stream_) api_->stream_destroy(stream_);
}

Result<std::unique_ptr<CudaForward>> CudaForward::create(const ModelConfig& config, const ShardLayout& layout,
                                                         const ModelWeights& weights, DeviceComm* comm,
                                                         const CudaForwardOptions& options) {
  return create(config, layout, weights, comm, options, describe_architecture(config, weights));
}

Result<std::unique_ptr<CudaForward>> CudaForward::create(const ModelConfig& config, const ShardLayout& layout,
                                                         const ModelWeights& weights, DeviceComm* comm,
                                                         const CudaForwardOptions& options, ArchSpec arch) {
  if (options.block_size <= 0 || options.max_tokens_per_step <= 0 || options.max_seqs_per_step <= 0 ||
      options.max_logit_rows <= 0 || options.kv_headroom < 0.0 || options.kv_headroom >= 1.0)
    return Status::invalid_argument(fmt::format(
        "CudaForward options: block_size {}, max_tokens_per_step {}, max_seqs_per_step {}, max_logit_rows {} must "
        "be > 0 and kv_headroom {} in [0, 1)",
        options.block_size, options.max_tokens_per_step, options.max_seqs_per_step, options.max_logit_rows,
        options.kv_headroom));
  if (!kv_dtype_stored(options.kv_dtype, KvBackend::kCuda))
    return Status::unimplemented(fmt::format("CudaForward: a KV cache of {}: the CUDA kernels store {}",
                                             kv_dtype_name(options.kv_dtype), kv_dtypes_stored_text(KvBackend::kCuda)));
  if (options.max_graph_tokens < 1 || (options.max_graph_tokens & (options.max_graph_tokens - 1)) != 0)
    return Status::invalid_argument(
        fmt::format("CudaForward options: max_graph_tokens {} must be a power of two >= 1", options.max_graph_tokens));
  if (layout.tp_size > 1 && (comm == nullptr || comm->size() != layout.tp_size || comm->name() != "nccl"))
    return Status::invalid_argument(fmt::format(
        "CudaForward at TP {} needs an NCCL communicator of {} ranks (device pointers), got {}", layout.tp_size,
        layout.tp_size, comm ? std::string(comm->name()) + " of " + std::to_string(comm->size()) : "none"));
  if (static_cast<int64_t>(weights.layers.size()) != config.n_layers)
    return Status::invalid_argument(
        fmt::format("CudaForward: {} layers bound, the config has {}", weights.layers.size(), config.n_layers));
  const SparseAttentionConfig& sp = options.sparse;
  if (sp.measure)
    return Status::invalid_argument(
        "CudaForward options: sparse.measure (--sparse-attention auto) must be resolved to sparse.enabled and "
        "sparse.threshold_tokens by the backend first");
  if (sp.enabled && (sp.threshold_tokens < 1 || sp.select.sink_blocks < 0 || sp.select.recent_blocks < 1 ||
                     sp.select.top_blocks < 0 || sp.select.top_blocks > 0x7fffffff))
    return Status::invalid_argument(fmt::format(
        "CudaForward options: sparse attention threshold_tokens {} must be >= 1, sink_blocks {} >= 0, recent_blocks "
        "{} >= 1 (the current block) and top_blocks {} in [0, 2^31)",
        sp.threshold_tokens, sp.select.sink_blocks, sp.select.recent_blocks, sp.select.top_blocks));
  std::unique_ptr<CudaForward> f(new CudaForward(config, layout, comm, options));
  f->decoder_ = std::make_unique<Decoder>(std::move(arch), decoder_dims(config, layout));
  f->window_ = kv_window_layers(config, f->decoder_->spec());
  // Key summaries for the main pool's layers (as the CPU's KvCache keeps them); only those with
  // no sliding window select blocks.
  for (int64_t l = 0; l < config.n_layers; ++l) {
    const bool windowed = !f->window_.layers.empty() && f->window_.layers[static_cast<size_t>(l)];
    const bool summarized = sp.enabled && !windowed;
    f->summary_index_.push_back(summarized ? f->n_summarized_++ : -1);
    if (summarized && f->decoder_->spec().layers[static_cast<size_t>(l)].sliding_window == 0) ++f->n_sparse_layers_;
  }
  TESSERA_RETURN_IF_ERROR(f->init(weights));
  return f;
}

Status CudaForward::init(const ModelWeights& weights) {
  TESSERA_ASSIGN_OR_RETURN(api_, load_cuda_api_with_device());
  TESSERA_RETURN_IF_ERROR(decoder_->spec().validate(config_, &weights));
  TESSERA_RETURN_IF_ERROR(decoder_->check_backend(*this, weights));
  TESSERA_CUDA_TRY(api_->set_device(options_.device), fmt::format("select CUDA device {}", options_.device));
  {
    char name[256] = {};
    int major = 0, minor = 0;
    TESSERA_CUDA_TRY(api_->device_info(options_.device, name, sizeof(name), &major, &minor),
                     fmt::format("query CUDA device {}", options_.device));
    device_name_ = fmt::format("cuda:{} ({}, sm_{}{})", options_.device, name, major, minor);
  }
  if (layout_.tp_size > 1) {
    auto* nccl = static_cast<NcclComm*>(comm_);  // name() == "nccl" was checked
    if (nccl->device() != options_.device)
      return Status::invalid_argument(fmt::format("CudaForward on device {} got an NCCL communicator of device {}",
                                                  options_.device, nccl->device()));
    stream_ = nccl->stream();
  } else {
    TESSERA_CUDA_TRY(api_->stream_create(&stream_), "create the forward pass stream");
    owns_stream_ = true;
  }
  TESSERA_CUDA_TRY(api_->blas_create(&blas_), "create the cuBLAS handle");
  TESSERA_RETURN_IF_ERROR(upload_weights(weights));
  TESSERA_RETURN_IF_ERROR(allocate_workspace());
  if (options_.defer_kv_pool) return Status::ok();
  return allocate_kv_pool();
}

Result<void*> CudaForward::device_alloc(int64_t bytes, const char* what) {
  void* p = nullptr;
  const int rc = api_->device_malloc(&p, std::max<int64_t>(bytes, 1));
  if (rc != 0)
    return Status::resource_exhausted(
        fmt::format("CUDA device {}: cannot allocate {} bytes for {}: {}", options_.device, bytes, what,
                    api_->last_error()));
  allocations_.push_back(p);
  return p;
}

// ---- one step ----

Status CudaForward::validate(std::span<const SequenceInput> batch) const {
  // The same checks, in the same order, as ForwardPass::validate, plus the step limits.
  if (!kv_ready_) return Status::invalid_argument("CudaForward: a step before configure_kv()");
  const int64_t block_size = options_.block_size;
  int64_t n = 0;
  for (size_t s = 0; s < batch.size(); ++s) {
    const SequenceInput& in = batch[s];
    if (in.tokens.empty()) return Status::invalid_argument(fmt::format("sequence {} has no tokens", s));
    for (int32_t id : in.tokens) {
      if (id < 0 || id >= config_.vocab)
        return Status::out_of_range(fmt::format("token id {} is out of range: the vocabulary has {} tokens (0..{})",
                                                id, config_.vocab, config_.vocab - 1));
    }
    const int64_t end = in.start_pos + static_cast<int64_t>(in.tokens.size());
    if (in.start_pos < 0 || end > config_.max_positions)
      return Status::out_of_range(fmt::format("positions [{}, {}) exceed the context length {}", in.start_pos, end,
                                              config_.max_positions));
    if (static_cast<int64_t>(in.block_table.size()) * block_size < end)
      return Status::invalid_argument(fmt::format("sequence {}: block table of {} blocks cannot hold {} tokens", s,
                                                  in.block_table.size(), end));
    for (int32_t b : in.block_table)
      if (b < 0 || b >= num_blocks_)
        return Status::out_of_range(fmt::format("block id {} outside the cache (0..{})", b, num_blocks_ - 1));
    if (num_window_blocks_ == 0) {
      if (!in.window_block_table.empty())
        return Status::invalid_argument(fmt::format("sequence {}: a window table without a window pool", s));
    } else {
      TESSERA_RETURN_IF_ERROR(validate_window_table(in.window_block_table, s, in.start_pos, end - in.start_pos,
                                                    window_.window, block_size, num_window_blocks_));
    }
    n += static_cast<int64_t>(in.tokens.size());
  }
  if (n > options_.max_tokens_per_step || static_cast<int64_t>(batch.size()) > options_.max_seqs_per_step)
    return Status::invalid_argument(fmt::format(
        "step of {} tokens and {} sequences exceeds the CUDA workspace ({} tokens, {} sequences; tessera-shard "
        "--max-step-tokens / --max-step-seqs)",
        n, batch.size(), options_.max_tokens_per_step, options_.max_seqs_per_step));
  return Status::ok();
}

Status CudaForward::enqueue_forward(int64_t n, bool all_decode) {
  all_decode_ = all_decode;
  return decoder_->forward(*this, n);
}

Status CudaForward::run(std::span<const SequenceInput> batch, std::vector<float>& logits) {
  return run_step(batch, StepOut{.kind = Output::kLogits, .logits = &logits});
}

Status CudaForward::run_greedy(std::span<const SequenceInput> batch, std::vector<int32_t>& ids) {
  return run_step(batch, StepOut{.kind = Output::kGreedy, .ids = &ids});
}

Status CudaForward::run_sampled(std::span<const SequenceInput> batch, std::span<const TesseraCudaSampleRow> rows,
                                std::span<const TesseraCudaPenalty> penalties, std::vector<SampledToken>& out) {
  TESSERA_RETURN_IF_ERROR(can_sample(rows, penalties));
  size_t wanted = 0;
  for (const SequenceInput& in : batch) {
    if (in.all_logits) return Status::invalid_argument("run_sampled: a sequence wants all its logits (use run())");
    wanted += in.want_logits ? 1 : 0;
  }
  if (wanted != rows.size())
    return Status::invalid_argument(
        fmt::format("run_sampled: {} sequences want a token, {} sampling rows given", wanted, rows.size()));
  // Parameters go to the device before the step (stream order); padding rows of a graphed
  // bucket are greedy with no logprobs (run_graphed fills them).
  std::copy(rows.begin(), rows.end(), h_sample_rows_.begin());
  return run_step(batch, StepOut{.kind = Output::kSampled, .sampled = &out, .rows = rows, .penalties = penalties});
}

void CudaForward::fill_tables(const SequenceInput* in, int64_t s, int64_t used) {
  // A window table's released slots (-1) stay -1: validate() made sure no query reads them.
  int32_t* table = h_meta_.data() + meta_at_.tables + s * table_stride_;
  for (int64_t b = 0; b < table_stride_; ++b) table[b] = b < used ? in->block_table[static_cast<size_t>(b)] : 0;
  if (num_window_blocks_ == 0) return;
  int32_t* window_table = h_meta_.data() + meta_at_.window_tables + s * table_stride_;
  for (int64_t b = 0; b < table_stride_; ++b)
    window_table[b] = b < used ? in->window_block_table[static_cast<size_t>(b)] : 0;
}

void CudaForward::set_slots(const SequenceInput* in, int64_t row, int64_t pos) {
  const int64_t bs = options_.block_size;
  const auto slot = [&](std::span<const int32_t> table) -> int64_t {
    return in ? static_cast<int64_t>(table[static_cast<size_t>(pos / bs)]) * bs + pos % bs : -1;
  };
  h_slots_[static_cast<size_t>(row)] = slot(in ? in->block_table : std::span<const int32_t>{});
  if (num_window_blocks_ > 0)
    h_window_slots_[static_cast<size_t>(row)] = slot(in ? in->window_block_table : std::span<const int32_t>{});
}

Status CudaForward::run_step(std::span<const SequenceInput> batch, const StepOut& out) {
  step_start_ = std::chrono::steady_clock::now();
  last_step_ = CudaStepStats{};
  TESSERA_RETURN_IF_ERROR(validate(batch));
  plan_sparse(batch);
  if (const int64_t q = graph_tokens(batch); q > 0) return run_graphed(batch, out, q);
  graph_query_len_ = 0;

  const int64_t bs = options_.block_size;
  // Host metadata: token rows in batch order, one block-table row per sequence holding the
  // blocks its positions [0, end) use (stride = the longest such row of this step), packed
  // for this step's sizes.
  n_seqs_ = static_cast<int64_t>(batch.size());
  table_stride_ = 1;
  int64_t n_tokens = 0;
  for (const SequenceInput& in : batch) {
    table_stride_ = std::max<int64_t>(table_stride_, (in.start_pos + static_cast<int64_t>(in.tokens.size()) + bs - 1) / bs);
    n_tokens += static_cast<int64_t>(in.tokens.size());
  }
  meta_at_ = MetaLayout(n_tokens, n_seqs_, table_stride_, num_window_blocks_ > 0);
  const MetaLayout& meta = meta_at_;
  int64_t n = 0, n_out = 0;
  bool all_decode = true;
  for (int64_t s = 0; s < n_seqs_; ++s) {
    const SequenceInput& in = batch[static_cast<size_t>(s)];
    const auto len = static_cast<int64_t>(in.tokens.size());
    all_decode = all_decode && len == 1;
    h_meta_[static_cast<size_t>(meta.query_begin + s)] = static_cast<int32_t>(n);
    h_meta_[static_cast<size_t>(meta.query_len + s)] = static_cast<int32_t>(len);
    h_meta_[static_cast<size_t>(meta.start_pos + s)] = static_cast<int32_t>(in.start_pos);
    h_meta_[static_cast<size_t>(meta.seq_lens + s)] = static_cast<int32_t>(in.start_pos + len);
    fill_tables(&in, s, (in.start_pos + len + bs - 1) / bs);
    for (int64_t i = 0; i < len; ++i, ++n) {
      const int64_t pos = in.start_pos + i;
      h_meta_[static_cast<size_t>(meta.tokens + n)] = in.tokens[static_cast<size_t>(i)];
      h_meta_[static_cast<size_t>(meta.positions + n)] = static_cast<int32_t>(pos);
      set_slots(&in, n, pos);
    }
    const int64_t first = in.all_logits ? n - len : in.want_logits ? n - 1 : n;
    for (int64_t i = first; i < n; ++i, ++n_out) h_meta_[static_cast<size_t>(meta.out_rows + n_out)] = static_cast<int32_t>(i);
  }

  TESSERA_CUDA_TRY(api_->set_device(options_.device), "select the CUDA device");
  // Pageable host memory: the copies are staged before the calls return, and h_meta_ is not
  // touched again before the stream synchronization at the end of the step anyway.
  TESSERA_CUDA_LAUNCH(api_->device_memcpy_async(meta_, h_meta_.data(), meta.total * 4, stream_),
                      "upload step metadata");
  TESSERA_CUDA_LAUNCH(api_->device_memcpy_async(slots_, h_slots_.data(), n * 8, stream_), "upload KV slots");
  if (window_slots_)
    TESSERA_CUDA_LAUNCH(api_->device_memcpy_async(window_slots_, h_window_slots_.data(), n * 8, stream_),
                        "upload window-pool KV slots");
  if (out.kind == Output::kSampled) TESSERA_RETURN_IF_ERROR(upload_sampling(n_out, out.penalties));
  TESSERA_RETURN_IF_ERROR(enqueue_forward(n, all_decode));
  count_sparse();
  if (out.logits) out.logits->resize(static_cast<size_t>(n_out * config_.vocab));
  if (out.ids) out.ids->resize(static_cast<size_t>(n_out));
  if (out.sampled) out.sampled->resize(static_cast<size_t>(n_out));
  if (n_out == 0) {
    last_step_.host_micros = micros_since(step_start_);
    TESSERA_CUDA_TRY(api_->stream_synchronize(stream_), "forward step");
  }
  // Logit rows in pieces of at most max_logit_rows (a long prompt with prompt logprobs).
  for (int64_t row0 = 0; row0 < n_out; row0 += options_.max_logit_rows) {
    const int64_t count = std::min(options_.max_logit_rows, n_out - row0);
    TESSERA_RETURN_IF_ERROR(enqueue_lm_head(row0, count, out.kind));
    switch (out.kind) {
      case Output::kGreedy:
        TESSERA_RETURN_IF_ERROR(download_greedy(count, count, out.ids->data() + row0));
        break;
      case Output::kSampled:
        TESSERA_RETURN_IF_ERROR(
            download_sampled(count, out.rows.subspan(static_cast<size_t>(row0)), out.sampled->data() + row0));
        break;
      case Output::kLogits:
        TESSERA_RETURN_IF_ERROR(download_logits(count, count, out.logits->data() + row0 * config_.vocab));
        break;
    }
  }
  last_step_.total_micros = micros_since(step_start_);
  return Status::ok();
}

}  // namespace tessera
