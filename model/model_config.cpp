#include "model/model_config.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <numbers>
#include <optional>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "model/gguf.h"

namespace tessera {
namespace {

using Json = nlohmann::json;

// Upper bounds that keep every product of two dimensions far from int64 overflow and reject
// absurd values from corrupted files before anything is allocated from them.
constexpr int64_t kMaxDim = int64_t{1} << 24;
constexpr int64_t kMaxLayers = 4096;

std::string json_type_name(const Json& j) {
  return j.type_name();
}

// Reads an integer field. A float with an integral value is accepted because some exporters
// write "64.0". Returns nullopt when the field is absent or null.
Result<std::optional<int64_t>> opt_int(const Json& obj, const char* key, std::string_view source) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return std::optional<int64_t>{};
  if (it->is_number_integer()) {
    if (it->is_number_unsigned() &&
        it->get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
      return Status::invalid_argument(fmt::format("{}: field '{}' is out of range", source, key));
    return std::optional<int64_t>{it->get<int64_t>()};
  }
  if (it->is_number_float()) {
    const double d = it->get<double>();
    if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9.0e15)
      return std::optional<int64_t>{static_cast<int64_t>(d)};
  }
  return Status::invalid_argument(fmt::format("{}: field '{}' must be an integer, got {} {}",
                                              source, key, json_type_name(*it), it->dump()));
}

Result<int64_t> req_int(const Json& obj, const char* key, std::string_view source) {
  TESSERA_ASSIGN_OR_RETURN(auto v, opt_int(obj, key, source));
  if (!v) return Status::invalid_argument(fmt::format("{}: missing field '{}'", source, key));
  return *v;
}

Result<std::optional<double>> opt_float(const Json& obj, const char* key, std::string_view source) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return std::optional<double>{};
  if (it->is_number()) return std::optional<double>{it->get<double>()};
  return Status::invalid_argument(fmt::format("{}: field '{}' must be a number, got {} {}", source,
                                              key, json_type_name(*it), it->dump()));
}

Result<std::optional<bool>> opt_bool(const Json& obj, const char* key, std::string_view source) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return std::optional<bool>{};
  if (it->is_boolean()) return std::optional<bool>{it->get<bool>()};
  return Status::invalid_argument(fmt::format("{}: field '{}' must be true or false, got {}",
                                              source, key, it->dump()));
}

Result<std::optional<std::string>> opt_string(const Json& obj, const char* key,
                                              std::string_view source) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return std::optional<std::string>{};
  if (it->is_string()) return std::optional<std::string>{it->get<std::string>()};
  return Status::invalid_argument(fmt::format("{}: field '{}' must be a string, got {}", source,
                                              key, it->dump()));
}

Result<Architecture> parse_architecture(const Json& j, std::string_view source) {
  auto it = j.find("architectures");
  if (it != j.end() && !it->is_null()) {
    if (!it->is_array() || it->empty() || !(*it)[0].is_string())
      return Status::invalid_argument(fmt::format(
          "{}: field 'architectures' must be a non-empty list of strings, got {}", source,
          it->dump()));
    const std::string name = (*it)[0].get<std::string>();
    if (const ArchitectureTraits* row = find_architecture_by_hf_class(name)) return row->arch;
    return Status::unimplemented(fmt::format("{}: unsupported architecture '{}' (supported: {})", source, name,
                                             architecture_names_list(&ArchitectureTraits::hf_classes)));
  }
  TESSERA_ASSIGN_OR_RETURN(auto model_type, opt_string(j, "model_type", source));
  if (!model_type)
    return Status::invalid_argument(
        fmt::format("{}: missing field 'architectures' (and no 'model_type')", source));
  if (const ArchitectureTraits* row = find_architecture_by_model_type(*model_type)) return row->arch;
  return Status::unimplemented(fmt::format("{}: unsupported architecture '{}' (model_type; supported: {})", source,
                                           *model_type, architecture_names_list(&ArchitectureTraits::hf_model_types)));
}

Status parse_rope_scaling(const Json& j, std::string_view source, RopeScaling* out) {
  *out = RopeScaling{};
  // Newer transformers releases nest RoPE settings under "rope_parameters".
  const Json* rs = nullptr;
  const char* field = "rope_scaling";
  if (auto it = j.find("rope_scaling"); it != j.end() && !it->is_null()) {
    rs = &*it;
  } else if (auto it2 = j.find("rope_parameters"); it2 != j.end() && !it2->is_null()) {
    rs = &*it2;
    field = "rope_parameters";
  }
  if (!rs) return Status::ok();
  if (!rs->is_object())
    return Status::invalid_argument(
        fmt::format("{}: field '{}' must be an object or null, got {}", source, field, rs->dump()));
  std::optional<std::string> type;
  {
    TESSERA_ASSIGN_OR_RETURN(auto t1, opt_string(*rs, "rope_type", source));
    TESSERA_ASSIGN_OR_RETURN(auto t2, opt_string(*rs, "type", source));
    type = t1 ? t1 : t2;
  }
  if (!type || *type == "default") return Status::ok();
  auto get_factor = [&](const char* key, float* dst) -> Status {
    TESSERA_ASSIGN_OR_RETURN(auto v, opt_float(*rs, key, source));
    if (!v)
      return Status::invalid_argument(
          fmt::format("{}: field '{}.{}' is missing for rope type '{}'", source, field, key, *type));
    *dst = static_cast<float>(*v);
    return Status::ok();
  };
  if (*type == "linear") {
    out->type = RopeScalingType::kLinear;
    return get_factor("factor", &out->factor);
  }
  if (*type == "llama3") {
    out->type = RopeScalingType::kLlama3;
    TESSERA_RETURN_IF_ERROR(get_factor("factor", &out->factor));
    TESSERA_RETURN_IF_ERROR(get_factor("low_freq_factor", &out->low_freq_factor));
    TESSERA_RETURN_IF_ERROR(get_factor("high_freq_factor", &out->high_freq_factor));
    TESSERA_ASSIGN_OR_RETURN(auto orig, opt_int(*rs, "original_max_position_embeddings", source));
    if (!orig)
      return Status::invalid_argument(fmt::format(
          "{}: field '{}.original_max_position_embeddings' is missing for rope type 'llama3'",
          source, field));
    out->original_max_position = *orig;
    return Status::ok();
  }
  return Status::unimplemented(fmt::format(
      "{}: field '{}' has unsupported rope type '{}' (supported: default, linear, llama3)", source,
      field, *type));
}

