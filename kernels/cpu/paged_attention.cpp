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
//   m = max_j s_j;  e_j = exp_poly(s_j - m)  (a fixed polynomial, below, not libm)
//   sum = 16-lane sum of e_j over j (lane j % 16, same reduction tree);  inv = 1 / sum
//   out_i = fma(e_j * inv, v_j,i, out_i) for j in increasing order, out_i starting at +0.
// The cache holds fp32, fp16 or int8 rows (kernels/paged_attention.h): fp16 is widened exactly as
// it is loaded, int8 is multiplied by its row's scale as it is loaded (one fp32 product per value,
// the same on every path), so an fp16 or int8 cache gives the results of an fp32 cache holding
// the values it reads back.
#include "kernels/paged_attention.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

#include "common/check.h"
#include "common/dtype.h"
#include "common/thread_pool.h"
#include "kernels/cpu/exp_poly.h"
#include "kernels/cpu/fgemm.h"
#include "kernels/cpu/vec.h"

#if defined(__x86_64__)
#include <immintrin.h>
#define TESSERA_ATT_X86 1
#endif

namespace tessera {
namespace {

constexpr int kLanes = 16;
constexpr int kMaxGroup = 64;  // query heads per KV head handled in one item

// Cache elements: float (fp32 cache), uint16_t (fp16) or int8_t (int8), read as fp32. Rows are
// passed as a pointer to their first value: an int8 row's scale sits kInt8RowLead bytes before it.
template <typename T>
inline constexpr int64_t kRowLead = std::is_same_v<T, int8_t> ? kInt8RowLead : 0;
inline float row_scale(const int8_t* row) {
  float s;
  std::memcpy(&s, row - kInt8RowLead, sizeof(s));
  return s;
}
// Value i of a row, as attention reads it.
inline float widen_at(const float* row, int64_t i) { return row[i]; }
inline float widen_at(const uint16_t* row, int64_t i) { return fp16_to_f32(row[i]); }
inline float widen_at(const int8_t* row, int64_t i) { return static_cast<float>(row[i]) * row_scale(row); }

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

#ifdef TESSERA_ATT_X86
#define TESSERA_AVX2 __attribute__((target("avx2,fma,f16c")))
#define TESSERA_AVX512 __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c")))
// Values off .. off + 15 (load16z: those the mask selects, zeros elsewhere) or off .. off + 7 of a row.
TESSERA_AVX512 inline __m512 load16(const float* row, int64_t off) { return _mm512_loadu_ps(row + off); }
TESSERA_AVX512 inline __m512 load16(const uint16_t* row, int64_t off) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + off)));
}
TESSERA_AVX512 inline __m512 load16(const int8_t* row, int64_t off) {
  const __m512i q = _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + off)));
  return _mm512_mul_ps(_mm512_cvtepi32_ps(q), _mm512_set1_ps(row_scale(row)));
}
TESSERA_AVX512 inline __m512 load16z(__mmask16 m, const float* row, int64_t off) {
  return _mm512_maskz_loadu_ps(m, row + off);
}
TESSERA_AVX512 inline __m512 load16z(__mmask16 m, const uint16_t* row, int64_t off) {
  return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, row + off));
}
TESSERA_AVX512 inline __m512 load16z(__mmask16 m, const int8_t* row, int64_t off) {
  const __m512i q = _mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(m, row + off));
  return _mm512_mul_ps(_mm512_cvtepi32_ps(q), _mm512_set1_ps(row_scale(row)));
}
TESSERA_AVX2 inline __m256 load8(const float* row, int64_t off) { return _mm256_loadu_ps(row + off); }
TESSERA_AVX2 inline __m256 load8(const uint16_t* row, int64_t off) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + off)));
}
TESSERA_AVX2 inline __m256 load8(const int8_t* row, int64_t off) {
  const __m256i q = _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(row + off)));
  return _mm256_mul_ps(_mm256_cvtepi32_ps(q), _mm256_set1_ps(row_scale(row)));
}
#endif

// exp(x) for x <= 0 (kernels/cpu/exp_poly.h); inputs below -87 are clamped (e^-87 ~ 1.6e-38,
// which is negligible next to the largest term, 1).
inline float exp_poly(float x) { return cpu::exp_poly_clamped(std::max(x, cpu::kExpPolyLo)); }

// The canonical reduction of 16 partial sums, the float matmuls' (kernels/cpu/fgemm.h).
using cpu::reduce16;

// The cache rows of one head are scattered (blocks, and n_kv_heads rows per slot), so the
// hardware prefetchers do not follow them: prefetch the row kPrefetchAhead keys ahead.
constexpr int64_t kPrefetchAhead = 8;

template <typename T>
inline void prefetch_row(const T* row, int64_t hd) {
  const auto* bytes = reinterpret_cast<const char*>(row);
  for (int64_t i = 0; i < hd * static_cast<int64_t>(sizeof(T)); i += 64) __builtin_prefetch(bytes + i, 0, 3);
}

// ---- the three phases of one item, per ISA. Keys are visited block by block: `keys` lists
// the first float of each visible key's head row, in order.

template <typename T>
struct Item {
  const T* const* keys;    // [n] pointers to k rows of this KV head
  const T* const* values;  // [n] pointers to v rows
  int64_t n;
  int64_t hd;
  int64_t group;
  const float* q;              // group query heads, hd apart
  float* out;                  // group output heads, hd apart
  float scale;
  float* scores;               // [group][n]
  bool prefetch;               // keys are cold (decode); in prefill they stay in cache
};

