#include "common/shard_options.h"

#include <fmt/format.h>

#include <charconv>

namespace tessera {

const char* matmul_precision_name(MatmulPrecision p) {
  switch (p) {
    case MatmulPrecision::kAuto: return "auto";
    case MatmulPrecision::kFp32: return "fp32";
    case MatmulPrecision::kBf16: return "bf16";
  }
  return "?";
}

bool parse_matmul_precision(const std::string& text, MatmulPrecision* out) {
  for (MatmulPrecision p : {MatmulPrecision::kAuto, MatmulPrecision::kFp32, MatmulPrecision::kBf16}) {
    if (text == matmul_precision_name(p)) {
      *out = p;
      return true;
    }
  }
  return false;
}

namespace shard_option_codec {
namespace {

Status not_one_of(std::string_view flag, std::string_view text, const std::vector<std::string>& choices) {
  return Status::invalid_argument(fmt::format("{} '{}': expected one of {}", flag, text, fmt::join(choices, ", ")));
}

}  // namespace

Status parse_count(std::string_view flag, std::string_view text, int64_t* value) {
  int64_t v = 0;
  auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || p != text.data() + text.size() || v < 0)
    return Status::invalid_argument(fmt::format("{} '{}': expected a whole number >= 0", flag, text));
  *value = v;
  return Status::ok();
}

Status Switch::parse(std::string_view flag, std::string_view text, bool& value) {
  if (text != "true" && text != "false") return not_one_of(flag, text, {"true", "false"});
  value = text == "true";
  return Status::ok();
}

Status Text::parse(std::string_view, std::string_view text, std::string& value) {
  value = std::string(text);
  return Status::ok();
}
std::string Text::format(const std::string& value) { return value; }
std::vector<std::string> Text::choices() { return {}; }
std::string Text::describe() { return ""; }

Status Device::parse(std::string_view flag, std::string_view text, std::string& value) {
  for (const std::string& c : choices())
    if (text == c) {
      value = c;
      return Status::ok();
    }
  return not_one_of(flag, text, choices());
}
std::string Device::format(const std::string& value) { return value; }
std::vector<std::string> Device::choices() { return {"cpu", "cuda", "auto"}; }
std::string Device::describe() { return fmt::format("{}", fmt::join(choices(), ", ")); }

Status Quant::parse(std::string_view flag, std::string_view text, WeightQuant& value) {
  Result<WeightQuant> q = parse_weight_quant(text);
  if (!q.is_ok()) return not_one_of(flag, text, choices());
  value = *q;
  return Status::ok();
}
std::string Quant::format(const WeightQuant& value) { return std::string(weight_quant_name(value)); }
std::vector<std::string> Quant::choices() {
  std::vector<std::string> names;
  for (WeightQuant q : all_weight_quants()) names.emplace_back(weight_quant_name(q));
  return names;
}
std::string Quant::describe() { return weight_quant_help(); }

Status KvDtypeRuntime::parse(std::string_view flag, std::string_view text, KvDtype& value) {
  for (const std::string& c : choices())
    if (text == c) {
      value = parse_kv_dtype(text).value();
      return Status::ok();
    }
  return not_one_of(flag, text, choices());
}
std::string KvDtypeRuntime::format(const KvDtype& value) { return std::string(kv_dtype_name(value)); }
std::vector<std::string> KvDtypeRuntime::choices() { return kv_dtype_runtime_names(); }
std::string KvDtypeRuntime::describe() {
  return fmt::format("{}; the CPU stores {}, CUDA {}", fmt::join(choices(), ", "), kv_dtypes_stored_text(KvBackend::kCpu),
                     kv_dtypes_stored_text(KvBackend::kCuda));
}

Status Precision::parse(std::string_view flag, std::string_view text, MatmulPrecision& value) {
  if (!parse_matmul_precision(std::string(text), &value)) return not_one_of(flag, text, choices());
  return Status::ok();
}
std::string Precision::format(const MatmulPrecision& value) { return matmul_precision_name(value); }
std::vector<std::string> Precision::choices() { return {"auto", "fp32", "bf16"}; }
std::string Precision::describe() { return fmt::format("{}", fmt::join(choices(), ", ")); }

Status SparseMode::parse(std::string_view flag, std::string_view text, SparseAttentionConfig& value) {
  if (text != "auto" && text != "on" && text != "off") return not_one_of(flag, text, choices());
  value.measure = text == "auto";
  value.enabled = text == "on";
  return Status::ok();
}
std::string SparseMode::format(const SparseAttentionConfig& value) {
  return value.measure ? "auto" : value.enabled ? "on" : "off";
}
std::vector<std::string> SparseMode::choices() { return {"auto", "on", "off"}; }
std::string SparseMode::describe() { return fmt::format("{}", fmt::join(choices(), ", ")); }

// A threshold given with auto replaces the measurement: on from there. The table lists this row
// after --sparse-attention, so its value is read after that one's.
Status SparseThreshold::parse(std::string_view flag, std::string_view text, SparseAttentionConfig& value) {
  int64_t t = 0;
  TESSERA_RETURN_IF_ERROR(parse_count(flag, text, &t));
  if (t < 1) return Status::invalid_argument(fmt::format("{} '{}': expected at least 1 token", flag, text));
  value.threshold_tokens = t;
  if (value.measure) {
    value.measure = false;
    value.enabled = true;
  }
  return Status::ok();
}
std::string SparseThreshold::format(const SparseAttentionConfig& value) { return std::to_string(value.threshold_tokens); }
std::vector<std::string> SparseThreshold::choices() { return {}; }
std::string SparseThreshold::describe() { return ""; }

}  // namespace shard_option_codec

ShardRuntimeOptions shard_command_line_defaults() {
  ShardRuntimeOptions o;
  o.sparse = measured_sparse_attention();
  return o;
}

std::vector<std::string> shard_runtime_argv(const ShardRuntimeOptions& o) {
  using namespace shard_option_codec;
  const ShardRuntimeOptions defaults = shard_command_line_defaults();
  std::vector<std::string> argv;
#define TESSERA_SHARD_ARGV(field, flag, codec, scope, help)           \
  if (codec::format(o.field) != codec::format(defaults.field)) {      \
    argv.emplace_back(flag);                                           \
    if constexpr (!codec::kSwitch) argv.push_back(codec::format(o.field)); \
  }
  TESSERA_SHARD_RUNTIME_OPTIONS(TESSERA_SHARD_ARGV)
#undef TESSERA_SHARD_ARGV
  return argv;
}

Status validate_shard_runtime_options(const ShardRuntimeOptions& o) {
  using namespace shard_option_codec;
  // Every row's value must read back as itself (a device outside its choices, a negative count).
#define TESSERA_SHARD_CHECK(field, flag, codec, scope, help)                                    \
  if constexpr (!codec::kSwitch) {                                                              \
    auto copy = o.field;                                                                        \
    TESSERA_RETURN_IF_ERROR(codec::parse(flag, codec::format(o.field), copy));                  \
  }
  TESSERA_SHARD_RUNTIME_OPTIONS(TESSERA_SHARD_CHECK)
#undef TESSERA_SHARD_CHECK
  return Status::ok();
}

}  // namespace tessera