Status parse_token_ids(const Json& j, std::string_view source, ModelConfig* c) {
  TESSERA_ASSIGN_OR_RETURN(auto bos, opt_int(j, "bos_token_id", source));
  c->bos_id = -1;
  if (bos) {
    if (*bos < 0 || *bos > std::numeric_limits<int32_t>::max())
      return Status::invalid_argument(
          fmt::format("{}: field 'bos_token_id' is out of range: {}", source, *bos));
    c->bos_id = static_cast<int32_t>(*bos);
  }
  c->eos_ids.clear();
  auto it = j.find("eos_token_id");
  if (it == j.end() || it->is_null()) return Status::ok();
  auto add = [&](const Json& v) -> Status {
    if (!v.is_number_integer() || v.get<int64_t>() < 0 ||
        v.get<int64_t>() > std::numeric_limits<int32_t>::max())
      return Status::invalid_argument(fmt::format(
          "{}: field 'eos_token_id' must be a token id or a list of ids, got {}", source, v.dump()));
    c->eos_ids.push_back(static_cast<int32_t>(v.get<int64_t>()));
    return Status::ok();
  };
  if (it->is_array()) {
    for (const Json& v : *it) TESSERA_RETURN_IF_ERROR(add(v));
  } else {
    TESSERA_RETURN_IF_ERROR(add(*it));
  }
  return Status::ok();
}

// quantization_config: AWQ (GEMM packing) and GPTQ, 4 bits, group size 128 (the I4_G128
// layout; other group sizes are refused here so the error comes before any tensor is read).
Status parse_quantization_config(const Json& j, std::string_view source, QuantizationConfig* q) {
  auto it = j.find("quantization_config");
  if (it == j.end() || it->is_null()) return Status::ok();
  if (!it->is_object())
    return Status::invalid_argument(fmt::format("{}: field 'quantization_config' must be an object", source));
  const Json& o = *it;
  TESSERA_ASSIGN_OR_RETURN(auto method, opt_string(o, "quant_method", source));
  if (!method)
    return Status::invalid_argument(fmt::format("{}: quantization_config has no 'quant_method'", source));
  if (*method == "awq") {
    q->method = CheckpointQuant::kAwq;
  } else if (*method == "gptq") {
    q->method = CheckpointQuant::kGptq;
  } else {
    return Status::unimplemented(fmt::format(
        "{}: quantization_config.quant_method '{}' is not supported (awq and gptq are)", source, *method));
  }
  TESSERA_ASSIGN_OR_RETURN(auto bits, opt_int(o, "bits", source));
  if (!bits) {
    TESSERA_ASSIGN_OR_RETURN(bits, opt_int(o, "w_bit", source));
  }
  q->bits = static_cast<int>(bits.value_or(4));
  if (q->bits != 4)
    return Status::unimplemented(fmt::format("{}: quantization_config.bits is {}; only 4-bit {} is supported",
                                             source, q->bits, *method));
  TESSERA_ASSIGN_OR_RETURN(auto group, opt_int(o, "group_size", source));
  if (!group) {
    TESSERA_ASSIGN_OR_RETURN(group, opt_int(o, "q_group_size", source));
  }
  q->group_size = group.value_or(128);
  if (q->group_size != 128)
    return Status::unimplemented(fmt::format(
        "{}: quantization_config.group_size is {}; Tessera's INT4 layout uses groups of 128", source,
        q->group_size));
  if (q->method == CheckpointQuant::kAwq) {
    TESSERA_ASSIGN_OR_RETURN(auto zp, opt_bool(o, "zero_point", source));
    q->sym = !zp.value_or(true);
    TESSERA_ASSIGN_OR_RETURN(auto version, opt_string(o, "version", source));
    if (version && *version != "gemm" && *version != "GEMM")
      return Status::unimplemented(fmt::format(
          "{}: quantization_config.version '{}': only AWQ's GEMM packing is supported", source, *version));
  } else {
    TESSERA_ASSIGN_OR_RETURN(auto sym, opt_bool(o, "sym", source));
    q->sym = sym.value_or(true);
    TESSERA_ASSIGN_OR_RETURN(auto desc, opt_bool(o, "desc_act", source));
    q->desc_act = desc.value_or(false);
    TESSERA_ASSIGN_OR_RETURN(auto fmt_name, opt_string(o, "checkpoint_format", source));
    q->gptq_v2 = fmt_name && *fmt_name == "gptq_v2";
  }
  return Status::ok();
}

