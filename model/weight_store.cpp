#include "model/weight_store.h"

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>

#include <fmt/format.h>

#include "common/logging.h"
#include "common/thread_pool.h"
#include "model/gguf.h"
#include "model/int4_checkpoint.h"
#include "common/weight_codec.h"
#include "model/safetensors.h"

namespace tessera {

struct WeightStore::Entry {
  std::string name;                // canonical HF name
  const std::string* file = nullptr;  // the file that holds it (for messages)
  TensorView view;                 // data == nullptr when unusable (see `unusable`)
  std::string unusable;            // why get() fails for a listed tensor
  std::vector<uint8_t> owned;      // the row-permuted copy of a GGUF Q/K tensor
};

namespace {

namespace fs = std::filesystem;

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

// GGUF per-layer tensor suffixes and their HF counterparts.
constexpr std::pair<std::string_view, std::string_view> kLayerNames[] = {
    {"attn_norm.weight", "input_layernorm.weight"},
    {"attn_q.weight", "self_attn.q_proj.weight"},
    {"attn_k.weight", "self_attn.k_proj.weight"},
    {"attn_v.weight", "self_attn.v_proj.weight"},
    {"attn_output.weight", "self_attn.o_proj.weight"},
    {"attn_q.bias", "self_attn.q_proj.bias"},
    {"attn_k.bias", "self_attn.k_proj.bias"},
    {"attn_v.bias", "self_attn.v_proj.bias"},
    {"attn_output.bias", "self_attn.o_proj.bias"},
    {"attn_q_norm.weight", "self_attn.q_norm.weight"},
    {"attn_k_norm.weight", "self_attn.k_norm.weight"},
    {"ffn_norm.weight", "post_attention_layernorm.weight"},
    {"ffn_gate.weight", "mlp.gate_proj.weight"},
    {"ffn_up.weight", "mlp.up_proj.weight"},
    {"ffn_down.weight", "mlp.down_proj.weight"},
};

}  // namespace

std::string gguf_to_hf_name(std::string_view gguf_name, Architecture arch) {
  if (gguf_name == "token_embd.weight") return "model.embed_tokens.weight";
  if (gguf_name == "output_norm.weight") return "model.norm.weight";
  if (gguf_name == "output.weight") return "lm_head.weight";
  constexpr std::string_view kBlk = "blk.";
  if (gguf_name.substr(0, kBlk.size()) != kBlk) return std::string(gguf_name);
  const std::string_view rest = gguf_name.substr(kBlk.size());
  const size_t dot = rest.find('.');
  if (dot == 0 || dot == std::string_view::npos || dot > 9) return std::string(gguf_name);
  const std::string_view layer = rest.substr(0, dot);
  for (char ch : layer)
    if (ch < '0' || ch > '9') return std::string(gguf_name);
  const std::string_view suffix = rest.substr(dot + 1);
  // The architecture's own names first (model/architecture.h), then the common ones.
  for (const auto& [g, hf] : architecture_traits(arch).gguf_layer_names)
    if (suffix == g) return fmt::format("model.layers.{}.{}", layer, hf);
  for (const auto& [g, hf] : kLayerNames)
    if (suffix == g) return fmt::format("model.layers.{}.{}", layer, hf);
  return std::string(gguf_name);
}

Status unpermute_gguf_qk_rows(const TensorView& src, int64_t n_heads, std::string_view what,
                              std::vector<uint8_t>* owned, TensorView* dst) {
  const QuantTraits& tr = quant_traits(src.type);
  int64_t rows = 0;
  size_t row_size = 0;
  if (src.ndim == 2) {
    rows = src.shape[0];
    row_size = src.row_stride_bytes();
  } else if (src.ndim == 1 && tr.block_elems == 1) {  // a bias: one element per "row"
    rows = src.shape[0];
    row_size = static_cast<size_t>(tr.block_bytes);
  } else {
    return Status::unimplemented(fmt::format("{} has shape {} in {}; cannot reorder its rows",
                                             what, src.shape_string(), quant_name(src.type)));
  }
  if (n_heads <= 0 || rows % (2 * n_heads) != 0)
    return Status::invalid_argument(fmt::format(
        "{} has {} rows, not a multiple of 2 x {} heads", what, rows, n_heads));
  const int64_t hd = rows / n_heads;
  owned->resize(static_cast<size_t>(rows) * row_size);
  const auto* in = static_cast<const uint8_t*>(src.data);
  uint8_t* out = owned->data();
  auto row = [&](uint8_t* base, int64_t r) { return base + static_cast<size_t>(r) * row_size; };
  auto crow = [&](int64_t r) { return in + static_cast<size_t>(r) * row_size; };
  for (int64_t h = 0; h < n_heads; ++h) {
    for (int64_t i = 0; i < hd / 2; ++i) {
      std::memcpy(row(out, h * hd + i), crow(h * hd + 2 * i), row_size);
      std::memcpy(row(out, h * hd + i + hd / 2), crow(h * hd + 2 * i + 1), row_size);
    }
  }
  *dst = src;
  dst->data = out;
  return Status::ok();
}

// Builds a WeightStore from either format.
class WeightStoreBuilder {
 public:
  static Result<std::unique_ptr<WeightStore>> open(const std::string& path) {
    TESSERA_ASSIGN_OR_RETURN(const ModelPath where, resolve_model_path(path));
    if (where.format == ModelFormat::kGguf) return open_gguf(where.file);
    return open_hf(where.dir, where.file);
  }

