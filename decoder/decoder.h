// The decoder's layer graph, written once (ARCHITECTURE.md "One step", step 3): embedding, then per
// layer [norm -> QKV projection (+ bias, q/k norm) -> RoPE + KV write + paged attention -> O
// projection -> all-reduce (-> post-norm) -> residual add + norm -> gate/up projection -> gated
// activation -> down projection -> all-reduce (-> post-norm) -> residual add + next norm], the
// final norm last. Which optional steps run comes from the ArchSpec (decoder/arch.h).
//
// The decoder owns no memory and no weights: it calls ops on a DecoderBackend, which holds the
// step's activations (named by Act), this rank's weights (named by WeightRef), the KV cache and
// the communicator. The CPU forward pass (shard/forward.h) and the CUDA forward pass
// (shard/cuda_forward.h) are the two backends; each keeps its own buffers, weight layouts, KV
// storage and (CUDA) graphs, and neither repeats the layer sequence.
//
// Thread-safety: a Decoder is immutable after construction; forward() may run on any thread that
// owns the backend.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <span>

#include "common/dtype.h"
#include "common/status.h"
#include "decoder/arch.h"
#include "model/weight_store.h"

namespace tessera {

// The activations of one step, each [n_tokens, width] fp32 (the backend may keep other copies,
// e.g. the f16 inputs of its GEMMs). Widths: kResidual, kNormed, kProj: hidden; kQ, kAttn:
// this rank's query heads * head_dim; kK, kV: its KV heads * head_dim; kGate, kUp: its FFN slice.
enum class Act : uint8_t { kResidual, kNormed, kQ, kK, kV, kAttn, kProj, kGate, kUp };

// A weight of this rank's slice: a layer's tensor, or one of the model's own (layer kModel).
enum class Tensor : uint8_t {
  kAttnNorm, kWq, kWk, kWv, kBq, kBk, kBv, kQNorm, kKNorm, kWo, kPostAttnNorm,
  kFfnNorm, kWGate, kWUp, kWDown, kPostFfnNorm,
  kEmbed, kFinalNorm, kLmHead,  // layer kModel
};
std::string_view tensor_role_name(Tensor t);
struct WeightRef {
  static constexpr int64_t kModel = -1;
  int64_t layer = kModel;
  Tensor tensor = Tensor::kFinalNorm;
};

// The ops the decoder calls. supports() answers for an op and the stored type of the weight it
// reads (QuantType::kF32 for ops that read none); Decoder::check_backend asks it for every call
// a model will make, so a backend that lacks one fails at load with a message, not mid-step.
enum class DecoderOp : uint8_t {
  kEmbed, kScale, kRmsNorm, kAddRmsNorm, kMatmul, kAddBias, kAttention, kSiluMul, kGeluTanhMul, kAllReduce,
};
std::string_view decoder_op_name(DecoderOp op);

// One output of a projection: out = in . weight^T.
struct Projection {
  WeightRef weight;
  Act out;
};

class DecoderBackend {
 public:
  virtual ~DecoderBackend() = default;
  virtual std::string_view backend_name() const = 0;
  virtual bool supports(DecoderOp op, QuantType weight_type) const = 0;

  // kResidual[t] = the embedding row of the step's token t (the backend knows the step's tokens).
  virtual Status embed(int64_t n_tokens) = 0;
  // a[i] *= s for the first `count` elements.
  virtual Status scale(Act a, int64_t count, float s) = 0;
  // out = rms_norm(in) * w, `rows` rows of `dim` (out may be in).
  virtual Status rms_norm(Act in, WeightRef w, Act out, int64_t rows, int64_t dim) = 0;
  // kResidual += delta; kNormed = rms_norm(kResidual) * w; n_tokens rows of hidden.
  virtual Status add_rms_norm(Act delta, WeightRef w, int64_t n_tokens) = 0;
  // Every output from the same input (a backend may convert the input once for all of them).
  virtual Status project(Act in, std::span<const Projection> outs, int64_t n_tokens) = 0;
  // a[t, i] += bias[i], n_tokens rows of dim.
  virtual Status add_bias(Act a, WeightRef bias, int64_t n_tokens, int64_t dim) = 0;
  // RoPE (table spec.rope_table) on kQ and kK, kK / kV written to the KV cache at the step's
  // positions, then causal paged attention of kQ over the cache (spec.sliding_window, `scale`)
  // into kAttn.
  virtual Status attention(int64_t layer, const LayerSpec& spec, float scale, int64_t n_tokens) = 0;
  // kGate = act(kGate) * kUp, n_tokens rows of this rank's FFN slice.
  virtual Status gated_activation(GluActivation act, int64_t n_tokens) = 0;
  // Sum over the TP group, in place (a no-op at TP 1).
  virtual Status all_reduce(Act a, int64_t count) = 0;
};

// This rank's widths (ShardLayout's share of the model's dimensions).
struct DecoderDims {
  int64_t hidden = 0;
  int64_t head_dim = 0;
  int64_t n_heads = 0;     // query heads on this rank
  int64_t n_kv_heads = 0;  // KV heads on this rank
  int64_t ffn = 0;         // FFN columns on this rank
};

class Decoder {
 public:
  Decoder(ArchSpec spec, const DecoderDims& dims);

  const ArchSpec& spec() const { return spec_; }
  const DecoderDims& dims() const { return dims_; }
  int64_t n_layers() const { return static_cast<int64_t>(spec_.layers.size()); }

  // Unimplemented naming the backend, the op and the weight type when `backend` lacks an op
  // this model needs (e.g. an embedding stored in a type its kernel cannot read).
  Status check_backend(const DecoderBackend& backend, const ModelWeights& weights) const;

  // The layer graph for n_tokens tokens: leaves the final-normed hidden states in kNormed. The
  // first failing op's Status is returned as the backend gave it. With 0 < n_layers < n_layers():
  // the first n_layers layers only, the final norm after the last of them (the self-draft of
  // speculative decoding, shard/self_draft.h: an early exit through the model's own head).
  Status forward(DecoderBackend& backend, int64_t n_tokens, int64_t n_layers = 0) const;

 private:
  Status layer(DecoderBackend& b, int64_t l, int64_t n, int64_t last) const;

  ArchSpec spec_;
  DecoderDims dims_;
};

}  // namespace tessera
