// The bf16 compute mode of the float-weight matmul (arithmetic in fgemm_bf16.h).
//
// The structure follows fgemm.cpp's AVX-512 kernels, with one VDPBF16PS step (32 columns)
// where those take one fma (16 columns):
//   1..64 tokens: weights stream from memory 4 rows at a time (prefetched ahead into L2)
//     and are rounded to bf16 in registers; with more than 6 tokens the rounded rows of a quad
//     are kept in an L1 buffer for the further token groups.
//   65+ tokens: a blocked GEMM; blocks of 48 weight rows are rounded once into bf16 panels
//     that stay in L2 while blocks of 144 tokens pass them, 4 x 6 register tiles.
#include "kernels/cpu/fgemm_bf16.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <vector>

#include "common/dtype.h"

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#define TESSERA_BF16X86 1
#define TESSERA_BF16 __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx512bf16,avx2,fma,f16c")))
#endif

namespace tessera::cpu {
namespace {

constexpr int kLanes = 16;  // fp32 partial sums
constexpr int64_t kSteps = kBf16StepCols;

// ------------------------------------------------------------------ scalar reference

inline float bits_to_f32(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Denormal -> zero of the same sign (DAZ on inputs, FTZ on results).
inline float flush_denormal(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return (u & 0x7f800000u) == 0 ? bits_to_f32(u & 0x80000000u) : f;
}

inline float bf16_value(uint16_t h) { return bits_to_f32(static_cast<uint32_t>(h) << 16); }

// One lane of VDPBF16PS (fgemm_bf16.h).
inline float dot_step(float acc, uint16_t w0, uint16_t w1, uint16_t x0, uint16_t x1) {
  acc = flush_denormal(std::fma(flush_denormal(bf16_value(w1)), flush_denormal(bf16_value(x1)), flush_denormal(acc)));
  return flush_denormal(std::fma(flush_denormal(bf16_value(w0)), flush_denormal(bf16_value(x0)), acc));
}

inline uint16_t weight_bf16(QuantType type, const uint8_t* row, int64_t c) {
  switch (type) {
    case QuantType::kF16: {
      uint16_t h;
      std::memcpy(&h, row + 2 * c, 2);
      return round_to_bf16(fp16_to_f32(h));
    }
    case QuantType::kBF16: {
      uint16_t h;
      std::memcpy(&h, row + 2 * c, 2);
      return h;
    }
    default: {
      float f;
      std::memcpy(&f, row + 4 * c, 4);
      return round_to_bf16(f);
    }
  }
}

void convert_acts_scalar(const float* x, int64_t k, int64_t t0, int64_t t1, uint16_t* dst) {
  const int64_t kpad = bf16_kpad(k);
  for (int64_t t = t0; t < t1; ++t)
    for (int64_t c = 0; c < kpad; ++c) dst[t * kpad + c] = c < k ? round_to_bf16(x[t * k + c]) : 0;
}

#ifdef TESSERA_BF16X86
// ------------------------------------------------------------------ AVX-512 BF16

bool detect_bf16_dot() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid(1, &a, &b, &c, &d) == 0) return false;
  const bool osxsave = (c & (1u << 27)) != 0, fma = (c & (1u << 12)) != 0, f16c = (c & (1u << 29)) != 0;
  if (!osxsave || !fma || !f16c) return false;
  uint32_t xcr0_lo = 0, xcr0_hi = 0;
  __asm__ volatile("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
  // SSE, AVX, opmask, upper halves of zmm0-15, zmm16-31.
  if ((xcr0_lo & 0xe6u) != 0xe6u) return false;
  if (__get_cpuid_count(7, 0, &a, &b, &c, &d) == 0) return false;
  const unsigned need_ebx = (1u << 5) | (1u << 16) | (1u << 17) | (1u << 30) | (1u << 31);  // AVX2 F DQ BW VL
  if ((b & need_ebx) != need_ebx) return false;
  if (a < 1 || __get_cpuid_count(7, 1, &a, &b, &c, &d) == 0) return false;
  return (a & (1u << 5)) != 0;  // AVX512_BF16
}

// Seconds for `iters` x 12 independent VDPBF16PS (dot) or VFMADD231PS (fma) on zmm registers.
TESSERA_BF16 double time_dependent_chains(bool dot, int64_t iters) {
  const auto t0 = std::chrono::steady_clock::now();
#define TESSERA_OP12(op)                                                                                       \
  op " %%zmm12, %%zmm13, %%zmm0\n\t" op " %%zmm12, %%zmm13, %%zmm1\n\t" op " %%zmm12, %%zmm13, %%zmm2\n\t"     \
  op " %%zmm12, %%zmm13, %%zmm3\n\t" op " %%zmm12, %%zmm13, %%zmm4\n\t" op " %%zmm12, %%zmm13, %%zmm5\n\t" \
  op " %%zmm12, %%zmm13, %%zmm6\n\t" op " %%zmm12, %%zmm13, %%zmm7\n\t" op " %%zmm12, %%zmm13, %%zmm8\n\t" \
  op " %%zmm12, %%zmm13, %%zmm9\n\t" op " %%zmm12, %%zmm13, %%zmm10\n\t" op " %%zmm12, %%zmm13, %%zmm11\n\t"
  // Zeroed inputs: no denormal or overflow slows either instruction.
  __asm__ volatile("vpxord %%zmm12, %%zmm12, %%zmm12\n\tvpxord %%zmm13, %%zmm13, %%zmm13" ::: "xmm12", "xmm13");
  if (dot) {
    for (int64_t i = 0; i < iters; ++i)
      __asm__ volatile(TESSERA_OP12("vdpbf16ps") ::: "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7",
                       "xmm8", "xmm9", "xmm10", "xmm11");
  } else {
    for (int64_t i = 0; i < iters; ++i)
      __asm__ volatile(TESSERA_OP12("vfmadd231ps") ::: "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7",
                       "xmm8", "xmm9", "xmm10", "xmm11");
  }
#undef TESSERA_OP12
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

double measure_bf16_dot_speedup() {
  constexpr int64_t kIters = 4000;  // 48k instructions: ~20-100 us per pass
  double dot = 1e9, fma = 1e9;
  time_dependent_chains(true, kIters);  // warm-up (clock, 512-bit units)
  for (int rep = 0; rep < 5; ++rep) {
    dot = std::min(dot, time_dependent_chains(true, kIters));
    fma = std::min(fma, time_dependent_chains(false, kIters));
  }
  // 32 multiply-adds per VDPBF16PS, 16 per fma.
  return dot > 0 ? (32.0 / dot) / (16.0 / fma) : 0.0;
}

TESSERA_BF16 inline __m512bh as_bh(__m512i v) { return (__m512bh)v; }
TESSERA_BF16 inline __m512i as_si(__m512bh v) { return (__m512i)v; }

// 32 weights of a row from column c on, rounded to bf16; `valid` (1..32) of them are read,
// the rest are zero.
template <QuantType kType>
TESSERA_BF16 inline __m512i load_w32(const uint8_t* row, int64_t c, int64_t valid) {
  if constexpr (kType == QuantType::kBF16) {
    if (valid >= kSteps) return _mm512_loadu_si512(row + 2 * c);
    return _mm512_maskz_loadu_epi16(static_cast<__mmask32>((1ull << valid) - 1u), row + 2 * c);
  } else {
    __m512 lo, hi;
    if (valid >= kSteps) {
      if constexpr (kType == QuantType::kF16) {
        lo = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + 2 * c)));
        hi = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + 2 * c + 32)));
      } else {
        lo = _mm512_loadu_ps(reinterpret_cast<const float*>(row) + c);
        hi = _mm512_loadu_ps(reinterpret_cast<const float*>(row) + c + kLanes);
      }
    } else {
      const auto m = static_cast<__mmask32>((1ull << valid) - 1u);
      const auto mlo = static_cast<__mmask16>(m), mhi = static_cast<__mmask16>(m >> 16);
      if constexpr (kType == QuantType::kF16) {
        lo = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mlo, row + 2 * c));
        hi = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mhi, row + 2 * c + 32));
      } else {
        lo = _mm512_maskz_loadu_ps(mlo, reinterpret_cast<const float*>(row) + c);
        hi = _mm512_maskz_loadu_ps(mhi, reinterpret_cast<const float*>(row) + c + kLanes);
      }
    }
    return as_si(_mm512_cvtne2ps_pbh(hi, lo));  // lo -> elements 0..15, hi -> 16..31
  }
}

