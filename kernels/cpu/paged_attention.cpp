// Paged attention on CPU.
//
// Work item = (query token, KV head): the query heads that share a KV head (GQA group) are
// processed together, so every K and V row of the cache is loaded once per item. Items are
// spread over the pool in an order that mixes short and long causal spans (balanced prefill).
//
// Canonical arithmetic for one query q (head h) at position p, keys j in its visible span —
// the same on the scalar, AVX2 and AVX-512 paths, so results depend on neither the ISA nor the
// thread count nor how the query's sequence was chunked:
//   s_j = dot16(q, k_j) * scale, where dot16 is the 16-lane fp32 dot of kernels/cpu/fgemm.h
//   m = max_j s_j;  e_j = exp_poly(s_j - m)  (a fixed polynomial, below, not libm)
//   sum = 16-lane sum of e_j over j (lane j % 16, same reduction tree);  inv = 1 / sum
//   out_i = fma(e_j * inv, v_j,i, out_i) for j in increasing order, out_i starting at +0.
#include "kernels/paged_attention.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <vector>

#include "common/check.h"
#include "common/thread_pool.h"
#include "kernels/cpu/exp_poly.h"
#include "kernels/cpu/vec.h"

#if defined(__x86_64__)
#include <immintrin.h>
#define TESSERA_ATT_X86 1
#define TESSERA_AVX2 __attribute__((target("avx2,fma,f16c")))
#define TESSERA_AVX512 __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c")))
#endif

