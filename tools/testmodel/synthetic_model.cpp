#include "tools/testmodel/synthetic_model.h"

#include <cmath>
#include <cstring>
#include <filesystem>
#include <memory>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/check.h"
#include "common/logging.h"
#include "common/strings.h"
#include "common/thread_pool.h"
#include "kernels/quant.h"
#include "model/int4_checkpoint.h"
#include "model/model_config.h"
#include "tools/testmodel/atomic_file.h"
#include "tools/testmodel/gguf_writer.h"
#include "tools/testmodel/safetensors_writer.h"
#include "tools/testmodel/synthetic_vocab.h"

namespace tessera {
namespace {

constexpr uint64_t kGamma = 0x9E3779B97F4A7C15ull;  // splitmix64's increment
constexpr float kVectorNoise = 0.02f;
constexpr float kHeadGain = 2.0f;                    // LM head std = kHeadGain / sqrt(hidden)
constexpr int64_t kRowsPerTask = 16;

uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

uint64_t fnv1a64(std::string_view s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (char c : s) h = (h ^ static_cast<uint8_t>(c)) * 0x100000001b3ull;
  return h;
}

// Sum of four 16-bit uniforms, centred and scaled to unit variance: mean 4 * 65535 / 2,
// variance 4 * (65536^2 - 1) / 12.
const float kIrwinHallInvStd = static_cast<float>(1.0 / std::sqrt((65536.0 * 65536.0 - 1.0) / 3.0));

inline float unit_normal(uint64_t seed, uint64_t element) {
  const uint64_t z = mix64(seed + (element + 1) * kGamma);
  const int64_t sum = static_cast<int64_t>((z & 0xffff) + ((z >> 16) & 0xffff) + ((z >> 32) & 0xffff) + (z >> 48));
  return static_cast<float>(sum - 131070) * kIrwinHallInvStd;
}

// Values exact in bf16, f16 and f32 alike: bf16 rounding, and nothing in f16's subnormal range.
float round_for_all_float_types(float x) {
  const float r = bf16_to_f32(f32_to_bf16(x));
  return std::fabs(r) < 0x1p-14f ? 0.0f : r;
}

enum class Kind { kEmbed, kHead, kLinear, kNorm, kBias };

struct TensorDef {
  SyntheticTensorInfo info;
  Kind kind = Kind::kLinear;
  int64_t layer = -1;
  std::string role;            // GGUF short name without "blk.N." / ".weight": "attn_v", "output", ...
  int64_t permute_heads = 0;   // > 0: llama Q/K whose GGUF rows are in adjacent-pair order
  float gguf_offset = 0.0f;    // added to the values in GGUF (Gemma norms: HF stores w - 1)
};

std::vector<TensorDef> tensor_defs(const SyntheticModelSpec& s) {
  const int64_t hd = synthetic_head_dim(s);
  const int64_t q_dim = s.n_heads * hd, kv_dim = s.n_kv_heads * hd;
  const bool permute = s.arch == "llama";
  const bool gemma = s.arch == "gemma3";
  const float norm_offset = gemma ? 1.0f : 0.0f;
  std::vector<TensorDef> defs;
  auto add = [&](std::string hf, std::string gguf, std::vector<int64_t> shape, Kind kind, int64_t layer,
                 std::string role, int64_t permute_heads = 0) {
    const float offset = kind == Kind::kNorm ? norm_offset : 0.0f;
    defs.push_back(
        {{std::move(hf), std::move(gguf), std::move(shape)}, kind, layer, std::move(role), permute_heads, offset});
  };
  add("model.embed_tokens.weight", "token_embd.weight", {s.vocab, s.hidden}, Kind::kEmbed, -1, "token_embd");
  for (int64_t l = 0; l < s.n_layers; ++l) {
    const std::string hf = fmt::format("model.layers.{}.", l);
    const std::string gg = fmt::format("blk.{}.", l);
    add(hf + "input_layernorm.weight", gg + "attn_norm.weight", {s.hidden}, Kind::kNorm, l, "attn_norm");
    add(hf + "self_attn.q_proj.weight", gg + "attn_q.weight", {q_dim, s.hidden}, Kind::kLinear, l, "attn_q",
        permute ? s.n_heads : 0);
    add(hf + "self_attn.k_proj.weight", gg + "attn_k.weight", {kv_dim, s.hidden}, Kind::kLinear, l, "attn_k",
        permute ? s.n_kv_heads : 0);
    add(hf + "self_attn.v_proj.weight", gg + "attn_v.weight", {kv_dim, s.hidden}, Kind::kLinear, l, "attn_v");
    if (s.qkv_bias) {
      add(hf + "self_attn.q_proj.bias", gg + "attn_q.bias", {q_dim}, Kind::kBias, l, "attn_q.bias");
      add(hf + "self_attn.k_proj.bias", gg + "attn_k.bias", {kv_dim}, Kind::kBias, l, "attn_k.bias");
      add(hf + "self_attn.v_proj.bias", gg + "attn_v.bias", {kv_dim}, Kind::kBias, l, "attn_v.bias");
    }
    if (s.qk_norm) {
      add(hf + "self_attn.q_norm.weight", gg + "attn_q_norm.weight", {hd}, Kind::kNorm, l, "attn_q_norm");
      add(hf + "self_attn.k_norm.weight", gg + "attn_k_norm.weight", {hd}, Kind::kNorm, l, "attn_k_norm");
    }
    add(hf + "self_attn.o_proj.weight", gg + "attn_output.weight", {s.hidden, q_dim}, Kind::kLinear, l, "attn_output");
    if (gemma) {
      // HF's post_attention_layernorm norms the attention output here; GGUF's ffn_norm is the pre-FFN norm.
      add(hf + "post_attention_layernorm.weight", gg + "post_attention_norm.weight", {s.hidden}, Kind::kNorm, l,
          "post_attention_norm");
      add(hf + "pre_feedforward_layernorm.weight", gg + "ffn_norm.weight", {s.hidden}, Kind::kNorm, l, "ffn_norm");
    } else {
      add(hf + "post_attention_layernorm.weight", gg + "ffn_norm.weight", {s.hidden}, Kind::kNorm, l, "ffn_norm");
    }
    add(hf + "mlp.gate_proj.weight", gg + "ffn_gate.weight", {s.ffn, s.hidden}, Kind::kLinear, l, "ffn_gate");
    add(hf + "mlp.up_proj.weight", gg + "ffn_up.weight", {s.ffn, s.hidden}, Kind::kLinear, l, "ffn_up");
    add(hf + "mlp.down_proj.weight", gg + "ffn_down.weight", {s.hidden, s.ffn}, Kind::kLinear, l, "ffn_down");
    if (gemma)
      add(hf + "post_feedforward_layernorm.weight", gg + "post_ffw_norm.weight", {s.hidden}, Kind::kNorm, l,
          "post_ffw_norm");
  }
  add("model.norm.weight", "output_norm.weight", {s.hidden}, Kind::kNorm, -1, "output_norm");
  if (!s.tie_embeddings) add("lm_head.weight", "output.weight", {s.vocab, s.hidden}, Kind::kHead, -1, "output");
  return defs;
}

const TensorDef* find_def(const std::vector<TensorDef>& defs, std::string_view hf_name) {
  for (const TensorDef& d : defs)
    if (d.info.hf_name == hf_name) return &d;
  return nullptr;
}

// Generates rows of one tensor in HF layout; any row can be produced on its own.
class RowGenerator {
 public:
  RowGenerator(const SyntheticModelSpec& spec, const TensorDef& def)
      : seed_(mix64(spec.seed * kGamma ^ fnv1a64(def.info.hf_name))),
        kind_(def.kind),
        cols_(def.info.shape.back()),
        norm_base_(1.0f - def.gguf_offset) {
    const float hidden = static_cast<float>(spec.hidden);
    switch (def.kind) {
      case Kind::kEmbed: std_ = spec.tie_embeddings ? kHeadGain / std::sqrt(hidden) : 1.0f; break;
      case Kind::kHead: std_ = kHeadGain / std::sqrt(hidden); break;
      case Kind::kLinear: std_ = 1.0f / std::sqrt(static_cast<float>(def.info.shape[1])); break;
      case Kind::kNorm:
      case Kind::kBias: std_ = kVectorNoise; break;
    }
  }

