#include "decoder/arch.h"

#include <fmt/format.h>

#include <cmath>

namespace tessera {

std::string_view glu_activation_name(GluActivation a) {
  switch (a) {
    case GluActivation::kSilu: return "silu";
    case GluActivation::kGeluTanh: return "gelu_tanh";
  }
  return "?";
}

ArchSpec describe_architecture(const ModelConfig& c, const ModelWeights& w) {
  const ArchitectureTraits& row = architecture_traits(c.arch);
  ArchSpec s;
  s.name = std::string(row.name);
  s.activation = row.activation;
  s.post_norms = row.post_norms;
  switch (row.embed_scale) {
    case EmbedScale::kNone: break;
    case EmbedScale::kSqrtHidden: s.embed_scale = std::sqrt(static_cast<float>(c.hidden)); break;
  }
  const float scalar = c.query_pre_attn_scalar > 0.0f ? c.query_pre_attn_scalar : static_cast<float>(c.head_dim);
  s.attn_scale = 1.0f / std::sqrt(scalar);
  s.rms_eps = c.rms_eps;
  // Table 0: the global layers (rope_theta, rope_scaling); table 1: the local layers' own base.
  s.rope_inv_freq.push_back(rope_inv_freq(c));
  const bool local_table = c.rope_theta_local > 0.0f;
  if (local_table) s.rope_inv_freq.push_back(rope_inv_freq_local(c));
  s.layers.resize(static_cast<size_t>(c.n_layers));
  for (size_t l = 0; l < s.layers.size(); ++l) {
    LayerSpec& ls = s.layers[l];
    const bool local = c.is_local_layer(static_cast<int64_t>(l));
    ls.sliding_window = local ? c.sliding_window : 0;
    ls.rope_table = local && local_table ? 1 : 0;
    // Biases present in the file are used even where the config does not announce them
    // (model/weight_store.cpp binds them when present).
    if (l < w.layers.size()) {
      ls.qkv_bias = w.layers[l].bq.data != nullptr;
      ls.qk_norm = w.layers[l].q_norm.data != nullptr;
    }
  }
  return s;
}

Status ArchSpec::validate(const ModelConfig& c, const ModelWeights* w) const {
  const std::string what = name.empty() ? "architecture description" : name + " description";
  if (static_cast<int64_t>(layers.size()) != c.n_layers)
    return Status::invalid_argument(fmt::format("{}: {} layers, the model has {}", what, layers.size(), c.n_layers));
  if (!std::isfinite(attn_scale) || attn_scale <= 0.0f || !std::isfinite(embed_scale) || !(rms_eps > 0.0f))
    return Status::invalid_argument(fmt::format("{}: attn_scale {}, embed_scale {}, rms_eps {} must be finite and > 0",
                                                what, attn_scale, embed_scale, rms_eps));
  for (size_t t = 0; t < rope_inv_freq.size(); ++t)
    if (static_cast<int64_t>(rope_inv_freq[t].size()) * 2 != c.head_dim)
      return Status::invalid_argument(fmt::format("{}: RoPE table {} has {} frequencies, head_dim {} needs {}", what, t,
                                                  rope_inv_freq[t].size(), c.head_dim, c.head_dim / 2));
  for (size_t l = 0; l < layers.size(); ++l) {
    const LayerSpec& ls = layers[l];
    if (ls.rope_table < 0 || static_cast<size_t>(ls.rope_table) >= rope_inv_freq.size())
      return Status::invalid_argument(fmt::format("{}: layer {} uses RoPE table {} of {}", what, l, ls.rope_table,
                                                  rope_inv_freq.size()));
    if (ls.sliding_window < 0)
      return Status::invalid_argument(fmt::format("{}: layer {} has sliding window {}", what, l, ls.sliding_window));
    if (w == nullptr || l >= w->layers.size()) continue;
    const LayerWeights& lw = w->layers[l];
    auto missing = [&](const TensorView& v, const char* tensor, const char* why) -> Status {
      if (v.data != nullptr) return Status::ok();
      return Status::invalid_argument(
          fmt::format("{}: layer {} needs {} ({}), the weights have none", what, l, tensor, why));
    };
    if (ls.qkv_bias) {
      TESSERA_RETURN_IF_ERROR(missing(lw.bq, "self_attn.q_proj.bias", "qkv_bias"));
      TESSERA_RETURN_IF_ERROR(missing(lw.bk, "self_attn.k_proj.bias", "qkv_bias"));
      TESSERA_RETURN_IF_ERROR(missing(lw.bv, "self_attn.v_proj.bias", "qkv_bias"));
    }
    if (ls.qk_norm) {
      TESSERA_RETURN_IF_ERROR(missing(lw.q_norm, "self_attn.q_norm.weight", "qk_norm"));
      TESSERA_RETURN_IF_ERROR(missing(lw.k_norm, "self_attn.k_norm.weight", "qk_norm"));
    }
    if (post_norms) {
      TESSERA_RETURN_IF_ERROR(missing(lw.post_attn_norm, "post-attention norm", "post_norms"));
      TESSERA_RETURN_IF_ERROR(missing(lw.post_ffn_norm, "post-FFN norm", "post_norms"));
    }
  }
  return Status::ok();
}

}  // namespace tessera