TESSERA_BF16 void convert_acts_avx512(const float* x, int64_t k, int64_t t0, int64_t t1, uint16_t* dst) {
  const int64_t kpad = bf16_kpad(k);
  for (int64_t t = t0; t < t1; ++t) {
    const float* src = x + t * k;
    uint16_t* out = dst + t * kpad;
    int64_t c = 0;
    for (; c + kSteps <= k; c += kSteps)
      _mm512_storeu_si512(out + c, as_si(_mm512_cvtne2ps_pbh(_mm512_loadu_ps(src + c + kLanes), _mm512_loadu_ps(src + c))));
    if (c < kpad) {
      const auto m = static_cast<__mmask32>((1ull << (k - c)) - 1u);
      const __m512 lo = _mm512_maskz_loadu_ps(static_cast<__mmask16>(m), src + c);
      const __m512 hi = _mm512_maskz_loadu_ps(static_cast<__mmask16>(m >> 16), src + c + kLanes);
      _mm512_storeu_si512(out + c, as_si(_mm512_cvtne2ps_pbh(hi, lo)));
    }
  }
}

// ---- reduction of 16 accumulators at once (the additions of reduce16, in its order; as in
// fgemm.cpp).
TESSERA_BF16 inline __m512 fold8(__m512 a, __m512 b) {
  return _mm512_add_ps(_mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(1, 0, 1, 0)),
                       _mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(3, 2, 3, 2)));
}
TESSERA_BF16 inline __m512 fold4(__m512 ab, __m512 cd) {
  return _mm512_add_ps(_mm512_shuffle_f32x4(ab, cd, _MM_SHUFFLE(2, 0, 2, 0)),
                       _mm512_shuffle_f32x4(ab, cd, _MM_SHUFFLE(3, 1, 3, 1)));
}
TESSERA_BF16 inline __m512 fold2(__m512 a, __m512 b) {
  return _mm512_add_ps(_mm512_shuffle_ps(a, b, _MM_SHUFFLE(1, 0, 1, 0)),
                       _mm512_shuffle_ps(a, b, _MM_SHUFFLE(3, 2, 3, 2)));
}
TESSERA_BF16 inline __m512 fold_rows(const __m512* u) {
  const __m512 v01 = fold2(u[0], u[1]), v23 = fold2(u[2], u[3]);
  return _mm512_add_ps(_mm512_shuffle_ps(v01, v23, _MM_SHUFFLE(2, 0, 2, 0)),
                       _mm512_shuffle_ps(v01, v23, _MM_SHUFFLE(3, 1, 3, 1)));
}
TESSERA_BF16 inline __m128 block128(__m512 v, int b) {
  switch (b) {
    case 0: return _mm512_castps512_ps128(v);
    case 1: return _mm512_extractf32x4_ps(v, 1);
    case 2: return _mm512_extractf32x4_ps(v, 2);
    default: return _mm512_extractf32x4_ps(v, 3);
  }
}