template <typename T>
void scores_scalar(const Item<T>& it) {
  for (int64_t j = 0; j < it.n; ++j) {
    for (int64_t g = 0; g < it.group; ++g) {
      float s[kLanes] = {};
      const float* q = it.q + g * it.hd;
      const int64_t pad = (it.hd + kLanes - 1) / kLanes * kLanes;
      for (int64_t i = 0; i < pad; ++i) {
        const float a = i < it.hd ? q[i] : 0.0f, b = i < it.hd ? widen_at(it.keys[j], i) : 0.0f;
        s[i % kLanes] = std::fma(a, b, s[i % kLanes]);
      }
      it.scores[g * it.n + j] = reduce16(s) * it.scale;
    }
  }
}

// e_j in place, returns 1 / sum.
float softmax_scalar(float* s, int64_t n) {
  float m = -INFINITY;
  for (int64_t j = 0; j < n; ++j) m = std::max(m, s[j]);
  float lanes[kLanes] = {};
  const int64_t pad = (n + kLanes - 1) / kLanes * kLanes;
  for (int64_t j = 0; j < pad; ++j) {
    const float e = j < n ? exp_poly(s[j] - m) : 0.0f;
    if (j < n) s[j] = e;
    lanes[j % kLanes] += e;
  }
  return 1.0f / reduce16(lanes);
}

template <typename T>
void values_scalar(const Item<T>& it, const float* inv) {
  for (int64_t g = 0; g < it.group; ++g) std::memset(it.out + g * it.hd, 0, static_cast<size_t>(it.hd) * 4);
  for (int64_t j = 0; j < it.n; ++j)
    for (int64_t g = 0; g < it.group; ++g) {
      const float p = it.scores[g * it.n + j] * inv[g];
      float* o = it.out + g * it.hd;
      for (int64_t i = 0; i < it.hd; ++i) o[i] = std::fma(p, widen_at(it.values[j], i), o[i]);
    }
}

#ifdef TESSERA_ATT_X86
TESSERA_AVX512 inline float reduce16_avx512(__m512 s) {
  const __m256 t = _mm256_add_ps(_mm512_castps512_ps256(s), _mm512_extractf32x8_ps(s, 1));
  const __m128 u = _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
  const __m128 v = _mm_add_ps(u, _mm_movehl_ps(u, u));
  return _mm_cvtss_f32(_mm_add_ss(v, _mm_movehdup_ps(v)));
}

TESSERA_AVX512 inline __m512 exp_poly_avx512(__m512 x) {
  return cpu::exp_poly_clamped_avx512(_mm512_max_ps(x, _mm512_set1_ps(cpu::kExpPolyLo)));
}

// The 16 canonical reductions of acc[0..15] at once: lane m of the result is reduce16(acc[m]).
// Each step adds the same lane pairs as reduce16 (i and i + 8, then i + 4, i + 2, i + 1), only
// several vectors per instruction.
TESSERA_AVX512 inline __m512 reduce16x16_avx512(const __m512* acc) {
  const __m512i s1l = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23);
  const __m512i s1h = _mm512_setr_epi32(8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
  const __m512i s2l = _mm512_setr_epi32(0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27);
  const __m512i s2h = _mm512_setr_epi32(4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31);
  const __m512i s3l = _mm512_setr_epi32(0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25, 28, 29);
  const __m512i s3h = _mm512_setr_epi32(2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 22, 23, 26, 27, 30, 31);
  const __m512i s4l = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i s4h = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
  __m512 t[8], u[4], v[2];
  for (int m = 0; m < 8; ++m)
    t[m] = _mm512_add_ps(_mm512_permutex2var_ps(acc[2 * m], s1l, acc[2 * m + 1]),
                         _mm512_permutex2var_ps(acc[2 * m], s1h, acc[2 * m + 1]));
  for (int m = 0; m < 4; ++m)
    u[m] = _mm512_add_ps(_mm512_permutex2var_ps(t[2 * m], s2l, t[2 * m + 1]),
                         _mm512_permutex2var_ps(t[2 * m], s2h, t[2 * m + 1]));
  for (int m = 0; m < 2; ++m)
    v[m] = _mm512_add_ps(_mm512_permutex2var_ps(u[2 * m], s3l, u[2 * m + 1]),
                         _mm512_permutex2var_ps(u[2 * m], s3h, u[2 * m + 1]));
  return _mm512_add_ps(_mm512_permutex2var_ps(v[0], s4l, v[1]), _mm512_permutex2var_ps(v[0], s4h, v[1]));
}

