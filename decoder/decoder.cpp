#include "decoder/decoder.h"

#include <fmt/format.h>

#include <array>

namespace tessera {

std::string_view tensor_role_name(Tensor t) {
  switch (t) {
    case Tensor::kAttnNorm: return "attn_norm";
    case Tensor::kWq: return "q_proj";
    case Tensor::kWk: return "k_proj";
    case Tensor::kWv: return "v_proj";
    case Tensor::kBq: return "q_proj.bias";
    case Tensor::kBk: return "k_proj.bias";
    case Tensor::kBv: return "v_proj.bias";
    case Tensor::kQNorm: return "q_norm";
    case Tensor::kKNorm: return "k_norm";
    case Tensor::kWo: return "o_proj";
    case Tensor::kPostAttnNorm: return "post_attn_norm";
    case Tensor::kFfnNorm: return "ffn_norm";
    case Tensor::kWGate: return "gate_proj";
    case Tensor::kWUp: return "up_proj";
    case Tensor::kWDown: return "down_proj";
    case Tensor::kPostFfnNorm: return "post_ffn_norm";
    case Tensor::kEmbed: return "embed_tokens";
    case Tensor::kFinalNorm: return "norm";
    case Tensor::kLmHead: return "lm_head";
  }
  return "?";
}

std::string_view decoder_op_name(DecoderOp op) {
  switch (op) {
    case DecoderOp::kEmbed: return "embedding";
    case DecoderOp::kScale: return "scale";
    case DecoderOp::kRmsNorm: return "RMSNorm";
    case DecoderOp::kAddRmsNorm: return "residual add + RMSNorm";
    case DecoderOp::kMatmul: return "matmul";
    case DecoderOp::kAddBias: return "bias";
    case DecoderOp::kAttention: return "RoPE + paged attention";
    case DecoderOp::kSiluMul: return "SiLU * up";
    case DecoderOp::kGeluTanhMul: return "GELU(tanh) * up";
    case DecoderOp::kAllReduce: return "all-reduce";
  }
  return "?";
}

Decoder::Decoder(ArchSpec spec, const DecoderDims& dims) : spec_(std::move(spec)), dims_(dims) {}

Status Decoder::check_backend(const DecoderBackend& backend, const ModelWeights& weights) const {
  auto need = [&](DecoderOp op, QuantType type, std::string_view what) -> Status {
    if (backend.supports(op, type)) return Status::ok();
    return Status::unimplemented(fmt::format("the {} backend has no {} for {} ({})", backend.backend_name(),
                                             decoder_op_name(op), quant_name(type), what));
  };
  TESSERA_RETURN_IF_ERROR(need(DecoderOp::kEmbed, weights.embed.type, "model.embed_tokens.weight"));
  TESSERA_RETURN_IF_ERROR(need(DecoderOp::kMatmul, weights.lm_head.type, "lm_head.weight"));
  const DecoderOp glu = spec_.activation == GluActivation::kSilu ? DecoderOp::kSiluMul : DecoderOp::kGeluTanhMul;
  for (DecoderOp op : {DecoderOp::kRmsNorm, DecoderOp::kAddRmsNorm, DecoderOp::kAttention, glu, DecoderOp::kAllReduce})
    TESSERA_RETURN_IF_ERROR(need(op, QuantType::kF32, "every layer"));
  if (spec_.embed_scale != 1.0f) TESSERA_RETURN_IF_ERROR(need(DecoderOp::kScale, QuantType::kF32, "embedding scale"));
  for (size_t l = 0; l < weights.layers.size(); ++l) {
    const LayerWeights& w = weights.layers[l];
    for (const TensorView* m : {&w.wq, &w.wk, &w.wv, &w.wo, &w.w_gate, &w.w_up, &w.w_down})
      TESSERA_RETURN_IF_ERROR(need(DecoderOp::kMatmul, m->type, fmt::format("layer {}", l)));
    if (l < spec_.layers.size() && spec_.layers[l].qkv_bias)
      TESSERA_RETURN_IF_ERROR(need(DecoderOp::kAddBias, QuantType::kF32, fmt::format("layer {}", l)));
  }
  return Status::ok();
}

Status Decoder::forward(DecoderBackend& b, int64_t n, int64_t layers) const {
  const int64_t count = layers > 0 && layers < n_layers() ? layers : n_layers();
  TESSERA_RETURN_IF_ERROR(b.embed(n));
  if (spec_.embed_scale != 1.0f) TESSERA_RETURN_IF_ERROR(b.scale(Act::kResidual, n * dims_.hidden, spec_.embed_scale));
  TESSERA_RETURN_IF_ERROR(b.rms_norm(Act::kResidual, {0, Tensor::kAttnNorm}, Act::kNormed, n, dims_.hidden));
  for (int64_t l = 0; l < count; ++l) TESSERA_RETURN_IF_ERROR(layer(b, l, n, count - 1));
  return Status::ok();
}

Status Decoder::layer(DecoderBackend& b, int64_t l, int64_t n, int64_t last) const {
  const LayerSpec& ls = spec_.layers[static_cast<size_t>(l)];
  const int64_t hidden = dims_.hidden, hd = dims_.head_dim;
  const int64_t q_dim = dims_.n_heads * hd, kv_dim = dims_.n_kv_heads * hd;

  // Attention block.
  const std::array<Projection, 3> qkv = {Projection{{l, Tensor::kWq}, Act::kQ}, Projection{{l, Tensor::kWk}, Act::kK},
                                         Projection{{l, Tensor::kWv}, Act::kV}};
  TESSERA_RETURN_IF_ERROR(b.project(Act::kNormed, qkv, n));
  if (ls.qkv_bias) {
    TESSERA_RETURN_IF_ERROR(b.add_bias(Act::kQ, {l, Tensor::kBq}, n, q_dim));
    TESSERA_RETURN_IF_ERROR(b.add_bias(Act::kK, {l, Tensor::kBk}, n, kv_dim));
    TESSERA_RETURN_IF_ERROR(b.add_bias(Act::kV, {l, Tensor::kBv}, n, kv_dim));
  }
  if (ls.qk_norm) {
    TESSERA_RETURN_IF_ERROR(b.rms_norm(Act::kQ, {l, Tensor::kQNorm}, Act::kQ, n * dims_.n_heads, hd));
    TESSERA_RETURN_IF_ERROR(b.rms_norm(Act::kK, {l, Tensor::kKNorm}, Act::kK, n * dims_.n_kv_heads, hd));
  }
  TESSERA_RETURN_IF_ERROR(b.attention(l, ls, spec_.attn_scale, n));
  const std::array<Projection, 1> o = {Projection{{l, Tensor::kWo}, Act::kProj}};
  TESSERA_RETURN_IF_ERROR(b.project(Act::kAttn, o, n));
  TESSERA_RETURN_IF_ERROR(b.all_reduce(Act::kProj, n * hidden));
  if (spec_.post_norms)
    TESSERA_RETURN_IF_ERROR(b.rms_norm(Act::kProj, {l, Tensor::kPostAttnNorm}, Act::kProj, n, hidden));
  TESSERA_RETURN_IF_ERROR(b.add_rms_norm(Act::kProj, {l, Tensor::kFfnNorm}, n));

  // MLP block.
  const std::array<Projection, 2> gate_up = {Projection{{l, Tensor::kWGate}, Act::kGate},
                                             Projection{{l, Tensor::kWUp}, Act::kUp}};
  TESSERA_RETURN_IF_ERROR(b.project(Act::kNormed, gate_up, n));
  TESSERA_RETURN_IF_ERROR(b.gated_activation(spec_.activation, n));
  const std::array<Projection, 1> down = {Projection{{l, Tensor::kWDown}, Act::kProj}};
  TESSERA_RETURN_IF_ERROR(b.project(Act::kGate, down, n));
  TESSERA_RETURN_IF_ERROR(b.all_reduce(Act::kProj, n * hidden));
  if (spec_.post_norms)
    TESSERA_RETURN_IF_ERROR(b.rms_norm(Act::kProj, {l, Tensor::kPostFfnNorm}, Act::kProj, n, hidden));
  // The residual add and the next layer's input norm (the final norm after the last layer).
  const WeightRef next = l < last ? WeightRef{l + 1, Tensor::kAttnNorm} : WeightRef{WeightRef::kModel, Tensor::kFinalNorm};
  return b.add_rms_norm(Act::kProj, next, n);
}

}  // namespace tessera