constexpr int64_t kQuadRows = 4;
constexpr int64_t kGroupTokens = 6;
constexpr int64_t kTileFloats = kQuadRows * kGroupTokens * kLanes;

// The 4 row results of one token (lanes 0-3 of v) to y; all 4 rows or the first n_rows.
TESSERA_BF16 inline void store_rows(float* y, __m128 v, int n_rows) {
  if (n_rows == kQuadRows) {
    _mm_storeu_ps(y, v);
  } else {
    _mm_mask_storeu_ps(y, static_cast<__mmask8>((1u << n_rows) - 1u), v);
  }
}

// Reduces the accumulators of 4 rows x TN tokens and writes y[t * y_stride + r] for the first
// n_rows rows: 4 tokens at a time (16 results in one vector), then 2, then 1, so that a
// partial group does not reduce zeros.
template <int TN>
TESSERA_BF16 inline void write_tile(const __m512 (&acc)[kQuadRows][TN], float* y, int64_t y_stride, int n_rows) {
  int t = 0;
  for (; t + 4 <= TN; t += 4) {
    __m512 u[kQuadRows];
    for (int r = 0; r < kQuadRows; ++r)
      u[r] = fold4(fold8(acc[r][t], acc[r][t + 1]), fold8(acc[r][t + 2], acc[r][t + 3]));
    const __m512 res = fold_rows(u);  // block b: rows 0..3 of token t + b
    for (int b = 0; b < 4; ++b) store_rows(y + (t + b) * y_stride, block128(res, b), n_rows);
  }
  if (TN - t >= 2) {
    // Blocks of p: u of (row 0, t), (row 0, t+1), (row 1, t), (row 1, t+1); q: rows 2 and 3.
    const __m512 p = fold4(fold8(acc[0][t], acc[0][t + 1]), fold8(acc[1][t], acc[1][t + 1]));
    const __m512 q = fold4(fold8(acc[2][t], acc[2][t + 1]), fold8(acc[3][t], acc[3][t + 1]));
    const __m512 v = fold2(p, q);  // block b: v_0, v_1 of item b of p, then of q
    const __m512 res = _mm512_add_ps(_mm512_shuffle_ps(v, v, _MM_SHUFFLE(2, 0, 2, 0)),
                                     _mm512_shuffle_ps(v, v, _MM_SHUFFLE(3, 1, 3, 1)));
    // res lanes: 0 (row 0, t), 1 (row 2, t), 4 (row 0, t+1), 5 (row 2, t+1), 8 (row 1, t), ...
    const __m512 rows = _mm512_permutexvar_ps(_mm512_setr_epi32(0, 8, 1, 9, 4, 12, 5, 13, 0, 0, 0, 0, 0, 0, 0, 0), res);
    store_rows(y + t * y_stride, _mm512_castps512_ps128(rows), n_rows);
    store_rows(y + (t + 1) * y_stride, _mm512_extractf32x4_ps(rows, 1), n_rows);
    t += 2;
  }
  if (TN - t == 1) {
    // Blocks of u: u of rows 0..3; then v_i = u_i + u_(i+2) and v_0 + v_1 in lane 0 of each block.
    const __m512 u = fold4(fold8(acc[0][t], acc[1][t]), fold8(acc[2][t], acc[3][t]));
    const __m512 v = _mm512_add_ps(u, _mm512_shuffle_ps(u, u, _MM_SHUFFLE(3, 2, 3, 2)));
    const __m512 res = _mm512_add_ps(v, _mm512_shuffle_ps(v, v, _MM_SHUFFLE(1, 1, 1, 1)));
    const __m512 rows = _mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0), res);
    store_rows(y + t * y_stride, _mm512_castps512_ps128(rows), n_rows);
  }
}