 private:
  static std::unique_ptr<WeightStore> make() {
    return std::unique_ptr<WeightStore>(new WeightStore());
  }

  static void add(WeightStore* s, std::unique_ptr<WeightStore::Entry> e) {
    s->index_[e->name] = e.get();
    s->entries_.push_back(std::move(e));
  }

  static Result<std::unique_ptr<WeightStore>> open_hf(const std::string& dir,
                                                      const std::string& weights_path) {
    auto s = make();
    s->format_ = ModelFormat::kHuggingFace;
    s->path_ = dir;
    const std::string config_path = (fs::path(dir) / "config.json").string();
    TESSERA_ASSIGN_OR_RETURN(s->config_, load_hf_config(config_path));
    TESSERA_RETURN_IF_ERROR(s->config_.validate(config_path));
    TESSERA_ASSIGN_OR_RETURN(s->safetensors_, SafetensorsCheckpoint::open(weights_path));
    for (const auto& [name, t] : s->safetensors_->tensors()) {
      auto e = std::make_unique<WeightStore::Entry>();
      e->name = name;
      e->file = t.file;
      e->view = t.view;
      if (!t.view.data)
        e->unusable = fmt::format("{}: tensor '{}' ({} {}) has no usable Tessera type", *t.file,
                                  name, t.dtype, shape_string(t.shape));
      add(s.get(), std::move(e));
    }
    if (s->config_.quantization.method != CheckpointQuant::kNone) TESSERA_RETURN_IF_ERROR(add_int4_linears(s.get()));
    return s;
  }

  // AWQ / GPTQ: every "<prefix>.qweight" becomes "<prefix>.weight" in I4_G128 (owned).
  static Status add_int4_linears(WeightStore* s) {
    std::vector<std::string> prefixes;
    for (const auto& [name, t] : s->safetensors_->tensors())
      if (ends_with(name, ".qweight")) prefixes.push_back(name.substr(0, name.size() - 8));
    if (prefixes.empty())
      return Status::invalid_argument(fmt::format("{}: config.json has a quantization_config but no tensor "
                                                  "ends in '.qweight'", s->path_));
    for (const std::string& prefix : prefixes) {
      const std::string name = prefix + ".weight";
      if (s->index_.count(name))
        return Status::corrupt(fmt::format("{}: both '{}' and '{}.qweight' are present", s->path_, name, prefix));
      auto lin = convert_int4_linear(*s->safetensors_, prefix, s->config_.quantization);
      if (!lin.is_ok()) return lin.status().with_context(s->path_);
      auto e = std::make_unique<WeightStore::Entry>();
      e->name = name;
      e->file = s->safetensors_->find(prefix + ".qweight")->file;
      e->owned = std::move(lin->bytes);
      e->view = make_view(e->owned.data(), QuantType::kI4_G128, {lin->out_features, lin->in_features});
      add(s, std::move(e));
    }
    return Status::ok();
  }

  static std::string shape_string(const std::vector<int64_t>& shape) {
    return fmt::format("[{}]", fmt::join(shape, ", "));
  }