namespace tessera {
namespace {

constexpr int kLanes = 16;
constexpr int kMaxGroup = 64;  // query heads per KV head handled in one item

// exp(x) for x <= 0 (kernels/cpu/exp_poly.h); inputs below -87 are clamped (e^-87 ~ 1.6e-38,
// which is negligible next to the largest term, 1).
inline float exp_poly(float x) { return cpu::exp_poly_clamped(std::max(x, cpu::kExpPolyLo)); }

inline float reduce16(const float* s) {
  float t[8], u[4], v[2];
  for (int i = 0; i < 8; ++i) t[i] = s[i] + s[i + 8];
  for (int i = 0; i < 4; ++i) u[i] = t[i] + t[i + 4];
  for (int i = 0; i < 2; ++i) v[i] = u[i] + u[i + 2];
  return v[0] + v[1];
}

// The cache rows of one head are scattered (blocks, and n_kv_heads rows per slot), so the
// hardware prefetchers do not follow them: prefetch the row kPrefetchAhead keys ahead.
constexpr int64_t kPrefetchAhead = 8;

inline void prefetch_row(const float* row, int64_t hd) {
  for (int64_t i = 0; i < hd; i += 16) __builtin_prefetch(row + i, 0, 3);
}

// ---- the three phases of one item, per ISA. Keys are visited block by block: `keys` lists
// the first float of each visible key's head row, in order.

struct Item {
  const float* const* keys;    // [n] pointers to k rows of this KV head
  const float* const* values;  // [n] pointers to v rows
  int64_t n;
  int64_t hd;
  int64_t group;
  const float* q;              // group query heads, hd apart
  float* out;                  // group output heads, hd apart
  float scale;
  float* scores;               // [group][n]
  bool prefetch;               // keys are cold (decode); in prefill they stay in cache
};

void scores_scalar(const Item& it) {
  for (int64_t j = 0; j < it.n; ++j) {
    for (int64_t g = 0; g < it.group; ++g) {
      float s[kLanes] = {};
      const float* q = it.q + g * it.hd;
      const int64_t pad = (it.hd + kLanes - 1) / kLanes * kLanes;
      for (int64_t i = 0; i < pad; ++i) {
        const float a = i < it.hd ? q[i] : 0.0f, b = i < it.hd ? it.keys[j][i] : 0.0f;
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

void values_scalar(const Item& it, const float* inv) {
  for (int64_t g = 0; g < it.group; ++g) std::memset(it.out + g * it.hd, 0, static_cast<size_t>(it.hd) * 4);
  for (int64_t j = 0; j < it.n; ++j)
    for (int64_t g = 0; g < it.group; ++g) {
      const float p = it.scores[g * it.n + j] * inv[g];
      float* o = it.out + g * it.hd;
      for (int64_t i = 0; i < it.hd; ++i) o[i] = std::fma(p, it.values[j][i], o[i]);
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
template <int kNc>
TESSERA_AVX512 void scores_head_avx512(const Item& it, int64_t g) {
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
      const float* k = it.keys[j0 + jj];
      if (it.prefetch && g == 0 && j0 + jj + kPrefetchAhead < it.n) prefetch_row(it.keys[j0 + jj + kPrefetchAhead], it.hd);
      for (int64_t c = 0; c < nc; ++c) {
        if (kNc > 0 || c < full) {
          acc[jj] = _mm512_fmadd_ps(_mm512_loadu_ps(q + 16 * c), _mm512_loadu_ps(k + 16 * c), acc[jj]);
        } else {
          acc[jj] = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(tail, q + 16 * c), _mm512_maskz_loadu_ps(tail, k + 16 * c),
                                    acc[jj]);
        }
      }
    }
    const __m512 sums = _mm512_mul_ps(reduce16x16_avx512(acc), scale);
    _mm512_mask_storeu_ps(out + j0, static_cast<__mmask16>((1u << nk) - 1u), sums);
  }
}

TESSERA_AVX512 void scores_avx512(const Item& it) {
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
template <int kNc>
TESSERA_AVX512 void values_head_avx512(const Item& it, int64_t g, float inv) {
  __m512 o[kNc];
  for (auto& v : o) v = _mm512_setzero_ps();
  const float* sc = it.scores + g * it.n;
  for (int64_t j = 0; j < it.n; ++j) {
    const float* v = it.values[j];
    if (it.prefetch && g == 0 && j + kPrefetchAhead < it.n) prefetch_row(it.values[j + kPrefetchAhead], it.hd);
    const __m512 p = _mm512_set1_ps(sc[j] * inv);
    for (int c = 0; c < kNc; ++c) o[c] = _mm512_fmadd_ps(p, _mm512_loadu_ps(v + 16 * c), o[c]);
  }
  float* out = it.out + g * it.hd;
  for (int c = 0; c < kNc; ++c) _mm512_storeu_ps(out + 16 * c, o[c]);
}

TESSERA_AVX512 void values_avx512(const Item& it, const float* inv) {
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
    const float* v = it.values[j];
    if (it.prefetch && j + kPrefetchAhead < it.n) prefetch_row(it.values[j + kPrefetchAhead], it.hd);
    for (int64_t g = 0; g < it.group; ++g) {
      const __m512 p = _mm512_set1_ps(it.scores[g * it.n + j] * inv[g]);
      float* o = it.out + g * it.hd;
      for (int64_t i = 0; i < full; i += kLanes)
        _mm512_storeu_ps(o + i, _mm512_fmadd_ps(p, _mm512_loadu_ps(v + i), _mm512_loadu_ps(o + i)));
      if (full < it.hd)
        _mm512_mask_storeu_ps(o + full, tail,
                              _mm512_fmadd_ps(p, _mm512_maskz_loadu_ps(tail, v + full), _mm512_maskz_loadu_ps(tail, o + full)));
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

TESSERA_AVX2 void scores_avx2(const Item& it) {
  const int64_t full = it.hd / kLanes * kLanes;
  alignas(32) float kt[kLanes], qt[kLanes];
  for (int64_t j = 0; j < it.n; ++j) {
    const float* k = it.keys[j];
    for (int64_t g = 0; g < it.group; ++g) {
      const float* q = it.q + g * it.hd;
      __m256 lo = _mm256_setzero_ps(), hi = lo;
      for (int64_t i = 0; i < full; i += kLanes) {
        lo = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), _mm256_loadu_ps(k + i), lo);
        hi = _mm256_fmadd_ps(_mm256_loadu_ps(q + i + 8), _mm256_loadu_ps(k + i + 8), hi);
      }
      if (full < it.hd) {
        for (int i = 0; i < kLanes; ++i) {
          kt[i] = full + i < it.hd ? k[full + i] : 0.0f;
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

TESSERA_AVX2 void values_avx2(const Item& it, const float* inv) {
  const int64_t full = it.hd / 8 * 8;
  for (int64_t g = 0; g < it.group; ++g) std::memset(it.out + g * it.hd, 0, static_cast<size_t>(it.hd) * 4);
  for (int64_t j = 0; j < it.n; ++j) {
    const float* v = it.values[j];
    for (int64_t g = 0; g < it.group; ++g) {
      const float p = it.scores[g * it.n + j] * inv[g];
      const __m256 pv = _mm256_set1_ps(p);
      float* o = it.out + g * it.hd;
      for (int64_t i = 0; i < full; i += 8)
        _mm256_storeu_ps(o + i, _mm256_fmadd_ps(pv, _mm256_loadu_ps(v + i), _mm256_loadu_ps(o + i)));
      for (int64_t i = full; i < it.hd; ++i) o[i] = std::fma(p, v[i], o[i]);
    }
  }
}
#endif  // TESSERA_ATT_X86

void run_item(const Item& it) {
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

inline int64_t slot_offset(const PagedKvLayer& kv, const int32_t* block_table, int64_t pos) {
  const int32_t block = block_table[pos / kv.block_size];
  TESSERA_CHECK(block >= 0 && block < kv.num_blocks, "paged kv: position {} maps to block {} of {}",
                pos, block, kv.num_blocks);
  return (static_cast<int64_t>(block) * kv.block_size + pos % kv.block_size) * kv.n_kv_heads *
         kv.head_dim;
}

// Per-thread scratch, grown to the longest span seen and reused.
// The key / value row pointers of one KV head are shared by every query token of a call (a
// prefix for causal attention), so they are built once per (call, head, span start) and
// extended as longer spans come; `call` changes with every paged_attention call, since block
// tables and the cache may change between calls.
struct Scratch {
  uint64_t call = 0;
  const float* k = nullptr;
  int64_t kvh = -1;
  int64_t first = -1;
  int64_t filled = 0;
  std::vector<float> scores;
  std::vector<const float*> keys, values;
};

Scratch& scratch() {
  thread_local Scratch s;
  return s;
}

void attend(const PagedKvLayer& kv, const AttentionArgs& args, int64_t t, int64_t kvh, uint64_t call) {
  const int64_t hd = kv.head_dim;
  const int64_t group = args.n_heads / kv.n_kv_heads;
  const int64_t pos = args.start_pos + t;
  const int64_t first = args.sliding_window > 0 ? std::max<int64_t>(0, pos - args.sliding_window + 1) : 0;
  const int64_t n = pos - first + 1;
  Scratch& s = scratch();
  if (static_cast<int64_t>(s.keys.size()) < n) {
    s.keys.resize(static_cast<size_t>(n));
    s.values.resize(static_cast<size_t>(n));
  }
  if (static_cast<int64_t>(s.scores.size()) < n * group) s.scores.resize(static_cast<size_t>(n * group));
  if (s.call != call || s.k != kv.k || s.kvh != kvh || s.first != first) {
    s.call = call;
    s.k = kv.k;
    s.kvh = kvh;
    s.first = first;
    s.filled = 0;
  }
  const int64_t row = kv.n_kv_heads * hd;
  for (int64_t j = s.filled; j < n;) {
    // One cache block at a time: its slots are consecutive rows.
    const int64_t p0 = first + j;
    const int64_t in_block = std::min(n - j, kv.block_size - p0 % kv.block_size);
    const int64_t off = slot_offset(kv, args.block_table, p0) + kvh * hd;
    for (int64_t i = 0; i < in_block; ++i, ++j) {
      s.keys[static_cast<size_t>(j)] = kv.k + off + i * row;
      s.values[static_cast<size_t>(j)] = kv.v + off + i * row;
    }
  }
  s.filled = std::max(s.filled, n);
  const int64_t h0 = kvh * group;
  Item it{s.keys.data(), s.values.data(), n, hd, group, args.q + (t * args.n_heads + h0) * hd,
          args.out + (t * args.n_heads + h0) * hd, args.scale, s.scores.data(), args.n_tokens == 1};
  run_item(it);
}

}  // namespace

void kv_write(const PagedKvLayer& kv, const int32_t* block_table, int64_t start_pos,
              int64_t n_tokens, const float* k, const float* v) {
  TESSERA_CHECK(kv.block_size > 0 && start_pos >= 0, "kv_write: block_size {} start_pos {}",
                kv.block_size, start_pos);
  const int64_t row = kv.n_kv_heads * kv.head_dim;
  const size_t bytes = static_cast<size_t>(row) * sizeof(float);
  for (int64_t t = 0; t < n_tokens; ++t) {
    const int64_t off = slot_offset(kv, block_table, start_pos + t);
    std::memcpy(kv.k + off, k + t * row, bytes);
    std::memcpy(kv.v + off, v + t * row, bytes);
  }
}

void paged_attention(const PagedKvLayer& kv, const AttentionArgs& args, ThreadPool* pool) {
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
  const int64_t nt = args.n_tokens;
  const int64_t items = nt * kv.n_kv_heads;
  static std::atomic<uint64_t> calls{0};
  const uint64_t call = ++calls;
  // Item i: KV head i / nt; within a head, tokens alternate from both ends (0, nt-1, 1, nt-2,
  // ...) so any contiguous range of items holds short and long causal spans alike.
  auto run = [&](int64_t b, int64_t e, int) {
    for (int64_t i = b; i < e; ++i) {
      const int64_t kvh = i / nt, r = i % nt;
      const int64_t t = r % 2 == 0 ? r / 2 : nt - 1 - r / 2;
      attend(kv, args, t, kvh, call);
    }
  };
  if (pool == nullptr || items == 1) {
    run(0, items, 0);
  } else {
    pool->parallel_for(items, 1, run);
  }
}

}  // namespace tessera
