// Tessera's synthetic models: deterministic random-weight Llama / Qwen2 / Qwen3 / Gemma 3 decoders
// of any size, written as a Hugging Face directory or as a GGUF file. The "tiny" preset is the
// project's embedded default model (README quick start, tests, benchmarks); "gemma3-tiny" is a
// small Gemma 3 (local and global layers, a short window) for the Gemma tests.
//
// Same spec => same model in every output: weights are generated in fp32 from the seed (each
// tensor from its own counter-based stream, so values do not depend on the order or the number
// of threads that produce them), then stored in the requested type. The HF directory and an F32
// GGUF of one spec hold bitwise-equal tensors once the GGUF loader has undone llama.cpp's Q/K row
// permutation. Norm weights and biases are rounded to bf16 precision when generated, so they are
// exact in F32, F16 and BF16 files alike.
//
// Gemma 3 norms: Hugging Face checkpoints store w - 1 (the model applies 1 + w), GGUF files w.
// The generator draws d = w - 1 rounded to bf16 precision; the HF file holds d, the GGUF file
// 1 + d (exact in F32), so after the HF loader's + 1 both give bitwise-equal F32 norm weights.
//
// Scales (so that activations stay O(1) for every preset size and attention is not uniform):
// linear weights ~ N(0, 1/in_features), the token embedding ~ N(0, 1) and the LM head
// ~ N(0, 4/hidden) (logits of standard deviation ~2); a tied embedding uses the LM head's scale.
// Norm weights ~ 1 + N(0, 0.02^2), biases ~ N(0, 0.02^2). The normal law is approximated by the
// sum of four 16-bit uniforms (Irwin-Hall): pure integer arithmetic, so the bytes are identical
// on every platform and libm version.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/dtype.h"
#include "common/status.h"