// ---- Up to kSmallTokens tokens: stream the weights. Measured on Zen 4 (one thread, F16),
// this beats the blocked GEMM below at least up to 72 tokens, whose separate packing pass is
// paid for by few tokens: 17 / 24 / 48 / 72 tokens at 32000 x 768, 141 / 146 / 165 / 169
// against 105 / 122 / 153 / 165 GFLOP/s; equal at 128. The blocked GEMM keeps the activations
// of a token block in L2 for 48 rows at a time instead of re-reading them for every 4 rows,
// which matters more with many cores sharing L3, so it takes over at 65 tokens.
constexpr int64_t kSmallTokens = 64;

// One step (32 columns) of stream4: rounds the quad's weights, keeps them in `store` when set
// ([step][row][32]), and accumulates kT tokens.
template <QuantType kType, int kT>
TESSERA_BF16 __attribute__((always_inline)) inline void stream_step(__m512 (&acc)[kQuadRows][kT],
                                                                    const uint8_t* const* rows, int64_t c,
                                                                    int64_t valid, const uint16_t* x, int64_t kpad,
                                                                    uint16_t* store) {
  __m512i w[kQuadRows];
  for (int r = 0; r < kQuadRows; ++r) w[r] = load_w32<kType>(rows[r], c, valid);
  if (store != nullptr) {
    for (int r = 0; r < kQuadRows; ++r) _mm512_store_si512(store + (c / kSteps * kQuadRows + r) * kSteps, w[r]);
  }
  for (int t = 0; t < kT; ++t) {
    const __m512bh xv = as_bh(_mm512_loadu_si512(x + t * kpad + c));
    for (int r = 0; r < kQuadRows; ++r) acc[r][t] = _mm512_dpbf16_ps(acc[r][t], as_bh(w[r]), xv);
  }
}

// Rows [g, g + 4) x tokens [t0, t0 + kT), y at row g of token t0. Weights come from `rows`
// (rounded here; with `store`, kept there for later token groups). `next`, `next_bytes`: rows
// to prefetch at the pace these are consumed. Into L2 (T1), unlike fgemm.cpp's non-temporal
// hint (tuned on Zen 5): on Zen 4, F16, one thread, T1 against NTA measured 4000 x 4096 at
// 1 token 31-33 against 14-17 GFLOP/s, 32000 x 768 at 16 tokens 131-138 against 92-110,
// and the same where the weights fit in cache.
template <QuantType kType, int kT>
TESSERA_BF16 void stream4(const FMatmulArgs& a, const uint8_t* const* rows, const uint16_t* xb, int64_t t0,
                          uint16_t* store, const uint8_t* next, size_t next_bytes, float* y, int n_rows) {
  __m512 acc[kQuadRows][kT];
  for (int r = 0; r < kQuadRows; ++r)
    for (int t = 0; t < kT; ++t) acc[r][t] = _mm512_setzero_ps();
  const int64_t kpad = bf16_kpad(a.k);
  const int64_t kfull = a.k / kSteps * kSteps;
  const size_t elem = kType == QuantType::kF32 ? 4 : 2;
  const size_t step_bytes = kQuadRows * kSteps * elem;
  const uint16_t* x = xb + t0 * kpad;
  size_t pf = 0;
  int64_t c = 0;
  for (; c < kfull; c += kSteps) {
    if (pf < next_bytes) {
      for (size_t e = pf + step_bytes; pf < e; pf += 64) _mm_prefetch(reinterpret_cast<const char*>(next + pf), _MM_HINT_T1);
    }
    stream_step<kType, kT>(acc, rows, c, kSteps, x, kpad, store);
  }
  if (c < a.k) stream_step<kType, kT>(acc, rows, c, a.k - c, x, kpad, store);
  write_tile<kT>(acc, y, a.y_stride, n_rows);
}