// Scores of one query head against 16 keys at a time; kNc = head_dim / 16 (0: any head_dim).
template <int kNc, typename T>
TESSERA_AVX512 void scores_head_avx512(const Item<T>& it, int64_t g) {
  const int64_t nc = kNc > 0 ? kNc : (it.hd + kLanes - 1) / kLanes;
  const int64_t full = it.hd / kLanes;
  const auto tail = static_cast<__mmask16>((1u << (it.hd % kLanes)) - 1u);
  const float* q = it.q + g * it.hd;
  float* out = it.scores + g * it.n;
  const __m512 scale = _mm512_set1_ps(it.scale);
  for (int64_t j0 = 0; j0 < it.n; j0 += kLanes) {
    const int64_t nk = std::min<int64_t>(kLanes, it.n - j0);
    __m512 acc[kLanes];
    for (int64_t jj = 0; jj < kLanes; ++jj) {
      acc[jj] = _mm512_setzero_ps();
      if (jj >= nk) continue;
      const T* k = it.keys[j0 + jj];
      if (it.prefetch && g == 0 && j0 + jj + kPrefetchAhead < it.n) prefetch_row(it.keys[j0 + jj + kPrefetchAhead], it.hd);
      for (int64_t c = 0; c < nc; ++c) {
        if (kNc > 0 || c < full) {
          acc[jj] = _mm512_fmadd_ps(_mm512_loadu_ps(q + 16 * c), load16(k, 16 * c), acc[jj]);
        } else {
          acc[jj] = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(tail, q + 16 * c), load16z(tail, k, 16 * c), acc[jj]);
        }
      }
    }
    const __m512 sums = _mm512_mul_ps(reduce16x16_avx512(acc), scale);
    _mm512_mask_storeu_ps(out + j0, static_cast<__mmask16>((1u << nk) - 1u), sums);
  }
}

template <typename T>
TESSERA_AVX512 void scores_avx512(const Item<T>& it) {
  for (int64_t g = 0; g < it.group; ++g) {
    switch (it.hd) {
      case 64: scores_head_avx512<4>(it, g); break;
      case 128: scores_head_avx512<8>(it, g); break;
      default: scores_head_avx512<0>(it, g); break;
    }
  }
}

TESSERA_AVX512 float softmax_avx512(float* s, int64_t n) {
  __m512 m = _mm512_set1_ps(-INFINITY);
  const int64_t full = n / kLanes * kLanes;
  const auto tail = static_cast<__mmask16>((1u << (n - full)) - 1u);
  for (int64_t j = 0; j < full; j += kLanes) m = _mm512_max_ps(m, _mm512_loadu_ps(s + j));
  if (full < n) m = _mm512_mask_max_ps(m, tail, m, _mm512_maskz_loadu_ps(tail, s + full));
  const __m512 mx = _mm512_set1_ps(_mm512_reduce_max_ps(m));
  __m512 sum = _mm512_setzero_ps();
  for (int64_t j = 0; j < full; j += kLanes) {
    const __m512 e = exp_poly_avx512(_mm512_sub_ps(_mm512_loadu_ps(s + j), mx));
    _mm512_storeu_ps(s + j, e);
    sum = _mm512_add_ps(sum, e);
  }
  if (full < n) {
    const __m512 e = _mm512_maskz_mov_ps(tail, exp_poly_avx512(_mm512_sub_ps(_mm512_maskz_loadu_ps(tail, s + full), mx)));
    _mm512_mask_storeu_ps(s + full, tail, e);
    sum = _mm512_add_ps(sum, e);
  }
  return 1.0f / reduce16_avx512(sum);
}

// One query head's output kept in registers over all its keys (kNc = head_dim / 16).
template <int kNc, typename T>
TESSERA_AVX512 void values_head_avx512(const Item<T>& it, int64_t g, float inv) {
  __m512 o[kNc];
  for (auto& v : o) v = _mm512_setzero_ps();
  const float* sc = it.scores + g * it.n;
  for (int64_t j = 0; j < it.n; ++j) {
    const T* v = it.values[j];
    if (it.prefetch && g == 0 && j + kPrefetchAhead < it.n) prefetch_row(it.values[j + kPrefetchAhead], it.hd);
    const __m512 p = _mm512_set1_ps(sc[j] * inv);
    for (int c = 0; c < kNc; ++c) o[c] = _mm512_fmadd_ps(p, load16(v, 16 * c), o[c]);
  }
  float* out = it.out + g * it.hd;
  for (int c = 0; c < kNc; ++c) _mm512_storeu_ps(out + 16 * c, o[c]);
}

template <typename T>
TESSERA_AVX512 void values_avx512(const Item<T>& it, const float* inv) {
  if (it.hd == 64 || it.hd == 128) {
    for (int64_t g = 0; g < it.group; ++g) {
      if (it.hd == 64) values_head_avx512<4>(it, g, inv[g]);
      else values_head_avx512<8>(it, g, inv[g]);
    }
    return;
  }
  const int64_t full = it.hd / kLanes * kLanes;
  const auto tail = static_cast<__mmask16>((1u << (it.hd - full)) - 1u);
  for (int64_t g = 0; g < it.group; ++g) std::memset(it.out + g * it.hd, 0, static_cast<size_t>(it.hd) * 4);
  for (int64_t j = 0; j < it.n; ++j) {
    const T* v = it.values[j];
    if (it.prefetch && j + kPrefetchAhead < it.n) prefetch_row(it.values[j + kPrefetchAhead], it.hd);
    for (int64_t g = 0; g < it.group; ++g) {
      const __m512 p = _mm512_set1_ps(it.scores[g * it.n + j] * inv[g]);
      float* o = it.out + g * it.hd;
      for (int64_t i = 0; i < full; i += kLanes)
        _mm512_storeu_ps(o + i, _mm512_fmadd_ps(p, load16(v, i), _mm512_loadu_ps(o + i)));
      if (full < it.hd)
        _mm512_mask_storeu_ps(o + full, tail,
                              _mm512_fmadd_ps(p, load16z(tail, v, full), _mm512_maskz_loadu_ps(tail, o + full)));
    }
  }
}

