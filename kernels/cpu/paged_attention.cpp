// Paged attention on CPU.
//
// Work item = (query token, KV head): the query heads that share a KV head (GQA group) are
// processed together, so every K and V row of the cache is loaded once per item. Items are
// spread over the pool in an order that mixes short and long causal spans (balanced prefill).
//
// Prefill on AVX-512 and AVX2 (>= kTileMinTokens query tokens): item = (tile of consecutive tokens, KV
// head), up to kTileRows query rows (tokens x GQA heads). Each thread keeps a transposed copy of
// the head's keys for the whole call (built once, blocks of 16 positions), so scores need no
// horizontal reductions, and each loaded value row serves several rows; per-token items had
// re-read the head's K and V rows from L2 for every query token and were load-bound.
// paged_attention_batch spreads the items of all sequences of a step over the pool at once, split
// by estimated cost, instead of one pool pass (and its wake-up) per sequence.
//
// Canonical arithmetic for one query q (head h) at position p, keys j in its visible span —
// the same on the scalar, AVX2 and AVX-512 paths, so results depend on neither the ISA nor the
// thread count nor how the query's sequence was chunked:
//   s_j = dot16(q, k_j) * scale, where dot16 is the 16-lane fp32 dot of kernels/cpu/fgemm.h
//   m = max_j s_j;  e_j = exp_poly(s_j - m)  (a fixed polynomial, kernels/cpu/exp_poly.h, not libm)
//   sum = 16-lane sum of e_j over j (lane j % 16, same reduction tree);  inv = 1 / sum
//   out_i = fma(e_j * inv, v_j,i, out_i) for j in increasing order, out_i starting at +0.
// The cache holds fp32, fp16 or int8 rows (kernels/paged_attention.h): fp16 is widened exactly as
// it is loaded, int8 is multiplied by its row's scale as it is loaded (one fp32 product per value,
// the same on every path), so an fp16 or int8 cache gives the results of an fp32 cache holding
// the values it reads back.
//
// This file is the driver: items and their scheduling over the pool, the per-thread scratch, the
// transposed keys and the tiles' orchestration, the KV writes. The arithmetic is in one file per
// ISA, paged_attention_{scalar,avx2,avx512}.cpp, behind kernels/cpu/paged_attention_isa.h.
#include "kernels/paged_attention.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <span>
#include <type_traits>
#include <vector>

#include "common/check.h"
#include "common/dtype.h"
#include "common/thread_pool.h"
#include "kernels/cpu/paged_attention_isa.h"
#include "kernels/cpu/vec.h"