  static Result<std::unique_ptr<WeightStore>> open_gguf(const std::string& path) {
    auto s = make();
    s->format_ = ModelFormat::kGguf;
    s->path_ = path;
    TESSERA_ASSIGN_OR_RETURN(s->gguf_, GgufFile::open(path));
    TESSERA_ASSIGN_OR_RETURN(s->config_, config_from_gguf(*s->gguf_));
    TESSERA_RETURN_IF_ERROR(s->config_.validate(path));
    // llama.cpp's converter interleaves the two rotate-half halves of every Q and K head of some
    // architectures only (the row's gguf_qk_permuted: "llama", which Mistral also uses).
    const bool permuted_qk = architecture_traits(s->config_.arch).gguf_qk_permuted;
    for (const GgufTensorInfo& t : s->gguf_->tensors()) {
      auto e = std::make_unique<WeightStore::Entry>();
      e->name = gguf_to_hf_name(t.name, s->config_.arch);
      e->file = &s->path_;
      if (s->index_.count(e->name))
        return Status::corrupt(fmt::format("{}: tensors '{}' and another both map to '{}'", path,
                                           t.name, e->name));
      if (!t.supported) {
        e->unusable = fmt::format("{}: tensor '{}' has ggml type {} ({}), which Tessera does not "
                                  "support",
                                  path, t.name, t.ggml_type, ggml_type_name(t.ggml_type));
      } else {
        e->view = t.view;
        const bool is_q = ends_with(t.name, ".attn_q.weight") || ends_with(t.name, ".attn_q.bias");
        const bool is_k = ends_with(t.name, ".attn_k.weight") || ends_with(t.name, ".attn_k.bias");
        if (permuted_qk && (is_q || is_k)) {
          const int64_t heads = is_q ? s->config_.n_heads : s->config_.n_kv_heads;
          Status st = unpermute_gguf_qk_rows(t.view, heads, fmt::format("tensor '{}'", t.name),
                                             &e->owned, &e->view);
          if (!st.is_ok()) return st.with_context(path);
        }
      }
      add(s.get(), std::move(e));
    }
    return s;
  }
};

WeightStore::~WeightStore() = default;

Result<std::unique_ptr<WeightStore>> WeightStore::open(const std::string& path) {
  return WeightStoreBuilder::open(path);
}

bool WeightStore::has(std::string_view hf_name) const { return index_.find(hf_name) != index_.end(); }

Result<TensorView> WeightStore::get(std::string_view hf_name) const {
  auto it = index_.find(hf_name);
  if (it == index_.end())
    return Status::not_found(fmt::format("{}: no tensor '{}'", path_, hf_name));
  if (!it->second->unusable.empty()) return Status::unimplemented(it->second->unusable);
  return it->second->view;
}

const std::string& WeightStore::source_file(std::string_view hf_name) const {
  auto it = index_.find(hf_name);
  return it == index_.end() || !it->second->file ? path_ : *it->second->file;
}

std::vector<std::string> WeightStore::names() const {
  std::vector<std::string> out;
  out.reserve(index_.size());
  for (const auto& [name, e] : index_) out.push_back(name);
  return out;
}

// ---------------------------------------------------------------------------------------------
// bind_model_weights

namespace {

class Binder {
 public:
  // `codec`: the arithmetic of dequantizing and quantizing rows (common/weight_codec.h), or
  // nullptr: a tensor that needs it is an error naming what is missing.
  Binder(const WeightStore& s, ModelWeights* w, const WeightCodec* codec,
         const ImportanceMatrix* importance = nullptr, bool keep_unquantizable = false)
      : s_(s), w_(w), codec_(codec), importance_(importance), keep_unquantizable_(keep_unquantizable) {}