namespace tessera {

struct SyntheticModelSpec {
  // "llama", "qwen2" (needs qkv_bias), "qwen3" (needs qk_norm) or "gemma3" (needs qk_norm and
  // tie_embeddings; adds the post-attention, pre-FFN and post-FFN norms, GeGLU, the sqrt(hidden)
  // embedding scale, softmax scale 1 / sqrt(head_dim), RoPE base 10,000 on the local layers).
  std::string arch = "llama";
  int64_t hidden = 128;
  int64_t n_layers = 4;
  int64_t n_heads = 4;
  int64_t n_kv_heads = 2;
  int64_t head_dim = 0;         // 0: hidden / n_heads
  int64_t ffn = 384;
  int64_t vocab = 2048;
  int64_t max_positions = 1024;
  float rope_theta = 10000.0f;  // gemma3: the global layers' base
  float rms_eps = 1e-5f;
  // gemma3 only: the local layers' window (a query at p sees keys (p - window, p]) and the layer
  // pattern, layer l global when (l + 1) % sliding_window_pattern == 0 (Gemma 3: 6).
  int64_t sliding_window = 0;
  int64_t sliding_window_pattern = 6;
  bool tie_embeddings = false;
  uint64_t seed = 1234;
  // HF: F32, F16 or BF16. GGUF: every format with a file_type in common/dtype.h's table (the
  // float ones and the GGUF block formats). A matrix whose rows are not a multiple of the type's
  // block falls back as llama.cpp does, to the format's file_fallback (Q4_K -> Q5_0, Q5_K /
  // Q6_K -> Q8_0, Q2_K / Q3_K -> Q4_0), else (32-element types, TQ1_0 / TQ2_0) to F16.
  QuantType weight_type = QuantType::kF32;
  // Tests: a GGUF block type here rounds every matrix through the type a GGUF file of
  // weight_type = grid_type would store it in (fallbacks included) before it is stored in
  // weight_type, so a float file of this spec holds exactly the weights that quantized file's
  // matrices dequantize to. kF32: the generator's values as they are.
  QuantType grid_type = QuantType::kF32;
  // GGUF only, overrides weight_type: a Q4_K_M-like mix - Q4_K everywhere, Q6_K for output.weight
  // and for attn_v / ffn_down of the even-numbered layers.
  bool gguf_mixed_q4_k_m = false;
  bool qkv_bias = false;        // q/k/v projection biases (Qwen2)
  bool qk_norm = false;         // per-head RMSNorm of q and k (Qwen3, Gemma 3)
  int hf_shards = 1;            // HF only: > 1 writes model-0000i-of-0000N.safetensors + index
  // HF only: "awq" or "gptq" writes the linear layers (q, k, v, o, gate, up, down) as a 4-bit
  // pre-quantized checkpoint (qweight / qzeros / scales, + g_idx for GPTQ, group 128,
  // quantization_config in config.json; packing in model/int4_checkpoint.h, GPTQ zeros in the v1
  // "minus one" convention). The levels are the RTN grid of kernels/quant.h applied to the
  // weights as stored in weight_type, so `--quant int4` (int4-sym with int4_sym) on the float
  // model of the same spec gives the same quantized weights.
  std::string hf_int4_packing;
  bool int4_sym = false;
  bool gptq_act_order = false;  // tests: write a permuted (act-order) g_idx, which loaders refuse
};

// Presets: "tiny" (the default), "gqa4", "110m", "1.1b", "llama3-8b", "gemma3-tiny" (hidden 128,
// 4 heads of 64, 1 KV head, 7 layers: 5 local (window 8), 1 global, 1 local). NotFound lists the
// names.
Result<SyntheticModelSpec> synthetic_preset(std::string_view name);

// A small two-layer model whose every matrix dimension is a multiple of 256 (hidden 256, FFN
// 512, vocabulary 512), so every GGUF block format fits every matrix: the quantization tests'.
SyntheticModelSpec block_aligned_spec(QuantType weight_type, uint64_t seed);
const std::vector<std::string>& synthetic_preset_names();

// Checks sizes and flags for consistency; InvalidArgument names the field and value.
Status validate_synthetic_spec(const SyntheticModelSpec& spec);

// Writes `dir` (created if missing): config.json, model.safetensors (or shards + index),
// tokenizer.json, tokenizer_config.json (with the chat template), special_tokens_map.json,
// generation_config.json. InvalidArgument for a weight_type other than F32/F16/BF16.
Status write_synthetic_hf(const SyntheticModelSpec& spec, const std::string& dir);

// Writes one GGUF v3 file: hyper-parameters, tokenizer, chat template and tensors named as
// llama.cpp names them, Q/K rows of "llama" in llama.cpp's adjacent-pair order, norms and biases F32.
// gemma3: `gemma3.attention.sliding_window`, and `gemma3.attention.sliding_window_pattern` only
// when the pattern is not llama.cpp's assumed 6.
Status write_synthetic_gguf(const SyntheticModelSpec& spec, const std::string& path);

// ---- introspection (tests, tools) ----

// spec.head_dim, or hidden / n_heads when it is 0.
int64_t synthetic_head_dim(const SyntheticModelSpec& spec);

struct SyntheticTensorInfo {
  std::string hf_name;          // "model.layers.0.self_attn.q_proj.weight"
  std::string gguf_name;        // "blk.0.attn_q.weight"
  std::vector<int64_t> shape;   // HF shape, outermost first ([out, in] for matrices)
};

// The model's tensors in GGUF file order (the HF file holds the same set, sorted by name).
// Empty when the spec is not valid.
std::vector<SyntheticTensorInfo> synthetic_tensors(const SyntheticModelSpec& spec);

// The fp32 values of one tensor in HF layout (row-major, HF rotate-half Q/K order), exactly
// what the writers convert from (Gemma 3 norms as the HF file stores them, w - 1; the GGUF file
// holds these + 1). NotFound for a name not in synthetic_tensors().
Result<std::vector<float>> synthetic_tensor_values(const SyntheticModelSpec& spec, std::string_view hf_name);

// The type a tensor is stored in by write_synthetic_gguf (after the mix and fallbacks).
Result<QuantType> synthetic_gguf_tensor_type(const SyntheticModelSpec& spec, std::string_view hf_name);

// GGUF `general.file_type` (llama.cpp's LLAMA_FTYPE numbering) for the spec.
uint32_t synthetic_gguf_file_type(const SyntheticModelSpec& spec);

// The weight types tessera-make-model's --type takes, lower case, in the order of
// common/dtype.h's table: the formats a GGUF file holds throughout (file_type >= 0; the float ones
// also in HF directories), then the mixes and packings "q4_k_m", "awq" and "gptq".
std::vector<std::string> synthetic_weight_type_names();

}  // namespace tessera