// AVX2: 16 lanes as two 8-lane halves; tails through zero-padded copies.
TESSERA_AVX2 inline float reduce16_avx2(__m256 lo, __m256 hi) {
  const __m256 t = _mm256_add_ps(lo, hi);
  const __m128 u = _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
  const __m128 v = _mm_add_ps(u, _mm_movehl_ps(u, u));
  return _mm_cvtss_f32(_mm_add_ss(v, _mm_movehdup_ps(v)));
}

TESSERA_AVX2 inline __m256 exp_poly_avx2(__m256 x) {
  return cpu::exp_poly_clamped_avx2(_mm256_max_ps(x, _mm256_set1_ps(cpu::kExpPolyLo)));
}

template <typename T>
TESSERA_AVX2 void scores_avx2(const Item<T>& it) {
  const int64_t full = it.hd / kLanes * kLanes;
  alignas(32) float kt[kLanes], qt[kLanes];
  for (int64_t j = 0; j < it.n; ++j) {
    const T* k = it.keys[j];
    for (int64_t g = 0; g < it.group; ++g) {
      const float* q = it.q + g * it.hd;
      __m256 lo = _mm256_setzero_ps(), hi = lo;
      for (int64_t i = 0; i < full; i += kLanes) {
        lo = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), load8(k, i), lo);
        hi = _mm256_fmadd_ps(_mm256_loadu_ps(q + i + 8), load8(k, i + 8), hi);
      }
      if (full < it.hd) {
        for (int i = 0; i < kLanes; ++i) {
          kt[i] = full + i < it.hd ? widen_at(k, full + i) : 0.0f;
          qt[i] = full + i < it.hd ? q[full + i] : 0.0f;
        }
        lo = _mm256_fmadd_ps(_mm256_load_ps(qt), _mm256_load_ps(kt), lo);
        hi = _mm256_fmadd_ps(_mm256_load_ps(qt + 8), _mm256_load_ps(kt + 8), hi);
      }
      it.scores[g * it.n + j] = reduce16_avx2(lo, hi) * it.scale;
    }
  }
}

TESSERA_AVX2 float softmax_avx2(float* s, int64_t n) {
  float m = -INFINITY;
  for (int64_t j = 0; j < n; ++j) m = std::max(m, s[j]);
  const __m256 mx = _mm256_set1_ps(m);
  __m256 lo = _mm256_setzero_ps(), hi = lo;
  const int64_t full = n / kLanes * kLanes;
  for (int64_t j = 0; j < full; j += kLanes) {
    const __m256 e0 = exp_poly_avx2(_mm256_sub_ps(_mm256_loadu_ps(s + j), mx));
    const __m256 e1 = exp_poly_avx2(_mm256_sub_ps(_mm256_loadu_ps(s + j + 8), mx));
    _mm256_storeu_ps(s + j, e0);
    _mm256_storeu_ps(s + j + 8, e1);
    lo = _mm256_add_ps(lo, e0);
    hi = _mm256_add_ps(hi, e1);
  }
  if (full < n) {
    alignas(32) float t[kLanes];
    for (int i = 0; i < kLanes; ++i) t[i] = full + i < n ? s[full + i] - m : 0.0f;
    __m256 e0 = exp_poly_avx2(_mm256_load_ps(t)), e1 = exp_poly_avx2(_mm256_load_ps(t + 8));
    _mm256_store_ps(t, e0);
    _mm256_store_ps(t + 8, e1);
    for (int i = 0; i < kLanes; ++i) {
      if (full + i < n) s[full + i] = t[i]; else t[i] = 0.0f;
    }
    lo = _mm256_add_ps(lo, _mm256_load_ps(t));
    hi = _mm256_add_ps(hi, _mm256_load_ps(t + 8));
  }
  return 1.0f / reduce16_avx2(lo, hi);
}

template <typename T>
TESSERA_AVX2 void values_avx2(const Item<T>& it, const float* inv) {
  const int64_t full = it.hd / 8 * 8;
  for (int64_t g = 0; g < it.group; ++g) std::memset(it.out + g * it.hd, 0, static_cast<size_t>(it.hd) * 4);
  for (int64_t j = 0; j < it.n; ++j) {
    const T* v = it.values[j];
    for (int64_t g = 0; g < it.group; ++g) {
      const float p = it.scores[g * it.n + j] * inv[g];
      const __m256 pv = _mm256_set1_ps(p);
      float* o = it.out + g * it.hd;
      for (int64_t i = 0; i < full; i += 8)
        _mm256_storeu_ps(o + i, _mm256_fmadd_ps(pv, load8(v, i), _mm256_loadu_ps(o + i)));
      for (int64_t i = full; i < it.hd; ++i) o[i] = std::fma(p, widen_at(v, i), o[i]);
    }
  }
}

// ---- prefill tiles (AVX-512; AVX2 below): several query rows (tokens x GQA heads) against one KV head.
//
// Scores use a transposed copy of the keys, blocks of 16 keys as [head_dim_padded][16], so a
// vector holds one dim lane of 16 keys: lane l of dot16 for 16 keys is the fma chain over the
// chunks c of q[16c + l] * kt[16c + l][:], and the 16 lane sums are combined by vertical adds
// in reduce16's tree (pairs i, i + 8, then i + 4, i + 2, i + 1). That is the canonical
// arithmetic with no horizontal shuffles; kRb rows x kKb key blocks share each load.