// The row's gated activation, as config.json spells it.
Status check_hf_activation(const Json& j, std::string_view source, const ArchitectureTraits& row) {
  switch (row.activation) {
    case GluActivation::kSilu: {
      TESSERA_ASSIGN_OR_RETURN(auto act, opt_string(j, "hidden_act", source));
      if (act && *act != "silu")
        return Status::unimplemented(
            fmt::format("{}: field 'hidden_act' is '{}'; only 'silu' is supported", source, *act));
      return Status::ok();
    }
    case GluActivation::kGeluTanh:
      // Gemma configs name it `hidden_activation`; `hidden_act` is the older key.
      for (const char* key : {"hidden_activation", "hidden_act"}) {
        TESSERA_ASSIGN_OR_RETURN(auto a, opt_string(j, key, source));
        if (a && *a != "gelu_pytorch_tanh" && *a != "gelu_tanh")
          return Status::unimplemented(fmt::format("{}: field '{}' is '{}'; {} is supported with 'gelu_pytorch_tanh'",
                                                   source, key, *a, row.display_name));
      }
      return Status::ok();
  }
  return Status::ok();
}

}  // namespace

// The parsed config.json that HfConfigHooks (model/architecture.h) read.
struct HfConfigJson {
  const nlohmann::json& json;
};

// Gemma 3 (`gemma3_text`): softcapping (refused), the local RoPE base, the attention scale, the
// sliding-window layers (`layer_types` or `sliding_window_pattern`). Newer transformers nest the
// two RoPE settings under rope_parameters {"full_attention": {...}, "sliding_attention": {...}}.
// The activation, the (1 + w) norms and the tied head are the row's (model/architecture.h).
Status gemma3_hf_config(const HfConfigJson& hf, std::string_view source, ModelConfig* c) {
  const Json& j = hf.json;
  for (const char* key : {"final_logit_softcapping", "attn_logit_softcapping"}) {
    TESSERA_ASSIGN_OR_RETURN(auto cap, opt_float(j, key, source));
    if (cap)
      return Status::unimplemented(
          fmt::format("{}: field '{}' is {}; logit softcapping is not supported", source, key, *cap));
  }
  TESSERA_ASSIGN_OR_RETURN(auto local_base, opt_float(j, "rope_local_base_freq", source));
  if (auto it = j.find("rope_parameters"); it != j.end() && it->is_object()) {
    if (auto full = it->find("full_attention"); full != it->end() && full->is_object()) {
      TESSERA_ASSIGN_OR_RETURN(auto theta, opt_float(*full, "rope_theta", source));
      if (theta) c->rope_theta = static_cast<float>(*theta);
      TESSERA_RETURN_IF_ERROR(parse_rope_scaling(Json{{"rope_scaling", *full}}, source, &c->rope_scaling));
    }
    if (auto slide = it->find("sliding_attention"); slide != it->end() && slide->is_object()) {
      TESSERA_ASSIGN_OR_RETURN(auto theta, opt_float(*slide, "rope_theta", source));
      if (theta) local_base = theta;
    }
  }
  c->rope_theta_local = static_cast<float>(local_base.value_or(10000.0));
  TESSERA_ASSIGN_OR_RETURN(auto scalar, opt_float(j, "query_pre_attn_scalar", source));
  c->query_pre_attn_scalar = static_cast<float>(scalar.value_or(256.0));
  TESSERA_ASSIGN_OR_RETURN(auto window, opt_int(j, "sliding_window", source));
  c->sliding_window = window.value_or(4096);
  if (auto it = j.find("layer_types"); it != j.end() && !it->is_null()) {
    if (!it->is_array())
      return Status::invalid_argument(fmt::format("{}: field 'layer_types' must be a list", source));
    c->local_layers.clear();
    for (const Json& t : *it) {
      const std::string name = t.is_string() ? t.get<std::string>() : t.dump();
      if (name != "sliding_attention" && name != "full_attention")
        return Status::invalid_argument(fmt::format(
            "{}: field 'layer_types' holds '{}' (expected sliding_attention or full_attention)", source, name));
      c->local_layers.push_back(name == "sliding_attention");
    }
  } else {
    TESSERA_ASSIGN_OR_RETURN(auto pattern, opt_int(j, "sliding_window_pattern", source));
    const int64_t n = pattern.value_or(6);
    if (n < 1 || n > kMaxLayers)
      return Status::invalid_argument(
          fmt::format("{}: field 'sliding_window_pattern' must be in [1, {}], got {}", source, kMaxLayers, n));
    c->local_layers = gemma_local_layers(c->n_layers, n);
  }
  return Status::ok();
}

