// AVX-512 paths of paged attention, bit-identical to the scalar one (the canonical arithmetic is
// stated in kernels/cpu/paged_attention.cpp): the three phases of a per-token item, and the
// prefill tiles' kernels (scores against the transposed keys, row softmax, value runs) with the
// transpose that builds those keys.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <utility>

#include "common/check.h"
#include "kernels/cpu/exp_poly.h"
#include "kernels/cpu/paged_attention_isa.h"

#if defined(__x86_64__)
#include <immintrin.h>

#define TESSERA_AVX512 __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c")))

namespace tessera::cpu::attention {
namespace {

// Values off .. off + 15 of a row (load16z: those the mask selects, zeros elsewhere).
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

// The cache rows of one head are scattered (blocks, and n_kv_heads rows per slot), so the
// hardware prefetchers do not follow them: prefetch the row kPrefetchAhead keys ahead.
constexpr int64_t kPrefetchAhead = 8;

template <typename T>
inline void prefetch_row(const T* row, int64_t hd) {
  const auto* bytes = reinterpret_cast<const char*>(row);
  for (int64_t i = 0; i < hd * static_cast<int64_t>(sizeof(T)); i += 64) __builtin_prefetch(bytes + i, 0, 3);
}

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

// ---- prefill tiles (AVX2: paged_attention_avx2.cpp): several query rows (tokens x GQA heads)
// against one KV head.
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

// dst[j][i] = rows[i][c + j] for 16 rows, 16 values from c on (zero for a null row or j >= n).
template <typename T>
TESSERA_AVX512 void transpose16(const T* const* rows, int64_t c, __mmask16 n, float* dst) {
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

}  // namespace

template <typename T>
void run_item_avx512(const Item<T>& it) {
  float inv[kMaxGroup];
  scores_avx512(it);
  for (int64_t g = 0; g < it.group; ++g) inv[g] = softmax_avx512(it.scores + g * it.n, it.n);
  values_avx512(it, inv);
}

void tile_scores_avx512(const TileScores& t) { kScoresTiles[t.hdp / 16 - 1](t); }

void softmax_row_avx512(float* s, int64_t n) { scale_row_avx512(s, n, softmax_avx512(s, n)); }

template <typename T>
void tile_values_avx512(const TileValues& t, bool check, int64_t rows, int64_t j0, int64_t j1, const T* v,
                        int64_t stride) {
  kValuesRuns<T>[check ? 1 : 0][t.hdp / 16 - 1](t, rows, j0, j1, v, stride);
}

template <typename T>
void transpose16_avx512(const T* const* rows, int64_t c, uint16_t n, float* dst) {
  transpose16(rows, c, n, dst);
}

}  // namespace tessera::cpu::attention

#else  // not x86-64: items take the scalar path, and use_tiles() never picks the tiles

namespace tessera::cpu::attention {

template <typename T>
void run_item_avx512(const Item<T>& it) {
  run_item_scalar(it);
}
void tile_scores_avx512(const TileScores&) { TESSERA_CHECK(false, "paged_attention: prefill tiles need x86"); }
void softmax_row_avx512(float*, int64_t) { TESSERA_CHECK(false, "paged_attention: prefill tiles need x86"); }
template <typename T>
void tile_values_avx512(const TileValues&, bool, int64_t, int64_t, int64_t, const T*, int64_t) {
  TESSERA_CHECK(false, "paged_attention: prefill tiles need x86");
}
template <typename T>
void transpose16_avx512(const T* const*, int64_t, uint16_t, float*) {
  TESSERA_CHECK(false, "paged_attention: prefill tiles need x86");
}

}  // namespace tessera::cpu::attention

#endif

namespace tessera::cpu::attention {

template void run_item_avx512<float>(const Item<float>& it);
template void run_item_avx512<uint16_t>(const Item<uint16_t>& it);
template void run_item_avx512<int8_t>(const Item<int8_t>& it);
template void tile_values_avx512<float>(const TileValues&, bool, int64_t, int64_t, int64_t, const float*, int64_t);
template void tile_values_avx512<uint16_t>(const TileValues&, bool, int64_t, int64_t, int64_t, const uint16_t*,
                                           int64_t);
template void tile_values_avx512<int8_t>(const TileValues&, bool, int64_t, int64_t, int64_t, const int8_t*, int64_t);
template void transpose16_avx512<float>(const float* const*, int64_t, uint16_t, float*);
template void transpose16_avx512<uint16_t>(const uint16_t* const*, int64_t, uint16_t, float*);
template void transpose16_avx512<int8_t>(const int8_t* const*, int64_t, uint16_t, float*);

}  // namespace tessera::cpu::attention
