// A toy architecture for the decoder tests: stories260K's weights with post-norm weights added,
// and a description (toy_arch) that differs from Llama in every way the decoder can vary.
#pragma once

#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

#include "decoder/arch.h"
#include "model/weight_store.h"
#include "shard/tp_slice.h"

namespace tessera::test {

// |got - want| <= tol * max(1, max |want|) over the row (f16 GEMM inputs on the device).
inline float max_rel_err(const std::vector<float>& got, const std::vector<float>& want) {
  float scale = 1.0f, err = 0.0f;
  for (float w : want) scale = std::max(scale, std::fabs(w));
  for (size_t i = 0; i < want.size(); ++i) err = std::max(err, std::fabs(got[i] - want[i]));
  return err / scale;
}

inline float max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  float d = 0.0f;
  for (size_t i = 0; i < a.size(); ++i) d = std::max(d, std::fabs(a[i] - b[i]));
  return d;
}

// stories260K's weights, TP 1, with post-attention / post-FFN norm weights (owned by `norms`).
struct ToyModel {
  std::unique_ptr<WeightStore> store;
  ShardLayout layout;
  std::vector<std::vector<float>> norms;

  Result<ShardWeights> weights() {
    const ModelConfig& c = store->config();
    TESSERA_ASSIGN_OR_RETURN(ModelWeights full, bind_model_weights(*store));
    TESSERA_ASSIGN_OR_RETURN(ShardWeights w, slice_model_weights(std::move(full), c, layout));
    if (norms.empty()) {
      for (int64_t l = 0; l < 2 * c.n_layers; ++l) {
        std::vector<float>& v = norms.emplace_back(static_cast<size_t>(c.hidden));
        for (int64_t i = 0; i < c.hidden; ++i) v[static_cast<size_t>(i)] = 0.8f + 0.4f * std::sin(0.37f * (i + 11 * l));
      }
    }
    for (int64_t l = 0; l < c.n_layers; ++l) {
      w.weights.layers[static_cast<size_t>(l)].post_attn_norm =
          make_view(norms[static_cast<size_t>(2 * l)].data(), QuantType::kF32, {c.hidden});
      w.weights.layers[static_cast<size_t>(l)].post_ffn_norm =
          make_view(norms[static_cast<size_t>(2 * l + 1)].data(), QuantType::kF32, {c.hidden});
    }
    return w;
  }
};

// Everything the decoder can vary, set away from Llama's values.
inline ArchSpec toy_arch(const ModelConfig& c, const ModelWeights& w) {
  ArchSpec a = describe_architecture(c, w);
  a.name = "toy";
  a.post_norms = true;
  a.activation = GluActivation::kGeluTanh;
  a.embed_scale = 2.0f;
  a.attn_scale = 0.25f;
  std::vector<float> global(static_cast<size_t>(c.head_dim / 2));
  for (size_t i = 0; i < global.size(); ++i)
    global[i] = 1.0f / std::pow(1.0e6f, static_cast<float>(2 * i) / static_cast<float>(c.head_dim));
  a.rope_inv_freq.push_back(global);
  for (size_t l = 0; l < a.layers.size(); ++l) {
    a.layers[l].sliding_window = l % 2 == 0 ? 4 : 0;  // local layers see 4 keys
    a.layers[l].rope_table = l % 2 == 0 ? 0 : 1;
  }
  return a;
}

}  // namespace tessera::test