// Rows of a quad panel ([step][row][32] bf16, `steps` steps) x tokens, accumulators parked in
// `acc` between k chunks (storing and reloading fp32 values changes no bit).
struct TileJob {
  const uint16_t* wq;
  int64_t steps;
  const uint16_t* x;  // token 0 of the group at the chunk's first column
  int64_t ldx;        // kpad
  float* acc;         // kTileFloats parked accumulators
  bool first, last;   // chunk 0 (start from zero) / final chunk (reduce and write y)
  float* y;           // y of token 0, row 0 of the quad
  int64_t y_stride;
  int n_rows;
};

template <int TN>
TESSERA_BF16 void tile_4xT(const TileJob& j) {
  __m512 acc[kQuadRows][TN];
  for (int r = 0; r < kQuadRows; ++r)
    for (int t = 0; t < TN; ++t)
      acc[r][t] = j.first ? _mm512_setzero_ps() : _mm512_load_ps(j.acc + (r * kGroupTokens + t) * kLanes);
  const uint16_t* w = j.wq;
  const uint16_t* x = j.x;
#pragma GCC unroll 2
  for (int64_t s = 0; s < j.steps; ++s, w += kQuadRows * kSteps, x += kSteps) {
    __m512bh wv[kQuadRows];
    for (int r = 0; r < kQuadRows; ++r) wv[r] = as_bh(_mm512_load_si512(w + r * kSteps));
    for (int t = 0; t < TN; ++t) {
      const __m512bh xv = as_bh(_mm512_loadu_si512(x + t * j.ldx));
      for (int r = 0; r < kQuadRows; ++r) acc[r][t] = _mm512_dpbf16_ps(acc[r][t], wv[r], xv);
    }
  }
  if (!j.last) {
    for (int r = 0; r < kQuadRows; ++r)
      for (int t = 0; t < TN; ++t) _mm512_store_ps(j.acc + (r * kGroupTokens + t) * kLanes, acc[r][t]);
    return;
  }
  write_tile<TN>(acc, j.y, j.y_stride, j.n_rows);
}

TESSERA_BF16 void tile_dispatch(int tn, const TileJob& j) {
  switch (tn) {
    case 1: return tile_4xT<1>(j);
    case 2: return tile_4xT<2>(j);
    case 3: return tile_4xT<3>(j);
    case 4: return tile_4xT<4>(j);
    case 5: return tile_4xT<5>(j);
    default: return tile_4xT<6>(j);
  }
}

template <QuantType kType>
TESSERA_BF16 void stream_dispatch(int tn, const FMatmulArgs& a, const uint8_t* const* rows, const uint16_t* xb,
                                  int64_t t0, uint16_t* store, const uint8_t* next, size_t next_bytes, float* y,
                                  int n_rows) {
  switch (tn) {
    case 1: return stream4<kType, 1>(a, rows, xb, t0, store, next, next_bytes, y, n_rows);
    case 2: return stream4<kType, 2>(a, rows, xb, t0, store, next, next_bytes, y, n_rows);
    case 3: return stream4<kType, 3>(a, rows, xb, t0, store, next, next_bytes, y, n_rows);
    case 4: return stream4<kType, 4>(a, rows, xb, t0, store, next, next_bytes, y, n_rows);
    case 5: return stream4<kType, 5>(a, rows, xb, t0, store, next, next_bytes, y, n_rows);
    default: return stream4<kType, 6>(a, rows, xb, t0, store, next, next_bytes, y, n_rows);
  }
}

uint16_t* aligned_u16(std::vector<uint16_t>& buf, size_t n) {
  if (buf.size() < n + 32) buf.resize(n + 32);
  auto addr = reinterpret_cast<uintptr_t>(buf.data());
  return buf.data() + ((64 - addr % 64) % 64) / 2;
}

float* aligned_floats(std::vector<float>& buf, size_t n) {
  if (buf.size() < n + 16) buf.resize(n + 16);
  auto addr = reinterpret_cast<uintptr_t>(buf.data());
  return buf.data() + ((64 - addr % 64) % 64) / 4;
}

// Per-thread buffers: grown on first use, then reused (no allocation per call).
struct Bf16Scratch {
  std::vector<uint16_t> quad, panel;
  std::vector<float> parked;
};

Bf16Scratch& bf16_scratch() {
  thread_local Bf16Scratch scratch;
  return scratch;
}