  // Converts a matrix to the mode's type (RTN, rows in parallel; a quantized matrix from its
  // dequantized values) into owned bytes; one already in that type stays as it is.
  Status quantize(const std::string& name, WeightQuant q, ThreadPool* pool, TensorView* m) const {
    if (q == WeightQuant::kNone) return Status::ok();
    const int64_t rows = m->rows(), cols = m->cols();
    const QuantType type = weight_quant_type_for(q, cols);
    if (m->type == type) return Status::ok();
    if (!can_convert_from(m->type))
      return Status::unimplemented(fmt::format("{}: tensor '{}' is stored as {}, which --quant {} cannot convert",
                                               s_.source_file(name), name, quant_name(m->type), weight_quant_name(q)));
    const int be = quant_traits(type).block_elems;
    if (cols % be != 0 && keep_unquantizable_) {
      TESSERA_LOG_WARN("{}: tensor '{}' stays {}: its {} columns fill no {}-element block as --quant {} needs",
                       s_.source_file(name), name, quant_name(m->type), cols, be, weight_quant_name(q));
      return Status::ok();
    }
    if (cols % be != 0)
      return Status::invalid_argument(fmt::format(
          "{}: tensor '{}' has {} columns, not a multiple of {} as --quant {} needs",
          s_.source_file(name), name, cols, be, weight_quant_name(q)));
    const float* importance = nullptr;
    if (importance_ != nullptr) {
      auto it = importance_->columns.find(name);
      if (it != importance_->columns.end()) {
        if (static_cast<int64_t>(it->second.size()) != cols)
          return Status::invalid_argument(fmt::format(
              "importance file (measured on {}): tensor '{}' has {} columns there, {} in {}", importance_->model,
              name, it->second.size(), cols, s_.source_file(name)));
        if (codec_->can_quantize_weighted(type)) importance = it->second.data();
      }
    }
    const size_t rb = row_bytes(type, cols);
    WeightBytes bytes(rb * static_cast<size_t>(rows));
    const TensorView src = *m;
    auto work = [&](int64_t b, int64_t e) {
      std::vector<float> row(static_cast<size_t>(cols));
      for (int64_t r = b; r < e; ++r) {
        codec_->dequantize_row(src.type, src.row_ptr(r), row.data(), cols);
        uint8_t* dst = bytes.data() + static_cast<size_t>(r) * rb;
        if (type == QuantType::kF32)
          std::memcpy(dst, row.data(), rb);
        else if (q == WeightQuant::kInt4Sym)
          codec_->quantize_row_int4(row.data(), dst, cols, Int4Grid::kSymmetric);
        else
          codec_->quantize_row_weighted(type, row.data(), importance, dst, cols);
      }
    };
    pool->parallel_for(rows, 16, [&](int64_t b, int64_t e, int) { work(b, e); });
    w_->owned_bytes.push_back(std::move(bytes));
    *m = make_view(w_->owned_bytes.back().data(), type, {rows, cols});
    return Status::ok();
  }

  // Whether dequantize_row reads a matrix of `t` (everything but plain integer types).
  static bool can_convert_from(QuantType t) {
    return t != QuantType::kI8 && t != QuantType::kI32 && t != QuantType::kCount;
  }

  Status shape_error(std::string_view name, const TensorView& v, std::string_view expected) const {
    return Status::invalid_argument(fmt::format("{}: tensor '{}' has shape {}, expected {}",
                                                s_.source_file(name), name, v.shape_string(),
                                                expected));
  }

  // A [rows, cols] weight matrix, kept as a view in its stored type.
  Status matrix(const std::string& name, int64_t rows, int64_t cols, TensorView* out) const {
    TESSERA_ASSIGN_OR_RETURN(TensorView v, s_.get(name));
    if (v.ndim != 2 || v.shape[0] != rows || v.shape[1] != cols)
      return shape_error(name, v, fmt::format("[{}, {}]", rows, cols));
    if (v.type == QuantType::kI8 || v.type == QuantType::kI32)
      return Status::unimplemented(fmt::format(
          "{}: tensor '{}' is a plain {} matrix; integer weights need a quantization scheme "
          "(scales) that Tessera does not read from this format",
          s_.source_file(name), name, quant_name(v.type)));
    *out = v;
    return Status::ok();
  }

