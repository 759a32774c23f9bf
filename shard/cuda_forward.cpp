#include "shard/cuda_forward.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <tuple>
#include <unordered_map>

#include "comm/device_comm.h"
#include "comm/nccl_comm.h"
#include "common/check.h"
#include "common/dtype.h"
#include "kernels/cuda/cuda_loader.h"
#include "kernels/quant.h"
#include "kernels/rope.h"

namespace tessera {

// A weight matrix on the device, [rows, cols] row-major in one of four forms.
struct CudaForward::Matrix {
  enum class Kind { kF16, kW8, kW4, kGguf };
  Kind kind = Kind::kF16;
  int64_t rows = 0, cols = 0;
  // f16 [rows, cols] | int8 [rows, cols] | uint8 [rows, cols / 2] | GGUF: the file's blocks,
  // row r at r * row_bytes
  void* w = nullptr;
  void* scales = nullptr;  // W8: fp32 [rows]; W4: f16 [rows, cols / 128]
  void* zeros = nullptr;   // W4: uint8 [rows, cols / 128]
  QuantType gguf_type = QuantType::kF16;  // GGUF: the block type (tessera_cuda_gemm_gguf's `type`)
  int64_t row_bytes = 0;                  // GGUF: bytes of one row's blocks
  int64_t bytes = 0;
};

struct CudaForward::Layer {
  float* attn_norm = nullptr;
  float* ffn_norm = nullptr;
  float *post_attn_norm = nullptr, *post_ffn_norm = nullptr;
  float *bq = nullptr, *bk = nullptr, *bv = nullptr;
  float *q_norm = nullptr, *k_norm = nullptr;
  Matrix wq, wk, wv, wo, w_gate, w_up, w_down;
};

namespace {

// Split decode attention: pieces of about kSplitKeys keys, at most kMaxSplits of them, used
// while a step has fewer than kSplitBelowBlocks (sequence, head) pairs.
constexpr int64_t kSplitKeys = 512;
constexpr int64_t kMaxSplits = 32;
constexpr int64_t kSplitBelowBlocks = 1024;

// Rows converted per host staging pass (bounds host memory during upload).
constexpr int64_t kStagingBytes = int64_t{64} << 20;

#define TESSERA_CUDA_TRY(call, what) TESSERA_RETURN_IF_ERROR(api_->check((call), (what)))
// The same for a call that enqueues work on the stream (counted in last_step_.launches).
#define TESSERA_CUDA_LAUNCH(call, what) \
  do {                                  \
    ++last_step_.launches;              \
    TESSERA_CUDA_TRY(call, what);       \
  } while (0)

double micros_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

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
  if (options.kv_dtype != KvDtype::kF32 && options.kv_dtype != KvDtype::kF16)
    return Status::unimplemented(fmt::format("CudaForward: a KV cache of {}: the CUDA kernels store fp32 or fp16",
                                             kv_dtype_name(options.kv_dtype)));
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

// ---- weights ----

namespace {

// GGUF block types the device kernels read as stored (kernels/cuda/gguf_gemm.cu); other
// block types are expanded to f16 at upload. The format table says which (common/dtype.h).
bool gguf_on_device(QuantType t) { return quant_traits(t).cuda == CudaWeightForm::kBlocks; }

// tessera_cuda_gemm_gguf's `type` is a QuantType value (kernels/cuda/cuda_api.h keeps a C copy).
static_assert(TESSERA_CUDA_GGUF_Q8_0 == static_cast<int>(QuantType::kQ8_0) &&
                  TESSERA_CUDA_GGUF_Q4_0 == static_cast<int>(QuantType::kQ4_0) &&
                  TESSERA_CUDA_GGUF_Q5_0 == static_cast<int>(QuantType::kQ5_0) &&
                  TESSERA_CUDA_GGUF_Q4_K == static_cast<int>(QuantType::kQ4_K) &&
                  TESSERA_CUDA_GGUF_Q5_K == static_cast<int>(QuantType::kQ5_K) &&
                  TESSERA_CUDA_GGUF_Q6_K == static_cast<int>(QuantType::kQ6_K) &&
                  TESSERA_CUDA_GGUF_Q2_K == static_cast<int>(QuantType::kQ2_K) &&
                  TESSERA_CUDA_GGUF_Q3_K == static_cast<int>(QuantType::kQ3_K) &&
                  TESSERA_CUDA_GGUF_TQ1_0 == static_cast<int>(QuantType::kTQ1_0) &&
                  TESSERA_CUDA_GGUF_TQ2_0 == static_cast<int>(QuantType::kTQ2_0),
              "the TESSERA_CUDA_GGUF_* values of cuda_api.h are tessera::QuantType's values");

// Converts rows [r0, r0 + n) of a float or GGUF-block matrix to f16.
void rows_to_f16(const TensorView& v, int64_t r0, int64_t n, std::vector<float>& tmp, uint16_t* dst) {
  const int64_t cols = v.cols();
  tmp.resize(static_cast<size_t>(cols));
  for (int64_t r = 0; r < n; ++r) {
    dequantize_row(v.type, v.row_ptr(r0 + r), tmp.data(), cols);
    for (int64_t c = 0; c < cols; ++c) dst[r * cols + c] = f32_to_fp16(tmp[static_cast<size_t>(c)]);
  }
}

}  // namespace

Status CudaForward::upload_weights(const ModelWeights& weights) {
  // Uploads one matrix; chunks of rows are converted on the host into `staging` and copied
  // (tessera_cuda_memcpy is synchronous, so the staging buffer is reused right away).
  std::vector<uint8_t> staging;
  std::vector<float> tmp;
  // keep_blocks: GGUF block matrices stay in their blocks (every matrix but the embedding,
  // whose kernel reads f16 / f32 tables).
  auto upload_matrix = [&](const TensorView& v, const std::string& name, Matrix* m, bool keep_blocks) -> Status {
    if (!v.data || v.ndim != 2)
      return Status::invalid_argument(fmt::format("CudaForward: {} is missing or not a matrix", name));
    m->rows = v.rows();
    m->cols = v.cols();
    const int64_t rows = m->rows, cols = m->cols;
    const QuantType type = v.type;
    if (type == QuantType::kI8_CH) {
      m->kind = Matrix::Kind::kW8;
      TESSERA_ASSIGN_OR_RETURN(m->w, device_alloc(rows * cols, name.c_str()));
      TESSERA_ASSIGN_OR_RETURN(m->scales, device_alloc(rows * 4, name.c_str()));
      std::vector<float> scales(static_cast<size_t>(rows));
      const int64_t chunk = std::max<int64_t>(1, kStagingBytes / std::max<int64_t>(cols, 1));
      for (int64_t r0 = 0; r0 < rows; r0 += chunk) {
        const int64_t n = std::min(chunk, rows - r0);
        staging.resize(static_cast<size_t>(n * cols));
        for (int64_t r = 0; r < n; ++r) {
          const uint8_t* row = v.row_ptr(r0 + r);
          std::memcpy(&staging[static_cast<size_t>(r * cols)], row, static_cast<size_t>(cols));
          std::memcpy(&scales[static_cast<size_t>(r0 + r)], row + cols, 4);  // the fp32 row trailer
        }
        TESSERA_CUDA_TRY(api_->device_memcpy(static_cast<int8_t*>(m->w) + r0 * cols, staging.data(), n * cols),
                         "upload " + name);
      }
      TESSERA_CUDA_TRY(api_->device_memcpy(m->scales, scales.data(), rows * 4), "upload " + name + " scales");
      m->bytes = rows * cols + rows * 4;
    } else if (type == QuantType::kI4_G128) {
      m->kind = Matrix::Kind::kW4;
      const int64_t groups = cols / kInt4Group;
      TESSERA_ASSIGN_OR_RETURN(m->w, device_alloc(rows * cols / 2, name.c_str()));
      TESSERA_ASSIGN_OR_RETURN(m->scales, device_alloc(rows * groups * 2, name.c_str()));
      TESSERA_ASSIGN_OR_RETURN(m->zeros, device_alloc(rows * groups, name.c_str()));
      std::vector<uint16_t> scales(static_cast<size_t>(rows * groups));
      std::vector<uint8_t> zeros(static_cast<size_t>(rows * groups));
      const int64_t chunk = std::max<int64_t>(1, kStagingBytes / std::max<int64_t>(cols / 2, 1));
      Int4Group g;
      for (int64_t r0 = 0; r0 < rows; r0 += chunk) {
        const int64_t n = std::min(chunk, rows - r0);
        staging.assign(static_cast<size_t>(n * cols / 2), 0);
        for (int64_t r = 0; r < n; ++r) {
          const uint8_t* row = v.row_ptr(r0 + r);
          for (int64_t gi = 0; gi < groups; ++gi) {
            unpack_int4_group(row + gi * quant_traits(type).block_bytes, &g);
            scales[static_cast<size_t>((r0 + r) * groups + gi)] = g.scale_fp16;
            zeros[static_cast<size_t>((r0 + r) * groups + gi)] = g.zero;
            for (int64_t e = 0; e < kInt4Group; e += 2) {  // elements 2b, 2b + 1 share byte b
              const int64_t c = gi * kInt4Group + e;
              staging[static_cast<size_t>(r * cols / 2 + c / 2)] =
                  static_cast<uint8_t>((g.levels[e] & 15) | ((g.levels[e + 1] & 15) << 4));
            }
          }
        }
        TESSERA_CUDA_TRY(api_->device_memcpy(static_cast<uint8_t*>(m->w) + r0 * cols / 2, staging.data(),
                                             n * cols / 2),
                         "upload " + name);
      }
      TESSERA_CUDA_TRY(api_->device_memcpy(m->scales, scales.data(), rows * groups * 2), "upload " + name);
      TESSERA_CUDA_TRY(api_->device_memcpy(m->zeros, zeros.data(), rows * groups), "upload " + name);
      m->bytes = rows * cols / 2 + rows * groups * 3;
    } else if (keep_blocks && gguf_on_device(type)) {
      // The file's blocks as they are (a TP slice's rows are contiguous, row_ptr(r) apart).
      m->kind = Matrix::Kind::kGguf;
      m->gguf_type = type;
      m->row_bytes = static_cast<int64_t>(row_bytes(type, cols));
      TESSERA_ASSIGN_OR_RETURN(m->w, device_alloc(rows * m->row_bytes, name.c_str()));
      const int64_t chunk = std::max<int64_t>(1, kStagingBytes / std::max<int64_t>(m->row_bytes, 1));
      for (int64_t r0 = 0; r0 < rows; r0 += chunk) {
        const int64_t n = std::min(chunk, rows - r0);
        staging.resize(static_cast<size_t>(n * m->row_bytes));
        for (int64_t r = 0; r < n; ++r)
          std::memcpy(&staging[static_cast<size_t>(r * m->row_bytes)], v.row_ptr(r0 + r),
                      static_cast<size_t>(m->row_bytes));
        TESSERA_CUDA_TRY(api_->device_memcpy(static_cast<uint8_t*>(m->w) + r0 * m->row_bytes, staging.data(),
                                             n * m->row_bytes),
                         "upload " + name);
      }
      m->bytes = rows * m->row_bytes;
    } else {
      // F16 as stored; F32, BF16 and the other GGUF block types (and a GGUF embedding)
      // dequantized to f16 on the host.
      m->kind = Matrix::Kind::kF16;
      TESSERA_ASSIGN_OR_RETURN(m->w, device_alloc(rows * cols * 2, name.c_str()));
      auto* dst = static_cast<uint16_t*>(m->w);
      if (type == QuantType::kF16) {
        TESSERA_CUDA_TRY(api_->device_memcpy(dst, v.data, rows * cols * 2), "upload " + name);
      } else {
        const int64_t chunk = std::max<int64_t>(1, kStagingBytes / std::max<int64_t>(cols * 2, 1));
        for (int64_t r0 = 0; r0 < rows; r0 += chunk) {
          const int64_t n = std::min(chunk, rows - r0);
          staging.resize(static_cast<size_t>(n * cols * 2));
          rows_to_f16(v, r0, n, tmp, reinterpret_cast<uint16_t*>(staging.data()));
          TESSERA_CUDA_TRY(api_->device_memcpy(dst + r0 * cols, staging.data(), n * cols * 2), "upload " + name);
        }
      }
      m->bytes = rows * cols * 2;
    }
    weight_bytes_ += m->bytes;
    if (m->kind != Matrix::Kind::kF16) dequant_elems_ = std::max(dequant_elems_, rows * cols);
    return Status::ok();
  };
  // Vectors (norms, biases) are F32 after binding; null stays null.
  auto upload_vector = [&](const TensorView& v, int64_t expect, const std::string& name, float** out) -> Status {
    *out = nullptr;
    if (!v.data) return Status::ok();
    if (v.type != QuantType::kF32 || v.numel() != expect)
      return Status::invalid_argument(fmt::format("CudaForward: {} is {} {}, expected F32 [{}]", name,
                                                  quant_name(v.type), v.shape_string(), expect));
    void* p = nullptr;
    TESSERA_ASSIGN_OR_RETURN(p, device_alloc(expect * 4, name.c_str()));
    TESSERA_CUDA_TRY(api_->device_memcpy(p, v.data, expect * 4), "upload " + name);
    weight_bytes_ += expect * 4;
    *out = static_cast<float*>(p);
    return Status::ok();
  };

  const int64_t hd = config_.head_dim, hidden = config_.hidden;
  embed_ = std::make_unique<Matrix>();
  TESSERA_RETURN_IF_ERROR(upload_matrix(weights.embed, "model.embed_tokens.weight", embed_.get(), false));
  TESSERA_CHECK(embed_->kind == Matrix::Kind::kF16, "supports(kEmbed) let a quantized embedding through");
  const bool tied = weights.lm_head.data == weights.embed.data && weights.lm_head.type == weights.embed.type &&
                    weights.lm_head.rows() == weights.embed.rows();
  if (tied) {
    lm_head_ = embed_.get();
  } else {
    lm_head_own_ = std::make_unique<Matrix>();
    TESSERA_RETURN_IF_ERROR(upload_matrix(weights.lm_head, "lm_head.weight", lm_head_own_.get(), true));
    lm_head_ = lm_head_own_.get();
  }
  step_weight_bytes_ = lm_head_->bytes;
  TESSERA_RETURN_IF_ERROR(upload_vector(weights.final_norm, hidden, "model.norm.weight", &final_norm_));
  if (!final_norm_) return Status::invalid_argument("CudaForward: model.norm.weight is missing");
  const int64_t q_dim = layout_.n_heads * hd, kv_dim = layout_.n_kv_heads * hd;
  layers_.resize(weights.layers.size());
  for (size_t i = 0; i < weights.layers.size(); ++i) {
    const LayerWeights& w = weights.layers[i];
    Layer& d = layers_[i];
    const std::string p = "model.layers." + std::to_string(i);
    TESSERA_RETURN_IF_ERROR(upload_vector(w.attn_norm, hidden, p + ".input_layernorm.weight", &d.attn_norm));
    TESSERA_RETURN_IF_ERROR(upload_vector(w.ffn_norm, hidden, p + ".post_attention_layernorm.weight", &d.ffn_norm));
    if (!d.attn_norm || !d.ffn_norm) return Status::invalid_argument("CudaForward: " + p + " lacks a norm weight");
    TESSERA_RETURN_IF_ERROR(upload_vector(w.post_attn_norm, hidden, p + ".post_attention_norm.weight", &d.post_attn_norm));
    TESSERA_RETURN_IF_ERROR(upload_vector(w.post_ffn_norm, hidden, p + ".post_feedforward_norm.weight", &d.post_ffn_norm));
    TESSERA_RETURN_IF_ERROR(upload_vector(w.bq, q_dim, p + ".self_attn.q_proj.bias", &d.bq));
    TESSERA_RETURN_IF_ERROR(upload_vector(w.bk, kv_dim, p + ".self_attn.k_proj.bias", &d.bk));
    TESSERA_RETURN_IF_ERROR(upload_vector(w.bv, kv_dim, p + ".self_attn.v_proj.bias", &d.bv));
    TESSERA_RETURN_IF_ERROR(upload_vector(w.q_norm, hd, p + ".self_attn.q_norm.weight", &d.q_norm));
    TESSERA_RETURN_IF_ERROR(upload_vector(w.k_norm, hd, p + ".self_attn.k_norm.weight", &d.k_norm));
    TESSERA_RETURN_IF_ERROR(upload_matrix(w.wq, p + ".self_attn.q_proj.weight", &d.wq, true));
    TESSERA_RETURN_IF_ERROR(upload_matrix(w.wk, p + ".self_attn.k_proj.weight", &d.wk, true));
    TESSERA_RETURN_IF_ERROR(upload_matrix(w.wv, p + ".self_attn.v_proj.weight", &d.wv, true));
    TESSERA_RETURN_IF_ERROR(upload_matrix(w.wo, p + ".self_attn.o_proj.weight", &d.wo, true));
    TESSERA_RETURN_IF_ERROR(upload_matrix(w.w_gate, p + ".mlp.gate_proj.weight", &d.w_gate, true));
    TESSERA_RETURN_IF_ERROR(upload_matrix(w.w_up, p + ".mlp.up_proj.weight", &d.w_up, true));
    TESSERA_RETURN_IF_ERROR(upload_matrix(w.w_down, p + ".mlp.down_proj.weight", &d.w_down, true));
    const struct { const Matrix* m; int64_t rows, cols; } shapes[] = {
        {&d.wq, q_dim, hidden}, {&d.wk, kv_dim, hidden}, {&d.wv, kv_dim, hidden}, {&d.wo, hidden, q_dim},
        {&d.w_gate, layout_.ffn, hidden}, {&d.w_up, layout_.ffn, hidden}, {&d.w_down, hidden, layout_.ffn}};
    for (const auto& s : shapes) {
      if (s.m->rows != s.rows || s.m->cols != s.cols)
        return Status::invalid_argument(fmt::format("CudaForward: {} has shape [{}, {}], the layout expects [{}, {}]",
                                                    p, s.m->rows, s.m->cols, s.rows, s.cols));
      step_weight_bytes_ += s.m->bytes;
    }
  }
  for (const std::vector<float>& table : decoder_->spec().rope_inv_freq) {
    void* p = nullptr;
    TESSERA_ASSIGN_OR_RETURN(p, device_alloc(static_cast<int64_t>(table.size()) * 4, "RoPE frequencies"));
    TESSERA_CUDA_TRY(api_->device_memcpy(p, table.data(), static_cast<int64_t>(table.size()) * 4),
                     "upload RoPE frequencies");
    inv_freq_.push_back(static_cast<float*>(p));
  }
  return Status::ok();
}

// ---- workspace and KV pool ----

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

// The kernels' code for the cache's element type (CudaForward accepts fp32 and fp16).
int32_t cuda_kv_dtype(KvDtype t) { return t == KvDtype::kF16 ? TESSERA_CUDA_F16 : TESSERA_CUDA_F32; }

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

Status CudaForward::download_logits(int64_t n_rows, int64_t n_real, float* out) {
  // n_rows logit rows were computed (a graphed step's padded bucket); the first n_real go to
  // out [n_real, vocab].
  const int64_t vocab = config_.vocab;
  if (layout_.tp_size == 1) {
    ++last_step_.launches;
    TESSERA_CUDA_TRY(api_->device_memcpy_async(out, logits_, n_real * vocab * 4, stream_), "copy logits");
    last_step_.host_micros = micros_since(step_start_);
    TESSERA_CUDA_TRY(api_->stream_synchronize(stream_), "forward step");
    return Status::ok();
  }
  // Each rank's chunk of n_rows * per floats holds its [n_rows, count_r] logits packed at the
  // front (count_r <= per; the rest is unused), gathered as [rank][chunk].
  const int64_t per = layout_.vocab_per_rank;
  h_gathered_.resize(static_cast<size_t>(layout_.tp_size * n_rows * per));
  ++last_step_.launches;
  TESSERA_CUDA_TRY(
      api_->device_memcpy_async(h_gathered_.data(), gathered_, layout_.tp_size * n_rows * per * 4, stream_),
      "copy gathered logits");
  last_step_.host_micros = micros_since(step_start_);
  TESSERA_CUDA_TRY(api_->stream_synchronize(stream_), "forward step");
  for (int r = 0; r < layout_.tp_size; ++r) {
    const int64_t begin = std::min<int64_t>(vocab, per * r);
    const int64_t count = std::min<int64_t>(vocab, begin + per) - begin;
    const float* chunk = &h_gathered_[static_cast<size_t>(r * n_rows * per)];
    for (int64_t t = 0; t < n_real; ++t) std::copy_n(chunk + t * count, count, out + t * vocab + begin);
  }
  return Status::ok();
}

Status CudaForward::enqueue_forward(int64_t n, bool all_decode) {
  all_decode_ = all_decode;
  return decoder_->forward(*this, n);
}

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

const CudaForward::Matrix& CudaForward::matrix(WeightRef r) const {
  if (r.layer == WeightRef::kModel) {
    if (r.tensor == Tensor::kEmbed) return *embed_;
    if (r.tensor == Tensor::kLmHead) return *lm_head_;
    TESSERA_CHECK(false, "{} is not a model matrix", tensor_role_name(r.tensor));
  }
  const Layer& w = layers_[static_cast<size_t>(r.layer)];
  switch (r.tensor) {
    case Tensor::kWq: return w.wq;
    case Tensor::kWk: return w.wk;
    case Tensor::kWv: return w.wv;
    case Tensor::kWo: return w.wo;
    case Tensor::kWGate: return w.w_gate;
    case Tensor::kWUp: return w.w_up;
    case Tensor::kWDown: return w.w_down;
    default: break;
  }
  TESSERA_CHECK(false, "{} is not a layer matrix", tensor_role_name(r.tensor));
  return *embed_;
}

const float* CudaForward::vector(WeightRef r) const {
  if (r.layer == WeightRef::kModel) {
    TESSERA_CHECK(r.tensor == Tensor::kFinalNorm, "{} is not a model vector", tensor_role_name(r.tensor));
    return final_norm_;
  }
  const Layer& w = layers_[static_cast<size_t>(r.layer)];
  switch (r.tensor) {
    case Tensor::kAttnNorm: return w.attn_norm;
    case Tensor::kBq: return w.bq;
    case Tensor::kBk: return w.bk;
    case Tensor::kBv: return w.bv;
    case Tensor::kQNorm: return w.q_norm;
    case Tensor::kKNorm: return w.k_norm;
    case Tensor::kPostAttnNorm: return w.post_attn_norm;
    case Tensor::kFfnNorm: return w.ffn_norm;
    case Tensor::kPostFfnNorm: return w.post_ffn_norm;
    default: break;
  }
  TESSERA_CHECK(false, "{} is not a layer vector", tensor_role_name(r.tensor));
  return nullptr;
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

Status CudaForward::enqueue_lm_head(int64_t row0, int64_t count, Output kind) {
  // The final-normed rows out_rows[row0 .. row0 + count) -> proj_ -> f16 -> LM head; count <=
  // max_logit_rows. Then, by output kind:
  //  * logits: the all-gather at TP > 1;
  //  * greedy: each row's argmax over this rank's vocabulary slice with its value, gathered from
  //    every rank (8 bytes a row);
  //  * sampled: the full logits (unsharded from the all-gather at TP > 1) sampled on the device
  //    with the parameters of rows row0 .. row0 + count.
  const MetaLayout& meta = meta_at_;
  const int64_t hidden = config_.hidden;
  TESSERA_CUDA_LAUNCH(api_->gather_rows_f32(h_, meta_ + meta.out_rows + row0, proj_, count, hidden, stream_),
                      "gather rows");
  TESSERA_CUDA_LAUNCH(api_->convert_f32_to_f16(proj_, act16_, count * hidden, stream_), "f32 -> f16");
  TESSERA_RETURN_IF_ERROR(gemm(*lm_head_, act16_, logits_, count));  // [count, local] packed
  if (kind == Output::kGreedy) {
    const int64_t first_id = std::min<int64_t>(config_.vocab, layout_.vocab_per_rank * layout_.tp_rank);
    auto* values = reinterpret_cast<float*>(greedy_ + count);  // [ids | values] of this rank
    TESSERA_CUDA_LAUNCH(api_->argmax_value_f32(logits_, count, lm_head_->rows, static_cast<int32_t>(first_id), greedy_,
                                               values, stream_),
                        "greedy argmax");
    if (layout_.tp_size > 1) {
      ++last_step_.launches;
      TESSERA_RETURN_IF_ERROR(comm_->all_gather(greedy_, greedy_gathered_, count * 8));
    }
    return Status::ok();
  }
  if (layout_.tp_size > 1) {
    ++last_step_.launches;
    TESSERA_RETURN_IF_ERROR(comm_->all_gather(logits_, gathered_, count * layout_.vocab_per_rank * 4));
  }
  if (kind == Output::kSampled) {
    float* full = logits_;
    if (layout_.tp_size > 1) {
      full = full_logits_;
      TESSERA_CUDA_LAUNCH(api_->unshard_logits_f32(gathered_, count, config_.vocab, layout_.vocab_per_rank,
                                                   layout_.tp_size, full, stream_),
                          "unshard logits");
    }
    const int64_t R = options_.max_logit_rows;
    TesseraCudaSampleArgs a{};
    a.logits = full;
    a.scratch = sample_scratch_;
    a.rows = sample_rows_ + row0;
    a.penalties = penalties_;
    a.n_rows = count;
    a.vocab = config_.vocab;
    a.ids = sampled_;
    a.logprobs = reinterpret_cast<float*>(sampled_ + R);
    a.top_ids = sampled_ + 2 * R;
    a.top_logprobs = reinterpret_cast<float*>(sampled_ + 2 * R + R * TESSERA_CUDA_MAX_TOP_LOGPROBS);
    TESSERA_CUDA_LAUNCH(api_->sample_f32(&a, stream_), "sampling");
  }
  return Status::ok();
}

Status CudaForward::download_greedy(int64_t n_rows, int64_t n_real, int32_t* out) {
  // Per rank [ids (n_rows) | values (n_rows)]; the larger value wins, then the lower id (the
  // single-device argmax's choice; ranks hold increasing id ranges).
  const int64_t ranks = layout_.tp_size;
  const int32_t* src = ranks > 1 ? greedy_gathered_ : greedy_;
  h_greedy_.resize(static_cast<size_t>(ranks * 2 * n_rows));
  ++last_step_.launches;
  TESSERA_CUDA_TRY(api_->device_memcpy_async(h_greedy_.data(), src, ranks * 2 * n_rows * 4, stream_), "copy token ids");
  last_step_.host_micros = micros_since(step_start_);
  TESSERA_CUDA_TRY(api_->stream_synchronize(stream_), "forward step");
  for (int64_t t = 0; t < n_real; ++t) {
    int32_t best_id = h_greedy_[static_cast<size_t>(t)];
    float best_v = 0.0f;
    std::memcpy(&best_v, &h_greedy_[static_cast<size_t>(n_rows + t)], 4);
    for (int64_t r = 1; r < ranks; ++r) {
      const int32_t id = h_greedy_[static_cast<size_t>(r * 2 * n_rows + t)];
      float v = 0.0f;
      std::memcpy(&v, &h_greedy_[static_cast<size_t>(r * 2 * n_rows + n_rows + t)], 4);
      if (v > best_v || (v == best_v && id < best_id)) {
        best_v = v;
        best_id = id;
      }
    }
    out[t] = best_id;
  }
  return Status::ok();
}

Status CudaForward::download_sampled(int64_t n_real, std::span<const TesseraCudaSampleRow> rows, SampledToken* out) {
  // sampled_ = [ids (R) | logprobs (R) | top ids (R x MAX) | top logprobs (R x MAX)]; the first
  // n_real rows of each part come back (the top parts only when a row asked for them).
  const int64_t R = options_.max_logit_rows, top = TESSERA_CUDA_MAX_TOP_LOGPROBS;
  bool tops = false;
  for (int64_t t = 0; t < n_real; ++t) tops = tops || rows[static_cast<size_t>(t)].n_logprobs > 0;
  h_sampled_.resize(static_cast<size_t>(2 * R + 2 * R * top));
  ++last_step_.launches;
  TESSERA_CUDA_TRY(api_->device_memcpy_async(h_sampled_.data(), sampled_, (R + n_real) * 4, stream_),
                   "copy sampled tokens");
  if (tops) {
    ++last_step_.launches;
    TESSERA_CUDA_TRY(
        api_->device_memcpy_async(h_sampled_.data() + 2 * R, sampled_ + 2 * R, (R * top + n_real * top) * 4, stream_),
        "copy top logprobs");
  }
  last_step_.host_micros = micros_since(step_start_);
  TESSERA_CUDA_TRY(api_->stream_synchronize(stream_), "forward step");
  auto as_float = [](int32_t bits) {
    float f = 0.0f;
    std::memcpy(&f, &bits, 4);
    return f;
  };
  for (int64_t t = 0; t < n_real; ++t) {
    SampledToken& o = out[t];
    const TesseraCudaSampleRow& row = rows[static_cast<size_t>(t)];
    o.id = h_sampled_[static_cast<size_t>(t)];
    o.logprob = as_float(h_sampled_[static_cast<size_t>(R + t)]);
    o.top_logprobs.clear();
    const int64_t n_top = std::clamp<int64_t>(std::min<int64_t>(row.n_logprobs, config_.vocab), 0, top);
    for (int64_t j = 0; j < n_top; ++j)
      o.top_logprobs.emplace_back(h_sampled_[static_cast<size_t>(2 * R + t * top + j)],
                                  as_float(h_sampled_[static_cast<size_t>(2 * R + R * top + t * top + j)]));
  }
  return Status::ok();
}

void CudaForward::set_cuda_graphs(bool on) {
  options_.cuda_graphs = on;
  max_graph_batch_ = on ? std::min({options_.max_graph_batch, options_.max_seqs_per_step, options_.max_logit_rows,
                                    options_.max_tokens_per_step})
                        : 0;
}

int64_t CudaForward::graph_bucket(int64_t n_seqs) const {
  int64_t b = 1;
  while (b < n_seqs) b *= 2;
  return std::min(b, max_graph_batch_);
}

int64_t CudaForward::graph_tokens(std::span<const SequenceInput> batch) const {
  const auto n_seqs = static_cast<int64_t>(batch.size());
  if (max_graph_batch_ == 0 || n_seqs == 0 || n_seqs > max_graph_batch_) return 0;
  int64_t longest = 1;
  for (const SequenceInput& in : batch) {
    const auto len = static_cast<int64_t>(in.tokens.size());
    // Every row's logits: one decode token, or a verification piece (all_logits).
    if (!in.want_logits || (len > 1 && !in.all_logits) || len > options_.max_graph_tokens) return 0;
    longest = std::max(longest, len);
  }
  int64_t q = 1;
  while (q < longest) q *= 2;
  // The padded step's rows are all token rows and all logit rows of the graph.
  const int64_t rows = graph_bucket(n_seqs) * q;
  if (q > 1 && (rows > options_.max_logit_rows || rows > options_.max_tokens_per_step)) return 0;
  return q;
}

Status CudaForward::upload_sampling(int64_t n_rows, std::span<const TesseraCudaPenalty> penalties) {
  // Pageable host memory: staged before the call returns (as the metadata uploads).
  TESSERA_CUDA_LAUNCH(api_->device_memcpy_async(sample_rows_, h_sample_rows_.data(),
                                                n_rows * static_cast<int64_t>(sizeof(TesseraCudaSampleRow)), stream_),
                      "upload sampling parameters");
  if (!penalties.empty())
    TESSERA_CUDA_LAUNCH(
        api_->device_memcpy_async(penalties_, penalties.data(), static_cast<int64_t>(penalties.size_bytes()), stream_),
        "upload penalty entries");
  return Status::ok();
}

Status CudaForward::run(std::span<const SequenceInput> batch, std::vector<float>& logits) {
  return run_step(batch, StepOut{.kind = Output::kLogits, .logits = &logits});
}

Status CudaForward::run_greedy(std::span<const SequenceInput> batch, std::vector<int32_t>& ids) {
  return run_step(batch, StepOut{.kind = Output::kGreedy, .ids = &ids});
}

TesseraCudaSampleRow device_sample_row(const Sampler& sampler, std::span<const int32_t> banned,
                                       std::vector<TesseraCudaPenalty>& penalties) {
  const SamplingParams& p = sampler.params();
  TesseraCudaSampleRow row{};
  row.u = sampling_uniform(sampler.seed(), static_cast<uint64_t>(sampler.num_output_tokens()));
  row.temperature = p.temperature;
  row.top_p = p.top_p;
  row.min_p = p.min_p;
  row.top_k = p.top_k;
  row.repetition_penalty = p.repetition_penalty;
  row.presence_penalty = p.presence_penalty;
  row.frequency_penalty = p.frequency_penalty;
  row.n_logprobs = p.n_logprobs;
  row.want_logprob = p.return_logprob ? 1 : 0;
  row.penalty_begin = static_cast<int32_t>(penalties.size());
  std::unordered_map<int32_t, size_t> index;  // id -> its entry
  auto entry = [&](int32_t id) -> TesseraCudaPenalty& {
    auto [at, added] = index.try_emplace(id, penalties.size());
    if (added) penalties.push_back(TesseraCudaPenalty{id, 0, 0, 0});
    return penalties[at->second];
  };
  const bool repetition = p.repetition_penalty != 1.0f;
  if (repetition)
    for (const auto& [id, count] : sampler.prompt_counts()) entry(id).in_prompt = 1;
  if (repetition || p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f)
    for (const auto& [id, count] : sampler.output_counts()) entry(id).out_count = count;
  for (const int32_t id : banned) entry(id).banned = 1;
  row.penalty_end = static_cast<int32_t>(penalties.size());
  return row;
}

Status CudaForward::can_sample(std::span<const TesseraCudaSampleRow> rows,
                               std::span<const TesseraCudaPenalty> penalties) const {
  if (config_.vocab > (int64_t{1} << 20))
    return Status::invalid_argument(
        fmt::format("device sampling takes vocabularies of at most 2^20 ids, this model has {}", config_.vocab));
  if (static_cast<int64_t>(rows.size()) > std::max(options_.max_seqs_per_step, options_.max_logit_rows))
    return Status::invalid_argument(fmt::format("{} sampled rows, at most {} a step", rows.size(),
                                                std::max(options_.max_seqs_per_step, options_.max_logit_rows)));
  if (static_cast<int64_t>(penalties.size()) > options_.max_penalty_entries)
    return Status::invalid_argument(fmt::format("{} penalty entries, at most {} a step (max_penalty_entries)",
                                                penalties.size(), options_.max_penalty_entries));
  for (size_t i = 0; i < rows.size(); ++i) {
    const TesseraCudaSampleRow& r = rows[i];
    if (r.n_logprobs < 0 || r.n_logprobs > TESSERA_CUDA_MAX_TOP_LOGPROBS)
      return Status::invalid_argument(fmt::format("row {}: n_logprobs {}, the device returns 0 .. {}", i, r.n_logprobs,
                                                  static_cast<int>(TESSERA_CUDA_MAX_TOP_LOGPROBS)));
    if (r.penalty_begin < 0 || r.penalty_begin > r.penalty_end ||
        r.penalty_end > static_cast<int64_t>(penalties.size()))
      return Status::invalid_argument(fmt::format("row {}: penalty entries [{}, {}) outside the {} given", i,
                                                  r.penalty_begin, r.penalty_end, penalties.size()));
    if (!(r.u >= 0.0 && r.u < 1.0) || !std::isfinite(r.temperature) || r.temperature < 0.0f)
      return Status::invalid_argument(fmt::format("row {}: u {} / temperature {} out of range", i, r.u, r.temperature));
  }
  return Status::ok();
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

Status CudaForward::run_graphed(std::span<const SequenceInput> batch, const StepOut& out, int64_t q) {
  const int64_t bs = options_.block_size;
  const auto n_real = static_cast<int64_t>(batch.size());
  const int64_t bucket = graph_bucket(n_real);
  const int64_t T = bucket * q;  // token rows, and logit rows of the LM head
  // Fixed shapes for the graph: `bucket` sequences of q token rows, block tables at the full
  // stride, the regions packed for the bucket (the same offsets at every replay of its graph).
  // Padding sequences decode token 0 at position 0 of a one-key sequence in block 0; dead rows
  // (past a sequence's tokens) hold token 0 at position 0. Neither writes KV (slot -1), and their
  // outputs are never read: the real logit rows come first in out_rows, the rest repeat row 0.
  n_seqs_ = bucket;
  table_stride_ = max_table_blocks_;
  graph_query_len_ = q;
  meta_at_ = MetaLayout(T, bucket, table_stride_, num_window_blocks_ > 0);
  const MetaLayout& meta = meta_at_;
  int64_t n_out = 0;
  for (int64_t s = 0; s < bucket; ++s) {
    const bool real = s < n_real;
    const SequenceInput* in = real ? &batch[static_cast<size_t>(s)] : nullptr;
    const int64_t pos = real ? in->start_pos : 0;
    const int64_t len = real ? static_cast<int64_t>(in->tokens.size()) : 1;
    h_meta_[static_cast<size_t>(meta.query_begin + s)] = static_cast<int32_t>(s * q);
    h_meta_[static_cast<size_t>(meta.query_len + s)] = static_cast<int32_t>(len);
    h_meta_[static_cast<size_t>(meta.start_pos + s)] = static_cast<int32_t>(pos);
    h_meta_[static_cast<size_t>(meta.seq_lens + s)] = static_cast<int32_t>(pos + len);
    fill_tables(in, s, real ? (pos + len + bs - 1) / bs : 0);
    for (int64_t i = 0; i < q; ++i) {
      const int64_t row = s * q + i;
      const bool live = real && i < len;
      h_meta_[static_cast<size_t>(meta.tokens + row)] = live ? in->tokens[static_cast<size_t>(i)] : 0;
      h_meta_[static_cast<size_t>(meta.positions + row)] = live ? static_cast<int32_t>(pos + i) : 0;
      set_slots(live ? in : nullptr, row, pos + i);
    }
    if (real)  // graph_tokens() admitted only pieces that want every row (one row: its last)
      for (int64_t i = in->all_logits ? 0 : len - 1; i < len; ++i)
        h_meta_[static_cast<size_t>(meta.out_rows + n_out++)] = static_cast<int32_t>(s * q + i);
  }
  for (int64_t r = n_out; r < T; ++r) h_meta_[static_cast<size_t>(meta.out_rows + r)] = 0;
  TESSERA_CUDA_TRY(api_->set_device(options_.device), "select the CUDA device");
  // Every region the graph reads, at the bucket's offsets.
  TESSERA_CUDA_LAUNCH(api_->device_memcpy_async(meta_, h_meta_.data(), meta.total * 4, stream_),
                      "upload step metadata");
  TESSERA_CUDA_LAUNCH(api_->device_memcpy_async(slots_, h_slots_.data(), T * 8, stream_), "upload KV slots");
  if (window_slots_)
    TESSERA_CUDA_LAUNCH(api_->device_memcpy_async(window_slots_, h_window_slots_.data(), T * 8, stream_),
                        "upload window-pool KV slots");
  if (out.kind == Output::kSampled) {
    // Padding rows: greedy, no logprobs, no penalties (their tokens are dropped).
    for (int64_t r = n_out; r < T; ++r) h_sample_rows_[static_cast<size_t>(r)] = TesseraCudaSampleRow{};
    TESSERA_RETURN_IF_ERROR(upload_sampling(T, out.penalties));
  }
  // One graph per bucket, rows per sequence, output kind (logits, greedy ids or tokens sampled
  // on the device) and whether it selects sparse blocks.
  const int64_t key =
      ((bucket * (options_.max_graph_tokens + 1) + q) * 3 + static_cast<int64_t>(out.kind)) * 2 + (sparse_step_ ? 1 : 0);
  void* graph = nullptr;
  for (const auto& [k, g] : graphs_)
    if (k == key) graph = g;
  if (!graph) {
    TESSERA_CUDA_TRY(api_->graph_begin_capture(stream_),
                     fmt::format("begin capturing the step graph of {} x {} rows", bucket, q));
    const int64_t before = last_step_.launches;
    Status s = enqueue_forward(T, /*all_decode=*/q == 1);
    if (s.is_ok()) s = enqueue_lm_head(0, T, out.kind);
    last_step_.launches = before;  // captured, not launched
    void* captured = nullptr;
    const int rc = api_->graph_end_capture(stream_, &captured);
    if (!s.is_ok()) {
      if (rc == 0) api_->graph_destroy(captured);
      return s.with_context(fmt::format("capturing the step graph of {} x {} rows", bucket, q));
    }
    TESSERA_CUDA_TRY(rc, fmt::format("instantiate the step graph of {} x {} rows", bucket, q));
    graphs_.emplace_back(key, captured);
    graph = captured;
    last_step_.captured = true;
  }
  TESSERA_CUDA_LAUNCH(api_->graph_launch(graph, stream_), "launch the step graph");
  count_sparse();
  last_step_.graphed = true;
  last_step_.bucket = bucket;
  last_step_.graph_tokens = q;
  switch (out.kind) {
    case Output::kGreedy:
      out.ids->resize(static_cast<size_t>(n_out));
      TESSERA_RETURN_IF_ERROR(download_greedy(T, n_out, out.ids->data()));
      break;
    case Output::kSampled:
      out.sampled->resize(static_cast<size_t>(n_out));
      TESSERA_RETURN_IF_ERROR(download_sampled(n_out, out.rows, out.sampled->data()));
      break;
    case Output::kLogits:
      out.logits->resize(static_cast<size_t>(n_out * config_.vocab));
      TESSERA_RETURN_IF_ERROR(download_logits(T, n_out, out.logits->data()));
      break;
  }
  last_step_.total_micros = micros_since(step_start_);
  return Status::ok();
}

}  // namespace tessera