// Scores of kRb rows against kKb blocks of 16 keys, times scale, into s (row r at s + r * ld).
// For each lane pair (i, i + 8), the 2 * kRb * kKb fma chains run interleaved (enough of them
// to hide the fma latency) and their sum t_i (reduce16's first level) goes to a stack buffer;
// the remaining levels (t_i + t_{i+4}, then + 2, + 1) are done at the end.
template <int kNc, int kRb, int kKb>
TESSERA_AVX512 void scores_block_avx512(const float* q, const float* kt, int64_t hdp, float* s, int64_t ld,
                                        float scale) {
  __m512 t[8][kRb][kKb];
  for (int i = 0; i < 8; ++i) {
    __m512 a[kRb][kKb], b[kRb][kKb];
#pragma GCC unroll 16
    for (int r = 0; r < kRb; ++r)
#pragma GCC unroll 16
      for (int k = 0; k < kKb; ++k) a[r][k] = b[r][k] = _mm512_setzero_ps();
#pragma GCC unroll 16
    for (int c = 0; c < kNc; ++c) {
      __m512 ka[kKb], kb[kKb];
#pragma GCC unroll 16
      for (int k = 0; k < kKb; ++k) {
        ka[k] = _mm512_loadu_ps(kt + k * 16 * hdp + (16 * c + i) * 16);
        kb[k] = _mm512_loadu_ps(kt + k * 16 * hdp + (16 * c + i + 8) * 16);
      }
#pragma GCC unroll 16
      for (int r = 0; r < kRb; ++r) {
        const __m512 qa = _mm512_set1_ps(q[r * hdp + 16 * c + i]);
        const __m512 qb = _mm512_set1_ps(q[r * hdp + 16 * c + i + 8]);
#pragma GCC unroll 16
        for (int k = 0; k < kKb; ++k) {
          a[r][k] = _mm512_fmadd_ps(qa, ka[k], a[r][k]);
          b[r][k] = _mm512_fmadd_ps(qb, kb[k], b[r][k]);
        }
      }
    }
#pragma GCC unroll 16
    for (int r = 0; r < kRb; ++r)
#pragma GCC unroll 16
      for (int k = 0; k < kKb; ++k) t[i][r][k] = _mm512_add_ps(a[r][k], b[r][k]);
  }
  const __m512 sc = _mm512_set1_ps(scale);
#pragma GCC unroll 16
  for (int r = 0; r < kRb; ++r) {
#pragma GCC unroll 16
    for (int k = 0; k < kKb; ++k) {
      __m512 u[4];
#pragma GCC unroll 4
      for (int i = 0; i < 4; ++i) u[i] = _mm512_add_ps(t[i][r][k], t[i + 4][r][k]);
      const __m512 v0 = _mm512_add_ps(u[0], u[2]), v1 = _mm512_add_ps(u[1], u[3]);
      _mm512_storeu_ps(s + r * ld + 16 * k, _mm512_mul_ps(_mm512_add_ps(v0, v1), sc));
    }
  }
}

using ScoresBlockFn = void (*)(const float*, const float*, int64_t, float*, int64_t, float);

// Row blocks of kScoreRows (the last may be shorter) x pairs of key blocks.
constexpr int kScoreRows = 4;

template <int kNc, int kKb>
constexpr std::array<ScoresBlockFn, kScoreRows> kScoresBlocks = {
    &scores_block_avx512<kNc, 1, kKb>, &scores_block_avx512<kNc, 2, kKb>, &scores_block_avx512<kNc, 3, kKb>,
    &scores_block_avx512<kNc, 4, kKb>};

struct TileScores {
  const float* q;   // [rows][hdp]
  const float* kt;  // [blocks][hdp][16]
  int64_t rows, blocks, hdp;
  float* s;         // [rows][ld], ld = 16 * blocks
  float scale;
};

template <int kNc>
TESSERA_AVX512 void scores_tile_avx512(const TileScores& t) {
  const int64_t ld = 16 * t.blocks, kb = 16 * t.hdp;
  for (int64_t b = 0; b < t.blocks; b += 2) {
    const auto& fns = b + 1 < t.blocks ? kScoresBlocks<kNc, 2> : kScoresBlocks<kNc, 1>;
    for (int64_t r = 0; r < t.rows; r += kScoreRows) {
      const int64_t n = std::min<int64_t>(kScoreRows, t.rows - r);
      fns[static_cast<size_t>(n - 1)](t.q + r * t.hdp, t.kt + b * kb, t.hdp, t.s + r * ld + 16 * b, ld, t.scale);
    }
  }
}

// p_j = e_j * inv over one row's span (the canonical weight of value j).
TESSERA_AVX512 void scale_row_avx512(float* s, int64_t n, float inv) {
  const __m512 iv = _mm512_set1_ps(inv);
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes) _mm512_storeu_ps(s + j, _mm512_mul_ps(_mm512_loadu_ps(s + j), iv));
  if (j < n) {
    const auto m = static_cast<__mmask16>((1u << (n - j)) - 1u);
    _mm512_mask_storeu_ps(s + j, m, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, s + j), iv));
  }
}

struct TileValues {
  const float* p;        // weights, row r at p + r * ld, key position j at index j - base
  int64_t ld, base;
  const int64_t* first;  // per row: visible key positions first[r] .. last[r]
  const int64_t* last;
  float* o;              // [rows][hdp] accumulators
  int64_t hdp, hd;
};