template <QuantType kType>
TESSERA_BF16 void fmatmul_small(const FMatmulArgs& a, const uint16_t* xb, int64_t r0, int64_t r1) {
  const int64_t kpad = bf16_kpad(a.k);
  const bool keep = a.n_tokens > kGroupTokens;
  uint16_t* quad = keep ? aligned_u16(bf16_scratch().quad, static_cast<size_t>(kQuadRows * kpad)) : nullptr;
  for (int64_t g = r0; g < r1; g += kQuadRows) {
    const int n_rows = static_cast<int>(std::min<int64_t>(kQuadRows, r1 - g));
    const uint8_t* rows[kQuadRows];
    for (int r = 0; r < kQuadRows; ++r) rows[r] = a.w + static_cast<size_t>(g + std::min(r, n_rows - 1)) * a.row_bytes;
    // Two quads ahead: one is too short a lead for DRAM latency.
    constexpr int64_t kAhead = 2 * kQuadRows;
    const uint8_t* next = a.w + static_cast<size_t>(g + kAhead) * a.row_bytes;
    const size_t next_bytes =
        g + kAhead < r1 ? static_cast<size_t>(std::min<int64_t>(kQuadRows, r1 - g - kAhead)) * a.row_bytes : 0;
    const int tn0 = static_cast<int>(std::min(kGroupTokens, a.n_tokens));
    stream_dispatch<kType>(tn0, a, rows, xb, 0, quad, next, next_bytes, a.y + g, n_rows);
    TileJob j;
    j.wq = quad;
    j.steps = kpad / kSteps;
    j.ldx = kpad;
    j.acc = nullptr;
    j.first = j.last = true;
    j.y_stride = a.y_stride;
    j.n_rows = n_rows;
    for (int64_t t0 = tn0; t0 < a.n_tokens; t0 += kGroupTokens) {
      j.x = xb + t0 * kpad;
      j.y = a.y + t0 * a.y_stride + g;
      tile_dispatch(static_cast<int>(std::min(kGroupTokens, a.n_tokens - t0)), j);
    }
  }
}

// ---- 65+ tokens: the blocked GEMM (fgemm.cpp's fmatmul_batch_avx512, with bf16 panels).
//   rows   in blocks of kBlockRows within a thread's share,
//   tokens in blocks of kBlockTokens,
//   k      in balanced chunks of at most kBlockSteps * 32 columns.
// Sizes for Zen 4 (32 KB L1, 1 MB L2): the panel (at most kPanelBytes) stays in L2, and with it
// the parked accumulators (12 x 24 x 1.5 KB = 432 KB) when k spans several chunks. The quad in
// use streams from L2 (4 loads per 24 VDPBF16PS), the 6-token activation slice (6 x 8 KB at
// most) from L1 and L2. Long chunks measured best on Zen 4 (single thread, 768 x 2048 and
// 256 x 8192, 288 tokens: 1024 columns 180 / 152 GFLOP/s, 2048: 199 / 164, 4096: 201 / 178):
// each extra chunk parks and reloads every accumulator and keeps 432 KB of them in L2.
constexpr int64_t kBlockRows = 48;     // a multiple of kQuadRows
constexpr int64_t kBlockTokens = 144;  // a multiple of kGroupTokens
constexpr int64_t kBlockSteps = 128;   // longest k chunk: 4096 columns
constexpr size_t kPanelBytes = 448 * 1024;
constexpr int64_t kMinResidentRows = 32;

// Columns [c0, c0 + 32 * steps) of rows [row0, row0 + n_rows) into
// panel[quad][step][row of quad][32], rounded to bf16; zeros past k and for rows past n_rows.
template <QuantType kType>
TESSERA_BF16 void pack_panel(const FMatmulArgs& a, int64_t row0, int64_t n_rows, int64_t c0, int64_t steps,
                             uint16_t* panel) {
  const int64_t n_quads = (n_rows + kQuadRows - 1) / kQuadRows;
  for (int64_t r = 0; r < n_quads * kQuadRows; ++r) {
    uint16_t* dst = panel + (r / kQuadRows) * steps * kQuadRows * kSteps + (r % kQuadRows) * kSteps;
    const uint8_t* row = a.w + static_cast<size_t>(row0 + std::min(r, n_rows - 1)) * a.row_bytes;
    for (int64_t s = 0; s < steps; ++s) {
      const int64_t c = c0 + s * kSteps;
      const int64_t valid = r < n_rows ? std::clamp<int64_t>(a.k - c, 0, kSteps) : 0;
      const __m512i v = valid > 0 ? load_w32<kType>(row, c, valid) : _mm512_setzero_si512();
      _mm512_store_si512(dst + s * kQuadRows * kSteps, v);
    }
  }
}

