// Model hyper-parameters, from a Hugging Face config.json or from GGUF metadata, validated.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "model/architecture.h"

namespace tessera {

class GgufFile;

enum class RopeScalingType { kNone, kLinear, kLlama3 };

struct RopeScaling {
  RopeScalingType type = RopeScalingType::kNone;
  float factor = 1.0f;
  float low_freq_factor = 1.0f;              // llama3
  float high_freq_factor = 4.0f;             // llama3
  int64_t original_max_position = 8192;      // llama3
};

// `quantization_config` of a pre-quantized HF checkpoint (AWQ or GPTQ, 4-bit). Tessera reads
// qweight / qzeros / scales (+ g_idx) and converts them to I4_G128 at load
// (model/int4_checkpoint.h).
enum class CheckpointQuant { kNone, kAwq, kGptq };

struct QuantizationConfig {
  CheckpointQuant method = CheckpointQuant::kNone;
  int bits = 4;
  int64_t group_size = 128;
  bool sym = false;            // GPTQ "sym"; AWQ: !zero_point
  bool desc_act = false;       // GPTQ act-order (refused at load when g_idx is not sorted)
  bool gptq_v2 = false;        // GPTQ checkpoint_format "gptq_v2": zeros stored as is (v1: minus one)
};

struct ModelConfig {
  Architecture arch = Architecture::kLlama;  // its other facts: architecture_traits(arch)
  int64_t hidden = 0;            // d_model
  int64_t n_layers = 0;
  int64_t n_heads = 0;
  int64_t n_kv_heads = 0;
  int64_t head_dim = 0;          // hidden / n_heads unless the file says otherwise
  int64_t ffn = 0;               // intermediate size
  int64_t vocab = 0;
  int64_t max_positions = 0;     // context length
  float rms_eps = 1e-5f;
  float rope_theta = 10000.0f;
  RopeScaling rope_scaling;
  int64_t sliding_window = 0;    // 0: full attention (Mistral sets it)
  // Layers that use sliding_window; empty: every layer does (Mistral). Gemma 3 interleaves 5
  // local layers with 1 global one (layer l is global when (l + 1) % 6 == 0); HF configs name
  // the layers in `layer_types` or give `sliding_window_pattern`.
  std::vector<bool> local_layers;
  // RoPE base of the local (sliding-window) layers when it differs (Gemma 3: 10,000; the global
  // layers use rope_theta and rope_scaling, the local ones no scaling); 0: rope_theta everywhere.
  float rope_theta_local = 0.0f;
  // Softmax scale 1 / sqrt(query_pre_attn_scalar) (Gemma); 0: 1 / sqrt(head_dim).
  float query_pre_attn_scalar = 0.0f;
  // Added to every RMSNorm weight at load: Hugging Face Gemma checkpoints store w - 1 and apply
  // (1 + w) at run time; llama.cpp's GGUF converter already added the 1 (offset 0 there).
  float norm_weight_offset = 0.0f;
  bool qkv_bias = false;         // Qwen2
  bool qk_norm = false;          // Qwen3: RMSNorm over each head of q and k before RoPE
  bool tie_embeddings = false;   // no lm_head: use embed_tokens
  int32_t bos_id = -1;
  std::vector<int32_t> eos_ids;  // may hold several (Llama 3)
  QuantizationConfig quantization;  // HF quantization_config (method kNone when absent)

  // Checks every field for consistency; errors name the source and the field.
  Status validate(std::string_view source) const;
  // Whether layer l attends over a sliding window (sliding_window > 0 and, when local_layers is
  // given, that layer is local).
  bool is_local_layer(int64_t l) const {
    if (sliding_window <= 0) return false;
    return local_layers.empty() || (l >= 0 && static_cast<size_t>(l) < local_layers.size() && local_layers[l]);
  }
};

// Parses a Hugging Face config.json text. `source` names the file in errors.
Result<ModelConfig> parse_hf_config(std::string_view json_text, std::string_view source);
Result<ModelConfig> load_hf_config(const std::string& config_json_path);
// Reads `general.architecture` and `<arch>.*` keys (and the rope_freqs.weight tensor when present);
// the architecture's row (model/architecture.h) decides what else applies.
Result<ModelConfig> config_from_gguf(const GgufFile& gguf);
// The token ids generation stops at in a GGUF model: tokenizer.ggml.{eos,eot,eom}_token_id, then
// the end-of-turn token that some architectures' files leave unmarked (the row's
// gguf_unmarked_end_of_turn, model/architecture.h), found by its string in tokenizer.ggml.tokens
// ("<end_of_turn>" for gemma3). In that order, without duplicates; ids outside
// [0, vocab) are dropped (unset ids are often written as UINT32_MAX). The model config and the
// tokenizer both take their stop set from here.
Result<std::vector<int32_t>> gguf_stop_token_ids(const GgufFile& gguf, int64_t vocab);

enum class ModelFormat { kHuggingFace, kGguf };

// What a model path names: an HF directory (or a .safetensors / .json file in one) or a GGUF file
// (".gguf" or the GGUF magic). NotFound / InvalidArgument errors name the path.
struct ModelPath {
  ModelFormat format = ModelFormat::kHuggingFace;
  std::string dir;   // HF: the directory that holds config.json
  std::string file;  // GGUF: the file; HF: what the weights open from (the directory or a file in it)
};
Result<ModelPath> resolve_model_path(const std::string& path);

// The validated config of the model at `path` (see resolve_model_path) without its weights: the
// directory's config.json, or the GGUF header through GgufFile::open_metadata (no tensor data is
// mapped or read, except the small rope_freqs.weight when present). For processes that run no
// forward pass (the coordinator); WeightStore::open reads the same config.
Result<ModelConfig> load_model_config(const std::string& path);

// RoPE inverse frequencies (head_dim / 2 values) with the config's scaling applied.
std::vector<float> rope_inv_freq(const ModelConfig& config);
// Those of the local layers when rope_theta_local is set: base rope_theta_local, no scaling.
std::vector<float> rope_inv_freq_local(const ModelConfig& config);

// Gemma 3's layer pattern: every `pattern`-th layer global ((l + 1) % pattern == 0), the rest local.
std::vector<bool> gemma_local_layers(int64_t n_layers, int64_t pattern);
// The layers whose KV goes to the window pool (common/kv_config.h): the sliding-window layers,
// when some but not all layers have a window and it is shorter than the context. Empty
// otherwise (one pool: every layer keeps its KV for the whole sequence).
std::vector<bool> windowed_kv_layers(const ModelConfig& c);

}  // namespace tessera