// Rows r0 .. r0 + kRows - 1 over keys j0 .. j1 - 1, whose value rows start at v, `stride`
// floats apart (one cache block). kCheck: skip keys outside a row's span.
template <int kNc, int kRows, bool kCheck, typename T>
TESSERA_AVX512 void values_rows_avx512(const TileValues& t, int64_t r0, int64_t j0, int64_t j1, const T* v,
                                       int64_t stride) {
  const auto tail = static_cast<__mmask16>(t.hd % 16 == 0 ? 0xffffu : (1u << (t.hd % 16)) - 1u);
  float* o = t.o + r0 * t.hdp;
  __m512 acc[kRows][kNc];
#pragma GCC unroll 16
  for (int r = 0; r < kRows; ++r)
#pragma GCC unroll 16
    for (int c = 0; c < kNc; ++c) acc[r][c] = _mm512_loadu_ps(o + r * t.hdp + 16 * c);
  const float* p = t.p + r0 * t.ld - t.base;
  for (int64_t j = j0; j < j1; ++j, v += stride) {
    __m512 vv[kNc];
#pragma GCC unroll 16
    for (int c = 0; c < kNc; ++c) vv[c] = c + 1 < kNc ? load16(v, 16 * c) : load16z(tail, v, 16 * c);
#pragma GCC unroll 16
    for (int r = 0; r < kRows; ++r) {
      if (kCheck && (j < t.first[r0 + r] || j > t.last[r0 + r])) continue;
      const __m512 pv = _mm512_set1_ps(p[r * t.ld + j]);
#pragma GCC unroll 16
      for (int c = 0; c < kNc; ++c) acc[r][c] = _mm512_fmadd_ps(pv, vv[c], acc[r][c]);
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < kRows; ++r)
#pragma GCC unroll 16
    for (int c = 0; c < kNc; ++c) _mm512_storeu_ps(o + r * t.hdp + 16 * c, acc[r][c]);
}

// Rows per pass over the values: accumulators and one value row fit the 32 registers.
constexpr int values_rows_per_pass(int nc) { return std::min(8, (28 - nc) / nc); }

template <typename T>
using ValuesRowsFn = void (*)(const TileValues&, int64_t, int64_t, int64_t, const T*, int64_t);

template <int kNc, bool kCheck, typename T, int... kR>
constexpr std::array<ValuesRowsFn<T>, sizeof...(kR)> values_rows_table(std::integer_sequence<int, kR...>) {
  return {&values_rows_avx512<kNc, kR + 1, kCheck, T>...};
}

template <int kNc, bool kCheck, typename T>
TESSERA_AVX512 void values_run_avx512(const TileValues& t, int64_t rows, int64_t j0, int64_t j1, const T* v,
                                      int64_t stride) {
  constexpr int kRb = values_rows_per_pass(kNc);
  static constexpr auto kTable = values_rows_table<kNc, kCheck, T>(std::make_integer_sequence<int, kRb>());
  int64_t r = 0;
  for (; r + kRb <= rows; r += kRb) values_rows_avx512<kNc, kRb, kCheck>(t, r, j0, j1, v, stride);
  if (r < rows) kTable[static_cast<size_t>(rows - r - 1)](t, r, j0, j1, v, stride);
}

using ScoresTileFn = void (*)(const TileScores&);
template <typename T>
using ValuesRunFn = void (*)(const TileValues&, int64_t, int64_t, int64_t, const T*, int64_t);

template <int kNc>
constexpr ScoresTileFn kScoresTile = &scores_tile_avx512<kNc>;
constexpr ScoresTileFn kScoresTiles[8] = {kScoresTile<1>, kScoresTile<2>, kScoresTile<3>, kScoresTile<4>,
                                          kScoresTile<5>, kScoresTile<6>, kScoresTile<7>, kScoresTile<8>};
template <typename T>
constexpr ValuesRunFn<T> kValuesRuns[2][8] = {
    {&values_run_avx512<1, false, T>, &values_run_avx512<2, false, T>, &values_run_avx512<3, false, T>,
     &values_run_avx512<4, false, T>, &values_run_avx512<5, false, T>, &values_run_avx512<6, false, T>,
     &values_run_avx512<7, false, T>, &values_run_avx512<8, false, T>},
    {&values_run_avx512<1, true, T>, &values_run_avx512<2, true, T>, &values_run_avx512<3, true, T>,
     &values_run_avx512<4, true, T>, &values_run_avx512<5, true, T>, &values_run_avx512<6, true, T>,
     &values_run_avx512<7, true, T>, &values_run_avx512<8, true, T>}};

// ---- prefill tiles on AVX2: the same tiles and the same arithmetic, a block of 16 keys as two
// 8-key halves. Scores: kRb rows (1 or 2) against one block, the chains of lanes i and i + 8
// per half interleaved as in scores_block_avx512 (14 of the 16 registers).
template <int kNc, int kRb>
TESSERA_AVX2 void scores_block_avx2(const float* q, const float* kt, int64_t hdp, float* s, int64_t ld, float scale) {
  __m256 t[8][kRb][2];
  for (int i = 0; i < 8; ++i) {
    __m256 a[kRb][2], b[kRb][2];
    for (int r = 0; r < kRb; ++r)
      for (int h = 0; h < 2; ++h) a[r][h] = b[r][h] = _mm256_setzero_ps();
#pragma GCC unroll 8
    for (int c = 0; c < kNc; ++c) {
      __m256 ka[2], kb[2];
      for (int h = 0; h < 2; ++h) {
        ka[h] = _mm256_loadu_ps(kt + (16 * c + i) * 16 + 8 * h);
        kb[h] = _mm256_loadu_ps(kt + (16 * c + i + 8) * 16 + 8 * h);
      }
      for (int r = 0; r < kRb; ++r) {
        const __m256 qa = _mm256_set1_ps(q[r * hdp + 16 * c + i]);
        const __m256 qb = _mm256_set1_ps(q[r * hdp + 16 * c + i + 8]);
        for (int h = 0; h < 2; ++h) {
          a[r][h] = _mm256_fmadd_ps(qa, ka[h], a[r][h]);
          b[r][h] = _mm256_fmadd_ps(qb, kb[h], b[r][h]);
        }
      }
    }
    for (int r = 0; r < kRb; ++r)
      for (int h = 0; h < 2; ++h) t[i][r][h] = _mm256_add_ps(a[r][h], b[r][h]);
  }
  const __m256 sc = _mm256_set1_ps(scale);
  for (int r = 0; r < kRb; ++r) {
    for (int h = 0; h < 2; ++h) {
      __m256 u[4];
      for (int i = 0; i < 4; ++i) u[i] = _mm256_add_ps(t[i][r][h], t[i + 4][r][h]);
      const __m256 v0 = _mm256_add_ps(u[0], u[2]), v1 = _mm256_add_ps(u[1], u[3]);
      _mm256_storeu_ps(s + r * ld + 8 * h, _mm256_mul_ps(_mm256_add_ps(v0, v1), sc));
    }
  }
}

template <int kNc>
TESSERA_AVX2 void scores_tile_avx2(const TileScores& t) {
  const int64_t ld = 16 * t.blocks, kb = 16 * t.hdp;
  for (int64_t b = 0; b < t.blocks; ++b) {
    int64_t r = 0;
    for (; r + 2 <= t.rows; r += 2) scores_block_avx2<kNc, 2>(t.q + r * t.hdp, t.kt + b * kb, t.hdp, t.s + r * ld + 16 * b, ld, t.scale);
    if (r < t.rows) scores_block_avx2<kNc, 1>(t.q + r * t.hdp, t.kt + b * kb, t.hdp, t.s + r * ld + 16 * b, ld, t.scale);
  }
}

TESSERA_AVX2 void scale_row_avx2(float* s, int64_t n, float inv) {
  const __m256 iv = _mm256_set1_ps(inv);
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) _mm256_storeu_ps(s + j, _mm256_mul_ps(_mm256_loadu_ps(s + j), iv));
  for (; j < n; ++j) s[j] *= inv;
}