// Software prefetch into L2 of a block of weight rows (bytes [b0, b1) of each), a few lines
// per call, so that packing them later does not wait on DRAM (as in fgemm.cpp).
class WeightPrefetch {
 public:
  WeightPrefetch() = default;
  WeightPrefetch(const FMatmulArgs& a, int64_t row0, int64_t n_rows, size_t b0, size_t b1, int64_t calls) {
    if (n_rows <= 0) return;
    base_ = a.w + static_cast<size_t>(row0) * a.row_bytes + b0;
    row_bytes_ = a.row_bytes;
    span_ = b1 - b0;
    rows_ = n_rows;
    const int64_t lines = rows_ * static_cast<int64_t>((span_ + 63) / 64 + 1);
    per_call_ = (lines + calls - 1) / std::max<int64_t>(1, calls);
  }
  void step() {
    for (int64_t i = 0; i < per_call_ && row_ < rows_; ++i) {
      _mm_prefetch(reinterpret_cast<const char*>(base_ + static_cast<size_t>(row_) * row_bytes_ + off_), _MM_HINT_T1);
      off_ += 64;
      if (off_ >= span_ + 64) {
        off_ = 0;
        ++row_;
      }
    }
  }

 private:
  const uint8_t* base_ = nullptr;
  size_t row_bytes_ = 0, span_ = 0, off_ = 0;
  int64_t rows_ = 0, row_ = 0, per_call_ = 0;
};

template <QuantType kType>
TESSERA_BF16 void fmatmul_batch(const FMatmulArgs& a, const uint16_t* xb, int64_t r0, int64_t r1) {
  constexpr int64_t kQuads = kBlockRows / kQuadRows;
  constexpr int64_t kGroups = kBlockTokens / kGroupTokens;
  const size_t elem = kType == QuantType::kF32 ? 4 : 2;
  const int64_t kpad = bf16_kpad(a.k);
  const int64_t k_steps = kpad / kSteps;
  const int64_t n_chunks = (k_steps + kBlockSteps - 1) / kBlockSteps;
  const int64_t chunk_steps = (k_steps + n_chunks - 1) / n_chunks;  // balanced chunks
  const size_t row_panel_bytes = static_cast<size_t>(n_chunks * chunk_steps * kSteps) * 2;
  const int64_t fit_rows = static_cast<int64_t>(kPanelBytes / row_panel_bytes) / kQuadRows * kQuadRows;
  const int64_t block_rows = fit_rows >= kMinResidentRows ? std::min(kBlockRows, fit_rows) : kBlockRows;
  const int64_t slot_elems = block_rows * chunk_steps * kSteps;
  const bool resident = static_cast<size_t>(n_chunks * slot_elems) * 2 <= kPanelBytes;
  Bf16Scratch& scratch = bf16_scratch();
  uint16_t* panel = aligned_u16(scratch.panel, static_cast<size_t>((resident ? n_chunks : 1) * slot_elems));
  float* parked = n_chunks > 1 ? aligned_floats(scratch.parked, static_cast<size_t>(kQuads * kGroups * kTileFloats))
                               : nullptr;
  auto chunk_bytes = [&](int64_t s0, int64_t steps, size_t* b0, size_t* b1) {
    *b0 = std::min(static_cast<size_t>(s0 * kSteps) * elem, static_cast<size_t>(a.k) * elem);
    *b1 = static_cast<size_t>(std::min(a.k, (s0 + steps) * kSteps)) * elem;
  };
  for (int64_t rb = r0; rb < r1; rb += block_rows) {
    const int64_t n_rows = std::min(block_rows, r1 - rb);
    const int64_t n_quads = (n_rows + kQuadRows - 1) / kQuadRows;
    WeightPrefetch prefetch;
    for (int64_t tb = 0; tb < a.n_tokens; tb += kBlockTokens) {
      const int64_t n_tok = std::min(kBlockTokens, a.n_tokens - tb);
      const int64_t n_groups = (n_tok + kGroupTokens - 1) / kGroupTokens;
      for (int64_t ci = 0; ci < n_chunks; ++ci) {
        const int64_t s0 = ci * chunk_steps;
        const int64_t steps = std::min(chunk_steps, k_steps - s0);
        const int64_t c0 = s0 * kSteps;
        uint16_t* slot = panel + (resident ? ci * slot_elems : 0);
        if (!resident || tb == 0) pack_panel<kType>(a, rb, n_rows, c0, steps, slot);
        // Prefetches are issued late (over the last chunk before the weights are packed, or
        // the second half of it): the activations streaming through L2 evict them otherwise.
        if (resident && tb + n_tok >= a.n_tokens && ci == n_chunks - 1)  // the next row block
          prefetch = WeightPrefetch(a, rb + block_rows, std::min(block_rows, r1 - rb - block_rows), 0,
                                    static_cast<size_t>(a.k) * elem, n_groups);
        if (!resident) {  // the next chunk to pack
          int64_t nr = rb, ns = s0 + steps;
          if (ns >= k_steps) {
            ns = 0;
            if (tb + n_tok >= a.n_tokens) nr = rb + block_rows;
          }
          size_t b0, b1;
          chunk_bytes(ns, std::min(chunk_steps, k_steps - ns), &b0, &b1);
          prefetch = WeightPrefetch(a, nr, std::min(block_rows, r1 - nr), b0, b1, n_groups - n_groups / 2);
        }
        TileJob j;
        j.steps = steps;
        j.ldx = kpad;
        j.first = ci == 0;
        j.last = ci == n_chunks - 1;
        j.y_stride = a.y_stride;
        for (int64_t g = 0; g < n_groups; ++g) {
          const int64_t t0 = tb + g * kGroupTokens;
          const int tn = static_cast<int>(std::min(kGroupTokens, a.n_tokens - t0));
          j.x = xb + t0 * kpad + c0;
          if (resident || 2 * g >= n_groups) prefetch.step();
          for (int64_t q = 0; q < n_quads; ++q) {
            j.wq = slot + q * steps * kQuadRows * kSteps;
            j.acc = parked != nullptr ? parked + (g * kQuads + q) * kTileFloats : nullptr;
            j.y = a.y + t0 * a.y_stride + rb + q * kQuadRows;
            j.n_rows = static_cast<int>(std::min(kQuadRows, n_rows - q * kQuadRows));
            tile_dispatch(tn, j);
          }
        }
      }
    }
  }
}

