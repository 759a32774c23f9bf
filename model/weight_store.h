// A model on disk, by canonical Hugging Face tensor names, whatever the file format.
//
// HF directories (config.json + safetensors) are used as they are. GGUF files are mapped to HF
// names ("blk.3.attn_q.weight" -> "model.layers.3.self_attn.q_proj.weight", "token_embd.weight"
// -> "model.embed_tokens.weight", "output.weight" -> "lm_head.weight", ...) and llama.cpp's
// adjacent-pair Q/K row order is converted back to HF's rotate-half order at load (rows are
// permuted, so block-quantized rows move whole; those two tensors become owned copies).
// Every other view points into the memory-mapped file.
#pragma once

#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/huge_pages.h"
#include "common/status.h"
#include "common/tensor.h"
#include "model/importance.h"
#include "model/model_config.h"

namespace tessera {

class GgufFile;
class SafetensorsCheckpoint;
struct WeightCodec;

class WeightStore {
 public:
  // `path`: an HF directory (config.json + *.safetensors) or a .gguf file.
  static Result<std::unique_ptr<WeightStore>> open(const std::string& path);
  ~WeightStore();

  ModelFormat format() const { return format_; }
  const std::string& path() const { return path_; }
  const ModelConfig& config() const { return config_; }
  bool has(std::string_view hf_name) const;
  // NotFound error: "<path>: no tensor 'model.layers.3.mlp.up_proj.weight'".
  Result<TensorView> get(std::string_view hf_name) const;
  std::vector<std::string> names() const;
  // The underlying GGUF file (tokenizer metadata, chat template), or nullptr for HF.
  const GgufFile* gguf() const { return gguf_.get(); }
  // Path of the file that holds `hf_name` (the shard for sharded safetensors), for messages;
  // path() when the tensor is unknown.
  const std::string& source_file(std::string_view hf_name) const;

 private:
  WeightStore() = default;
  ModelFormat format_ = ModelFormat::kHuggingFace;
  std::string path_;
  ModelConfig config_;
  std::unique_ptr<GgufFile> gguf_;
  std::unique_ptr<SafetensorsCheckpoint> safetensors_;
  struct Entry;
  std::vector<std::unique_ptr<Entry>> entries_;  // name -> view (+ owned bytes for Q/K)
  std::map<std::string, const Entry*, std::less<>> index_;  // HF name -> entry
  friend class WeightStoreBuilder;
};

// GGUF tensor name -> HF name ("blk.3.ffn_up.weight" -> "model.layers.3.mlp.up_proj.weight");
// names without an HF counterpart (e.g. "rope_freqs.weight") are returned unchanged. The norms
// of Gemma 3 map by its own convention ("ffn_norm" -> "pre_feedforward_layernorm",
// "post_attention_norm" -> "post_attention_layernorm", "post_ffw_norm" ->
// "post_feedforward_layernorm").
std::string gguf_to_hf_name(std::string_view gguf_name, Architecture arch = Architecture::kLlama);

// Undoes llama.cpp's Q/K row order for `n_heads` heads: GGUF row h*hd + 2i becomes HF row
// h*hd + i and GGUF row h*hd + 2i + 1 becomes HF row h*hd + i + hd/2 (hd = rows / n_heads).
// Whole rows move, so any QuantType works for a matrix; a 1-D `src` (a bias) must be a plain
// type. Writes the permuted bytes to `owned` and a view of them (same type and shape) to `dst`.
// InvalidArgument when rows is not a multiple of 2 * n_heads. `what` names the tensor in errors.
Status unpermute_gguf_qk_rows(const TensorView& src, int64_t n_heads, std::string_view what,
                              std::vector<uint8_t>* owned, TensorView* dst);

// The weights the decoder forward pass uses, bound and shape-checked against the config.
// Matrices are [out_features, in_features] row-major in their stored QuantType. Vectors
// (norm weights, biases) are always converted to owned F32.
struct LayerWeights {
  TensorView attn_norm;           // [hidden] F32
  TensorView wq, wk, wv, wo;      // [n_heads*hd, hidden], [n_kv*hd, hidden] x2, [hidden, n_heads*hd]
  TensorView bq, bk, bv;          // F32 biases (Qwen2) or data == nullptr
  TensorView q_norm, k_norm;      // [head_dim] F32 (Qwen3) or data == nullptr
  TensorView ffn_norm;            // [hidden] F32 (the pre-FFN norm)
  // [hidden] F32 norms of the attention and MLP outputs before each residual add (Gemma 2 / 3:
  // ArchSpec::post_norms), or data == nullptr.
  TensorView post_attn_norm, post_ffn_norm;
  TensorView w_gate, w_up;        // [ffn, hidden]
  TensorView w_down;              // [hidden, ffn]
};

struct ModelWeights {
  TensorView embed;               // [vocab, hidden]
  TensorView final_norm;          // [hidden] F32
  TensorView lm_head;             // [vocab, hidden] (the embedding when tied)
  std::vector<LayerWeights> layers;
  std::vector<std::vector<float>> owned_f32;  // storage for converted vectors
  std::vector<WeightBytes> owned_bytes;       // storage for matrices quantized at load (huge pages)
};

struct WeightLoadOptions {
  // The arithmetic of the load (common/weight_codec.h): every loader passes kernels/
  // weight_codec.h's cpu_weight_codec(). Not owned. Without one, a load that must dequantize or
  // quantize (a --quant mode, a norm stored in a block format) fails with an InvalidArgument
  // naming the codec; one that uses the weights as stored needs none.
  const WeightCodec* codec = nullptr;
  WeightQuant quant = WeightQuant::kNone;
  bool quantize_lm_head = false;  // also the LM head (a tied one gets its own quantized copy)
  int threads = 0;                // threads for the quantization (0: all)
  // Calibration (model/importance.h): a weight it names is quantized with the importance of
  // its columns (the codec's quantize_row_weighted) where the format has such an
  // encoder. A weight whose entry has another length is an InvalidArgument naming both.
  // Not owned; must outlive the call.
  const ImportanceMatrix* importance = nullptr;
  // A matrix whose columns fill no block of the format nor of its fallback stays as stored
  // (logged as a warning naming it; `tessera eval` reports the formats of what it measured, and
  // the shards load the same way, so the quality gate judges what is served); false: such a
  // matrix fails the load with an InvalidArgument naming the tensor.
  bool keep_unquantizable = true;
};

// Errors name the file, the tensor and both shapes:
// "<path>: tensor 'model.layers.3.mlp.up_proj.weight' has shape [172, 64], expected [64, 172]".
// With options.quant, a matrix whose columns do not fill whole groups is an InvalidArgument
// naming the tensor.
Result<ModelWeights> bind_model_weights(const WeightStore& store, const WeightLoadOptions& options = {});

}  // namespace tessera