namespace {

Result<ModelConfig> parse_hf_config_json(const Json& j, std::string_view source) {
  if (!j.is_object())
    return Status::invalid_argument(fmt::format("{}: expected a JSON object", source));
  ModelConfig c;
  TESSERA_ASSIGN_OR_RETURN(c.arch, parse_architecture(j, source));
  const ArchitectureTraits& row = architecture_traits(c.arch);
  TESSERA_ASSIGN_OR_RETURN(c.hidden, req_int(j, "hidden_size", source));
  TESSERA_ASSIGN_OR_RETURN(c.n_layers, req_int(j, "num_hidden_layers", source));
  TESSERA_ASSIGN_OR_RETURN(c.n_heads, req_int(j, "num_attention_heads", source));
  TESSERA_ASSIGN_OR_RETURN(auto kv, opt_int(j, "num_key_value_heads", source));
  c.n_kv_heads = kv ? *kv : c.n_heads;
  TESSERA_ASSIGN_OR_RETURN(auto hd, opt_int(j, "head_dim", source));
  c.head_dim = hd ? *hd : (c.n_heads > 0 ? c.hidden / c.n_heads : 0);
  TESSERA_ASSIGN_OR_RETURN(c.ffn, req_int(j, "intermediate_size", source));
  TESSERA_ASSIGN_OR_RETURN(c.vocab, req_int(j, "vocab_size", source));
  TESSERA_ASSIGN_OR_RETURN(c.max_positions, req_int(j, "max_position_embeddings", source));
  TESSERA_ASSIGN_OR_RETURN(auto eps, opt_float(j, "rms_norm_eps", source));
  c.rms_eps = eps ? static_cast<float>(*eps) : 1e-6f;  // the transformers default
  TESSERA_ASSIGN_OR_RETURN(auto theta, opt_float(j, "rope_theta", source));
  if (!theta) {
    if (auto it = j.find("rope_parameters"); it != j.end() && it->is_object()) {
      TESSERA_ASSIGN_OR_RETURN(theta, opt_float(*it, "rope_theta", source));
    }
  }
  c.rope_theta = theta ? static_cast<float>(*theta) : 10000.0f;
  TESSERA_RETURN_IF_ERROR(parse_rope_scaling(j, source, &c.rope_scaling));
  TESSERA_ASSIGN_OR_RETURN(auto tie, opt_bool(j, "tie_word_embeddings", source));
  c.tie_embeddings = tie.value_or(row.hf_tie_embeddings_default);
  c.norm_weight_offset = row.hf_norm_weight_offset;
  TESSERA_RETURN_IF_ERROR(parse_token_ids(j, source, &c));
  TESSERA_RETURN_IF_ERROR(parse_quantization_config(j, source, &c.quantization));

  TESSERA_RETURN_IF_ERROR(check_hf_activation(j, source, row));
  if (row.hf_config_hook) TESSERA_RETURN_IF_ERROR(row.hf_config_hook(HfConfigJson{j}, source, &c));
  TESSERA_ASSIGN_OR_RETURN(auto mlp_bias, opt_bool(j, "mlp_bias", source));
  if (mlp_bias.value_or(false))
    return Status::unimplemented(
        fmt::format("{}: field 'mlp_bias' is true; MLP biases are not supported", source));
  TESSERA_ASSIGN_OR_RETURN(auto attn_bias, opt_bool(j, "attention_bias", source));

  if (row.qkv_bias) {
    c.qkv_bias = true;
  } else if (attn_bias.value_or(false)) {
    // Without the row's q/k/v biases, attention_bias puts a bias on o_proj too, which the
    // forward pass has no slot for.
    return Status::unimplemented(fmt::format(
        "{}: field 'attention_bias' is true; attention output biases are not supported", source));
  }
  c.qk_norm = row.qk_norm;

  TESSERA_ASSIGN_OR_RETURN(auto window, opt_int(j, "sliding_window", source));
  switch (row.sliding_window) {
    case SlidingWindowRule::kNone:
      break;
    case SlidingWindowRule::kEveryLayer:
      c.sliding_window = window.value_or(0);
      break;
    case SlidingWindowRule::kOptIn: {
      // Qwen configs always carry a window size; it only applies when use_sliding_window is set.
      TESSERA_ASSIGN_OR_RETURN(auto use, opt_bool(j, "use_sliding_window", source));
      c.sliding_window = use.value_or(false) ? window.value_or(0) : 0;
      break;
    }
    case SlidingWindowRule::kLocalLayers:
      break;  // the row's hook set it
  }
  return c;
}

Status check_positive(std::string_view source, std::string_view field, int64_t v, int64_t max) {
  if (v <= 0 || v > max)
    return Status::invalid_argument(
        fmt::format("{}: field '{}' must be in [1, {}], got {}", source, field, max, v));
  return Status::ok();
}

Result<Architecture> arch_from_gguf(std::string_view s, const GgufFile& g) {
  if (const ArchitectureTraits* row = find_architecture_by_gguf(s, g)) return row->arch;
  return Status::unimplemented(fmt::format("{}: unsupported architecture '{}' (general.architecture; supported: {})",
                                           g.path(), s, architecture_names_list(&ArchitectureTraits::gguf_names)));
}

Result<int64_t> gguf_int_or(const GgufFile& g, const std::string& key, int64_t fallback) {
  if (!g.has(key)) return fallback;
  return g.get_int(key);
}

Result<double> gguf_float_or(const GgufFile& g, const std::string& key, double fallback) {
  if (!g.has(key)) return fallback;
  return g.get_float(key);
}

double llama3_scaled_freq(double freq, const RopeScaling& s) {
  const double orig = static_cast<double>(s.original_max_position);
  const double low_wavelen = orig / s.low_freq_factor;
  const double high_wavelen = orig / s.high_freq_factor;
  const double wavelen = 2.0 * std::numbers::pi / freq;
  if (wavelen < high_wavelen) return freq;
  if (wavelen > low_wavelen) return freq / s.factor;
  const double smooth =
      (orig / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
  return (1.0 - smooth) * freq / s.factor + smooth * freq;
}

// Llama 3.1+ GGUFs carry no scaling metadata but a `rope_freqs.weight` tensor of per-frequency
// divisors. All released Llama 3 models use low 1, high 4, original 8192, so the factor is the
// largest divisor; the whole tensor is then checked against that reconstruction.
Status rope_scaling_from_freqs_tensor(const GgufFile& g, ModelConfig* c) {
  const GgufTensorInfo* t = g.find_tensor("rope_freqs.weight");
  if (!t) return Status::ok();
  const int64_t n = c->head_dim / 2;
  if (!t->supported || t->view.type != QuantType::kF32 || t->view.numel() != n)
    return Status::unimplemented(fmt::format(
        "{}: tensor 'rope_freqs.weight' must be F32 with {} values (head_dim / 2)", g.path(), n));
  std::vector<float> div(static_cast<size_t>(n));
  TESSERA_RETURN_IF_ERROR(g.read_tensor_data(*t, div.data(), div.size() * sizeof(float)));
  float max_div = 1.0f;
  for (float d : div) {
    if (!(d >= 1.0f && d < 1e6f))
      return Status::unimplemented(fmt::format(
          "{}: tensor 'rope_freqs.weight' holds divisor {}, not a llama3 rope scaling", g.path(), d));
    max_div = std::max(max_div, d);
  }
  if (max_div == 1.0f) return Status::ok();
  RopeScaling s;
  s.type = RopeScalingType::kLlama3;
  s.factor = max_div;
  s.low_freq_factor = 1.0f;
  s.high_freq_factor = 4.0f;
  s.original_max_position = 8192;
  for (int64_t i = 0; i < n; ++i) {
    const double freq = 1.0 / std::pow(static_cast<double>(c->rope_theta),
                                       2.0 * static_cast<double>(i) / static_cast<double>(c->head_dim));
    const double expect = freq / llama3_scaled_freq(freq, s);
    if (std::fabs(expect - div[static_cast<size_t>(i)]) > 1e-3 * expect)
      return Status::unimplemented(fmt::format(
          "{}: tensor 'rope_freqs.weight' does not match llama3 rope scaling (index {}: {} vs {})",
          g.path(), i, div[static_cast<size_t>(i)], expect));
  }
  c->rope_scaling = s;
  return Status::ok();
}

}  // namespace

// What llama.cpp assumes for "gemma3" files, which carry none of it: 5 local layers to 1
// global (a `<arch>.attention.sliding_window_pattern` integer, or per-layer booleans, when
// present), RoPE base 10,000 on local layers, softmax scale 1 / sqrt(head_dim) (the
// query_pre_attn_scalar of the released 270M, 1B, 4B and 12B models). The 27B model scales by
// hidden / heads, read from `general.size_label`. The norms stay as stored (offset 0): llama.cpp's
// converter added Gemma's 1.
Status gemma3_gguf_config(const GgufFile& g, const std::string& p, ModelConfig* c) {
  if (c->sliding_window <= 0) c->sliding_window = 4096;
  const std::string key = p + "attention.sliding_window_pattern";
  c->local_layers = gemma_local_layers(c->n_layers, 6);
  if (g.has(key)) {
    const GgufValue& v = g.metadata().find(key)->second;
    if (v.type == GgufValueType::kArray) {
      TESSERA_ASSIGN_OR_RETURN(std::vector<int64_t> flags, g.get_int_array(key));
      if (static_cast<int64_t>(flags.size()) != c->n_layers)
        return Status::invalid_argument(fmt::format("{}: metadata key '{}' has {} entries for {} layers", g.path(),
                                                    key, flags.size(), c->n_layers));
      for (size_t l = 0; l < flags.size(); ++l) c->local_layers[l] = flags[l] != 0;
    } else {
      TESSERA_ASSIGN_OR_RETURN(int64_t n, g.get_int(key));
      if (n < 1 || n > kMaxLayers)
        return Status::invalid_argument(fmt::format("{}: metadata key '{}' is {}", g.path(), key, n));
      c->local_layers = gemma_local_layers(c->n_layers, n);
    }
  }
  c->rope_theta_local = 10000.0f;
  c->query_pre_attn_scalar = static_cast<float>(c->head_dim);
  if (g.has("general.size_label")) {
    TESSERA_ASSIGN_OR_RETURN(std::string size, g.get_string("general.size_label"));
    if (size == "27B" && c->n_heads > 0) c->query_pre_attn_scalar = static_cast<float>(c->hidden / c->n_heads);
  }
  return Status::ok();
}

std::vector<bool> gemma_local_layers(int64_t n_layers, int64_t pattern) {
  std::vector<bool> local(static_cast<size_t>(std::max<int64_t>(n_layers, 0)));
  for (size_t l = 0; l < local.size(); ++l) local[l] = pattern > 0 && (static_cast<int64_t>(l) + 1) % pattern != 0;
  return local;
}

Status ModelConfig::validate(std::string_view source) const {
  TESSERA_RETURN_IF_ERROR(check_positive(source, "hidden_size", hidden, kMaxDim));
  TESSERA_RETURN_IF_ERROR(check_positive(source, "num_hidden_layers", n_layers, kMaxLayers));
  TESSERA_RETURN_IF_ERROR(check_positive(source, "num_attention_heads", n_heads, 65536));
  TESSERA_RETURN_IF_ERROR(check_positive(source, "num_key_value_heads", n_kv_heads, 65536));
  if (n_heads % n_kv_heads != 0)
    return Status::invalid_argument(fmt::format(
        "{}: num_attention_heads ({}) is not a multiple of num_key_value_heads ({})", source,
        n_heads, n_kv_heads));
  TESSERA_RETURN_IF_ERROR(check_positive(source, "head_dim", head_dim, 65536));
  if (head_dim % 2 != 0)
    return Status::invalid_argument(
        fmt::format("{}: field 'head_dim' must be even for RoPE, got {}", source, head_dim));
  if (n_heads * head_dim > kMaxDim)
    return Status::invalid_argument(fmt::format(
        "{}: num_attention_heads * head_dim = {} is too large", source, n_heads * head_dim));
  TESSERA_RETURN_IF_ERROR(check_positive(source, "intermediate_size", ffn, kMaxDim));
  TESSERA_RETURN_IF_ERROR(check_positive(source, "vocab_size", vocab, kMaxDim));
  TESSERA_RETURN_IF_ERROR(
      check_positive(source, "max_position_embeddings", max_positions, int64_t{1} << 31));
  if (!(std::isfinite(rms_eps) && rms_eps > 0.0f && rms_eps < 1.0f))
    return Status::invalid_argument(
        fmt::format("{}: field 'rms_norm_eps' must be in (0, 1), got {}", source, rms_eps));
  if (!(std::isfinite(rope_theta) && rope_theta > 1.0f))
    return Status::invalid_argument(
        fmt::format("{}: field 'rope_theta' must be > 1, got {}", source, rope_theta));
  const RopeScaling& rs = rope_scaling;
  if (rs.type != RopeScalingType::kNone && !(std::isfinite(rs.factor) && rs.factor > 0.0f))
    return Status::invalid_argument(
        fmt::format("{}: field 'rope_scaling.factor' must be > 0, got {}", source, rs.factor));
  if (rs.type == RopeScalingType::kLlama3) {
    if (!(std::isfinite(rs.low_freq_factor) && std::isfinite(rs.high_freq_factor) &&
          rs.low_freq_factor > 0.0f && rs.high_freq_factor > rs.low_freq_factor))
      return Status::invalid_argument(fmt::format(
          "{}: field 'rope_scaling' needs 0 < low_freq_factor < high_freq_factor, got {} and {}",
          source, rs.low_freq_factor, rs.high_freq_factor));
    TESSERA_RETURN_IF_ERROR(check_positive(source, "rope_scaling.original_max_position_embeddings",
                                           rs.original_max_position, int64_t{1} << 31));
  }
  if (sliding_window < 0)
    return Status::invalid_argument(
        fmt::format("{}: field 'sliding_window' must be >= 0, got {}", source, sliding_window));
  if (!local_layers.empty() && static_cast<int64_t>(local_layers.size()) != n_layers)
    return Status::invalid_argument(fmt::format("{}: field 'layer_types' names {} layers, the model has {}", source,
                                                local_layers.size(), n_layers));
  if (rope_theta_local != 0.0f && !(std::isfinite(rope_theta_local) && rope_theta_local > 1.0f))
    return Status::invalid_argument(
        fmt::format("{}: field 'rope_local_base_freq' must be > 1, got {}", source, rope_theta_local));
  if (query_pre_attn_scalar != 0.0f && !(std::isfinite(query_pre_attn_scalar) && query_pre_attn_scalar > 0.0f))
    return Status::invalid_argument(
        fmt::format("{}: field 'query_pre_attn_scalar' must be > 0, got {}", source, query_pre_attn_scalar));
  if (bos_id < -1 || bos_id >= vocab)
    return Status::invalid_argument(fmt::format(
        "{}: field 'bos_token_id' is {}, outside the vocabulary of {}", source, bos_id, vocab));
  for (int32_t e : eos_ids)
    if (e < 0 || e >= vocab)
      return Status::invalid_argument(fmt::format(
          "{}: field 'eos_token_id' holds {}, outside the vocabulary of {}", source, e, vocab));
  return Status::ok();
}

Result<ModelConfig> parse_hf_config(std::string_view json_text, std::string_view source) {
  try {
    Json j = Json::parse(json_text.begin(), json_text.end(), nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded())
      return Status::invalid_argument(fmt::format("{}: not valid JSON", source));
    return parse_hf_config_json(j, source);
  } catch (const std::exception& e) {
    // Every access above checks types first; this only guards against surprises in the library.
    return Status::invalid_argument(fmt::format("{}: {}", source, e.what()));
  }
}

Result<ModelConfig> load_hf_config(const std::string& config_json_path) {
  TESSERA_ASSIGN_OR_RETURN(std::string text, read_text_file(config_json_path));
  return parse_hf_config(text, config_json_path);
}

Result<std::vector<int32_t>> gguf_stop_token_ids(const GgufFile& g, int64_t vocab) {
  std::vector<int32_t> ids;
  auto add = [&](int64_t id) {
    if (id < 0 || id >= vocab) return;
    const auto id32 = static_cast<int32_t>(id);
    if (std::find(ids.begin(), ids.end(), id32) == ids.end()) ids.push_back(id32);
  };
  // Chat models often mark the end-of-turn token separately; generation stops on any of them.
  for (const char* key : {"tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id",
                          "tokenizer.ggml.eom_token_id"}) {
    TESSERA_ASSIGN_OR_RETURN(int64_t id, gguf_int_or(g, key, -1));
    add(id);
  }
  if (!g.has("general.architecture")) return ids;
  TESSERA_ASSIGN_OR_RETURN(const std::string arch, g.get_string("general.architecture"));
  const auto tokens_it = g.metadata().find("tokenizer.ggml.tokens");
  if (tokens_it == g.metadata().end()) return ids;
  const auto* tokens = std::get_if<std::vector<std::string>>(&tokens_it->second.value);
  if (tokens == nullptr) return ids;  // config_from_gguf and the tokenizer report the bad type
  // End-of-turn tokens that a family's files do not mark with tokenizer.ggml.eot_token_id (Gemma 3
  // chat turns end with <end_of_turn> while the files name only <eos>): the rows of this GGUF name.
  for (const ArchitectureTraits& row : kArchitectureTable) {
    const std::string_view token = row.gguf_unmarked_end_of_turn;
    if (token.empty() || std::find(row.gguf_names.begin(), row.gguf_names.end(), arch) == row.gguf_names.end())
      continue;
    const auto t = std::find(tokens->begin(), tokens->end(), token);
    if (t != tokens->end()) add(t - tokens->begin());
  }
  return ids;
}

Result<ModelConfig> config_from_gguf(const GgufFile& g) {
  TESSERA_ASSIGN_OR_RETURN(const std::string arch_name, g.get_string("general.architecture"));
  ModelConfig c;
  TESSERA_ASSIGN_OR_RETURN(c.arch, arch_from_gguf(arch_name, g));
  const std::string p = arch_name + ".";
  TESSERA_ASSIGN_OR_RETURN(c.hidden, g.get_int(p + "embedding_length"));
  TESSERA_ASSIGN_OR_RETURN(c.n_layers, g.get_int(p + "block_count"));
  TESSERA_ASSIGN_OR_RETURN(c.n_heads, g.get_int(p + "attention.head_count"));
  TESSERA_ASSIGN_OR_RETURN(c.n_kv_heads, gguf_int_or(g, p + "attention.head_count_kv", c.n_heads));
  TESSERA_ASSIGN_OR_RETURN(c.ffn, g.get_int(p + "feed_forward_length"));
  TESSERA_ASSIGN_OR_RETURN(c.max_positions, g.get_int(p + "context_length"));
  TESSERA_ASSIGN_OR_RETURN(double eps, gguf_float_or(g, p + "attention.layer_norm_rms_epsilon", 1e-5));
  c.rms_eps = static_cast<float>(eps);
  TESSERA_ASSIGN_OR_RETURN(double theta, gguf_float_or(g, p + "rope.freq_base", 10000.0));
  c.rope_theta = static_cast<float>(theta);

  const int64_t default_hd = c.n_heads > 0 ? c.hidden / c.n_heads : 0;
  TESSERA_ASSIGN_OR_RETURN(int64_t key_len, gguf_int_or(g, p + "attention.key_length", 0));
  TESSERA_ASSIGN_OR_RETURN(int64_t rope_dim, gguf_int_or(g, p + "rope.dimension_count", 0));
  TESSERA_ASSIGN_OR_RETURN(int64_t value_len, gguf_int_or(g, p + "attention.value_length", 0));
  c.head_dim = key_len > 0 ? key_len : (rope_dim > 0 ? rope_dim : default_hd);
  if (rope_dim > 0 && rope_dim != c.head_dim)
    return Status::unimplemented(fmt::format(
        "{}: {}rope.dimension_count is {} but the head dimension is {}; partial RoPE is not "
        "supported",
        g.path(), p, rope_dim, c.head_dim));
  if (value_len > 0 && value_len != c.head_dim)
    return Status::unimplemented(fmt::format(
        "{}: {}attention.value_length ({}) differs from the key length ({})", g.path(), p,
        value_len, c.head_dim));

  if (g.has(p + "rope.scaling.type")) {
    TESSERA_ASSIGN_OR_RETURN(std::string type, g.get_string(p + "rope.scaling.type"));
    if (type == "linear") {
      TESSERA_ASSIGN_OR_RETURN(double factor, g.get_float(p + "rope.scaling.factor"));
      c.rope_scaling.type = RopeScalingType::kLinear;
      c.rope_scaling.factor = static_cast<float>(factor);
    } else if (type != "none") {
      return Status::unimplemented(
          fmt::format("{}: {}rope.scaling.type '{}' is not supported (supported: none, linear)",
                      g.path(), p, type));
    }
  }

  if (g.has("tokenizer.ggml.tokens")) {
    auto it = g.metadata().find("tokenizer.ggml.tokens");
    const GgufValue& v = it->second;
    if (v.type != GgufValueType::kArray || v.array_type != GgufValueType::kString)
      return Status::invalid_argument(
          fmt::format("{}: metadata key 'tokenizer.ggml.tokens' must be an array of strings",
                      g.path()));
    c.vocab = static_cast<int64_t>(std::get<std::vector<std::string>>(v.value).size());
  } else if (g.has(p + "vocab_size")) {
    TESSERA_ASSIGN_OR_RETURN(c.vocab, g.get_int(p + "vocab_size"));
  } else if (const GgufTensorInfo* t = g.find_tensor("token_embd.weight");
             t && t->shape.size() == 2) {
    c.vocab = t->shape[0];
  } else {
    return Status::not_found(fmt::format(
        "{}: no vocabulary size (tokenizer.ggml.tokens, {}vocab_size or token_embd.weight)",
        g.path(), p));
  }
  c.tie_embeddings = g.find_tensor("output.weight") == nullptr;

  TESSERA_ASSIGN_OR_RETURN(int64_t bos, gguf_int_or(g, "tokenizer.ggml.bos_token_id", -1));
  // -1 and 0xFFFFFFFF (a uint32 -1) say "none"; any other id outside the vocabulary is an error.
  if (bos != -1 && bos != 0xFFFFFFFFll && (bos < 0 || bos >= c.vocab))
    return Status::invalid_argument(fmt::format("{}: tokenizer.ggml.bos_token_id is {}, outside the vocabulary of {}",
                                                g.path(), bos, c.vocab));
  c.bos_id = (bos >= 0 && bos < c.vocab) ? static_cast<int32_t>(bos) : -1;
  TESSERA_ASSIGN_OR_RETURN(c.eos_ids, gguf_stop_token_ids(g, c.vocab));

  const ArchitectureTraits& row = architecture_traits(c.arch);
  c.qkv_bias = row.qkv_bias || g.find_tensor("blk.0.attn_q.bias") != nullptr;
  c.qk_norm = row.qk_norm;
  TESSERA_ASSIGN_OR_RETURN(c.sliding_window, gguf_int_or(g, p + "attention.sliding_window", 0));
  if (row.sliding_window == SlidingWindowRule::kNone || row.sliding_window == SlidingWindowRule::kOptIn)
    c.sliding_window = 0;
  if (row.gguf_config_hook) TESSERA_RETURN_IF_ERROR(row.gguf_config_hook(g, p, &c));
  if (c.head_dim > 0 && c.head_dim % 2 == 0 && c.rope_theta > 1.0f && c.head_dim <= 65536)
    TESSERA_RETURN_IF_ERROR(rope_scaling_from_freqs_tensor(g, &c));
  return c;
}

namespace {

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

bool has_gguf_magic(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  char magic[4] = {};
  return in.read(magic, 4) && std::memcmp(magic, "GGUF", 4) == 0;
}

}  // namespace

Result<ModelPath> resolve_model_path(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (ec || !fs::exists(st))
    return Status::not_found(fmt::format("{}: no such file or directory", path));
  if (fs::is_directory(st)) return ModelPath{ModelFormat::kHuggingFace, path, path};
  if (ends_with(path, ".gguf") || has_gguf_magic(path)) return ModelPath{ModelFormat::kGguf, "", path};
  if (ends_with(path, ".safetensors") || ends_with(path, ".json")) {
    const fs::path parent = fs::path(path).parent_path();
    return ModelPath{ModelFormat::kHuggingFace, parent.empty() ? std::string(".") : parent.string(), path};
  }
  return Status::invalid_argument(fmt::format(
      "{}: not a model directory, .gguf or .safetensors file", path));
}

Result<ModelConfig> load_model_config(const std::string& path) {
  TESSERA_ASSIGN_OR_RETURN(const ModelPath where, resolve_model_path(path));
  if (where.format == ModelFormat::kGguf) {
    TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<GgufFile> gguf, GgufFile::open_metadata(where.file));
    TESSERA_ASSIGN_OR_RETURN(ModelConfig config, config_from_gguf(*gguf));
    TESSERA_RETURN_IF_ERROR(config.validate(where.file));
    return config;
  }
  const std::string config_path = (std::filesystem::path(where.dir) / "config.json").string();
  TESSERA_ASSIGN_OR_RETURN(ModelConfig config, load_hf_config(config_path));
  TESSERA_RETURN_IF_ERROR(config.validate(config_path));
  return config;
}