// Rows r0 .. r0 + kR - 1, dims 8 * c0 .. 8 * (c0 + kC) - 1, over keys j0 .. j1 - 1 (as
// values_rows_avx512; head_dim % 8 == 0 on this path).
template <int kC, int kR, bool kCheck, typename T>
TESSERA_AVX2 void values_rows_avx2(const TileValues& t, int64_t r0, int64_t c0, int64_t j0, int64_t j1, const T* v,
                                   int64_t stride) {
  float* o = t.o + r0 * t.hdp + 8 * c0;
  __m256 acc[kR][kC];
  for (int r = 0; r < kR; ++r)
    for (int c = 0; c < kC; ++c) acc[r][c] = _mm256_loadu_ps(o + r * t.hdp + 8 * c);
  const float* p = t.p + r0 * t.ld - t.base;
  for (int64_t j = j0; j < j1; ++j, v += stride) {
    __m256 vv[kC];
    for (int c = 0; c < kC; ++c) vv[c] = load8(v, 8 * (c0 + c));
    for (int r = 0; r < kR; ++r) {
      if (kCheck && (j < t.first[r0 + r] || j > t.last[r0 + r])) continue;
      const __m256 pv = _mm256_set1_ps(p[r * t.ld + j]);
      for (int c = 0; c < kC; ++c) acc[r][c] = _mm256_fmadd_ps(pv, vv[c], acc[r][c]);
    }
  }
  for (int r = 0; r < kR; ++r)
    for (int c = 0; c < kC; ++c) _mm256_storeu_ps(o + r * t.hdp + 8 * c, acc[r][c]);
}

template <typename T>
using ValuesSliceFn = void (*)(const TileValues&, int64_t, int64_t, int64_t, int64_t, const T*, int64_t);
template <bool kCheck, typename T>
constexpr ValuesSliceFn<T> kValuesSlices[2][4] = {
    {&values_rows_avx2<1, 1, kCheck, T>, &values_rows_avx2<2, 1, kCheck, T>, &values_rows_avx2<3, 1, kCheck, T>,
     &values_rows_avx2<4, 1, kCheck, T>},
    {&values_rows_avx2<1, 2, kCheck, T>, &values_rows_avx2<2, 2, kCheck, T>, &values_rows_avx2<3, 2, kCheck, T>,
     &values_rows_avx2<4, 2, kCheck, T>}};