  // A [n] vector, converted to owned F32, `offset` added to every element.
  Status vector(const std::string& name, int64_t n, TensorView* out, float offset = 0.0f) const {
    TESSERA_ASSIGN_OR_RETURN(TensorView v, s_.get(name));
    if (v.ndim != 1 || v.shape[0] != n) return shape_error(name, v, fmt::format("[{}]", n));
    std::vector<float> f(static_cast<size_t>(n));
    switch (v.type) {
      case QuantType::kF32:
        std::memcpy(f.data(), v.data, f.size() * sizeof(float));
        break;
      case QuantType::kF16:
      case QuantType::kBF16: {
        const auto* p = static_cast<const uint8_t*>(v.data);
        for (size_t i = 0; i < f.size(); ++i) {
          uint16_t h;
          std::memcpy(&h, p + 2 * i, 2);
          f[i] = v.type == QuantType::kF16 ? fp16_to_f32(h) : bf16_to_f32(h);
        }
        break;
      }
      case QuantType::kI8:
      case QuantType::kI32:
      case QuantType::kCount:
        return Status::unimplemented(fmt::format("{}: tensor '{}' has type {}, expected a float vector",
                                                 s_.source_file(name), name, quant_name(v.type)));
      default:  // block formats: the loader guaranteed n is a multiple of the block size
        if (codec_ == nullptr)
          return Status::invalid_argument(fmt::format(
              "{}: tensor '{}' is stored as {}: widening it to F32 needs a weight codec (WeightLoadOptions::codec, "
              "e.g. kernels/weight_codec.h's cpu_weight_codec()), and the load was given none",
              s_.source_file(name), name, quant_name(v.type)));
        codec_->dequantize_row(v.type, v.data, f.data(), n);
        break;
    }
    if (offset != 0.0f)
      for (float& x : f) x += offset;
    w_->owned_f32.push_back(std::move(f));
    *out = make_view(w_->owned_f32.back().data(), QuantType::kF32, {n});
    return Status::ok();
  }

  // An RMSNorm weight: with the config's norm_weight_offset (HF Gemma's 1 + w).
  Status norm(const std::string& name, int64_t n, TensorView* out) const {
    return vector(name, n, out, s_.config().norm_weight_offset);
  }

  Status optional_vector(const std::string& name, int64_t n, bool required, TensorView* out) const {
    if (!required && !s_.has(name)) {
      *out = TensorView{};
      return Status::ok();
    }
    return vector(name, n, out);
  }