namespace tessera {
namespace {

// The per-ISA kernels and the structs they take (kernels/cpu/paged_attention_isa.h).
using namespace cpu::attention;

// The cache's K array (values = false) or V array, as elements of type T.
template <typename T>
const T* cache_array(const PagedKvLayer& kv, bool values) {
  if constexpr (std::is_same_v<T, float>) {
    return values ? kv.v : kv.k;
  } else if constexpr (std::is_same_v<T, uint16_t>) {
    return values ? kv.v16 : kv.k16;
  } else {
    return values ? kv.v8 : kv.k8;
  }
}

// Calls f with a value of the cache's element type (float, uint16_t or int8_t).
template <typename F>
void with_element_type(const PagedKvLayer& kv, F&& f) {
  if (kv.k16 != nullptr)
    f(uint16_t{});
  else if (kv.k8 != nullptr)
    f(int8_t{});
  else
    f(float{});
}

// Elements between the starts of consecutive (slot, KV head) rows of a cache of T.
template <typename T>
inline int64_t row_elems(const PagedKvLayer& kv) {
  return kv.head_dim + kRowLead<T>;
}

template <typename T>
void run_item(const Item<T>& it) {
  switch (cpu::active_isa()) {
    case cpu::Isa::kAvx512:
      run_item_avx512(it);
      return;
    case cpu::Isa::kAvx2:
      run_item_avx2(it);
      return;
    default:
      run_item_scalar(it);
      return;
  }
}

// Offset, in elements of T, of the slot holding position pos (its first row, KV head 0).
template <typename T>
inline int64_t slot_offset(const PagedKvLayer& kv, const int32_t* block_table, int64_t pos) {
  const int32_t block = block_table[pos / kv.block_size];
  TESSERA_CHECK(block >= 0 && block < kv.num_blocks, "paged kv: position {} maps to block {} of {}",
                pos, block, kv.num_blocks);
  return (static_cast<int64_t>(block) * kv.block_size + pos % kv.block_size) * kv.n_kv_heads * row_elems<T>(kv);
}

// Offset of the first value of KV head kvh's row at position pos.
template <typename T>
inline int64_t head_offset(const PagedKvLayer& kv, const int32_t* block_table, int64_t pos, int64_t kvh) {
  return slot_offset<T>(kv, block_table, pos) + kvh * row_elems<T>(kv) + kRowLead<T>;
}

// Per-thread scratch, grown to the longest span seen and reused.
// The key / value row pointers of one KV head are shared by every query token of a call (a
// prefix for causal attention), so they are built once per (call, head, span start) and
// extended as longer spans come; `call` changes with every paged_attention call, since block
// tables and the cache may change between calls.
struct Scratch {
  uint64_t call = 0;
  const void* k = nullptr;
  int64_t kvh = -1;
  int64_t first = -1;
  int64_t filled = 0;
  std::vector<float> scores;
  std::vector<const float*> keys, values;         // fp32 cache
  std::vector<const uint16_t*> keys16, values16;  // fp16 cache
  std::vector<const int8_t*> keys8, values8;      // int8 cache
  // The key rows (values = false) or value rows of a cache of element type T.
  template <typename T>
  std::vector<const T*>& rows(bool values_wanted) {
    if constexpr (std::is_same_v<T, float>) {
      return values_wanted ? values : keys;
    } else if constexpr (std::is_same_v<T, uint16_t>) {
      return values_wanted ? values16 : keys16;
    } else {
      return values_wanted ? values8 : keys8;
    }
  }
  // Prefill tiles: transposed keys of one KV head, blocks of 16 positions from kt_lo to kt_hi
  // (multiples of 16); positions outside [kt_real_lo, the call's written end) hold zeros.
  // Sized like one head's keys of the longest span seen (512 tokens x 64 dims: 128 KiB).
  uint64_t kt_call = 0;
  const void* kt_k = nullptr;
  int64_t kt_kvh = -1, kt_lo = 0, kt_hi = 0, kt_real_lo = 0;
  std::vector<float> kt, tile_q, tile_scores, tile_out;
  std::vector<int64_t> tile_first, tile_last;
};

Scratch& scratch() {
  thread_local Scratch s;
  return s;
}

template <typename T>
void attend(const PagedKvLayer& kv, const AttentionArgs& args, int64_t t, int64_t kvh, uint64_t call) {
  const int64_t hd = kv.head_dim;
  const int64_t group = args.n_heads / kv.n_kv_heads;
  const int64_t pos = args.start_pos + t;
  const int64_t first = args.sliding_window > 0 ? std::max<int64_t>(0, pos - args.sliding_window + 1) : 0;
  const int64_t n = pos - first + 1;
  Scratch& s = scratch();
  std::vector<const T*>& keys = s.rows<T>(false);
  std::vector<const T*>& values = s.rows<T>(true);
  if (static_cast<int64_t>(keys.size()) < n) {
    keys.resize(static_cast<size_t>(n));
    values.resize(static_cast<size_t>(n));
  }
  if (static_cast<int64_t>(s.scores.size()) < n * group) s.scores.resize(static_cast<size_t>(n * group));
  const T* kc = cache_array<T>(kv, false);
  const T* vc = cache_array<T>(kv, true);
  if (s.call != call || s.k != kc || s.kvh != kvh || s.first != first) {
    s.call = call;
    s.k = kc;
    s.kvh = kvh;
    s.first = first;
    s.filled = 0;
  }
  const int64_t row = kv.n_kv_heads * row_elems<T>(kv);
  for (int64_t j = s.filled; j < n;) {
    // One cache block at a time: its slots are consecutive rows.
    const int64_t p0 = first + j;
    const int64_t in_block = std::min(n - j, kv.block_size - p0 % kv.block_size);
    const int64_t off = head_offset<T>(kv, args.block_table, p0, kvh);
    for (int64_t i = 0; i < in_block; ++i, ++j) {
      keys[static_cast<size_t>(j)] = kc + off + i * row;
      values[static_cast<size_t>(j)] = vc + off + i * row;
    }
  }
  s.filled = std::max(s.filled, n);
  const int64_t h0 = kvh * group;
  Item<T> it{keys.data(),
             values.data(),
             n,
             hd,
             group,
             args.q + (t * args.n_heads + h0) * hd,
             args.out + (t * args.n_heads + h0) * hd,
             args.scale,
             s.scores.data(),
             args.n_tokens == 1};
  run_item(it);
}

// ---- prefill tiles

constexpr int64_t kTileRows = 16;   // query rows (tokens x heads of a GQA group) per prefill item
constexpr int64_t kTileMinTokens = 16;  // below this, per-token items (no transposed keys to build)
constexpr int64_t kTileMaxHeadDim = 128;

int64_t tile_tokens(int64_t group) { return std::max<int64_t>(1, kTileRows / group); }

bool use_tiles(const PagedKvLayer& kv, const AttentionArgs& args) {
#if defined(__x86_64__)  // the tiles' kernels exist on x86-64 only (paged_attention_isa.h)
  // AVX2 tiles read value rows 8 floats at a time: head_dim % 8 == 0 there.
  const cpu::Isa isa = cpu::active_isa();
  return (isa == cpu::Isa::kAvx512 || (isa == cpu::Isa::kAvx2 && kv.head_dim % 8 == 0)) &&
         args.n_tokens >= kTileMinTokens && kv.head_dim <= kTileMaxHeadDim;
#else
  return false;
#endif
}

inline int64_t span_first(const AttentionArgs& args, int64_t pos) {
  return args.sliding_window > 0 ? std::max<int64_t>(0, pos - args.sliding_window + 1) : 0;
}

// Transposed keys of KV head kvh for one block of 16 positions p0 .. p0 + 15 into dst
// [hdp][16]; positions outside [real_lo, real_hi) and dims past head_dim are zero.
template <typename T>
void transpose_key_block(const PagedKvLayer& kv, const int32_t* block_table, int64_t kvh, int64_t p0, int64_t real_lo,
                         int64_t real_hi, int64_t hdp, bool avx512, float* dst) {
  const int64_t hd = kv.head_dim;
  const T* rows[16];
  for (int64_t i = 0; i < 16; ++i) {
    const int64_t p = p0 + i;
    rows[i] = p < real_lo || p >= real_hi ? nullptr : cache_array<T>(kv, false) + head_offset<T>(kv, block_table, p, kvh);
  }
  for (int64_t c = 0; c < hdp; c += 16) {
    const int64_t n = std::min<int64_t>(16, hd - c);
    if (avx512) {
      transpose16_avx512(rows, c, static_cast<uint16_t>((1u << n) - 1u), dst + c * 16);
      continue;
    }
    for (int64_t j = 0; j < 16; ++j)
      for (int i = 0; i < 16; ++i)
        dst[(c + j) * 16 + i] = rows[i] != nullptr && j < n ? widen_at(rows[i], c + j) : 0.0f;
  }
}

// Makes s.kt cover positions [lo, hi) (multiples of 16) with real keys from real_lo on.
template <typename T>
void ensure_transposed_keys(const PagedKvLayer& kv, const AttentionArgs& args, int64_t kvh, uint64_t call, int64_t lo,
                            int64_t hi, int64_t real_lo, bool avx512, Scratch& s) {
  const int64_t hdp = (kv.head_dim + 15) / 16 * 16;
  const int64_t end = args.start_pos + args.n_tokens;  // positions below are written
  if (s.kt_call != call || s.kt_k != cache_array<T>(kv, false) || s.kt_kvh != kvh || lo < s.kt_lo ||
      real_lo < s.kt_real_lo) {
    s.kt_call = call;
    s.kt_k = cache_array<T>(kv, false);
    s.kt_kvh = kvh;
    s.kt_lo = s.kt_hi = lo;
    s.kt_real_lo = real_lo;
  }
  if (hi <= s.kt_hi) return;
  const auto need = static_cast<size_t>((hi - s.kt_lo) * hdp);
  if (s.kt.size() < need) s.kt.resize(std::max(need, 2 * s.kt.size()));
  for (int64_t p0 = s.kt_hi; p0 < hi; p0 += 16)
    transpose_key_block<T>(kv, args.block_table, kvh, p0, s.kt_real_lo, end, hdp, avx512,
                           &s.kt[static_cast<size_t>((p0 - s.kt_lo) * hdp)]);
  s.kt_hi = hi;
}
// Query tokens t0 .. t0 + n - 1 of KV head kvh: rows r = t * group + g. avx512: the ISA of the
// call's kernels (AVX2 otherwise), read once per call.
template <typename T>
void attend_tile(const PagedKvLayer& kv, const AttentionArgs& args, int64_t t0, int64_t n, int64_t kvh, uint64_t call,
                 bool avx512) {
  const int64_t hd = kv.head_dim, nc = (hd + 15) / 16, hdp = 16 * nc;
  const int64_t group = args.n_heads / kv.n_kv_heads, rows = n * group;
  const int64_t pos0 = args.start_pos + t0, pos1 = pos0 + n - 1;
  const int64_t lo = span_first(args, pos0);          // union of the rows' spans: lo .. pos1
  const int64_t base = lo / 16 * 16, blocks = (pos1 - base) / 16 + 1, ld = 16 * blocks;
  Scratch& s = scratch();
  ensure_transposed_keys<T>(kv, args, kvh, call, base, base + ld, lo, avx512, s);
  auto grow = [](auto& v, int64_t size) {
    if (static_cast<int64_t>(v.size()) < size) v.resize(static_cast<size_t>(size));
  };
  grow(s.tile_q, rows * hdp);
  grow(s.tile_scores, rows * ld);
  grow(s.tile_out, rows * hdp);
  grow(s.tile_first, rows);
  grow(s.tile_last, rows);
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t g = 0; g < group; ++g) {
      const int64_t r = t * group + g;
      float* q = &s.tile_q[static_cast<size_t>(r * hdp)];
      std::memcpy(q, args.q + ((t0 + t) * args.n_heads + kvh * group + g) * hd, static_cast<size_t>(hd) * sizeof(float));
      std::fill(q + hd, q + hdp, 0.0f);
      s.tile_first[static_cast<size_t>(r)] = span_first(args, pos0 + t);
      s.tile_last[static_cast<size_t>(r)] = pos0 + t;
    }
  }
  float* sc = s.tile_scores.data();
  const TileScores ts{s.tile_q.data(), &s.kt[static_cast<size_t>((base - s.kt_lo) * hdp)], rows, blocks, hdp, sc,
                      args.scale};
  if (avx512)
    tile_scores_avx512(ts);
  else
    tile_scores_avx2(ts);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t f = s.tile_first[static_cast<size_t>(r)], len = s.tile_last[static_cast<size_t>(r)] - f + 1;
    float* row = sc + r * ld + (f - base);
    if (avx512)
      softmax_row_avx512(row, len);
    else
      softmax_row_avx2(row, len);
  }
  std::fill(s.tile_out.begin(), s.tile_out.begin() + rows * hdp, 0.0f);
  const TileValues tv{sc, ld, base, s.tile_first.data(), s.tile_last.data(), s.tile_out.data(), hdp, hd};
  // Keys every row sees (no per-row test) between the ones only some rows see; each row still
  // takes its keys in increasing order.
  const int64_t all_lo = s.tile_first[static_cast<size_t>(rows - 1)], all_hi = pos0;
  const int64_t row_stride = kv.n_kv_heads * row_elems<T>(kv);
  auto values = [&](int64_t j0, int64_t j1, bool check) {
    for (int64_t j = j0; j < j1;) {
      const int64_t run = std::min(j1 - j, kv.block_size - j % kv.block_size);
      const T* v = cache_array<T>(kv, true) + head_offset<T>(kv, args.block_table, j, kvh);
      if (avx512)
        tile_values_avx512<T>(tv, check, rows, j, j + run, v, row_stride);
      else
        tile_values_avx2<T>(tv, check, rows, j, j + run, v, row_stride);
      j += run;
    }
  };
  if (all_lo <= all_hi) {
    values(lo, all_lo, true);
    values(all_lo, all_hi + 1, false);
    values(all_hi + 1, pos1 + 1, true);
  } else {
    values(lo, pos1 + 1, true);
  }
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t t = r / group, g = r % group;
    std::memcpy(args.out + ((t0 + t) * args.n_heads + kvh * group + g) * hd, &s.tile_out[static_cast<size_t>(r * hdp)],
                static_cast<size_t>(hd) * sizeof(float));
  }
}

}  // namespace