  void row(int64_t r, float* out) const {
    const auto base = static_cast<uint64_t>(r) * static_cast<uint64_t>(cols_);
    for (int64_t c = 0; c < cols_; ++c) out[c] = unit_normal(seed_, base + static_cast<uint64_t>(c)) * std_;
    if (kind_ == Kind::kNorm)
      for (int64_t c = 0; c < cols_; ++c) out[c] = round_for_all_float_types(norm_base_ + out[c]);
    if (kind_ == Kind::kBias)
      for (int64_t c = 0; c < cols_; ++c) out[c] = round_for_all_float_types(out[c]);
  }

 private:
  uint64_t seed_;
  Kind kind_;
  int64_t cols_;
  float norm_base_;  // 1 (w ~ 1 + noise), or 0 where the file stores w - 1 (HF Gemma)
  float std_ = 1.0f;
};

// GGUF row -> HF row for llama's Q/K: within each head, GGUF keeps rotation pairs adjacent
// (rows 2i, 2i+1) where HF keeps halves (rows i, i + hd/2).
int64_t hf_row_of_gguf_row(int64_t g, int64_t rows, int64_t permute_heads) {
  if (permute_heads <= 0) return g;
  const int64_t hd = rows / permute_heads;
  const int64_t head = g / hd, w = g % hd;
  return head * hd + (w % 2 == 0 ? w / 2 : w / 2 + hd / 2);
}

void store_row(QuantType type, const float* src, uint8_t* dst, int64_t k) {
  switch (type) {
    case QuantType::kF32: std::memcpy(dst, src, static_cast<size_t>(k) * 4); break;
    case QuantType::kF16:
      for (int64_t i = 0; i < k; ++i) {
        const uint16_t h = f32_to_fp16(src[i]);
        std::memcpy(dst + 2 * i, &h, 2);
      }
      break;
    case QuantType::kBF16:
      for (int64_t i = 0; i < k; ++i) {
        const uint16_t b = f32_to_bf16(src[i]);
        std::memcpy(dst + 2 * i, &b, 2);
      }
      break;
    default: quantize_row(type, src, dst, k); break;
  }
}

QuantType gguf_type_of(const SyntheticModelSpec& spec, const TensorDef& def);

// Fills a whole tensor, rows generated and converted in parallel straight into `dst`. `gguf`:
// GGUF's Q/K row order and values (Gemma norms + 1).
Status fill_tensor(ThreadPool& pool, const SyntheticModelSpec& spec, const TensorDef& def, QuantType type,
                   bool gguf, std::span<uint8_t> dst) {
  const int64_t cols = def.info.shape.back();
  const int64_t rows = def.info.shape.size() == 1 ? 1 : def.info.shape[0];
  const size_t stride = row_bytes(type, cols);
  TESSERA_CHECK(dst.size() == stride * static_cast<size_t>(rows), "{}: {} bytes for {} rows of {}", def.info.hf_name,
                dst.size(), rows, stride);
  const RowGenerator gen(spec, def);
  const int64_t permute = gguf ? def.permute_heads : 0;
  const float offset = gguf ? def.gguf_offset : 0.0f;
  QuantType grid = QuantType::kF32;  // spec.grid_type's type for this tensor
  if (spec.grid_type != QuantType::kF32 && def.info.shape.size() == 2) {
    SyntheticModelSpec grid_spec = spec;
    grid_spec.weight_type = spec.grid_type;
    grid_spec.gguf_mixed_q4_k_m = false;
    grid = gguf_type_of(grid_spec, def);
  }
  pool.parallel_for(rows, kRowsPerTask, [&](int64_t begin, int64_t end, int) {
    std::vector<float> buf(static_cast<size_t>(cols));
    std::vector<uint8_t> grid_row(grid == QuantType::kF32 ? 0 : row_bytes(grid, cols));
    for (int64_t r = begin; r < end; ++r) {
      gen.row(hf_row_of_gguf_row(r, rows, permute), buf.data());
      if (offset != 0.0f)
        for (float& v : buf) v += offset;  // exact: the values are bf16-precise and near 0
      if (grid != QuantType::kF32) {
        store_row(grid, buf.data(), grid_row.data(), cols);
        dequantize_row(grid, grid_row.data(), buf.data(), cols);
      }
      store_row(type, buf.data(), dst.data() + static_cast<size_t>(r) * stride, cols);
    }
  });
  return Status::ok();
}

QuantType gguf_type_of(const SyntheticModelSpec& spec, const TensorDef& def) {
  if (def.info.shape.size() == 1) return QuantType::kF32;
  QuantType t = spec.weight_type;
  if (spec.gguf_mixed_q4_k_m) {
    // A tied embedding is also the LM head, so it gets the head's extra bits.
    const bool head = def.role == "output" || (def.role == "token_embd" && spec.tie_embeddings);
    const bool more_bits = (def.role == "attn_v" || def.role == "ffn_down") && def.layer % 2 == 0;
    t = head || more_bits ? QuantType::kQ6_K : QuantType::kQ4_K;
  }
  // A matrix whose columns fill no block of its format: the format's file_fallback (the
  // table's column, llama.cpp's choice), else F16.
  const int64_t cols = def.info.shape.back();
  if (cols % quant_traits(t).block_elems != 0 && quant_traits(t).file_fallback != QuantType::kCount)
    t = quant_traits(t).file_fallback;
  if (cols % quant_traits(t).block_elems != 0) t = QuantType::kF16;
  return t;
}

// The formats a GGUF file of the writer holds throughout: those with a file_type.
bool gguf_weight_type_ok(QuantType t) { return quant_traits(t).file_type >= 0; }

// JSON numbers for float fields: the float's shortest decimal (1e-05, not 9.999999747378752e-06).
double json_float(float f) { return std::stod(fmt::format("{}", f)); }

std::string_view torch_dtype(QuantType t) {
  switch (t) {
    case QuantType::kF16: return "float16";
    case QuantType::kBF16: return "bfloat16";
    default: return "float32";
  }
}

// Gemma 3's config.json (transformers' Gemma3TextConfig fields; no softcapping).
nlohmann::ordered_json gemma3_config(const SyntheticModelSpec& s) {
  const int64_t hd = synthetic_head_dim(s);
  nlohmann::ordered_json c;
  c["architectures"] = {"Gemma3ForCausalLM"};
  c["attention_bias"] = false;
  c["attention_dropout"] = 0.0;
  c["bos_token_id"] = kSyntheticBosId;
  c["eos_token_id"] = kSyntheticEosId;
  c["head_dim"] = hd;
  c["hidden_activation"] = "gelu_pytorch_tanh";
  c["hidden_size"] = s.hidden;
  c["initializer_range"] = 0.02;
  c["intermediate_size"] = s.ffn;
  std::vector<std::string> layer_types;
  for (bool local : gemma_local_layers(s.n_layers, s.sliding_window_pattern))
    layer_types.emplace_back(local ? "sliding_attention" : "full_attention");
  c["layer_types"] = layer_types;
  c["max_position_embeddings"] = s.max_positions;
  c["model_type"] = "gemma3_text";
  c["num_attention_heads"] = s.n_heads;
  c["num_hidden_layers"] = s.n_layers;
  c["num_key_value_heads"] = s.n_kv_heads;
  c["query_pre_attn_scalar"] = hd;
  c["rms_norm_eps"] = json_float(s.rms_eps);
  c["rope_local_base_freq"] = 10000.0;
  c["rope_scaling"] = nullptr;
  c["rope_theta"] = json_float(s.rope_theta);
  c["sliding_window"] = s.sliding_window;
  c["sliding_window_pattern"] = s.sliding_window_pattern;
  c["tie_word_embeddings"] = s.tie_embeddings;
  return c;
}

Result<std::string> hf_config_json(const SyntheticModelSpec& s) {
  using ojson = nlohmann::ordered_json;
  const int64_t hd = synthetic_head_dim(s);
  try {
    ojson c;
    if (s.arch == "gemma3") {
      c = gemma3_config(s);
    } else {
      if (s.arch == "llama") {
        c["architectures"] = {"LlamaForCausalLM"};
        c["attention_bias"] = false;
        c["mlp_bias"] = false;
      } else if (s.arch == "qwen2") {
        c["architectures"] = {"Qwen2ForCausalLM"};
      } else {
        c["architectures"] = {"Qwen3ForCausalLM"};
        c["attention_bias"] = false;
      }
      c["attention_dropout"] = 0.0;
      c["bos_token_id"] = kSyntheticBosId;
      c["eos_token_id"] = kSyntheticEosId;
      c["head_dim"] = hd;
      c["hidden_act"] = "silu";
      c["hidden_size"] = s.hidden;
      c["initializer_range"] = 0.02;
      c["intermediate_size"] = s.ffn;
      c["max_position_embeddings"] = s.max_positions;
      if (s.arch != "llama") c["max_window_layers"] = s.n_layers;
      c["model_type"] = s.arch;
      c["num_attention_heads"] = s.n_heads;
      c["num_hidden_layers"] = s.n_layers;
      c["num_key_value_heads"] = s.n_kv_heads;
      if (s.arch == "llama") c["pretraining_tp"] = 1;
      c["rms_norm_eps"] = json_float(s.rms_eps);
      c["rope_scaling"] = nullptr;
      c["rope_theta"] = json_float(s.rope_theta);
      if (s.arch != "llama") {
        c["sliding_window"] = nullptr;
        c["use_sliding_window"] = false;
      }
      c["tie_word_embeddings"] = s.tie_embeddings;
    }
    if (s.hf_int4_packing == "awq") {
      c["quantization_config"] = {{"quant_method", "awq"}, {"bits", 4}, {"group_size", 128},
                                  {"zero_point", !s.int4_sym}, {"version", "gemm"}};
    } else if (s.hf_int4_packing == "gptq") {
      c["quantization_config"] = {{"quant_method", "gptq"}, {"bits", 4}, {"group_size", 128}, {"sym", s.int4_sym},
                                  {"desc_act", s.gptq_act_order}, {"checkpoint_format", "gptq"}};
    }
    c["torch_dtype"] = torch_dtype(s.weight_type);
    c["use_cache"] = true;
    c["vocab_size"] = s.vocab;
    return c.dump(2) + "\n";
  } catch (const std::exception& e) {
    return Status::internal(fmt::format("config.json: cannot encode: {}", e.what()));
  }
}

Status write_text(const std::string& path, const std::string& text) {
  TESSERA_ASSIGN_OR_RETURN(AtomicFile file, AtomicFile::create(path));
  TESSERA_RETURN_IF_ERROR(file.write(text.data(), text.size()));
  return file.commit();
}

Status make_dir(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return Status::io_error(fmt::format("{}: {}", dir, ec.message()));
  return Status::ok();
}

}  // namespace

const std::vector<std::string>& synthetic_preset_names() {
  static const std::vector<std::string> kNames = {"tiny", "gqa4", "110m", "1.1b", "llama3-8b", "gemma3-tiny"};
  return kNames;
}

SyntheticModelSpec block_aligned_spec(QuantType weight_type, uint64_t seed) {
  SyntheticModelSpec s;
  s.hidden = 256;
  s.n_layers = 2;
  s.n_heads = 4;
  s.n_kv_heads = 2;
  s.ffn = 512;
  s.vocab = 512;
  s.max_positions = 128;
  s.weight_type = weight_type;
  s.seed = seed;
  return s;
}

Result<SyntheticModelSpec> synthetic_preset(std::string_view name) {
  SyntheticModelSpec s;
  auto set = [&](int64_t hidden, int64_t layers, int64_t heads, int64_t kv, int64_t ffn, int64_t vocab, int64_t ctx) {
    s.hidden = hidden;
    s.n_layers = layers;
    s.n_heads = heads;
    s.n_kv_heads = kv;
    s.ffn = ffn;
    s.vocab = vocab;
    s.max_positions = ctx;
  };
  if (name == "tiny") {
    set(128, 4, 4, 2, 384, 2048, 1024);
  } else if (name == "gqa4") {
    set(256, 4, 8, 4, 512, 2048, 1024);
  } else if (name == "110m") {
    set(768, 12, 12, 12, 2048, 32000, 2048);
  } else if (name == "1.1b") {
    set(2048, 22, 32, 4, 5632, 32000, 2048);
  } else if (name == "llama3-8b") {
    set(4096, 32, 32, 8, 14336, 128256, 8192);
    s.rope_theta = 500000.0f;
  } else if (name == "gemma3-tiny") {
    // Both kinds of layer (0-4 and 6 local, 5 global) and a window short enough for tests of
    // ~40 tokens to cross it; head_dim 64 != hidden / heads, as in Gemma 3 1B (1152 / 4 = 288).
    set(128, 7, 4, 1, 384, 2048, 1024);
    s.arch = "gemma3";
    s.head_dim = 64;
    s.qk_norm = true;
    s.tie_embeddings = true;
    s.rope_theta = 1000000.0f;
    s.rms_eps = 1e-6f;
    s.sliding_window = 8;
    s.sliding_window_pattern = 6;
  } else {
    return Status::not_found(fmt::format("unknown synthetic preset '{}' (known: {})", name,
                                         fmt::join(synthetic_preset_names(), ", ")));
  }
  return s;
}

Status validate_synthetic_spec(const SyntheticModelSpec& s) {
  auto bad = [](std::string m) { return Status::invalid_argument("synthetic model: " + std::move(m)); };
  if (s.arch != "llama" && s.arch != "qwen2" && s.arch != "qwen3" && s.arch != "gemma3")
    return bad(fmt::format("arch '{}' is not llama, qwen2, qwen3 or gemma3", s.arch));
  const std::pair<const char*, int64_t> sizes[] = {{"hidden", s.hidden},   {"n_layers", s.n_layers},
                                                   {"n_heads", s.n_heads}, {"n_kv_heads", s.n_kv_heads},
                                                   {"ffn", s.ffn},         {"max_positions", s.max_positions}};
  for (const auto& [field, v] : sizes)
    if (v <= 0 || v > (int64_t{1} << 20)) return bad(fmt::format("{} = {} outside [1, 2^20]", field, v));
  if (s.head_dim < 0 || s.head_dim > (int64_t{1} << 16))
    return bad(fmt::format("head_dim = {} outside [0, 2^16] (0: hidden / n_heads)", s.head_dim));
  if (s.head_dim == 0 && s.hidden % s.n_heads != 0)
    return bad(fmt::format("hidden {} is not a multiple of n_heads {} (and head_dim is 0)", s.hidden, s.n_heads));
  const int64_t hd = synthetic_head_dim(s);
  if (hd % 2 != 0) return bad(fmt::format("head_dim {} is odd (RoPE needs pairs)", hd));
  if (s.n_heads % s.n_kv_heads != 0)
    return bad(fmt::format("n_heads {} is not a multiple of n_kv_heads {}", s.n_heads, s.n_kv_heads));
  if (s.vocab < synthetic_vocab_min_size() || s.vocab > (int64_t{1} << 24))
    return bad(fmt::format("vocab = {} outside [{}, 2^24]", s.vocab, synthetic_vocab_min_size()));
  if (!(s.rope_theta > 0.0f) || !std::isfinite(s.rope_theta)) return bad(fmt::format("rope_theta = {}", s.rope_theta));
  if (!(s.rms_eps > 0.0f) || !std::isfinite(s.rms_eps)) return bad(fmt::format("rms_eps = {}", s.rms_eps));
  if (s.qkv_bias != (s.arch == "qwen2"))
    return bad(fmt::format("qkv_bias = {} with arch '{}' (q/k/v biases go with qwen2 and only qwen2)", s.qkv_bias, s.arch));
  const bool gemma = s.arch == "gemma3";
  if (s.qk_norm != (s.arch == "qwen3" || gemma))
    return bad(fmt::format("qk_norm = {} with arch '{}' (q/k norms go with qwen3 and gemma3 only)", s.qk_norm, s.arch));
  if (gemma) {
    if (!s.tie_embeddings) return bad("tie_embeddings = false with arch 'gemma3' (Gemma 3 ties its LM head)");
    if (s.sliding_window <= 0 || s.sliding_window > s.max_positions)
      return bad(fmt::format("sliding_window = {} outside [1, max_positions {}] with arch 'gemma3'", s.sliding_window,
                             s.max_positions));
    if (s.sliding_window_pattern < 1 || s.sliding_window_pattern > (int64_t{1} << 20))
      return bad(fmt::format("sliding_window_pattern = {} outside [1, 2^20]", s.sliding_window_pattern));
  } else if (s.sliding_window != 0) {
    return bad(fmt::format("sliding_window = {} with arch '{}' (windows go with gemma3 only)", s.sliding_window, s.arch));
  }
  if (s.hf_shards < 1) return bad(fmt::format("hf_shards = {}", s.hf_shards));
  return Status::ok();
}

int64_t synthetic_head_dim(const SyntheticModelSpec& spec) {
  if (spec.head_dim > 0) return spec.head_dim;
  return spec.n_heads > 0 ? spec.hidden / spec.n_heads : 0;
}

std::vector<SyntheticTensorInfo> synthetic_tensors(const SyntheticModelSpec& spec) {
  std::vector<SyntheticTensorInfo> out;
  if (!validate_synthetic_spec(spec).is_ok()) return out;
  for (TensorDef& d : tensor_defs(spec)) out.push_back(std::move(d.info));
  return out;
}

Result<std::vector<float>> synthetic_tensor_values(const SyntheticModelSpec& spec, std::string_view hf_name) {
  TESSERA_RETURN_IF_ERROR(validate_synthetic_spec(spec));
  const std::vector<TensorDef> defs = tensor_defs(spec);
  const TensorDef* def = find_def(defs, hf_name);
  if (!def) return Status::not_found(fmt::format("synthetic model has no tensor '{}'", hf_name));
  const int64_t cols = def->info.shape.back();
  const int64_t rows = def->info.shape.size() == 1 ? 1 : def->info.shape[0];
  std::vector<float> values(static_cast<size_t>(rows * cols));
  const RowGenerator gen(spec, *def);
  for (int64_t r = 0; r < rows; ++r) gen.row(r, values.data() + r * cols);
  return values;
}

Result<QuantType> synthetic_gguf_tensor_type(const SyntheticModelSpec& spec, std::string_view hf_name) {
  TESSERA_RETURN_IF_ERROR(validate_synthetic_spec(spec));
  const std::vector<TensorDef> defs = tensor_defs(spec);
  const TensorDef* def = find_def(defs, hf_name);
  if (!def) return Status::not_found(fmt::format("synthetic model has no tensor '{}'", hf_name));
  return gguf_type_of(spec, *def);
}

std::vector<std::string> synthetic_weight_type_names() {
  std::vector<std::string> names;
  for (int i = 0; i < static_cast<int>(QuantType::kCount); ++i) {
    const QuantTraits& tr = quant_traits(static_cast<QuantType>(i));
    if (tr.file_type >= 0) names.push_back(ascii_lower(tr.name));
  }
  for (const char* n : {"q4_k_m", "awq", "gptq"}) names.emplace_back(n);
  return names;
}

uint32_t synthetic_gguf_file_type(const SyntheticModelSpec& spec) {
  if (spec.gguf_mixed_q4_k_m) return 15;  // MOSTLY_Q4_K_M
  const int file_type = quant_traits(spec.weight_type).file_type;  // the format's row (common/dtype.h)
  return file_type >= 0 ? static_cast<uint32_t>(file_type) : 0;
}

// One linear layer in AWQ or GPTQ packing (see SyntheticModelSpec::hf_int4_packing).
Status add_int4_packed(SafetensorsWriter& st, const SyntheticModelSpec& spec, const TensorDef& def) {
  const int64_t N = def.info.shape[0], K = def.info.shape[1];
  if (K % kInt4Group != 0 || N % 8 != 0)
    return Status::invalid_argument(fmt::format("{}: [{}, {}] cannot be packed in 4-bit groups of 128",
                                                def.info.hf_name, N, K));
  const int64_t G = K / kInt4Group;
  auto groups = std::make_shared<std::vector<Int4Group>>(static_cast<size_t>(N * G));
  const RowGenerator gen(spec, def);
  std::vector<float> row(static_cast<size_t>(K));
  std::vector<uint8_t> stored(row_bytes(spec.weight_type, K));
  for (int64_t n = 0; n < N; ++n) {
    gen.row(n, row.data());
    store_row(spec.weight_type, row.data(), stored.data(), K);  // the values a float file would hold
    dequantize_row(spec.weight_type, stored.data(), row.data(), K);
    for (int64_t g = 0; g < G; ++g)
      rtn_int4_group(row.data() + g * kInt4Group, spec.int4_sym ? Int4Grid::kSymmetric : Int4Grid::kAsymmetric,
                     &(*groups)[static_cast<size_t>(n * G + g)]);
  }
  const bool awq = spec.hf_int4_packing == "awq";
  const std::string prefix = def.info.hf_name.substr(0, def.info.hf_name.size() - 7);  // drop ".weight"
  auto at = [groups, G](int64_t n, int64_t k) -> const Int4Group& {
    return (*groups)[static_cast<size_t>(n * G + k / kInt4Group)];
  };
  auto put = [](std::span<uint8_t> dst, size_t i, uint32_t v) { std::memcpy(dst.data() + 4 * i, &v, 4); };
  // Nibble slot of column c (0..7) in a word: AWQ interleaves, GPTQ is sequential.
  auto slot = [awq](int64_t c) { return awq ? kAwqNibbleOfColumn[c] : static_cast<int>(c); };
  const std::vector<int64_t> qw_shape = awq ? std::vector<int64_t>{K, N / 8} : std::vector<int64_t>{K / 8, N};
  TESSERA_RETURN_IF_ERROR(st.add_tensor(prefix + ".qweight", qw_shape, QuantType::kI32, [=](std::span<uint8_t> dst) {
    for (int64_t r = 0; r < qw_shape[0]; ++r)
      for (int64_t c = 0; c < qw_shape[1]; ++c) {
        uint32_t v = 0;
        for (int64_t i = 0; i < 8; ++i) {
          const int64_t n = awq ? 8 * c + i : c, k = awq ? r : 8 * r + i;
          const uint32_t level = at(n, k).levels[k % kInt4Group];
          v |= level << (4 * (awq ? slot(i) : static_cast<int>(i)));
        }
        put(dst, static_cast<size_t>(r * qw_shape[1] + c), v);
      }
    return Status::ok();
  }));
  const std::vector<int64_t> z_shape = {G, N / 8};
  TESSERA_RETURN_IF_ERROR(st.add_tensor(prefix + ".qzeros", z_shape, QuantType::kI32, [=](std::span<uint8_t> dst) {
    for (int64_t g = 0; g < G; ++g)
      for (int64_t j = 0; j < N / 8; ++j) {
        uint32_t v = 0;
        for (int64_t c = 0; c < 8; ++c) {
          uint32_t z = at(8 * j + c, g * kInt4Group).zero;
          if (!awq) z = (z - 1) & 0xF;  // GPTQ v1 stores zero - 1
          v |= z << (4 * slot(c));
        }
        put(dst, static_cast<size_t>(g * (N / 8) + j), v);
      }
    return Status::ok();
  }));
  const std::vector<int64_t> s_shape = {G, N};
  TESSERA_RETURN_IF_ERROR(st.add_tensor(prefix + ".scales", s_shape, QuantType::kF16, [=](std::span<uint8_t> dst) {
    for (int64_t g = 0; g < G; ++g)
      for (int64_t n = 0; n < N; ++n)
        std::memcpy(dst.data() + 2 * static_cast<size_t>(g * N + n), &at(n, g * kInt4Group).scale_fp16, 2);
    return Status::ok();
  }));
  if (!awq) {
    const bool shuffled = spec.gptq_act_order;
    const std::vector<int64_t> g_shape = {K};
    TESSERA_RETURN_IF_ERROR(st.add_tensor(prefix + ".g_idx", g_shape, QuantType::kI32, [=](std::span<uint8_t> dst) {
      for (int64_t k = 0; k < K; ++k)
        put(dst, static_cast<size_t>(k), static_cast<uint32_t>(shuffled ? (k % G) : k / kInt4Group));
      return Status::ok();
    }));
  }
  return Status::ok();
}

Status write_synthetic_hf(const SyntheticModelSpec& spec, const std::string& dir) {
  TESSERA_RETURN_IF_ERROR(validate_synthetic_spec(spec));
  if (!spec.hf_int4_packing.empty() && spec.hf_int4_packing != "awq" && spec.hf_int4_packing != "gptq")
    return Status::invalid_argument(fmt::format("{}: 4-bit packing '{}' is not awq or gptq", dir, spec.hf_int4_packing));
  if (!quant_traits(spec.weight_type).is_float || spec.gguf_mixed_q4_k_m)
    return Status::invalid_argument(fmt::format("{}: a Hugging Face model holds F32, F16 or BF16 weights, not {}; "
                                                "write GGUF for quantized types", dir,
                                                spec.gguf_mixed_q4_k_m ? "Q4_K_M" : quant_name(spec.weight_type)));
  TESSERA_ASSIGN_OR_RETURN(SyntheticVocab vocab, build_synthetic_vocab(spec.vocab));
  TESSERA_RETURN_IF_ERROR(make_dir(dir));

  ThreadPool pool;
  SafetensorsWriter st;
  const std::vector<TensorDef> defs = tensor_defs(spec);
  for (const TensorDef& def : defs) {
    if (!spec.hf_int4_packing.empty() && def.kind == Kind::kLinear) {
      TESSERA_RETURN_IF_ERROR(add_int4_packed(st, spec, def));
      continue;
    }
    TESSERA_RETURN_IF_ERROR(st.add_tensor(def.info.hf_name, def.info.shape, spec.weight_type,
                                          [&pool, &spec, &def](std::span<uint8_t> dst) {
                                            return fill_tensor(pool, spec, def, spec.weight_type, false, dst);
                                          }));
  }
  if (spec.hf_shards > 1) {
    TESSERA_RETURN_IF_ERROR(st.write_sharded(dir, spec.hf_shards));
  } else {
    TESSERA_RETURN_IF_ERROR(st.write(dir + "/model.safetensors"));
  }

  TESSERA_ASSIGN_OR_RETURN(std::string config, hf_config_json(spec));
  TESSERA_RETURN_IF_ERROR(write_text(dir + "/config.json", config));
  TESSERA_ASSIGN_OR_RETURN(std::string tokenizer, synthetic_tokenizer_json(vocab));
  TESSERA_RETURN_IF_ERROR(write_text(dir + "/tokenizer.json", tokenizer));
  TESSERA_ASSIGN_OR_RETURN(std::string tok_config, synthetic_tokenizer_config_json(spec.max_positions));
  TESSERA_RETURN_IF_ERROR(write_text(dir + "/tokenizer_config.json", tok_config));
  TESSERA_RETURN_IF_ERROR(write_text(dir + "/special_tokens_map.json",
                                     "{\n  \"bos_token\": \"<s>\",\n  \"eos_token\": \"</s>\",\n"
                                     "  \"unk_token\": \"<unk>\"\n}\n"));
  return write_text(dir + "/generation_config.json",
                    fmt::format("{{\n  \"bos_token_id\": {},\n  \"eos_token_id\": {}\n}}\n", kSyntheticBosId,
                                kSyntheticEosId));
}

Status write_synthetic_gguf(const SyntheticModelSpec& spec, const std::string& path) {
  TESSERA_RETURN_IF_ERROR(validate_synthetic_spec(spec));
  if (!spec.gguf_mixed_q4_k_m && !gguf_weight_type_ok(spec.weight_type))
    return Status::invalid_argument(fmt::format("{}: cannot write {} weights to GGUF", path, quant_name(spec.weight_type)));
  TESSERA_ASSIGN_OR_RETURN(SyntheticVocab vocab, build_synthetic_vocab(spec.vocab));

  const int64_t hd = synthetic_head_dim(spec);
  const std::string& a = spec.arch;
  auto u32 = [](int64_t v) { return static_cast<uint32_t>(v); };
  GgufWriter w;
  w.set_string("general.architecture", a);
  w.set_string("general.type", "model");
  w.set_string("general.name", "tessera-synthetic");
  w.set_u32(a + ".context_length", u32(spec.max_positions));
  w.set_u32(a + ".embedding_length", u32(spec.hidden));
  w.set_u32(a + ".block_count", u32(spec.n_layers));
  w.set_u32(a + ".feed_forward_length", u32(spec.ffn));
  w.set_u32(a + ".attention.head_count", u32(spec.n_heads));
  w.set_u32(a + ".attention.head_count_kv", u32(spec.n_kv_heads));
  w.set_u32(a + ".attention.key_length", u32(hd));
  w.set_u32(a + ".attention.value_length", u32(hd));
  w.set_f32(a + ".attention.layer_norm_rms_epsilon", spec.rms_eps);
  w.set_f32(a + ".rope.freq_base", spec.rope_theta);
  w.set_u32(a + ".rope.dimension_count", u32(hd));
  w.set_u32(a + ".vocab_size", u32(spec.vocab));
  if (a == "gemma3") {
    w.set_u32(a + ".attention.sliding_window", u32(spec.sliding_window));
    // llama.cpp's gemma3 files carry no pattern (it assumes 6); written only for another one.
    if (spec.sliding_window_pattern != 6)
      w.set_u32(a + ".attention.sliding_window_pattern", u32(spec.sliding_window_pattern));
  }
  w.set_u32("general.file_type", synthetic_gguf_file_type(spec));
  w.set_u32("general.quantization_version", 2);
  w.set_string("tokenizer.ggml.model", "llama");
  w.set_string("tokenizer.ggml.pre", "default");
  w.set_string_array("tokenizer.ggml.tokens", vocab.tokens);
  w.set_f32_array("tokenizer.ggml.scores", vocab.scores);
  w.set_i32_array("tokenizer.ggml.token_type", vocab.token_types);
  w.set_u32("tokenizer.ggml.bos_token_id", kSyntheticBosId);
  w.set_u32("tokenizer.ggml.eos_token_id", kSyntheticEosId);
  w.set_u32("tokenizer.ggml.unknown_token_id", kSyntheticUnkId);
  w.set_bool("tokenizer.ggml.add_bos_token", true);
  w.set_bool("tokenizer.ggml.add_eos_token", false);
  w.set_bool("tokenizer.ggml.add_space_prefix", true);
  w.set_string("tokenizer.chat_template", synthetic_chat_template());

  ThreadPool pool;
  const std::vector<TensorDef> defs = tensor_defs(spec);
  for (const TensorDef& def : defs) {
    const QuantType type = gguf_type_of(spec, def);
    TESSERA_RETURN_IF_ERROR(w.add_tensor(def.info.gguf_name, def.info.shape, type,
                                         [&pool, &spec, &def, type](std::span<uint8_t> dst) {
                                           return fill_tensor(pool, spec, def, type, true, dst);
                                         }));
  }
  return w.write(path);
}

}  // namespace tessera