 private:
  const WeightStore& s_;
  ModelWeights* w_;
  const WeightCodec* codec_ = nullptr;
  const ImportanceMatrix* importance_ = nullptr;
  bool keep_unquantizable_ = false;
};

}  // namespace


namespace {

// The views of every weight, in their stored types.
Result<ModelWeights> bind_views(const WeightStore& store, const WeightCodec* codec) {
  const ModelConfig& c = store.config();
  ModelWeights w;
  Binder b(store, &w, codec);
  const int64_t q_dim = c.n_heads * c.head_dim;
  const int64_t kv_dim = c.n_kv_heads * c.head_dim;
  TESSERA_RETURN_IF_ERROR(b.matrix("model.embed_tokens.weight", c.vocab, c.hidden, &w.embed));
  TESSERA_RETURN_IF_ERROR(b.norm("model.norm.weight", c.hidden, &w.final_norm));
  if (!c.tie_embeddings && store.has("lm_head.weight")) {
    TESSERA_RETURN_IF_ERROR(b.matrix("lm_head.weight", c.vocab, c.hidden, &w.lm_head));
  } else {
    w.lm_head = w.embed;
  }
  w.layers.resize(static_cast<size_t>(c.n_layers));
  for (int64_t i = 0; i < c.n_layers; ++i) {
    LayerWeights& l = w.layers[static_cast<size_t>(i)];
    const std::string p = fmt::format("model.layers.{}.", i);
    if (store.has(p + "self_attn.o_proj.bias"))
      return Status::unimplemented(fmt::format("{}: tensor '{}self_attn.o_proj.bias': attention "
                                               "output biases are not supported",
                                               store.source_file(p + "self_attn.o_proj.bias"), p));
    TESSERA_RETURN_IF_ERROR(b.norm(p + "input_layernorm.weight", c.hidden, &l.attn_norm));
    TESSERA_RETURN_IF_ERROR(b.matrix(p + "self_attn.q_proj.weight", q_dim, c.hidden, &l.wq));
    TESSERA_RETURN_IF_ERROR(b.matrix(p + "self_attn.k_proj.weight", kv_dim, c.hidden, &l.wk));
    TESSERA_RETURN_IF_ERROR(b.matrix(p + "self_attn.v_proj.weight", kv_dim, c.hidden, &l.wv));
    TESSERA_RETURN_IF_ERROR(b.matrix(p + "self_attn.o_proj.weight", c.hidden, q_dim, &l.wo));
    // Biases present in the file are always used, even when the config does not announce them.
    TESSERA_RETURN_IF_ERROR(b.optional_vector(p + "self_attn.q_proj.bias", q_dim, c.qkv_bias, &l.bq));
    TESSERA_RETURN_IF_ERROR(b.optional_vector(p + "self_attn.k_proj.bias", kv_dim, c.qkv_bias, &l.bk));
    TESSERA_RETURN_IF_ERROR(b.optional_vector(p + "self_attn.v_proj.bias", kv_dim, c.qkv_bias, &l.bv));
    if (c.qk_norm) {
      TESSERA_RETURN_IF_ERROR(b.norm(p + "self_attn.q_norm.weight", c.head_dim, &l.q_norm));
      TESSERA_RETURN_IF_ERROR(b.norm(p + "self_attn.k_norm.weight", c.head_dim, &l.k_norm));
    }
    if (architecture_traits(c.arch).post_norms) {
      TESSERA_RETURN_IF_ERROR(b.norm(p + "post_attention_layernorm.weight", c.hidden, &l.post_attn_norm));
      TESSERA_RETURN_IF_ERROR(b.norm(p + "pre_feedforward_layernorm.weight", c.hidden, &l.ffn_norm));
      TESSERA_RETURN_IF_ERROR(b.norm(p + "post_feedforward_layernorm.weight", c.hidden, &l.post_ffn_norm));
    } else {
      TESSERA_RETURN_IF_ERROR(b.norm(p + "post_attention_layernorm.weight", c.hidden, &l.ffn_norm));
    }
    TESSERA_RETURN_IF_ERROR(b.matrix(p + "mlp.gate_proj.weight", c.ffn, c.hidden, &l.w_gate));
    TESSERA_RETURN_IF_ERROR(b.matrix(p + "mlp.up_proj.weight", c.ffn, c.hidden, &l.w_up));
    TESSERA_RETURN_IF_ERROR(b.matrix(p + "mlp.down_proj.weight", c.hidden, c.ffn, &l.w_down));
  }
  return w;
}

}  // namespace

Result<ModelWeights> bind_model_weights(const WeightStore& store, const WeightLoadOptions& options) {
  TESSERA_ASSIGN_OR_RETURN(ModelWeights w, bind_views(store, options.codec));
  if (options.quant == WeightQuant::kNone) return w;
  if (options.codec == nullptr)
    return Status::invalid_argument(fmt::format(
        "{}: --quant {} converts weights at load, which needs a weight codec (WeightLoadOptions::codec, e.g. "
        "kernels/weight_codec.h's cpu_weight_codec()), and the load was given none",
        store.path(), weight_quant_name(options.quant)));
  ThreadPool pool(ThreadPoolOptions{.num_threads = options.threads});
  Binder b(store, &w, options.codec, options.importance, options.keep_unquantizable);
  for (size_t i = 0; i < w.layers.size(); ++i) {
    LayerWeights& l = w.layers[i];
    const std::string p = fmt::format("model.layers.{}.", i);
    const std::pair<const char*, TensorView*> mats[] = {
        {"self_attn.q_proj.weight", &l.wq}, {"self_attn.k_proj.weight", &l.wk},
        {"self_attn.v_proj.weight", &l.wv}, {"self_attn.o_proj.weight", &l.wo},
        {"mlp.gate_proj.weight", &l.w_gate}, {"mlp.up_proj.weight", &l.w_up},
        {"mlp.down_proj.weight", &l.w_down}};
    for (const auto& [suffix, m] : mats) TESSERA_RETURN_IF_ERROR(b.quantize(p + suffix, options.quant, &pool, m));
  }
  if (options.quantize_lm_head) {
    const bool tied = w.lm_head.data == w.embed.data;
    TESSERA_RETURN_IF_ERROR(
        b.quantize(tied ? "model.embed_tokens.weight" : "lm_head.weight", options.quant, &pool, &w.lm_head));
  }
  return w;
}

}  // namespace tessera
