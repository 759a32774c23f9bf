#include "plan/planner.h"

#include <fmt/format.h>
#include <sys/stat.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <limits>
#include <numeric>
#include <nlohmann/json.hpp>

#include "common/dtype.h"
#include "common/kv_config.h"
#include "common/speculation_math.h"
#include "common/strings.h"
#include "model/gguf.h"
#include "model/safetensors.h"
#include "model/weight_store.h"

namespace tessera {
namespace {

uint64_t ceil_div(uint64_t a, uint64_t b) { return (a + b - 1) / b; }

PrecisionSpec spec(std::string name, std::string layout, int64_t group_elems, int64_t group_bytes,
                   int64_t row_extra = 0) {
  PrecisionSpec p;
  p.name = std::move(name);
  p.layout = std::move(layout);
  p.group_elems = group_elems;
  p.group_bytes = group_bytes;
  p.row_extra_bytes = row_extra;
  return p;
}

// A precision Tessera runs: its geometry is the format's row of the one table (common/dtype.h).
PrecisionSpec spec(std::string name, std::string layout, QuantType type) {
  const QuantTraits& tr = quant_traits(type);
  return spec(std::move(name), std::move(layout), tr.block_elems, tr.block_bytes, tr.row_extra_bytes);
}

// The precisions Tessera runs: every format of the one table (common/dtype.h) with a layout,
// named as --quant names it (upper case; the table's name where no mode makes it), its geometry
// the format's row. The float formats first, then those made only at load, then the GGUF ones,
// each in the table's order.
std::vector<PrecisionSpec> precision_table() {
  std::vector<PrecisionSpec> table;
  auto group = [](const QuantTraits& tr) { return tr.is_float ? 0 : tr.quant_at_load ? 1 : 2; };
  for (int g = 0; g < 3; ++g)
    for (int i = 0; i < static_cast<int>(QuantType::kCount); ++i) {
      const QuantTraits& tr = quant_traits(static_cast<QuantType>(i));
      if (tr.layout.empty() || group(tr) != g) continue;
      std::string name(tr.load_name.empty() ? tr.name : tr.load_name);
      for (char& ch : name) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
      table.push_back(spec(std::move(name), std::string(tr.layout), tr.type));
    }
  // Formats Tessera does not store yet (no QuantType; kernels/README.md): planned geometries.
  table.push_back(spec("2BIT", "2-bit, group 64: 16 B of crumbs + fp16 scale + fp16 zero per group", 64, 20));
  table.push_back(
      spec("TERNARY", "ternary {-1,0,1} packed 4 per byte (2 bits) + one fp16 absmean scale per row", 4, 1, 2));
  table.push_back(
      spec("TERNARY-B5", "ternary packed 5 trits per byte (3^5 = 243 <= 256) + one fp16 scale per row", 5, 1, 2));
  return table;
}

// ---- model presets ----

ModelConfig llama(int64_t hidden, int64_t layers, int64_t heads, int64_t kv_heads, int64_t ffn, int64_t vocab,
                  int64_t max_positions, float theta) {
  ModelConfig c;
  c.arch = Architecture::kLlama;
  c.hidden = hidden;
  c.n_layers = layers;
  c.n_heads = heads;
  c.n_kv_heads = kv_heads;
  c.head_dim = hidden / heads;
  c.ffn = ffn;
  c.vocab = vocab;
  c.max_positions = max_positions;
  c.rope_theta = theta;
  c.bos_id = 1;
  c.eos_ids = {2};
  return c;
}

ModelConfig llama3(int64_t hidden, int64_t layers, int64_t heads, int64_t ffn, int64_t max_positions) {
  ModelConfig c = llama(hidden, layers, heads, 8, ffn, 128256, max_positions, 500000.0f);
  c.bos_id = 128000;
  c.eos_ids = {128001, 128009};
  if (max_positions > 8192) {
    c.rope_scaling.type = RopeScalingType::kLlama3;
    c.rope_scaling.factor = 8.0f;
  }
  return c;
}

std::vector<std::pair<std::string, ModelConfig>> model_table() {
  return {
      {"llama-2-7b", llama(4096, 32, 32, 32, 11008, 32000, 4096, 10000.0f)},
      {"llama-2-13b", llama(5120, 40, 40, 40, 13824, 32000, 4096, 10000.0f)},
      {"llama-2-70b", llama(8192, 80, 64, 8, 28672, 32000, 4096, 10000.0f)},
      {"llama-3-8b", llama3(4096, 32, 32, 14336, 8192)},
      {"llama-3-70b", llama3(8192, 80, 64, 28672, 8192)},
      {"llama-3.1-8b", llama3(4096, 32, 32, 14336, 131072)},
      {"llama-3.1-70b", llama3(8192, 80, 64, 28672, 131072)},
      {"mistral-7b", llama(4096, 32, 32, 8, 14336, 32000, 32768, 1000000.0f)},
  };
}

// Element count of one layer's matrices (the logical weights, whatever their packing).
uint64_t layer_matrix_elems(const ModelConfig& c) {
  const auto h = static_cast<uint64_t>(c.hidden), q = static_cast<uint64_t>(c.n_heads * c.head_dim),
             kv = static_cast<uint64_t>(c.n_kv_heads * c.head_dim), f = static_cast<uint64_t>(c.ffn);
  return 2 * h * q + 2 * h * kv + 3 * h * f;
}

bool is_layer_matrix(std::string_view hf_name, int ndim) {
  return ndim >= 2 && hf_name.substr(0, 13) == "model.layers.";
}

size_t safetensors_dtype_bytes(std::string_view dtype) {
  if (dtype == "F64" || dtype == "I64" || dtype == "U64") return 8;
  if (dtype == "F32" || dtype == "I32" || dtype == "U32") return 4;
  if (dtype == "F16" || dtype == "BF16" || dtype == "I16" || dtype == "U16") return 2;
  return 1;  // I8, U8, BOOL, F8_*
}

struct StoredBytes {
  int64_t layer_block_elems = 1;  // the largest quantization block among the layers' matrices
  uint64_t layers = 0;
  uint64_t embed = 0;
  uint64_t lm_head = 0;
};

void add_tensor(StoredBytes& s, std::string_view hf_name, int ndim, uint64_t bytes) {
  if (is_layer_matrix(hf_name, ndim)) s.layers += bytes;
  else if (hf_name == "model.embed_tokens.weight") s.embed += bytes;
  else if (hf_name == "lm_head.weight") s.lm_head += bytes;
}

void set_stored(PlanModel& m, const StoredBytes& s) {
  const ModelConfig& c = m.config;
  m.has_weights = s.layers > 0 && s.embed > 0;
  if (!m.has_weights) return;
  // The rows billed are hidden, q heads * head_dim and ffn long: a group of 256 would bill a row
  // of 640 (Gemma-3-270M) as 768.
  const int64_t row_group = std::gcd(std::gcd(std::gcd<int64_t>(256, c.hidden), c.n_heads * c.head_dim), c.ffn);
  m.stored_layers = precision_from_totals("stored", s.layers, layer_matrix_elems(c) * static_cast<uint64_t>(c.n_layers),
                                          row_group > 0 ? row_group : 256);
  m.stored_layers.align_elems = s.layer_block_elems;
  const uint64_t table = static_cast<uint64_t>(c.vocab) * static_cast<uint64_t>(c.hidden);
  const uint64_t head = c.tie_embeddings || s.lm_head == 0 ? 0 : table;
  m.stored_embeddings = precision_from_totals("stored", s.embed + (head ? s.lm_head : 0), table + head);
}

bool is_directory(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

}  // namespace

// ---- precisions, dtypes ----

uint64_t PrecisionSpec::row_bytes(int64_t cols) const {
  const auto c = static_cast<uint64_t>(cols);
  if (group_elems <= 0) return 0;
  return ceil_div(c, static_cast<uint64_t>(group_elems)) * static_cast<uint64_t>(group_bytes) +
         static_cast<uint64_t>(row_extra_bytes);
}

Result<PrecisionSpec> precision_preset(std::string_view name) {
  std::string key = ascii_lower(name);
  if (key == "fp32") key = "f32";
  if (key == "fp16" || key == "half") key = "f16";
  if (key == "int4-g128" || key == "w4a16" || key == "awq" || key == "gptq") key = "int4";
  if (key == "w8a16") key = "int8";
  if (key == "q4_k_m" || key == "q4_k_s") key = "q4_k";
  if (key == "2-bit" || key == "int2" || key == "2bit-g64") key = "2bit";
  if (key == "1.58-bit" || key == "bitnet" || key == "ternary-2b") key = "ternary";
  for (PrecisionSpec& p : precision_table())
    if (ascii_lower(p.name) == key) return std::move(p);
  std::string choices;
  for (const std::string& n : precision_names()) choices += (choices.empty() ? "" : ", ") + n;
  return Status::not_found(fmt::format("unknown precision '{}': choose one of {}", name, choices));
}

std::vector<std::string> precision_names() {
  std::vector<std::string> names;
  for (const PrecisionSpec& p : precision_table()) names.push_back(p.name);
  return names;
}

PrecisionSpec precision_from_totals(std::string name, uint64_t bytes, uint64_t elements, int64_t max_group_elems) {
  // bits = bytes * 8 / elements as an exact fraction; one "group" is the whole fraction reduced,
  // so row_bytes(cols) is exact when cols is a multiple of the reduced denominator.
  const uint64_t g = std::gcd(bytes, elements);
  PrecisionSpec p;
  p.name = std::move(name);
  p.group_elems = static_cast<int64_t>(g ? elements / g : 1);
  p.group_bytes = static_cast<int64_t>(g ? bytes / g : 0);
  // A mix of types gives a large denominator; cap it so the rounding stays below half a byte per
  // group. A group that divides every row keeps rows from rounding up on top of that.
  const int64_t cap = std::max<int64_t>(1, max_group_elems);
  if (p.group_elems > cap) {
    p.group_bytes = static_cast<int64_t>(std::llround(static_cast<double>(cap) * static_cast<double>(bytes) / static_cast<double>(elements)));
    p.group_elems = cap;
  }
  p.layout = fmt::format("as stored in the file: {:.3f} bits per weight on average", p.bits_per_weight());
  return p;
}


// ---- models ----

Result<ModelConfig> model_preset(std::string_view name) {
  const std::string key = ascii_lower(name);
  for (auto& [n, c] : model_table())
    if (n == key) return c;
  std::string choices;
  for (const std::string& n : model_preset_names()) choices += (choices.empty() ? "" : ", ") + n;
  return Status::not_found(fmt::format("'{}' is neither a model file nor a preset ({})", name, choices));
}

std::vector<std::string> model_preset_names() {
  std::vector<std::string> names;
  for (const auto& entry : model_table()) names.push_back(entry.first);
  return names;
}

Result<PlanModel> load_plan_model(const std::string& path) {
  PlanModel m;
  m.name = path;
  auto preset = model_preset(path);
  if (preset.is_ok()) {
    m.config = std::move(preset).value();
    return m;
  }
  if (ends_with(path, ".json")) {
    TESSERA_ASSIGN_OR_RETURN(m.config, load_hf_config(path));
    return m;
  }
  if (ends_with(path, ".gguf")) {
    // The GGUF header alone: tensor types and shapes, without touching the weights.
    TESSERA_ASSIGN_OR_RETURN(auto gguf, GgufFile::open_metadata(path));
    TESSERA_ASSIGN_OR_RETURN(m.config, config_from_gguf(*gguf));
    StoredBytes s;
    for (const GgufTensorInfo& t : gguf->tensors()) {
      if (!t.supported) return m;  // a type Tessera cannot size: plan by --precision only
      const std::string hf_name = gguf_to_hf_name(t.name, m.config.arch);
      add_tensor(s, hf_name, static_cast<int>(t.shape.size()), t.view.nbytes());
      if (is_layer_matrix(hf_name, static_cast<int>(t.shape.size())))
        s.layer_block_elems = std::max<int64_t>(s.layer_block_elems, quant_traits(t.view.type).block_elems);
    }
    if (!gguf->find_tensor("output.weight")) m.config.tie_embeddings = true;
    set_stored(m, s);
    return m;
  }
  if (!is_directory(path)) return model_preset(path).status();
  TESSERA_ASSIGN_OR_RETURN(m.config, load_hf_config(path + "/config.json"));
  auto checkpoint = SafetensorsCheckpoint::open(path);
  if (!checkpoint.is_ok()) return m;  // a directory with a config only
  StoredBytes s;
  for (const auto& [name, t] : (*checkpoint)->tensors()) {
    uint64_t n = 1;
    for (int64_t d : t.shape) n *= static_cast<uint64_t>(d);
    add_tensor(s, name, static_cast<int>(t.shape.size()), n * safetensors_dtype_bytes(t.dtype));
  }
  set_stored(m, s);
  return m;
}

// ---- length distributions, fragmentation ----

SequenceLengths SequenceLengths::fixed(int64_t length) {
  SequenceLengths d;
  d.description = fmt::format("fixed:{}", length);
  d.points = {{length, 1.0}};
  return d;
}

Result<SequenceLengths> SequenceLengths::uniform(int64_t lo, int64_t hi) {
  if (lo < 1 || hi < lo)
    return Status::invalid_argument(fmt::format("uniform lengths need 1 <= lo <= hi, got {}..{}", lo, hi));
  SequenceLengths d;
  d.description = fmt::format("uniform:{}:{}", lo, hi);
  const double p = 1.0 / static_cast<double>(hi - lo + 1);
  for (int64_t l = lo; l <= hi; ++l) d.points.emplace_back(l, p);
  return d;
}

Result<SequenceLengths> SequenceLengths::geometric(double mean, int64_t max_length) {
  if (!(mean >= 1.0) || max_length < 1)
    return Status::invalid_argument(fmt::format("geometric lengths need a mean >= 1 and a maximum >= 1, got {} and {}",
                                                mean, max_length));
  SequenceLengths d;
  d.description = fmt::format("geometric:{} (cut at {})", mean, max_length);
  const double q = 1.0 - 1.0 / mean;  // P(L = l) = q^(l-1) (1 - q)
  double p = 1.0 - q, total = 0;
  for (int64_t l = 1; l <= max_length && p > 1e-15; ++l, p *= q) {
    d.points.emplace_back(l, p);
    total += p;
  }
  for (auto& point : d.points) point.second /= total;
  return d;
}

double SequenceLengths::mean() const {
  double m = 0;
  for (const auto& [l, p] : points) m += static_cast<double>(l) * p;
  return m;
}

int64_t SequenceLengths::max() const {
  int64_t m = 0;
  for (const auto& point : points) m = std::max(m, point.first);
  return m;
}

Result<SequenceLengths> parse_length_distribution(std::string_view spec_text, int64_t max_length) {
  const std::string text(spec_text);
  std::vector<std::string> parts;
  size_t start = 0;
  while (true) {
    const size_t colon = text.find(':', start);
    parts.push_back(text.substr(start, colon == std::string::npos ? std::string::npos : colon - start));
    if (colon == std::string::npos) break;
    start = colon + 1;
  }
  auto number = [&](size_t i) -> Result<double> {
    if (i >= parts.size() || parts[i].empty())
      return Status::invalid_argument(fmt::format("length distribution '{}': missing a number", text));
    char* end = nullptr;
    const double v = std::strtod(parts[i].c_str(), &end);
    if (*end != '\0' || !std::isfinite(v) || v < 1)
      return Status::invalid_argument(
          fmt::format("length distribution '{}': '{}' is not a length >= 1", text, parts[i]));
    return v;
  };
  const std::string kind = ascii_lower(parts[0]);
  auto cap = [&](double v) { return std::min<int64_t>(static_cast<int64_t>(std::llround(v)), max_length); };
  if (kind == "fixed" && parts.size() == 2) {
    TESSERA_ASSIGN_OR_RETURN(double n, number(1));
    return SequenceLengths::fixed(cap(n));
  }
  if (kind == "uniform" && parts.size() == 3) {
    TESSERA_ASSIGN_OR_RETURN(double lo, number(1));
    TESSERA_ASSIGN_OR_RETURN(double hi, number(2));
    return SequenceLengths::uniform(cap(lo), cap(hi));
  }
  if ((kind == "geometric" || kind == "exp") && parts.size() == 2) {
    TESSERA_ASSIGN_OR_RETURN(double mean, number(1));
    return SequenceLengths::geometric(mean, max_length);
  }
  return Status::invalid_argument(fmt::format(
      "length distribution '{}': expected fixed:N, uniform:LO:HI or geometric:MEAN", text));
}

Fragmentation expected_fragmentation(const SequenceLengths& lengths, int64_t block_size) {
  Fragmentation f;
  f.block_size = block_size;
  if (block_size < 1) return f;
  for (const auto& [l, p] : lengths.points) {
    const int64_t blocks = (l + block_size - 1) / block_size;
    f.blocks += p * static_cast<double>(blocks);
    f.unused_slots += p * static_cast<double>((block_size - l % block_size) % block_size);
  }
  const double slots = f.blocks * static_cast<double>(block_size);
  f.fraction = slots > 0 ? f.unused_slots / slots : 0;
  return f;
}

// ---- collectives ----

double ring_all_reduce_s(uint64_t bytes, int ranks, const LinkSpec& link) {
  if (ranks <= 1 || link.bandwidth <= 0) return 0;
  const double p = ranks;
  return 2 * (p - 1) / p * static_cast<double>(bytes) / link.bandwidth + 2 * (p - 1) * link.hop_latency_s;
}

double ring_all_gather_s(uint64_t bytes_per_rank, int ranks, const LinkSpec& link) {
  if (ranks <= 1 || link.bandwidth <= 0) return 0;
  const double p = ranks;
  return (p - 1) * static_cast<double>(bytes_per_rank) / link.bandwidth + (p - 1) * link.hop_latency_s;
}

// ---- the plan ----

namespace {

struct Split {
  int64_t q_cols = 0;   // query heads * head_dim on the rank
  int64_t kv_cols = 0;  // KV heads * head_dim on the rank
  int64_t ffn = 0;
  int64_t vocab = 0;    // LM-head rows on the largest rank
};

uint64_t layer_bytes(const ModelConfig& c, const Split& s, const PrecisionSpec& w) {
  const int64_t h = c.hidden;
  return w.matrix_bytes(s.q_cols, h) + 2 * w.matrix_bytes(s.kv_cols, h) + w.matrix_bytes(h, s.q_cols) +
         2 * w.matrix_bytes(s.ffn, h) + w.matrix_bytes(h, s.ffn);
}

uint64_t vector_elems(const ModelConfig& c, const Split& s) {
  uint64_t per_layer = (architecture_traits(c.arch).post_norms ? 4 : 2) * static_cast<uint64_t>(c.hidden);  // + 2 post-norms
  if (c.qkv_bias) per_layer += static_cast<uint64_t>(s.q_cols + 2 * s.kv_cols);
  if (c.qk_norm) per_layer += 2 * static_cast<uint64_t>(c.head_dim);
  return per_layer * static_cast<uint64_t>(c.n_layers) + static_cast<uint64_t>(c.hidden);
}

Status validate_input(const PlanInput& in) {
  const ModelConfig& c = in.model;
  if (in.tp < 1) return Status::invalid_argument(fmt::format("TP must be >= 1, got {}", in.tp));
  if (c.n_heads % in.tp != 0)
    return Status::invalid_argument(fmt::format("{} query heads cannot be split over TP {}", c.n_heads, in.tp));
  if (c.ffn % in.tp != 0)
    return Status::invalid_argument(fmt::format("intermediate size {} cannot be split over TP {}", c.ffn, in.tp));
  if (c.n_kv_heads % in.tp != 0 && in.tp % c.n_kv_heads != 0)
    return Status::invalid_argument(
        fmt::format("{} KV heads can be neither split nor replicated over TP {}", c.n_kv_heads, in.tp));
  if (!(in.headroom >= 0 && in.headroom < 1))
    return Status::invalid_argument(fmt::format("headroom must be in [0, 1), got {}", in.headroom));
  TESSERA_RETURN_IF_ERROR(validate_block_size(in.block_size).with_context("block size"));
  if (in.batch < 1) return Status::invalid_argument(fmt::format("batch must be >= 1, got {}", in.batch));
  if (in.max_batch < 1 || in.max_step_tokens < 1)
    return Status::invalid_argument("max_batch and max_step_tokens must be >= 1");
  if (in.context_length < 0) return Status::invalid_argument("context length must be >= 0");
  if (in.weights.group_elems < 1 || in.embeddings.group_elems < 1)
    return Status::invalid_argument("a precision has no group size");
  if (in.card.memory_bytes == 0 || in.card.memory_bandwidth <= 0 || in.card.peak_flops <= 0)
    return Status::invalid_argument(fmt::format("card '{}' has no memory, bandwidth or peak figure", in.card.name));
  return Status::ok();
}

// The coordinator's rule (server/shard_group.cpp plan_kv_memory), on this rank's KV room:
// the window pool takes what max_batch sequences can hold at once, the normal pool the rest, unless
// the window pool alone would need the room of every block one pool could hold.
void plan_kv_pools(const PlanInput& in, MemoryBill& m) {
  const auto block = static_cast<uint64_t>(in.block_size);
  const uint64_t room = m.kv_room_bytes > 0 ? static_cast<uint64_t>(m.kv_room_bytes) : 0;
  if (m.windowed_layers > 0) {
    m.window_blocks_per_sequence = window_blocks_per_sequence(m.window, in.block_size);
    m.window_pool_blocks = window_pool_blocks(m.window, in.max_step_tokens, in.block_size, in.max_batch);
    m.window_block_bytes = block * m.kv_bytes_per_token_windowed;
  }
  const KvPoolSplit split =
      split_kv_budget(room, block * m.kv_bytes_per_token, m.window_block_bytes, m.window_pool_blocks);
  m.window_pool = split.num_window_blocks > 0;
  m.kv_block_bytes = split.block_bytes;
  m.kv_blocks = split.num_blocks;
  m.window_pool_bytes = static_cast<uint64_t>(split.num_window_blocks) * split.window_block_bytes;
}

void memory_bill(const PlanInput& in, MemoryBill& m, const Split& s, const Split& whole) {
  const ModelConfig& c = in.model;
  const CardSpec& card = in.card;
  const int act = card.activation_bytes;
  m.layer_weight_bytes = layer_bytes(c, s, in.weights) * static_cast<uint64_t>(c.n_layers);
  m.embedding_bytes = in.embeddings.matrix_bytes(c.vocab, c.hidden);
  m.lm_head_bytes = c.tie_embeddings ? 0 : in.embeddings.matrix_bytes(s.vocab, c.hidden);
  m.vector_bytes = vector_elems(c, s) * static_cast<uint64_t>(act);
  m.weight_bytes = m.layer_weight_bytes + m.embedding_bytes + m.lm_head_bytes + m.vector_bytes;
  m.model_weight_bytes = layer_bytes(c, whole, in.weights) * static_cast<uint64_t>(c.n_layers) + m.embedding_bytes +
                         (c.tie_embeddings ? 0 : m.embedding_bytes) + vector_elems(c, whole) * static_cast<uint64_t>(act);
  const auto h = static_cast<uint64_t>(c.hidden);
  m.matrix_params_per_rank =
      static_cast<uint64_t>(c.n_layers) *
          (2 * h * static_cast<uint64_t>(s.q_cols) + 2 * h * static_cast<uint64_t>(s.kv_cols) + 3 * h * static_cast<uint64_t>(s.ffn)) +
      static_cast<uint64_t>(s.vocab) * h;

  // Bytes of one (token, KV head) row (int8: with its scale), and KV heads on a rank.
  const uint64_t kv_row = kv_row_bytes(in.kv_dtype, c.head_dim);
  const auto kv_heads = static_cast<uint64_t>(s.kv_cols / c.head_dim);
  m.kv_bytes_per_token = 2 * static_cast<uint64_t>(c.n_layers) * kv_heads * kv_row;
  m.kv_bytes_per_token_model = 2 * static_cast<uint64_t>(c.n_layers * c.n_kv_heads) * kv_row;
  for (bool w : windowed_kv_layers(c)) m.windowed_layers += w ? 1 : 0;
  m.window = m.windowed_layers > 0 ? c.sliding_window : 0;
  m.kv_bytes_per_token_windowed = 2 * static_cast<uint64_t>(m.windowed_layers) * kv_heads * kv_row;
  m.kv_bytes_per_token_global = m.kv_bytes_per_token - m.kv_bytes_per_token_windowed;

  m.workspace_activation_bytes = static_cast<uint64_t>(in.max_step_tokens) *
                                 static_cast<uint64_t>(3 * c.hidden + 2 * s.q_cols + 2 * s.kv_cols + 2 * s.ffn) *
                                 static_cast<uint64_t>(act);
  const int64_t logit_rows = std::min(in.max_batch, in.max_step_tokens);
  const int64_t logit_cols = s.vocab + (in.tp > 1 ? s.vocab * in.tp : 0);
  m.workspace_logits_bytes = static_cast<uint64_t>(logit_rows * logit_cols) * 4;
  m.workspace_bytes = m.workspace_activation_bytes + m.workspace_logits_bytes;

  m.memory_bytes = card.memory_bytes;
  m.reserve_bytes = card.runtime_reserve_bytes;
  m.headroom_bytes = static_cast<uint64_t>(std::llround(in.headroom * static_cast<double>(card.memory_bytes)));
  m.kv_room_bytes = static_cast<int64_t>(m.memory_bytes) - static_cast<int64_t>(m.headroom_bytes) -
                    static_cast<int64_t>(m.reserve_bytes) - static_cast<int64_t>(m.weight_bytes) -
                    static_cast<int64_t>(m.workspace_bytes);
  plan_kv_pools(in, m);
  m.kv_tokens = m.kv_blocks * in.block_size;
  m.context_length = in.context_length > 0 ? in.context_length : c.max_positions;
  m.blocks_per_sequence = (m.context_length + in.block_size - 1) / in.block_size;
  m.sequences_at_context = m.blocks_per_sequence > 0 ? m.kv_blocks / m.blocks_per_sequence : 0;
  const SequenceLengths lengths =
      in.lengths.points.empty() ? SequenceLengths::fixed(m.context_length) : in.lengths;
  m.fragmentation = expected_fragmentation(lengths, in.block_size);
  m.sequences_at_lengths =
      m.fragmentation.blocks > 0 ? static_cast<double>(m.kv_blocks) / m.fragmentation.blocks : 0;
  for (int64_t b = 16; b <= 1024; b *= 2) m.block_size_sweep.push_back(expected_fragmentation(lengths, b));
}

void time_bill(const PlanInput& in, const LinkSpec& link, const MemoryBill& m, const Split& s, TimeBill& t) {
  const ModelConfig& c = in.model;
  const CardSpec& card = in.card;
  t.batch = in.batch;
  const SequenceLengths lengths =
      in.lengths.points.empty() ? SequenceLengths::fixed(m.context_length) : in.lengths;
  t.context = in.decode_context >= 0 ? in.decode_context : static_cast<int64_t>(std::llround(lengths.mean()));
  // Every step reads all of the rank's matrices, its LM-head slice (the embedding's rows when
  // tied), the batch's embedding rows and the norm vectors.
  const uint64_t head_read = in.embeddings.matrix_bytes(s.vocab, c.hidden);
  const uint64_t fixed_read = m.layer_weight_bytes + head_read + m.vector_bytes;
  t.weight_bytes_read = fixed_read + in.embeddings.matrix_bytes(std::min(in.batch, c.vocab), c.hidden);
  // A windowed layer's attention reads the last `window` keys only (whichever pool holds them).
  const int64_t windowed_keys = m.windowed_layers > 0 ? std::min(t.context, m.window) : 0;
  const uint64_t kv_read_per_seq = static_cast<uint64_t>(t.context) * m.kv_bytes_per_token_global +
                                   static_cast<uint64_t>(windowed_keys) * m.kv_bytes_per_token_windowed;
  t.kv_bytes_read = static_cast<uint64_t>(t.batch) * kv_read_per_seq;
  t.weight_read_s = static_cast<double>(t.weight_bytes_read) / card.memory_bandwidth;
  t.kv_read_s = static_cast<double>(t.kv_bytes_read) / card.memory_bandwidth;
  t.memory_s = t.weight_read_s + t.kv_read_s;
  const double attn_keys_per_seq = static_cast<double>(c.n_layers - m.windowed_layers) * static_cast<double>(t.context) +
                                   static_cast<double>(m.windowed_layers) * static_cast<double>(windowed_keys);
  const double attn_flops_per_seq = 4.0 * static_cast<double>(s.q_cols) * attn_keys_per_seq;
  const double flops_per_seq = 2.0 * static_cast<double>(m.matrix_params_per_rank) + attn_flops_per_seq;
  t.flops = static_cast<double>(t.batch) * flops_per_seq;
  t.compute_s = t.flops / card.peak_flops;
  t.floor_s = std::max(t.memory_s, t.compute_s);
  t.compute_bound = t.compute_s > t.memory_s;
  // memory(B) = fixed / bw + B * kv_read_per_seq / bw;  compute(B) = B * flops_per_seq / peak.
  const double compute_slope = flops_per_seq / card.peak_flops;
  const double memory_slope = static_cast<double>(kv_read_per_seq) / card.memory_bandwidth;
  t.crossover_batch = compute_slope > memory_slope
                          ? static_cast<double>(fixed_read) / card.memory_bandwidth / (compute_slope - memory_slope)
                          : std::numeric_limits<double>::infinity();
  t.crossover_batch_no_kv =
      static_cast<double>(fixed_read) / card.memory_bandwidth / (2.0 * static_cast<double>(m.matrix_params_per_rank) / card.peak_flops);

  // What shard/cuda_forward.cpp enqueues per layer today: f32->f16, Q, K, V GEMMs, RoPE + KV
  // write, attention, f32->f16, O GEMM, add + RMSNorm, f32->f16, gate and up GEMMs, SiLU*mul,
  // f32->f16, down GEMM, add + RMSNorm (16), the q/k/v biases (Qwen2) and q/k norms (Qwen3), two
  // all-reduces with TP. Per step: the metadata and KV-slot uploads, embedding, first RMSNorm,
  // row gather, f32->f16, LM head, the argmax or logits copy (8), and the all-gather with TP.
  // Split decode attention (long contexts, small batches) adds its merge kernel per layer.
  // (Fusing the conversions into the norms and GEMM epilogues would take this to ~9 a layer.)
  t.launches_per_layer = 16 + (c.qkv_bias ? 3 : 0) + (c.qk_norm ? 2 : 0) + (in.tp > 1 ? 2 : 0);
  t.launches_per_step = t.launches_per_layer * static_cast<int>(c.n_layers) + 8 + (in.tp > 1 ? 1 : 0);
  t.launch_s = t.launches_per_step * card.launch_s;
  t.launch_graph_s = card.graph_node_s > 0 ? card.graph_launch_s + t.launches_per_step * card.graph_node_s : t.launch_s;

  t.all_reduces_per_step = in.tp > 1 ? 2 * static_cast<int>(c.n_layers) : 0;
  t.all_reduce_bytes = static_cast<uint64_t>(t.batch * c.hidden * card.activation_bytes);
  t.all_reduce_s = t.all_reduces_per_step * ring_all_reduce_s(t.all_reduce_bytes, in.tp, link);
  t.all_gather_s = ring_all_gather_s(static_cast<uint64_t>(t.batch * s.vocab) * 4, in.tp, link);
  t.step_s = t.floor_s + t.launch_s + t.all_reduce_s + t.all_gather_s;
  t.step_graph_s = t.floor_s + t.launch_graph_s + t.all_reduce_s + t.all_gather_s;
  t.tokens_per_s = static_cast<double>(t.batch) / t.step_graph_s;
}

void add_warnings(const PlanInput& in, Plan& plan, const Split& s) {
  const MemoryBill& m = plan.memory;
  const TimeBill& t = plan.time;
  auto warn = [&](bool fatal, std::string message) { plan.warnings.push_back({fatal, std::move(message)}); };
  const uint64_t fixed = m.weight_bytes + m.workspace_bytes + m.reserve_bytes;
  if (fixed > m.memory_bytes) {
    warn(true, fmt::format("weights ({}) + workspace ({}) + runtime reserve ({}) exceed the {} of {} memory: "
                           "use more TP ranks, a lower precision or a bigger card",
                           format_bytes(static_cast<double>(m.weight_bytes)), format_bytes(static_cast<double>(m.workspace_bytes)),
                           format_bytes(static_cast<double>(m.reserve_bytes)), format_bytes(static_cast<double>(m.memory_bytes)),
                           in.card.name));
  } else if (m.kv_room_bytes <= 0) {
    warn(true, fmt::format("no room for KV: weights, workspace and reserve leave {} free, less than the {:.0f}% "
                           "headroom ({}); this plan would run without headroom or not at all",
                           format_bytes(static_cast<double>(m.memory_bytes - fixed)), in.headroom * 100,
                           format_bytes(static_cast<double>(m.headroom_bytes))));
  } else if (m.kv_blocks < m.blocks_per_sequence) {
    warn(false, fmt::format("the KV room holds {} tokens, less than one sequence of the context length {}: "
                            "long requests will be refused or preempted",
                            m.kv_tokens, m.context_length));
  }
  if (m.fragmentation.fraction > 0.20) {
    const auto best = std::min_element(m.block_size_sweep.begin(), m.block_size_sweep.end(),
                                       [](const Fragmentation& a, const Fragmentation& b) { return a.fraction < b.fraction; });
    warn(false, fmt::format("block size {} wastes {:.1f}% of KV memory to fragmentation for lengths {} "
                            "(block {} would waste {:.1f}%)",
                            in.block_size, m.fragmentation.fraction * 100,
                            in.lengths.points.empty() ? fmt::format("fixed:{}", m.context_length) : in.lengths.description,
                            best->block_size, best->fraction * 100));
  }
  const int64_t blocks_needed = t.batch * ((t.context + 1 + in.block_size - 1) / in.block_size);
  if (m.kv_room_bytes > 0 && blocks_needed > m.kv_blocks)
    warn(false, fmt::format("the time bill's batch of {} sequences at context {} needs {} KV blocks; the plan has {}",
                            t.batch, t.context, blocks_needed, m.kv_blocks));
  if (in.batch > in.max_batch)
    warn(false, fmt::format("batch {} is above max_batch {}: the workspace's logits{} are sized for max_batch",
                            in.batch, in.max_batch, m.window_pool ? " and the window pool" : ""));
  if (m.windowed_layers > 0 && !m.window_pool && m.kv_room_bytes > 0)
    warn(false, fmt::format("the window pool ({} blocks for {} sequences) would take the room of every block one pool "
                            "holds: one pool keeps all {} layers' KV for the whole context",
                            m.window_pool_blocks, in.max_batch, in.model.n_layers));
  if (in.tp > 1) {
    for (const PrecisionSpec* p : {&in.weights}) {
      if (s.q_cols % p->alignment() != 0 || s.ffn % p->alignment() != 0)
        warn(false, fmt::format("a row-parallel slice ({} columns of O, {} of down) is not a multiple of the {} "
                                "group of {}: groups would straddle ranks (ARCHITECTURE.md forbids it; the loader refuses)",
                                s.q_cols, s.ffn, p->name, p->alignment()));
    }
  }
  if (t.context > m.context_length)
    warn(false, fmt::format("decode context {} is longer than the context length {}", t.context, m.context_length));
  // What the runtime stores: the KV dtype table's column of the card's backend
  // (common/kv_config.h).
  const KvBackend backend = in.card.is_cpu ? KvBackend::kCpu : KvBackend::kCuda;
  if (!kv_dtype_stored(in.kv_dtype, backend)) {
    const int fewer = kv_dtype_bytes(KvDtype::kF16) / kv_dtype_bytes(in.kv_dtype);
    warn(false, fmt::format("KV dtype {}: Tessera's {} KV cache stores {} today, so a run holds {} "
                            "than this plan; plan with --kv-dtype fp16 for what runs now",
                            kv_dtype_name(in.kv_dtype), kv_backend_name(backend), kv_dtypes_stored_text(backend),
                            fewer > 1 ? fmt::format("{}x fewer tokens", fewer) : "its tokens in fp16, not"));
  }
}

}  // namespace

void speculation_bill(const PlanInput& in, const LinkSpec& link, const Split& s, const TimeBill& t,
                      std::vector<SpeculationRow>& rows) {
  const double plain = t.step_graph_s;
  for (const int64_t k : {1, 2, 4, 8}) {
    const double q = static_cast<double>(k + 1);
    const double floor = std::max(t.memory_s, t.compute_s * q);
    const auto reduce_bytes = static_cast<uint64_t>(static_cast<double>(t.all_reduce_bytes) * q);
    const double reduce = t.all_reduces_per_step * ring_all_reduce_s(reduce_bytes, in.tp, link);
    const double gather =
        ring_all_gather_s(static_cast<uint64_t>(static_cast<double>(t.batch * s.vocab) * 4 * q), in.tp, link);
    SpeculationRow r;
    r.drafts = k;
    r.verify_s = floor + t.launch_graph_s + reduce + gather;
    r.cost_ratio = plain > 0 ? r.verify_s / plain : 0;
    r.break_even = break_even_acceptance(k, r.cost_ratio);
    rows.push_back(r);
  }
}

Result<Plan> make_plan(const PlanInput& input) {
  TESSERA_RETURN_IF_ERROR(validate_input(input));
  Plan plan;
  plan.input = input;
  const ModelConfig& c = input.model;
  plan.link = input.use_slow_link ? input.card.slow_link : input.card.fast_link;
  MemoryBill& m = plan.memory;
  m.q_heads_per_rank = c.n_heads / input.tp;
  if (c.n_kv_heads % input.tp == 0) {
    m.kv_heads_per_rank = c.n_kv_heads / input.tp;
  } else {
    m.kv_heads_per_rank = 1;  // tp % n_kv == 0: each KV head lives on tp / n_kv ranks
    m.kv_heads_replicated = true;
  }
  m.ffn_per_rank = c.ffn / input.tp;
  m.vocab_per_rank = (c.vocab + input.tp - 1) / input.tp;
  const Split s{m.q_heads_per_rank * c.head_dim, m.kv_heads_per_rank * c.head_dim, m.ffn_per_rank, m.vocab_per_rank};
  const Split whole{c.n_heads * c.head_dim, c.n_kv_heads * c.head_dim, c.ffn, c.vocab};
  memory_bill(input, m, s, whole);
  time_bill(input, plan.link, m, s, plan.time);
  speculation_bill(input, plan.link, s, plan.time, plan.speculation);
  add_warnings(input, plan, s);
  return plan;
}

// ---- formatting ----

std::string format_bytes(double bytes) {
  const double a = std::fabs(bytes);
  if (a >= 1e9) return fmt::format("{:.2f} GB ({:.2f} GiB)", bytes / 1e9, bytes / (1ull << 30));
  if (a >= 1e6) return fmt::format("{:.2f} MB ({:.2f} MiB)", bytes / 1e6, bytes / (1ull << 20));
  if (a >= 1e3) return fmt::format("{:.2f} KB ({:.2f} KiB)", bytes / 1e3, bytes / 1024);
  return fmt::format("{:.0f} B", bytes);
}

namespace {

std::string ms(double s) { return fmt::format("{:.3f} ms", s * 1e3); }

std::string row(std::string_view label, std::string_view detail, std::string_view value) {
  return fmt::format("  {:<17}{:<76} {:>22}\n", label, detail, value);
}

std::string gbps(double b) { return fmt::format("{:.{}f} GB/s", b / 1e9, b < 100e9 ? 1 : 0); }

std::string flops_text(double f) {
  return f >= 1e12 ? fmt::format("{:.1f} TFLOP/s", f / 1e12) : fmt::format("{:.1f} GFLOP/s", f / 1e9);
}

}  // namespace

std::string format_plan(const Plan& plan) {
  const PlanInput& in = plan.input;
  const ModelConfig& c = in.model;
  const CardSpec& card = in.card;
  const MemoryBill& m = plan.memory;
  const TimeBill& t = plan.time;
  const auto bytes = [](uint64_t b) { return format_bytes(static_cast<double>(b)); };
  std::string out;
  out += fmt::format("tessera plan: {} on {}, TP {}\n", in.model_name, card.name, in.tp);
  out += fmt::format("  model     {} layers, hidden {}, {} heads / {} KV heads x {}, ffn {}, vocab {}{}, context {}\n",
                     c.n_layers, c.hidden, c.n_heads, c.n_kv_heads, c.head_dim, c.ffn, c.vocab,
                     c.tie_embeddings ? " (tied LM head)" : "", c.max_positions);
  out += fmt::format("  weights   {} = {:.4g} bits/weight: {}\n", in.weights.name, in.weights.bits_per_weight(),
                     in.weights.layout);
  out += fmt::format("  embedding {} = {:.4g} bits/weight (embedding and LM head)\n", in.embeddings.name,
                     in.embeddings.bits_per_weight());
  const KvDtypeTraits& kv = kv_dtype_traits(in.kv_dtype);
  const std::string kv_scale =
      kv.row_extra_bytes > 0 ? fmt::format(" + a {} B scale per token and KV head", kv.row_extra_bytes) : "";
  out += fmt::format("  KV        {} ({} B{}), block {} tokens\n", kv.name, kv.elem_bytes, kv_scale, in.block_size);
  out += fmt::format("  card      {}: {} memory, {}, {} peak [{}]\n", card.description, bytes(card.memory_bytes),
                     gbps(card.memory_bandwidth), flops_text(card.peak_flops), card.source);
  if (in.tp > 1) out += fmt::format("  link      {}\n", plan.link.name);

  out += "\nMEMORY, per rank\n";
  out += row("layer weights",
             fmt::format("{} x (q {}x{} + k,v 2x{}x{} + o {}x{} + gate,up 2x{}x{} + down {}x{})", c.n_layers,
                         m.q_heads_per_rank * c.head_dim, c.hidden, m.kv_heads_per_rank * c.head_dim, c.hidden, c.hidden,
                         m.q_heads_per_rank * c.head_dim, m.ffn_per_rank, c.hidden, c.hidden, m.ffn_per_rank),
             bytes(m.layer_weight_bytes));
  out += row("embedding", fmt::format("{} x {}, replicated on every rank", c.vocab, c.hidden), bytes(m.embedding_bytes));
  out += row("LM head",
             c.tie_embeddings ? std::string("tied to the embedding")
                              : in.tp > 1 ? fmt::format("{} x {} (vocabulary split over {} ranks)", m.vocab_per_rank, c.hidden, in.tp)
                                          : fmt::format("{} x {}", m.vocab_per_rank, c.hidden),
             bytes(m.lm_head_bytes));
  out += row("norms, biases", fmt::format("at {} B per element", card.activation_bytes), bytes(m.vector_bytes));
  out += row("= weights", fmt::format("(whole model once: {})", bytes(m.model_weight_bytes)), bytes(m.weight_bytes));
  out += row("workspace",
             fmt::format("{} tokens x (3x{} + 2x{} + 2x{} + 2x{}) x {} B", in.max_step_tokens, c.hidden,
                         m.q_heads_per_rank * c.head_dim, m.kv_heads_per_rank * c.head_dim, m.ffn_per_rank,
                         card.activation_bytes),
             bytes(m.workspace_activation_bytes));
  out += row("  + logits", fmt::format("{} rows x {} x 4 B", std::min(in.max_batch, in.max_step_tokens),
                                       m.vocab_per_rank + (in.tp > 1 ? m.vocab_per_rank * in.tp : 0)),
             bytes(m.workspace_logits_bytes));
  out += row("runtime reserve", card.is_cpu ? "none on the CPU" : "CUDA context, cuBLAS workspace, NCCL buffers",
             bytes(m.reserve_bytes));
  out += row("headroom", fmt::format("{:.0f}% of {} kept free", in.headroom * 100, bytes(m.memory_bytes)),
             bytes(m.headroom_bytes));
  out += row("= KV room", "memory - headroom - reserve - weights - workspace",
             m.kv_room_bytes >= 0 ? bytes(static_cast<uint64_t>(m.kv_room_bytes))
                                  : "-" + bytes(static_cast<uint64_t>(-m.kv_room_bytes)));

  out += "\nKV CACHE\n";
  const auto per_token = [](uint64_t b) { return fmt::format("{} B ({:.1f} KiB)", b, b / 1024.0); };
  out += row("per token",
             fmt::format("2 x {} layers x {} KV heads{} x {}", c.n_layers, m.kv_heads_per_rank,
                         m.kv_heads_replicated ? " (replicated)" : "",
                         kv.row_extra_bytes > 0
                             ? fmt::format("({} x {} B + a {} B scale)", c.head_dim, kv.elem_bytes, kv.row_extra_bytes)
                             : fmt::format("{} x {} B", c.head_dim, kv.elem_bytes)),
             per_token(m.kv_bytes_per_token));
  if (m.windowed_layers > 0) {
    out += row("  global",
               fmt::format("{} layers: every position of the context", c.n_layers - m.windowed_layers),
               per_token(m.kv_bytes_per_token_global));
    out += row("  windowed",
               fmt::format("{} layers: the last {} positions (sliding window)", m.windowed_layers, m.window),
               per_token(m.kv_bytes_per_token_windowed));
    if (m.window_pool) {
      out += row("window pool",
                 fmt::format("({} blocks for a {}-token window + 2) x max batch {} + one step of {} tokens",
                             m.window_blocks_per_sequence, m.window, in.max_batch, in.max_step_tokens),
                 fmt::format("{} blocks", m.window_pool_blocks));
      out += row("", fmt::format("x {} tokens x {} B; a block is released once it is behind the window",
                                 in.block_size, m.kv_bytes_per_token_windowed),
                 bytes(m.window_pool_bytes));
      out += row("blocks",
                 fmt::format("(KV room - window pool) / ({} tokens x {} B per token, global layers)", in.block_size,
                             m.kv_bytes_per_token_global),
                 fmt::format("{} blocks", m.kv_blocks));
    } else {
      out += row("window pool",
                 fmt::format("{} blocks for max batch {} would fill the KV room: one pool, every layer's KV for "
                             "the full context", m.window_pool_blocks, in.max_batch),
                 "not split");
    }
  } else if (c.sliding_window > 0) {
    int64_t local = 0;
    for (int64_t l = 0; l < c.n_layers; ++l) local += c.is_local_layer(l) ? 1 : 0;
    // No window pool (every layer windowed, or the window spans the context): the paged cache
    // gives every layer the same blocks, so the local layers' KV is held for the whole context.
    out += row("sliding window",
               fmt::format("{} of {} layers attend over the last {} tokens; their KV is held for the full context",
                           local, c.n_layers, c.sliding_window),
               "billed above");
  }
  if (!m.window_pool)
    out += row("blocks", fmt::format("KV room / ({} tokens x {} B per token)", in.block_size, m.kv_bytes_per_token),
               fmt::format("{} blocks", m.kv_blocks));
  out += row("tokens", "blocks x block size", fmt::format("{} tokens", m.kv_tokens));
  out += row(fmt::format("context {}", m.context_length),
             fmt::format("{} blocks per sequence{}", m.blocks_per_sequence,
                         m.window_pool ? " (global layers; the window pool holds the rest)" : ""),
             fmt::format("{} sequences", m.sequences_at_context));
  const std::string dist = in.lengths.points.empty() ? fmt::format("fixed:{}", m.context_length) : in.lengths.description;
  out += row("fragmentation",
             fmt::format("lengths {} (mean {:.0f}): {:.1f} empty slots in the last block", dist,
                         in.lengths.points.empty() ? static_cast<double>(m.context_length) : in.lengths.mean(),
                         m.fragmentation.unused_slots),
             fmt::format("{:.2f}% of KV", m.fragmentation.fraction * 100));
  out += row("", fmt::format("{:.2f} blocks per sequence on average", m.fragmentation.blocks),
             fmt::format("{:.1f} sequences", m.sequences_at_lengths));
  std::string sweep;
  for (const Fragmentation& f : m.block_size_sweep) sweep += fmt::format("{}: {:.1f}%  ", f.block_size, f.fraction * 100);
  out += row("block sweep", sweep, "");

  out += fmt::format("\nTIME, one decode step: batch {}, context {}\n", t.batch, t.context);
  out += row("weights read", fmt::format("{} / {}", bytes(t.weight_bytes_read), gbps(card.memory_bandwidth)),
             ms(t.weight_read_s));
  out += row("KV read",
             m.windowed_layers > 0
                 ? fmt::format("{} x ({} tokens x {} B + {} tokens x {} B windowed) = {} / {}", t.batch, t.context,
                               m.kv_bytes_per_token_global, std::min(t.context, m.window),
                               m.kv_bytes_per_token_windowed, bytes(t.kv_bytes_read), gbps(card.memory_bandwidth))
                 : fmt::format("{} x {} tokens x {} B = {} / {}", t.batch, t.context, m.kv_bytes_per_token,
                               bytes(t.kv_bytes_read), gbps(card.memory_bandwidth)),
             ms(t.kv_read_s));
  out += row("compute", fmt::format("{:.4g} GFLOP / {}", t.flops / 1e9, flops_text(card.peak_flops)),
             ms(t.compute_s));
  out += row("= floor",
             fmt::format("max(memory, compute): {}; {} (weights alone: above batch {:.0f})",
                         t.compute_bound ? "compute-bound" : "memory-bound",
                         std::isfinite(t.crossover_batch)
                             ? fmt::format("compute dominates above batch {:.0f}", std::ceil(t.crossover_batch))
                             : std::string("KV reads keep it memory-bound at any batch"),
                         std::ceil(t.crossover_batch_no_kv)),
             ms(t.floor_s));
  out += row("launches",
             fmt::format("({} x {} + {}) = {} x {:.2f} us", t.launches_per_layer, c.n_layers,
                         t.launches_per_step - t.launches_per_layer * static_cast<int>(c.n_layers), t.launches_per_step,
                         card.launch_s * 1e6),
             ms(t.launch_s));
  if (card.graph_node_s > 0)
    out += row("  with graphs",
               fmt::format("{:.0f} us graph launch + {} x {:.2f} us", card.graph_launch_s * 1e6, t.launches_per_step,
                           card.graph_node_s * 1e6),
               ms(t.launch_graph_s));
  if (in.tp > 1) {
    out += row("all-reduce",
               fmt::format("{} x ring({} B, p={}): 2(p-1)/p x bytes / {} + 2(p-1) x {:.1f} us", t.all_reduces_per_step,
                           t.all_reduce_bytes, in.tp, gbps(plan.link.bandwidth), plan.link.hop_latency_s * 1e6),
               ms(t.all_reduce_s));
    out += row("logits gather", fmt::format("{} x {} x 4 B per rank", t.batch, m.vocab_per_rank), ms(t.all_gather_s));
  } else {
    out += row("all-reduce", "none at TP 1", ms(0));
  }
  out += row("= step", "floor + launches + collectives (no graphs)", ms(t.step_s));
  if (card.graph_node_s > 0) out += row("", "with CUDA graphs", ms(t.step_graph_s));
  out += row("throughput", fmt::format("{} tokens per step", t.batch), fmt::format("{:.1f} tokens/s", t.tokens_per_s));

  out += fmt::format("\nSPECULATION, k drafts per sequence verified in one step (batch {}, context {})\n", t.batch,
                     t.context);
  for (const SpeculationRow& r : plan.speculation)
    out += row(fmt::format("k = {}", r.drafts),
               fmt::format("{} per step ({:.2f}x plain): pays above acceptance {:.2f}", ms(r.verify_s), r.cost_ratio,
                           r.break_even),
               r.break_even >= 1.0 ? std::string("never pays") : fmt::format("{:.0f}% break-even", r.break_even * 100));

  if (!plan.warnings.empty()) {
    out += "\nWARNINGS\n";
    for (const PlanWarning& w : plan.warnings) out += fmt::format("  {}: {}\n", w.fatal ? "ERROR" : "warning", w.message);
  }
  out += "\nASSUMPTIONS\n";
  out += "  TP split as ARCHITECTURE.md says: Q/K/V, gate/up by rows; O, down by columns; LM head by vocabulary; embedding "
         "replicated.\n";
  out += "  Decode reads every weight of the rank once per step; launch costs are added, not overlapped; "
         "figures are nominal unless measured.\n";
  return out;
}

std::string plan_to_json(const Plan& plan) {
  const PlanInput& in = plan.input;
  const MemoryBill& m = plan.memory;
  const TimeBill& t = plan.time;
  nlohmann::ordered_json j;
  j["model"] = in.model_name;
  j["card"] = {{"name", in.card.name},
               {"memory_bytes", in.card.memory_bytes},
               {"bandwidth_bytes_per_s", in.card.memory_bandwidth},
               {"peak_flops", in.card.peak_flops},
               {"launch_s", in.card.launch_s},
               {"source", in.card.source}};
  j["link"] = {{"name", plan.link.name},
               {"bandwidth_bytes_per_s", plan.link.bandwidth},
               {"hop_latency_s", plan.link.hop_latency_s}};
  j["precision"] = {{"weights", in.weights.name},
                    {"weights_bits", in.weights.bits_per_weight()},
                    {"embeddings", in.embeddings.name},
                    {"embeddings_bits", in.embeddings.bits_per_weight()},
                    {"kv_dtype", std::string(kv_dtype_name(in.kv_dtype))}};
  j["tp"] = in.tp;
  j["headroom"] = in.headroom;
  j["block_size"] = in.block_size;
  j["max_batch"] = in.max_batch;
  j["max_step_tokens"] = in.max_step_tokens;
  std::vector<nlohmann::ordered_json> sweep;
  for (const Fragmentation& f : m.block_size_sweep)
    sweep.push_back({{"block_size", f.block_size}, {"fraction", f.fraction}});
  j["memory"] = {
      {"q_heads_per_rank", m.q_heads_per_rank},
      {"kv_heads_per_rank", m.kv_heads_per_rank},
      {"kv_heads_replicated", m.kv_heads_replicated},
      {"layer_weight_bytes", m.layer_weight_bytes},
      {"embedding_bytes", m.embedding_bytes},
      {"lm_head_bytes", m.lm_head_bytes},
      {"vector_bytes", m.vector_bytes},
      {"weight_bytes", m.weight_bytes},
      {"model_weight_bytes", m.model_weight_bytes},
      {"kv_bytes_per_token", m.kv_bytes_per_token},
      {"kv_bytes_per_token_model", m.kv_bytes_per_token_model},
      {"windowed_layers", m.windowed_layers},
      {"window", m.window},
      {"kv_bytes_per_token_global", m.kv_bytes_per_token_global},
      {"kv_bytes_per_token_windowed", m.kv_bytes_per_token_windowed},
      {"window_pool", m.window_pool},
      {"window_blocks_per_sequence", m.window_blocks_per_sequence},
      {"window_pool_blocks", m.window_pool_blocks},
      {"window_block_bytes", m.window_block_bytes},
      {"window_pool_bytes", m.window_pool_bytes},
      {"workspace_activation_bytes", m.workspace_activation_bytes},
      {"workspace_logits_bytes", m.workspace_logits_bytes},
      {"workspace_bytes", m.workspace_bytes},
      {"memory_bytes", m.memory_bytes},
      {"reserve_bytes", m.reserve_bytes},
      {"headroom_bytes", m.headroom_bytes},
      {"kv_room_bytes", m.kv_room_bytes},
      {"kv_block_bytes", m.kv_block_bytes},
      {"kv_blocks", m.kv_blocks},
      {"kv_tokens", m.kv_tokens},
      {"context_length", m.context_length},
      {"blocks_per_sequence", m.blocks_per_sequence},
      {"sequences_at_context", m.sequences_at_context},
      {"sequences_at_lengths", m.sequences_at_lengths},
      {"lengths", in.lengths.points.empty() ? fmt::format("fixed:{}", m.context_length) : in.lengths.description},
      {"fragmentation_unused_slots", m.fragmentation.unused_slots},
      {"fragmentation_fraction", m.fragmentation.fraction},
      {"block_size_sweep", sweep},
  };
  j["time"] = {
      {"batch", t.batch},
      {"context", t.context},
      {"weight_bytes_read", t.weight_bytes_read},
      {"kv_bytes_read", t.kv_bytes_read},
      {"weight_read_s", t.weight_read_s},
      {"kv_read_s", t.kv_read_s},
      {"memory_s", t.memory_s},
      {"flops", t.flops},
      {"compute_s", t.compute_s},
      {"floor_s", t.floor_s},
      {"compute_bound", t.compute_bound},
      {"crossover_batch", std::isfinite(t.crossover_batch) ? nlohmann::ordered_json(t.crossover_batch) : nullptr},
      {"crossover_batch_no_kv", t.crossover_batch_no_kv},
      {"launches_per_layer", t.launches_per_layer},
      {"launches_per_step", t.launches_per_step},
      {"launch_s", t.launch_s},
      {"launch_graph_s", t.launch_graph_s},
      {"all_reduces_per_step", t.all_reduces_per_step},
      {"all_reduce_bytes", t.all_reduce_bytes},
      {"all_reduce_s", t.all_reduce_s},
      {"all_gather_s", t.all_gather_s},
      {"step_s", t.step_s},
      {"step_graph_s", t.step_graph_s},
      {"tokens_per_s", t.tokens_per_s},
  };
  std::vector<nlohmann::ordered_json> spec;
  for (const SpeculationRow& r : plan.speculation)
    spec.push_back({{"drafts", r.drafts}, {"verify_s", r.verify_s}, {"cost_ratio", r.cost_ratio},
                    {"break_even_acceptance", r.break_even}});
  j["speculation"] = spec;
  std::vector<nlohmann::ordered_json> warnings;
  for (const PlanWarning& w : plan.warnings) warnings.push_back({{"fatal", w.fatal}, {"message", w.message}});
  j["warnings"] = warnings;
  try {
    return j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace);
  } catch (const std::exception& e) {
    return fmt::format("{{\"error\": \"cannot encode the plan as JSON: {}\"}}", e.what());
  }
}

}  // namespace tessera
