#include "shard/tp_slice.h"

#include <cstring>

#include "common/check.h"

namespace tessera {
namespace {

// Rows [begin, begin + count) of a 2-D view: a view into the same memory.
TensorView row_slice(const TensorView& w, int64_t begin, int64_t count) {
  TensorView v = w;
  v.data = w.row_ptr(begin);
  v.shape[0] = count;
  return v;
}

// Columns [begin, begin + count) of a 2-D view, copied into owned memory. Block formats split
// on block boundaries only (for I4_G128 a block is a quantization group of 128 inputs, so a
// group never straddles two ranks); a per-row trailer (I8_CH's scale) is copied with each row.
Result<TensorView> column_slice(const TensorView& w, int64_t begin, int64_t count, const char* name,
                                std::vector<WeightBytes>& owned) {
  const QuantTraits& tr = quant_traits(w.type);
  if (begin % tr.block_elems != 0 || count % tr.block_elems != 0) {
    const bool groups = w.type == QuantType::kI4_G128;
    return Status::invalid_argument(fmt::format(
        "{}: the tensor-parallel slice of columns [{}, {}) is not aligned to {} {} of {} elements{}", name, begin,
        begin + count, tr.name, groups ? "quantization groups" : "blocks", tr.block_elems,
        groups ? "; use a TP size that splits the input dimension into whole groups" : ""));
  }
  const size_t src_off = row_block_bytes(w.type, begin);
  const size_t data_bytes = row_block_bytes(w.type, count);
  const size_t trailer = static_cast<size_t>(tr.row_extra_bytes);
  const size_t src_trailer = row_block_bytes(w.type, w.cols());
  const size_t dst_row = row_bytes(w.type, count);
  WeightBytes bytes(dst_row * static_cast<size_t>(w.rows()));
  for (int64_t r = 0; r < w.rows(); ++r) {
    uint8_t* dst = bytes.data() + static_cast<size_t>(r) * dst_row;
    std::memcpy(dst, w.row_ptr(r) + src_off, data_bytes);
    if (trailer > 0) std::memcpy(dst + data_bytes, w.row_ptr(r) + src_trailer, trailer);
  }
  TensorView v = w;
  v.data = bytes.data();
  v.shape[1] = count;
  owned.push_back(std::move(bytes));
  return v;
}

TensorView vector_slice(const TensorView& b, int64_t begin, int64_t count) {
  if (!b.data) return b;
  TensorView v = b;
  v.data = static_cast<const float*>(b.data) + begin;
  v.shape[0] = count;
  return v;
}

}  // namespace

Result<ShardLayout> plan_shard_layout(const ModelConfig& c, const TpConfig& tp) {
  if (tp.size < 1 || tp.rank < 0 || tp.rank >= tp.size)
    return Status::invalid_argument(fmt::format("rank {} is outside a TP group of size {}", tp.rank, tp.size));
  if (c.n_heads % tp.size != 0)
    return Status::invalid_argument(fmt::format("{} query heads cannot be split over TP {}", c.n_heads, tp.size));
  if (c.ffn % tp.size != 0)
    return Status::invalid_argument(fmt::format("intermediate size {} cannot be split over TP {}", c.ffn, tp.size));
  ShardLayout l;
  l.tp_rank = tp.rank;
  l.tp_size = tp.size;
  l.n_heads = c.n_heads / tp.size;
  l.head_begin = l.n_heads * tp.rank;
  if (c.n_kv_heads % tp.size == 0) {
    l.n_kv_heads = c.n_kv_heads / tp.size;
    l.kv_head_begin = l.n_kv_heads * tp.rank;
  } else if (tp.size % c.n_kv_heads == 0) {
    l.n_kv_heads = 1;  // replicated: this rank's query heads all use one KV head
    l.kv_head_begin = l.head_begin / (c.n_heads / c.n_kv_heads);
  } else {
    return Status::invalid_argument(
        fmt::format("{} KV heads can be neither split nor replicated over TP {}", c.n_kv_heads, tp.size));
  }
  l.ffn = c.ffn / tp.size;
  l.ffn_begin = l.ffn * tp.rank;
  l.vocab_per_rank = (c.vocab + tp.size - 1) / tp.size;
  l.vocab_begin = std::min<int64_t>(c.vocab, l.vocab_per_rank * tp.rank);
  l.vocab_end = std::min<int64_t>(c.vocab, l.vocab_begin + l.vocab_per_rank);
  return l;
}

Result<ShardWeights> slice_model_weights(ModelWeights full_weights, const ModelConfig& c, const ShardLayout& l) {
  ShardWeights s;
  s.full = std::move(full_weights);  // moving keeps the converted vectors' buffers in place
  const ModelWeights& full = s.full;
  ModelWeights& w = s.weights;
  const int64_t hd = c.head_dim;
  w.embed = full.embed;
  w.final_norm = full.final_norm;
  w.lm_head = row_slice(full.lm_head, l.vocab_begin, l.vocab_end - l.vocab_begin);
  s.bytes = full.embed.nbytes() + w.lm_head.nbytes();
  for (size_t i = 0; i < full.layers.size(); ++i) {
    const LayerWeights& f = full.layers[i];
    LayerWeights t = f;
    t.wq = row_slice(f.wq, l.head_begin * hd, l.n_heads * hd);
    t.wk = row_slice(f.wk, l.kv_head_begin * hd, l.n_kv_heads * hd);
    t.wv = row_slice(f.wv, l.kv_head_begin * hd, l.n_kv_heads * hd);
    t.bq = vector_slice(f.bq, l.head_begin * hd, l.n_heads * hd);
    t.bk = vector_slice(f.bk, l.kv_head_begin * hd, l.n_kv_heads * hd);
    t.bv = vector_slice(f.bv, l.kv_head_begin * hd, l.n_kv_heads * hd);
    t.w_gate = row_slice(f.w_gate, l.ffn_begin, l.ffn);
    t.w_up = row_slice(f.w_up, l.ffn_begin, l.ffn);
    const std::string prefix = "model.layers." + std::to_string(i);
    if (l.tp_size == 1) {
      t.wo = f.wo;
      t.w_down = f.w_down;
    } else {
      TESSERA_ASSIGN_OR_RETURN(t.wo, column_slice(f.wo, l.head_begin * hd, l.n_heads * hd,
                                                  (prefix + ".self_attn.o_proj.weight").c_str(), s.owned));
      TESSERA_ASSIGN_OR_RETURN(t.w_down, column_slice(f.w_down, l.ffn_begin, l.ffn,
                                                      (prefix + ".mlp.down_proj.weight").c_str(), s.owned));
    }
    for (const TensorView* m : {&t.wq, &t.wk, &t.wv, &t.wo, &t.w_gate, &t.w_up, &t.w_down}) s.bytes += m->nbytes();
    w.layers.push_back(t);
  }
  return s;
}

}  // namespace tessera