namespace {

// One int8 row: dst[-kInt8RowLead..-1] = its scale s = max |x| / 127, dst[i] = round(x[i] / s).
void quantize_row_int8(const float* x, int64_t n, int8_t* dst) {
  float amax = 0.0f;
  bool nan = false;
  for (int64_t i = 0; i < n; ++i) {
    amax = std::max(amax, std::fabs(x[i]));
    nan = nan || std::isnan(x[i]);
  }
  const float scale = nan ? std::numeric_limits<float>::quiet_NaN() : amax / 127.0f;
  std::memcpy(dst - kInt8RowLead, &scale, sizeof(scale));
  // A row with a NaN or an infinity has no int8 grid: every value reads back as 0 * s, NaN.
  const bool grid = scale > 0.0f && std::isfinite(scale);
  for (int64_t i = 0; i < n; ++i) {
    const float q = grid ? std::nearbyint(x[i] / scale) : 0.0f;
    dst[i] = std::isnan(q) ? int8_t{0} : static_cast<int8_t>(std::clamp(q, -127.0f, 127.0f));
  }
}

}  // namespace

void kv_write(const PagedKvLayer& kv, const int32_t* block_table, int64_t start_pos,
              int64_t n_tokens, const float* k, const float* v) {
  TESSERA_CHECK(kv.block_size > 0 && start_pos >= 0, "kv_write: block_size {} start_pos {}",
                kv.block_size, start_pos);
  const int64_t row = kv.n_kv_heads * kv.head_dim;
  const size_t bytes = static_cast<size_t>(row) * sizeof(float);
  for (int64_t t = 0; t < n_tokens; ++t) {
    if (kv.k8 != nullptr) {
      for (int64_t h = 0; h < kv.n_kv_heads; ++h) {
        const int64_t off = head_offset<int8_t>(kv, block_table, start_pos + t, h);
        quantize_row_int8(k + t * row + h * kv.head_dim, kv.head_dim, kv.k8 + off);
        quantize_row_int8(v + t * row + h * kv.head_dim, kv.head_dim, kv.v8 + off);
      }
      continue;
    }
    const int64_t off = slot_offset<float>(kv, block_table, start_pos + t);
    if (kv.k16 != nullptr) {  // rounded to nearest even, as f32_to_fp16
      for (int64_t i = 0; i < row; ++i) {
        kv.k16[off + i] = f32_to_fp16(k[t * row + i]);
        kv.v16[off + i] = f32_to_fp16(v[t * row + i]);
      }
    } else {
      std::memcpy(kv.k + off, k + t * row, bytes);
      std::memcpy(kv.v + off, v + t * row, bytes);
    }
  }
}

