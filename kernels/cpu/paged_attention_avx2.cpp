// AVX2 paths of paged attention, bit-identical to the scalar one (the canonical arithmetic is
// stated in kernels/cpu/paged_attention.cpp): the three phases of a per-token item, and the
// prefill tiles' kernels (the AVX-512 tiles of paged_attention_avx512.cpp at half the width).
#include <algorithm>
#include <cmath>
#include <cstring>

#include "common/check.h"
#include "kernels/cpu/exp_poly.h"
#include "kernels/cpu/paged_attention_isa.h"

#if defined(__x86_64__)
#include <immintrin.h>

#define TESSERA_AVX2 __attribute__((target("avx2,fma,f16c")))

namespace tessera::cpu::attention {
namespace {

// Values off .. off + 7 of a row.
TESSERA_AVX2 inline __m256 load8(const float* row, int64_t off) { return _mm256_loadu_ps(row + off); }
TESSERA_AVX2 inline __m256 load8(const uint16_t* row, int64_t off) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + off)));
}
TESSERA_AVX2 inline __m256 load8(const int8_t* row, int64_t off) {
  const __m256i q = _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(row + off)));
  return _mm256_mul_ps(_mm256_cvtepi32_ps(q), _mm256_set1_ps(row_scale(row)));
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

// ---- prefill tiles on AVX2: the same tiles and the same arithmetic, a block of 16 keys as two
// 8-key halves. Scores: kRb rows (1 or 2) against one block, the chains of lanes i and i + 8
// per half interleaved as in scores_block_avx512 (paged_attention_avx512.cpp; 14 of the 16
// registers).
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

using ScoresTileFn = void (*)(const TileScores&);

template <int kNc>
constexpr ScoresTileFn kScoresTileAvx2 = &scores_tile_avx2<kNc>;
constexpr ScoresTileFn kScoresTilesAvx2[8] = {kScoresTileAvx2<1>, kScoresTileAvx2<2>, kScoresTileAvx2<3>,
                                              kScoresTileAvx2<4>, kScoresTileAvx2<5>, kScoresTileAvx2<6>,
                                              kScoresTileAvx2<7>, kScoresTileAvx2<8>};

}  // namespace

template <typename T>
void run_item_avx2(const Item<T>& it) {
  float inv[kMaxGroup];
  scores_avx2(it);
  for (int64_t g = 0; g < it.group; ++g) inv[g] = softmax_avx2(it.scores + g * it.n, it.n);
  values_avx2(it, inv);
}

void tile_scores_avx2(const TileScores& t) { kScoresTilesAvx2[t.hdp / 16 - 1](t); }

void softmax_row_avx2(float* s, int64_t n) { scale_row_avx2(s, n, softmax_avx2(s, n)); }

template <typename T>
void tile_values_avx2(const TileValues& t, bool check, int64_t rows, int64_t j0, int64_t j1, const T* v,
                      int64_t stride) {
  values_run_avx2<T>(t, check, rows, j0, j1, v, stride);
}

}  // namespace tessera::cpu::attention

#else  // not x86-64: items take the scalar path, and use_tiles() never picks the tiles

namespace tessera::cpu::attention {

template <typename T>
void run_item_avx2(const Item<T>& it) {
  run_item_scalar(it);
}
void tile_scores_avx2(const TileScores&) { TESSERA_CHECK(false, "paged_attention: prefill tiles need x86"); }
void softmax_row_avx2(float*, int64_t) { TESSERA_CHECK(false, "paged_attention: prefill tiles need x86"); }
template <typename T>
void tile_values_avx2(const TileValues&, bool, int64_t, int64_t, int64_t, const T*, int64_t) {
  TESSERA_CHECK(false, "paged_attention: prefill tiles need x86");
}

}  // namespace tessera::cpu::attention

#endif

namespace tessera::cpu::attention {

template void run_item_avx2<float>(const Item<float>& it);
template void run_item_avx2<uint16_t>(const Item<uint16_t>& it);
template void run_item_avx2<int8_t>(const Item<int8_t>& it);
template void tile_values_avx2<float>(const TileValues&, bool, int64_t, int64_t, int64_t, const float*, int64_t);
template void tile_values_avx2<uint16_t>(const TileValues&, bool, int64_t, int64_t, int64_t, const uint16_t*, int64_t);
template void tile_values_avx2<int8_t>(const TileValues&, bool, int64_t, int64_t, int64_t, const int8_t*, int64_t);

}  // namespace tessera::cpu::attention