// Pairs of rows x slices of 4 dim chunks of 8: 8 accumulators and 4 value vectors.
template <typename T>
TESSERA_AVX2 void values_run_avx2(const TileValues& t, bool check, int64_t rows, int64_t j0, int64_t j1, const T* v,
                                  int64_t stride) {
  const int64_t n8 = t.hd / 8;
  const auto& fns = check ? kValuesSlices<true, T> : kValuesSlices<false, T>;
  const auto tail = static_cast<size_t>((n8 - 1) % 4);  // slice width - 1 of the last slice
  for (int64_t r = 0; r < rows; r += 2) {
    const auto& by_width = fns[rows - r >= 2 ? 1 : 0];
    for (int64_t c0 = 0; c0 < n8; c0 += 4) by_width[c0 + 4 < n8 ? 3 : tail](t, r, c0, j0, j1, v, stride);
  }
}

template <int kNc>
constexpr ScoresTileFn kScoresTileAvx2 = &scores_tile_avx2<kNc>;
constexpr ScoresTileFn kScoresTilesAvx2[8] = {kScoresTileAvx2<1>, kScoresTileAvx2<2>, kScoresTileAvx2<3>,
                                              kScoresTileAvx2<4>, kScoresTileAvx2<5>, kScoresTileAvx2<6>,
                                              kScoresTileAvx2<7>, kScoresTileAvx2<8>};
#endif  // TESSERA_ATT_X86

template <typename T>
void run_item(const Item<T>& it) {
  float inv[kMaxGroup];
  switch (cpu::active_isa()) {
#ifdef TESSERA_ATT_X86
    case cpu::Isa::kAvx512:
      scores_avx512(it);
      for (int64_t g = 0; g < it.group; ++g) inv[g] = softmax_avx512(it.scores + g * it.n, it.n);
      values_avx512(it, inv);
      return;
    case cpu::Isa::kAvx2:
      scores_avx2(it);
      for (int64_t g = 0; g < it.group; ++g) inv[g] = softmax_avx2(it.scores + g * it.n, it.n);
      values_avx2(it, inv);
      return;
#endif
    default:
      scores_scalar(it);
      for (int64_t g = 0; g < it.group; ++g) inv[g] = softmax_scalar(it.scores + g * it.n, it.n);
      values_scalar(it, inv);
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
#ifdef TESSERA_ATT_X86
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

#ifdef TESSERA_ATT_X86
// dst[j][i] = rows[i][c + j] for 16 rows, 16 values from c on (zero for a null row or j >= n).
template <typename T>
TESSERA_AVX512 void transpose16_avx512(const T* const* rows, int64_t c, __mmask16 n, float* dst) {
  __m512 r[16], t[16], u[16];
  for (int i = 0; i < 16; ++i) r[i] = rows[i] != nullptr ? load16z(n, rows[i], c) : _mm512_setzero_ps();
  // t[2i], t[2i+1]: rows 2i, 2i+1 interleaved (elements 0, 1 and 2, 3 of each 128-bit lane).
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  // u[4i + m], 128-bit lane L: rows 4i .. 4i + 3 at element 4L + m.
  for (int i = 0; i < 4; ++i) {
    const __m512d a = _mm512_castps_pd(t[4 * i]), b = _mm512_castps_pd(t[4 * i + 1]);
    const __m512d c = _mm512_castps_pd(t[4 * i + 2]), d = _mm512_castps_pd(t[4 * i + 3]);
    u[4 * i] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, c));
    u[4 * i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, c));
    u[4 * i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(b, d));
    u[4 * i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(b, d));
  }
  // Column 4L + m gathers lane L of u[m], u[4 + m], u[8 + m], u[12 + m].
  for (int m = 0; m < 4; ++m) {
    const __m512 v = _mm512_shuffle_f32x4(u[m], u[4 + m], 0x44), w = _mm512_shuffle_f32x4(u[m], u[4 + m], 0xEE);
    const __m512 v2 = _mm512_shuffle_f32x4(u[8 + m], u[12 + m], 0x44);
    const __m512 w2 = _mm512_shuffle_f32x4(u[8 + m], u[12 + m], 0xEE);
    _mm512_storeu_ps(dst + (0 + m) * 16, _mm512_shuffle_f32x4(v, v2, 0x88));
    _mm512_storeu_ps(dst + (4 + m) * 16, _mm512_shuffle_f32x4(v, v2, 0xDD));
    _mm512_storeu_ps(dst + (8 + m) * 16, _mm512_shuffle_f32x4(w, w2, 0x88));
    _mm512_storeu_ps(dst + (12 + m) * 16, _mm512_shuffle_f32x4(w, w2, 0xDD));
  }
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
      transpose16_avx512(rows, c, static_cast<__mmask16>((1u << n) - 1u), dst + c * 16);
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
  (avx512 ? kScoresTiles : kScoresTilesAvx2)[nc - 1](ts);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t f = s.tile_first[static_cast<size_t>(r)], len = s.tile_last[static_cast<size_t>(r)] - f + 1;
    float* row = sc + r * ld + (f - base);
    if (avx512)
      scale_row_avx512(row, len, softmax_avx512(row, len));
    else
      scale_row_avx2(row, len, softmax_avx2(row, len));
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
        kValuesRuns<T>[check ? 1 : 0][nc - 1](tv, rows, j, j + run, v, row_stride);
      else
        values_run_avx2<T>(tv, check, rows, j, j + run, v, row_stride);
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
#else
template <typename T>
void attend_tile(const PagedKvLayer&, const AttentionArgs&, int64_t, int64_t, int64_t, uint64_t, bool) {
  TESSERA_CHECK(false, "paged_attention: prefill tiles need x86");
}
#endif  // TESSERA_ATT_X86

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