namespace {

void check_args(const PagedKvLayer& kv, const AttentionArgs& args) {
  const int pairs = (kv.k != nullptr && kv.v != nullptr) + (kv.k16 != nullptr && kv.v16 != nullptr) +
                    (kv.k8 != nullptr && kv.v8 != nullptr);
  TESSERA_CHECK(pairs == 1, "paged_attention: the layer needs exactly one of fp32, fp16 or int8 K and V arrays");
  TESSERA_CHECK(kv.block_size > 0 && kv.n_kv_heads > 0 && kv.head_dim > 0,
                "paged_attention: block_size {} n_kv_heads {} head_dim {}", kv.block_size,
                kv.n_kv_heads, kv.head_dim);
  TESSERA_CHECK(args.n_heads > 0 && args.n_heads % kv.n_kv_heads == 0,
                "paged_attention: n_heads {} not a multiple of n_kv_heads {}", args.n_heads,
                kv.n_kv_heads);
  TESSERA_CHECK(args.n_heads / kv.n_kv_heads <= kMaxGroup, "paged_attention: {} query heads per KV head (max {})",
                args.n_heads / kv.n_kv_heads, kMaxGroup);
  TESSERA_CHECK(args.start_pos >= 0 && args.n_tokens >= 0, "paged_attention: start_pos {} n_tokens {}",
                args.start_pos, args.n_tokens);
}

// One sequence's items: n_kv_heads x units, a unit being a query token, or a tile of
// `tile` tokens (prefill). Item i: KV head i / units; within a head, units alternate from both
// ends (0, units-1, 1, units-2, ...) so any contiguous range holds short and long causal spans
// alike, and items of one sequence cost about the same on average (`cost`).
struct SeqPlan {
  int64_t units = 0, tile = 0, items = 0, item_begin = 0;
  double cost = 0, cost_begin = 0;
  uint64_t call = 0;
  bool avx512 = false;  // the tiles' ISA (AVX2 otherwise)
};

SeqPlan plan_sequence(const PagedKvLayer& kv, const AttentionArgs& args) {
  SeqPlan p;
  const int64_t group = args.n_heads / kv.n_kv_heads;
  p.tile = use_tiles(kv, args) ? tile_tokens(group) : 0;
  p.avx512 = cpu::active_isa() == cpu::Isa::kAvx512;
  p.units = p.tile > 0 ? (args.n_tokens + p.tile - 1) / p.tile : args.n_tokens;
  p.items = p.units * kv.n_kv_heads;
  // Mean span of the sequence's queries, plus a fixed cost per item.
  const int64_t last = args.start_pos + args.n_tokens - 1;
  const double span = 0.5 * static_cast<double>(last - span_first(args, last) + 1 + args.start_pos -
                                                span_first(args, args.start_pos) + 1);
  p.cost = static_cast<double>(args.n_tokens * group) / static_cast<double>(std::max<int64_t>(1, p.units)) *
               static_cast<double>(kv.head_dim) * span +
           512.0;
  return p;
}

// One item: a tile of nt tokens from t0 (prefill tiles), or query token u.
template <typename T>
void attend_unit(const PagedKvLayer& kv, const AttentionArgs& args, const SeqPlan& p, int64_t u, int64_t t0, int64_t nt,
                 int64_t kvh) {
  if (p.tile > 0)
    attend_tile<T>(kv, args, t0, nt, kvh, p.call, p.avx512);
  else
    attend<T>(kv, args, u, kvh, p.call);
}

void run_sequence_items(const PagedKvLayer& kv, const AttentionArgs& args, const SeqPlan& p, int64_t b, int64_t e) {
  for (int64_t i = b; i < e; ++i) {
    const int64_t kvh = i / p.units, r = i % p.units;
    const int64_t u = r % 2 == 0 ? r / 2 : p.units - 1 - r / 2;
    const int64_t t0 = u * p.tile, nt = std::min(p.tile, args.n_tokens - t0);
    with_element_type(kv, [&](auto e) { attend_unit<decltype(e)>(kv, args, p, u, t0, nt, kvh); });
  }
}

// Per caller thread: the plans of the current call, grown once (no allocation per step).
std::vector<SeqPlan>& plans_scratch() {
  thread_local std::vector<SeqPlan> plans;
  return plans;
}

// Global item index at cumulative cost x (monotone in x).
int64_t item_at_cost(const std::vector<SeqPlan>& plans, size_t n, double x) {
  const auto it = std::upper_bound(plans.begin(), plans.begin() + static_cast<std::ptrdiff_t>(n), x,
                                   [](double v, const SeqPlan& p) { return v < p.cost_begin; });
  if (it == plans.begin()) return 0;
  const SeqPlan& p = *(it - 1);
  const auto k = static_cast<int64_t>((x - p.cost_begin) / p.cost + 0.5);
  return p.item_begin + std::clamp<int64_t>(k, 0, p.items);
}

}  // namespace