template <QuantType kType>
TESSERA_BF16 void fmatmul_bf16_avx512(const FMatmulArgs& a, const uint16_t* xb, int64_t r0, int64_t r1) {
  if (a.n_tokens <= kSmallTokens) return fmatmul_small<kType>(a, xb, r0, r1);
  fmatmul_batch<kType>(a, xb, r0, r1);
}
#endif  // TESSERA_BF16X86

}  // namespace

bool has_bf16_dot() {
#ifdef TESSERA_BF16X86
  static const bool kHas = detect_bf16_dot();
  return kHas;
#else
  return false;
#endif
}

double bf16_dot_speedup() {
#ifdef TESSERA_BF16X86
  static const double kSpeedup = has_bf16_dot() ? measure_bf16_dot_speedup() : 0.0;
  return kSpeedup;
#else
  return 0.0;
#endif
}

bool bf16_dot_pays() { return bf16_dot_speedup() >= kBf16DotMinSpeedup; }

uint16_t round_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);  // quiet NaN
  if ((u & 0x7f800000u) == 0) return static_cast<uint16_t>((u >> 16) & 0x8000u);        // zero, denormal
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

size_t bf16_acts_bytes(int64_t n_tokens, int64_t k) { return static_cast<size_t>(n_tokens * bf16_kpad(k)) * 2; }

void convert_acts_bf16(const float* x, int64_t k, int64_t t0, int64_t t1, uint16_t* dst) {
#ifdef TESSERA_BF16X86
  if (has_bf16_dot()) return convert_acts_avx512(x, k, t0, t1, dst);
#endif
  convert_acts_scalar(x, k, t0, t1, dst);
}

void fmatmul_bf16(const FMatmulArgs& a, const uint16_t* xb, int64_t r0, int64_t r1) {
  if (r0 >= r1 || a.n_tokens <= 0) return;
#ifdef TESSERA_BF16X86
  if (has_bf16_dot()) {
    switch (a.type) {
      case QuantType::kF16: return fmatmul_bf16_avx512<QuantType::kF16>(a, xb, r0, r1);
      case QuantType::kBF16: return fmatmul_bf16_avx512<QuantType::kBF16>(a, xb, r0, r1);
      default: return fmatmul_bf16_avx512<QuantType::kF32>(a, xb, r0, r1);
    }
  }
#endif
  fmatmul_bf16_reference(a, xb, r0, r1);
}

void fmatmul_bf16_reference(const FMatmulArgs& a, const uint16_t* xb, int64_t r0, int64_t r1) {
  const int64_t kpad = bf16_kpad(a.k);
  std::vector<uint16_t> w(static_cast<size_t>(kpad));
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* row = a.w + static_cast<size_t>(r) * a.row_bytes;
    for (int64_t c = 0; c < kpad; ++c) w[static_cast<size_t>(c)] = c < a.k ? weight_bf16(a.type, row, c) : 0;
    for (int64_t t = 0; t < a.n_tokens; ++t) {
      const uint16_t* x = xb + t * kpad;
      float s[kLanes] = {};
      for (int64_t i = 0; i < kpad / 2; ++i) {
        float& acc = s[i % kLanes];
        acc = dot_step(acc, w[static_cast<size_t>(2 * i)], w[static_cast<size_t>(2 * i + 1)], x[2 * i], x[2 * i + 1]);
      }
      a.y[t * a.y_stride + r] = reduce16(s);
    }
  }
}

}  // namespace tessera::cpu
