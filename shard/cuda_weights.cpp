// CudaForward's weights: upload_weights() puts this rank's slice of every matrix and vector on
// the device; matrix() and vector() find them for the decoder's ops.
//
// The forms, by weight type. F16 matrices are uploaded as they are; F32 / BF16 are converted to
// f16 at upload. I8_CH is uploaded as int8 levels + fp32 row scales (W8A16 kernel). I4_G128 is
// repacked to the W4A16 layout of cuda_api.h. GGUF block types Q8_0, Q4_0, Q5_0, Q4_K, Q5_K,
// Q6_K are uploaded as the file's blocks (row by row, the bytes weight_bytes() counts) and read
// by the GGUF block kernels (kernels/cuda/gguf_gemm.cu); other GGUF block types, and a GGUF
// embedding table (its kernel reads f16), are dequantized on the host to f16 at upload. Norm
// weights and biases stay fp32. A tied LM head shares the embedding's f16 matrix.

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "common/check.h"
#include "common/dtype.h"
#include "kernels/quant.h"
#include "shard/cuda_forward_internal.h"

namespace tessera {

namespace {

// Rows converted per host staging pass (bounds host memory during upload).
constexpr int64_t kStagingBytes = int64_t{64} << 20;

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

}  // namespace tessera
