// CudaForward's DecoderBackend ops: the kernels and GEMMs the decoder (decoder/decoder.h) enqueues
// for each layer on the forward stream (embedding, norms, projections, biases, the gated
// activation, the TP all-reduce, RoPE + KV write and paged attention), and the sparse decode
// attention's summary update and block selection.

#include <algorithm>

#include <fmt/format.h>

#include "comm/device_comm.h"
#include "common/check.h"
#include "common/dtype.h"
#include "shard/cuda_forward_internal.h"

namespace tessera {

using cuda_forward_detail::kSplitBelowBlocks;

namespace {

// The kernels' code for the cache's element type (CudaForward accepts fp32 and fp16).
int32_t cuda_kv_dtype(KvDtype t) { return t == KvDtype::kF16 ? TESSERA_CUDA_F16 : TESSERA_CUDA_F32; }

}  // namespace

// ---- the decoder's ops ----

float* CudaForward::act(Act a) const {
  switch (a) {
    case Act::kResidual: return x_;
    case Act::kNormed: return h_;
    case Act::kQ: return q_;
    case Act::kK: return k_;
    case Act::kV: return v_;
    case Act::kAttn: return attn_;
    case Act::kProj: return proj_;
    case Act::kGate: return gate_;
    case Act::kUp: return up_;
  }
  TESSERA_CHECK(false, "unknown activation {}", static_cast<int>(a));
  return nullptr;
}

int64_t CudaForward::act_width(Act a) const {
  const int64_t hd = config_.head_dim;
  switch (a) {
    case Act::kResidual:
    case Act::kNormed:
    case Act::kProj: return config_.hidden;
    case Act::kQ:
    case Act::kAttn: return layout_.n_heads * hd;
    case Act::kK:
    case Act::kV: return layout_.n_kv_heads * hd;
    case Act::kGate:
    case Act::kUp: return layout_.ffn;
  }
  return 0;
}

bool CudaForward::supports(DecoderOp op, QuantType type) const {
  const CudaWeightForm form = quant_traits(type).cuda;
  if (form == CudaWeightForm::kNone) return false;  // the CPU's re-laid layouts never come here
  // The embedding kernel reads f16 tables: F32 / BF16 / GGUF-block tables are expanded to f16 at
  // upload, the formats split into levels and scales (INT8 / INT4) are not.
  if (op == DecoderOp::kEmbed) return form != CudaWeightForm::kRepacked;
  return true;
}

Status CudaForward::embed(int64_t n) {
  TESSERA_CUDA_LAUNCH(api_->embedding(embed_->w, TESSERA_CUDA_F16, config_.vocab, config_.hidden, meta_ + meta_at_.tokens,
                                      n, x_, TESSERA_CUDA_F32, stream_),
                      "embedding");
  return Status::ok();
}

Status CudaForward::scale(Act a, int64_t count, float s) {
  TESSERA_CUDA_LAUNCH(api_->scale_f32(act(a), s, count, stream_), "scale");
  return Status::ok();
}

Status CudaForward::rms_norm(Act in, WeightRef w, Act out, int64_t rows, int64_t dim) {
  const float* weight = vector(w);
  if (weight == nullptr)
    return Status::invalid_argument(fmt::format("CudaForward: layer {} has no {}", w.layer, tensor_role_name(w.tensor)));
  TESSERA_CUDA_LAUNCH(api_->rms_norm_f32(act(in), weight, act(out), rows, dim, decoder_->spec().rms_eps, stream_),
                      w.tensor == Tensor::kQNorm ? "q norm" : w.tensor == Tensor::kKNorm ? "k norm" : "RMSNorm");
  return Status::ok();
}

Status CudaForward::add_rms_norm(Act delta, WeightRef w, int64_t n) {
  TESSERA_CUDA_LAUNCH(
      api_->add_rms_norm_f32(x_, act(delta), vector(w), h_, n, config_.hidden, decoder_->spec().rms_eps, stream_),
      "add + RMSNorm");
  return Status::ok();
}

Status CudaForward::project(Act in, std::span<const Projection> outs, int64_t n) {
  // One f16 copy of the input for every GEMM that reads it.
  TESSERA_CUDA_LAUNCH(api_->convert_f32_to_f16(act(in), act16_, n * act_width(in), stream_), "f32 -> f16");
  for (const Projection& p : outs) TESSERA_RETURN_IF_ERROR(gemm(matrix(p.weight), act16_, act(p.out), n));
  return Status::ok();
}

Status CudaForward::gemm(const Matrix& m, const uint16_t* x16, float* y, int64_t n) {
  // Quantized weights: the register-dequantizing FMA kernels up to kFmaMaxTokens tokens, the
  // tensor-core kernels (weights read once per 64 tokens) up to kTensorCoreMaxTokens, beyond
  // that the matrix expanded to f16 and cuBLAS. (Chosen from the kernels' weight traffic, not
  // yet from measurements on a device.)
  constexpr int64_t kFmaMaxTokens = 8;
  constexpr int64_t kTensorCoreMaxTokens = 256;
  ++last_step_.launches;
  if (m.kind == Matrix::Kind::kGguf) {
    // GGUF blocks: decoded in registers for decode-sized steps; beyond, the matrix expanded
    // to f16 into the scratch buffer (stream-ordered) and cuBLAS.
    // (Messages are formatted only on failure: this runs for every matrix of every step.)
    const int type = static_cast<int>(m.gguf_type);
    if (n <= kFmaMaxTokens) {
      const int rc = api_->gemm_gguf(type, m.w, m.row_bytes, x16, y, m.rows, m.cols, n, stream_);
      return rc == 0 ? Status::ok()
                     : api_->check(rc, fmt::format("{} [{}, {}] block GEMM of {} tokens", quant_name(m.gguf_type),
                                                   m.rows, m.cols, n));
    }
    if (const int rc = api_->dequantize_gguf(type, m.w, m.row_bytes, dequant_, m.rows, m.cols, stream_); rc != 0)
      return api_->check(rc, fmt::format("dequantize a {} [{}, {}] weight matrix", quant_name(m.gguf_type), m.rows,
                                         m.cols));
    ++last_step_.launches;
    return api_->check(api_->gemm_f16(blas_, dequant_, x16, y, m.rows, m.cols, n, stream_), "F16 GEMM");
  }
  const bool quantized = m.kind != Matrix::Kind::kF16;
  if (quantized && n > kFmaMaxTokens && n <= kTensorCoreMaxTokens && (m.kind == Matrix::Kind::kW4 || m.cols % 16 == 0)) {
    if (m.kind == Matrix::Kind::kW8)
      return api_->check(api_->gemm_w8a16_tc(static_cast<const int8_t*>(m.w), static_cast<const float*>(m.scales),
                                             x16, y, m.rows, m.cols, n, stream_),
                         "W8A16 tensor-core GEMM");
    return api_->check(api_->gemm_w4a16_tc(static_cast<const uint8_t*>(m.w), static_cast<const uint16_t*>(m.scales),
                                           static_cast<const uint8_t*>(m.zeros), x16, y, m.rows, m.cols, n, stream_),
                       "W4A16 tensor-core GEMM");
  }
  if (quantized && n > kTensorCoreMaxTokens) {
    // Large step: expand the matrix to f16 once (stream-ordered, so the buffer is free again
    // when the next GEMM's dequantization runs) and use cuBLAS.
    const int rc = m.kind == Matrix::Kind::kW8
                       ? api_->dequantize_w8a16(static_cast<const int8_t*>(m.w), static_cast<const float*>(m.scales),
                                                dequant_, m.rows, m.cols, stream_)
                       : api_->dequantize_w4a16(static_cast<const uint8_t*>(m.w),
                                                static_cast<const uint16_t*>(m.scales),
                                                static_cast<const uint8_t*>(m.zeros), dequant_, m.rows, m.cols, stream_);
    TESSERA_CUDA_TRY(rc, "dequantize a weight matrix");
    ++last_step_.launches;
    return api_->check(api_->gemm_f16(blas_, dequant_, x16, y, m.rows, m.cols, n, stream_), "F16 GEMM");
  }
  switch (m.kind) {
    case Matrix::Kind::kF16:
      return api_->check(api_->gemm_f16(blas_, static_cast<const uint16_t*>(m.w), x16, y, m.rows, m.cols, n, stream_),
                         "F16 GEMM");
    case Matrix::Kind::kW8:
      return api_->check(api_->gemm_w8a16(static_cast<const int8_t*>(m.w), static_cast<const float*>(m.scales), x16,
                                          y, m.rows, m.cols, n, stream_),
                         "W8A16 GEMM");
    case Matrix::Kind::kW4:
      return api_->check(
          api_->gemm_w4a16(static_cast<const uint8_t*>(m.w), static_cast<const uint16_t*>(m.scales),
                           static_cast<const uint8_t*>(m.zeros), x16, y, m.rows, m.cols, n, stream_),
          "W4A16 GEMM");
    case Matrix::Kind::kGguf:
      break;  // handled above
  }
  return Status::internal("CudaForward: unknown matrix kind");
}

Status CudaForward::add_bias(Act a, WeightRef bias, int64_t n, int64_t dim) {
  const float* b = vector(bias);
  if (b == nullptr)
    return Status::invalid_argument(fmt::format("CudaForward: layer {} has no {}", bias.layer, tensor_role_name(bias.tensor)));
  TESSERA_CUDA_LAUNCH(api_->add_bias_f32(act(a), b, n, dim, stream_),
                      bias.tensor == Tensor::kBq ? "q bias" : bias.tensor == Tensor::kBk ? "k bias" : "v bias");
  return Status::ok();
}

Status CudaForward::gated_activation(GluActivation a, int64_t n) {
  switch (a) {
    case GluActivation::kSilu:
      TESSERA_CUDA_LAUNCH(api_->silu_mul_f32(gate_, up_, gate_, n, layout_.ffn, stream_), "SiLU * up");
      return Status::ok();
    case GluActivation::kGeluTanh:
      TESSERA_CUDA_LAUNCH(api_->gelu_tanh_mul_f32(gate_, up_, gate_, n, layout_.ffn, stream_), "GELU * up");
      return Status::ok();
  }
  return Status::internal("unknown activation");
}

Status CudaForward::all_reduce(Act a, int64_t count) {
  if (layout_.tp_size == 1) return Status::ok();
  ++last_step_.launches;
  return comm_->all_reduce_sum(act(a), count);
}

Status CudaForward::attention(int64_t l, const LayerSpec& spec, float scale, int64_t n) {
  const bool all_decode = all_decode_;
  const MetaLayout& meta = meta_at_;
  // A windowed layer with a window pool: its KV, slots and tables are the window pool's.
  const bool windowed = num_window_blocks_ > 0 && window_.layers[static_cast<size_t>(l)];
  const int64_t i = pool_index_[static_cast<size_t>(l)];
  const int64_t layer_bytes = windowed ? window_layer_kv_bytes_ : layer_kv_bytes_;
  uint8_t* k_cache = (windowed ? window_pool_ : kv_pool_) + (2 * i) * layer_bytes;
  uint8_t* v_cache = k_cache + layer_bytes;
  const int32_t kv_dtype = cuda_kv_dtype(options_.kv_dtype);
  const int32_t* tables = meta_ + (windowed ? meta.window_tables : meta.tables);
  const int32_t* seq_lens = meta_ + meta.seq_lens;
  const int32_t* start_pos = meta_ + meta.start_pos;
  const int64_t hd = config_.head_dim;

  TesseraCudaRopeKvArgs rope{};
  rope.q = q_;
  rope.k = k_;
  rope.v = v_;
  rope.positions = meta_ + meta.positions;
  rope.slots = windowed ? window_slots_ : slots_;
  rope.inv_freq = inv_freq_[static_cast<size_t>(spec.rope_table)];
  rope.k_cache = k_cache;
  rope.v_cache = v_cache;
  rope.n_tokens = n;
  rope.n_heads = layout_.n_heads;
  rope.n_kv_heads = layout_.n_kv_heads;
  rope.head_dim = hd;
  rope.block_size = options_.block_size;
  rope.num_blocks = windowed ? num_window_blocks_ : num_blocks_;
  rope.kv_dtype = kv_dtype;
  TESSERA_CUDA_LAUNCH(api_->rope_kv_write_f32(&rope, stream_), "RoPE + KV write");
  if (summary_index_[static_cast<size_t>(l)] >= 0)
    TESSERA_RETURN_IF_ERROR(enqueue_sparse(l, spec, k_cache, n, &tables, &seq_lens, &start_pos));
  ++last_step_.launches;  // the attention kernel below

  if (all_decode) {  // one token per sequence: row s of q is sequence s
    TesseraCudaDecodeAttentionArgs a{};
    a.q = q_;
    a.out = attn_;
    a.k_cache = k_cache;
    a.v_cache = v_cache;
    a.block_tables = tables;
    a.seq_lens = seq_lens;
    a.n_seqs = n_seqs_;
    a.n_heads = layout_.n_heads;
    a.n_kv_heads = layout_.n_kv_heads;
    a.head_dim = hd;
    a.block_size = options_.block_size;
    a.max_blocks_per_seq = table_stride_;
    a.scale = scale;
    a.sliding_window = spec.sliding_window;
    a.kv_dtype = kv_dtype;
    // Few (sequence, head) blocks for the device: split every sequence's keys over several
    // blocks (flash-decoding), so a long context at a small batch still fills the GPU.
    if (decode_splits_ > 1 && n_seqs_ * layout_.n_heads < kSplitBelowBlocks) {
      a.n_splits = decode_splits_;
      a.split_keys = decode_split_keys_;
      a.partial = decode_partial_;
      ++last_step_.launches;  // the merge kernel
    }
    return api_->check(api_->paged_decode_attention_f32(&a, stream_), "paged decode attention");
  }
  TesseraCudaPrefillAttentionArgs a{};
  a.q = q_;
  a.out = attn_;
  a.k_cache = k_cache;
  a.v_cache = v_cache;
  a.block_tables = tables;
  a.query_begin = meta_ + meta.query_begin;
  a.query_len = meta_ + meta.query_len;
  a.start_pos = start_pos;
  a.n_seqs = n_seqs_;
  // A graph's grid holds every row of its bucket; each sequence reads its own query count.
  a.max_query_len = graph_query_len_;
  for (int64_t s = 0; s < n_seqs_ && graph_query_len_ == 0; ++s)
    a.max_query_len = std::max<int64_t>(a.max_query_len, h_meta_[static_cast<size_t>(meta.query_len + s)]);
  a.n_heads = layout_.n_heads;
  a.n_kv_heads = layout_.n_kv_heads;
  a.head_dim = hd;
  a.block_size = options_.block_size;
  a.max_blocks_per_seq = table_stride_;
  a.scale = scale;
  a.sliding_window = spec.sliding_window;
  a.kv_dtype = kv_dtype;
  return api_->check(api_->paged_prefill_attention_f32(&a, stream_), "paged prefill attention");
}

// Sparse decode attention (options.sparse, kernels/sparse_attention.h; kernels in
// kernels/cuda/sparse_attention.cu): after each RoPE + KV write of a summarized layer the key
// summaries of the blocks written are recomputed on the device. In a layer with no sliding
// window, when some piece of the step is one decode token at position p with p + 1 >=
// sparse.threshold_tokens, the device scores that sequence's blocks (the Quest bound, max over
// this rank's query heads), at TP > 1 all-gathers the scores so every rank selects with the max
// over all heads (the same blocks everywhere, bit-exact), selects sink + top + recent blocks
// and writes compacted block tables and positions, which the unchanged decode / prefill
// attention kernels read for every sequence of the step (other sequences' rows are copied
// as they are). Everything stays on the device (no host sync), so graphed decode steps hold
// it; a graph's key says whether the step has such a piece (a step without one runs the dense
// graph, with no sparse work). The result equals the CPU's ForwardPass with the same config
// (set_sparse_attention) up to the forward passes' own rounding differences, and the dense
// result exactly when the selection covers every block.

Status CudaForward::enqueue_sparse(int64_t l, const LayerSpec& spec, const void* k_cache, int64_t n,
                                   const int32_t** tables, const int32_t** seq_lens, const int32_t** start_pos) {
  const int64_t row = layout_.n_kv_heads * config_.head_dim;
  float* kmin = summaries_ + 2 * summary_index_[static_cast<size_t>(l)] * num_blocks_ * row;
  float* kmax = kmin + num_blocks_ * row;
  const int32_t kv_dtype = cuda_kv_dtype(options_.kv_dtype);
  TesseraCudaKvSummaryArgs u{};
  u.k_cache = k_cache;
  u.kmin = kmin;
  u.kmax = kmax;
  u.slots = slots_;
  u.n_tokens = n;
  u.n_kv_heads = layout_.n_kv_heads;
  u.head_dim = config_.head_dim;
  u.block_size = options_.block_size;
  u.num_blocks = num_blocks_;
  u.kv_dtype = kv_dtype;
  TESSERA_CUDA_LAUNCH(api_->kv_summary_update_f32(&u, stream_), "key summary update");
  if (!sparse_step_ || spec.sliding_window != 0) return Status::ok();

  // Scores -> (TP > 1: all-gather, the max over every rank's heads) -> selection into the
  // compacted arrays at fixed offsets of sparse_meta_ (a graph replays the same pointers).
  const MetaLayout& meta = meta_at_;
  const int64_t cells = options_.max_seqs_per_step * max_table_blocks_;
  const SparseAttentionConfig& sp = options_.sparse;
  TesseraCudaSparseArgs a{};
  a.q = q_;
  a.kmin = kmin;
  a.kmax = kmax;
  a.block_tables = *tables;
  a.query_begin = meta_ + meta.query_begin;
  a.query_len = meta_ + meta.query_len;
  a.seq_lens = *seq_lens;
  a.scores = sparse_scores_;
  a.gathered_scores = sparse_gathered_;
  a.compact_tables = sparse_meta_;
  a.compact_seq_lens = sparse_meta_ + cells;
  a.compact_start_pos = sparse_meta_ + cells + options_.max_seqs_per_step;
  a.n_seqs = n_seqs_;
  a.n_heads = layout_.n_heads;
  a.n_kv_heads = layout_.n_kv_heads;
  a.head_dim = config_.head_dim;
  a.block_size = options_.block_size;
  a.max_blocks_per_seq = table_stride_;
  a.num_blocks = num_blocks_;
  a.n_ranks = layout_.tp_size;
  a.threshold_tokens = sp.threshold_tokens;
  a.sink_blocks = sp.select.sink_blocks;
  a.recent_blocks = sp.select.recent_blocks;
  a.top_blocks = sp.select.top_blocks;
  TESSERA_CUDA_LAUNCH(api_->sparse_block_scores_f32(&a, stream_), "sparse attention block scores");
  if (layout_.tp_size > 1) {
    ++last_step_.launches;
    TESSERA_RETURN_IF_ERROR(comm_->all_gather(sparse_scores_, sparse_gathered_, n_seqs_ * table_stride_ * 4));
  }
  TESSERA_CUDA_LAUNCH(api_->sparse_select_blocks(&a, stream_), "sparse attention block selection");
  *tables = a.compact_tables;
  *seq_lens = a.compact_seq_lens;
  *start_pos = a.compact_start_pos;
  return Status::ok();
}

void CudaForward::plan_sparse(std::span<const SequenceInput> batch) {
  sparse_step_ = false;
  step_sparse_ = step_dense_ = 0;
  if (n_sparse_layers_ == 0) return;
  const SparseAttentionConfig& sp = options_.sparse;
  const int64_t budget = sp.select.sink_blocks + sp.select.recent_blocks + sp.select.top_blocks;
  for (const SequenceInput& in : batch) {
    if (in.tokens.size() != 1) continue;  // only decode pieces select (as ForwardPass)
    if (in.start_pos + 1 < sp.threshold_tokens) {
      ++step_dense_;
      continue;
    }
    ++step_sparse_;
    // The selection kernels run only when some sequence has more blocks than the selection.
    sparse_step_ = sparse_step_ || in.start_pos / options_.block_size + 1 > budget;
  }
}

void CudaForward::count_sparse() {
  sparse_attentions_ += step_sparse_ * static_cast<uint64_t>(n_sparse_layers_);
  dense_global_decodes_ += step_dense_ * static_cast<uint64_t>(n_sparse_layers_);
}

}  // namespace tessera