void paged_attention_batch(const PagedKvLayer& kv, std::span<const AttentionArgs> batch, ThreadPool* pool) {
  static std::atomic<uint64_t> calls{0};
  // One id per sequence: the per-thread caches are keyed by it (block tables differ).
  const uint64_t call0 = calls.fetch_add(batch.size() + 1) + 1;
  std::vector<SeqPlan>& plans = plans_scratch();
  if (plans.size() < batch.size()) plans.resize(batch.size());
  int64_t items = 0;
  double total = 0;
  for (size_t s = 0; s < batch.size(); ++s) {
    check_args(kv, batch[s]);
    SeqPlan p = plan_sequence(kv, batch[s]);
    p.call = call0 + s;
    p.item_begin = items;
    p.cost_begin = total;
    items += p.items;
    total += p.cost * static_cast<double>(p.items);
    plans[s] = p;
  }
  const size_t n = batch.size();
  // Items b .. e - 1 of the whole batch, sequence by sequence.
  auto run = [&](int64_t b, int64_t e) {
    size_t s = static_cast<size_t>(
        std::upper_bound(plans.begin(), plans.begin() + static_cast<std::ptrdiff_t>(n), b,
                         [](int64_t v, const SeqPlan& p) { return v < p.item_begin; }) -
        plans.begin() - 1);
    for (; s < n && b < e; ++s) {
      const SeqPlan& p = plans[s];
      const int64_t lo = std::max(b, p.item_begin), hi = std::min(e, p.item_begin + p.items);
      if (lo < hi) run_sequence_items(kv, batch[s], p, lo - p.item_begin, hi - p.item_begin);
    }
  };
  if (items == 0) return;
  if (pool == nullptr || pool->size() <= 1 || items == 1) {
    run(0, items);
    return;
  }
  // Part k of the pool takes the items between cumulative costs k / parts and (k + 1) / parts.
  const int64_t parts = std::min<int64_t>(pool->size(), items);
  pool->parallel_for(parts, 1, [&](int64_t b, int64_t e, int) {
    for (int64_t k = b; k < e; ++k) {
      const int64_t lo = k == 0 ? 0 : item_at_cost(plans, n, total * static_cast<double>(k) / static_cast<double>(parts));
      const int64_t hi =
          k + 1 == parts ? items : item_at_cost(plans, n, total * static_cast<double>(k + 1) / static_cast<double>(parts));
      run(lo, hi);
    }
  });
}

void paged_attention(const PagedKvLayer& kv, const AttentionArgs& args, ThreadPool* pool) {
  paged_attention_batch(kv, std::span<const AttentionArgs>(&args, 1), pool);
}

namespace {

template <typename T>
void read_slot(const PagedKvLayer& kv, bool values, int64_t block, int64_t slot, float* out) {
  const T* row = cache_array<T>(kv, values) + (block * kv.block_size + slot) * kv.n_kv_heads * row_elems<T>(kv);
  for (int64_t h = 0; h < kv.n_kv_heads; ++h, row += row_elems<T>(kv))
    for (int64_t i = 0; i < kv.head_dim; ++i) out[h * kv.head_dim + i] = widen_at(row + kRowLead<T>, i);
}

}  // namespace

void kv_read_slot(const PagedKvLayer& kv, bool values, int64_t block, int64_t slot, float* out) {
  TESSERA_CHECK(block >= 0 && block < kv.num_blocks && slot >= 0 && slot < kv.block_size,
                "kv_read_slot: block {} slot {} outside [0, {}) x [0, {})", block, slot, kv.num_blocks, kv.block_size);
  with_element_type(kv, [&](auto e) { read_slot<decltype(e)>(kv, values, block, slot, out); });
}

}  // namespace tessera