std::vector<float> rope_inv_freq_local(const ModelConfig& config) {
  ModelConfig local = config;
  local.rope_theta = config.rope_theta_local > 0.0f ? config.rope_theta_local : config.rope_theta;
  local.rope_scaling = RopeScaling{};
  return rope_inv_freq(local);
}

std::vector<float> rope_inv_freq(const ModelConfig& config) {
  const int64_t n = config.head_dim / 2;
  std::vector<float> out(static_cast<size_t>(std::max<int64_t>(n, 0)));
  const RopeScaling& s = config.rope_scaling;
  for (int64_t i = 0; i < n; ++i) {
    double freq = 1.0 / std::pow(static_cast<double>(config.rope_theta),
                                 2.0 * static_cast<double>(i) / static_cast<double>(config.head_dim));
    switch (s.type) {
      case RopeScalingType::kNone: break;
      case RopeScalingType::kLinear: freq /= s.factor; break;
      case RopeScalingType::kLlama3: freq = llama3_scaled_freq(freq, s); break;
    }
    out[static_cast<size_t>(i)] = static_cast<float>(freq);
  }
  return out;
}

std::vector<bool> windowed_kv_layers(const ModelConfig& c) {
  if (c.sliding_window <= 0 || (c.max_positions > 0 && c.sliding_window >= c.max_positions)) return {};
  std::vector<bool> w(static_cast<size_t>(std::max<int64_t>(0, c.n_layers)));
  int64_t n = 0;
  for (int64_t l = 0; l < c.n_layers; ++l) n += (w[static_cast<size_t>(l)] = c.is_local_layer(l));
  if (n == 0 || n == c.n_layers) return {};
  return w;
}

}  // namespace tessera
