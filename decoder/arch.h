// How one architecture's decoder layers are put together: the description the decoder
// (decoder/decoder.h) walks. An architecture is data here, not code: norm placement, the gated
// activation, q/k norms, biases, per-layer attention window and RoPE table, attention and
// embedding scales. describe_architecture fills it from the architecture's row
// (model/architecture.h) and the config: a new architecture is a new row, not a second layer graph.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "model/model_config.h"
#include "model/weight_store.h"

namespace tessera {

// GluActivation, the MLP's gated activation, is a column of the architecture table
// (model/architecture.h).
std::string_view glu_activation_name(GluActivation a);

// One layer's attention and which optional tensors it applies.
struct LayerSpec {
  int64_t sliding_window = 0;  // > 0: a query at p sees keys (p - sliding_window, p]; 0: all keys
  int32_t rope_table = 0;      // index into ArchSpec::rope_inv_freq
  bool qkv_bias = false;       // add bq / bk / bv after the projections (Qwen2)
  bool qk_norm = false;        // RMSNorm over each head of q and k before RoPE (Qwen3, Gemma 3)
};

struct ArchSpec {
  std::string name;                 // for messages ("llama", "toy", ...)
  // Pre-norm residual blocks always: h = norm(x); x += block(h). With post_norms the block's
  // output is normed once more before the add (Gemma 2 / 3): x += post_norm(block(h)); the
  // layer's post_attn_norm and post_ffn_norm weights are then required.
  bool post_norms = false;
  GluActivation activation = GluActivation::kSilu;
  float embed_scale = 1.0f;         // the embedding rows are multiplied by it (Gemma: sqrt(hidden))
  float attn_scale = 0.0f;          // softmax scale of q.k (Llama: 1 / sqrt(head_dim))
  float rms_eps = 1e-5f;
  // RoPE inverse frequencies, head_dim / 2 values per table (scaling applied); layers pick one.
  std::vector<std::vector<float>> rope_inv_freq;
  std::vector<LayerSpec> layers;    // one per layer

  // InvalidArgument naming the field: layer count, a RoPE table of the wrong size or index, a
  // non-finite scale, an optional tensor the description needs and `weights` lacks (when given).
  Status validate(const ModelConfig& config, const ModelWeights* weights = nullptr) const;
};

// The description of a model from its architecture's row (model/architecture.h: name, gated
// activation, post-norms, embedding scale), its config and its bound weights: q/k/v biases and
// q/k norms where the weights have them, the config's window on its local layers (every layer
// unless the config lists them), softmax scale 1 / sqrt(query_pre_attn_scalar) when the config
// sets it (else 1 / sqrt(head_dim)), and a second RoPE table (the local base, unscaled) for the
// local layers when the config sets rope_theta_local (Gemma 3).
ArchSpec describe_architecture(const ModelConfig& config, const ModelWeights& weights);

}  // namespace tessera
