// Float-weight matmul kernels (arithmetic in fgemm.h).
//
// Decode (one token): 4 rows at a time share each activation load; F16 / BF16 are widened in
// registers. Batches: a 16-row tile is widened to fp32 once (F32 rows are used in place) and
// run against the tokens by a 4-row x 6-token register block (24 accumulators), so every weight
// element is read from memory once per matmul.
#include "kernels/cpu/fgemm.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/cpu/vec.h"

#if defined(__x86_64__)
#include <immintrin.h>
// GCC 12 reports its own _mm512_undefined_* placeholders inside the intrinsics as
// maybe-uninitialized; the values are always overwritten.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#define TESSERA_FX86 1
#define TESSERA_AVX2 __attribute__((target("avx2,fma,f16c")))
#define TESSERA_AVX512 __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c")))
#endif

namespace tessera::cpu {
namespace {

constexpr int kLanes = 16;

inline float weight_at(QuantType type, const uint8_t* row, int64_t c) {
  switch (type) {
    case QuantType::kF16: {
      uint16_t h;
      std::memcpy(&h, row + 2 * c, 2);
      return fp16_to_f32(h);
    }
    case QuantType::kBF16: {
      uint16_t h;
      std::memcpy(&h, row + 2 * c, 2);
      return bf16_to_f32(h);
    }
    default: {
      float f;
      std::memcpy(&f, row + 4 * c, 4);
      return f;
    }
  }
}

inline float reduce16(const float* s) {
  float t[8], u[4], v[2];
  for (int i = 0; i < 8; ++i) t[i] = s[i] + s[i + 8];
  for (int i = 0; i < 4; ++i) u[i] = t[i] + t[i + 4];
  for (int i = 0; i < 2; ++i) v[i] = u[i] + u[i + 2];
  return v[0] + v[1];
}

void fmatmul_scalar(const FMatmulArgs& a, int64_t r0, int64_t r1) {
  const int64_t kpad = (a.k + kLanes - 1) / kLanes * kLanes;
  for (int64_t t = 0; t < a.n_tokens; ++t) {
    const float* x = a.x + t * a.k;
    for (int64_t r = r0; r < r1; ++r) {
      const uint8_t* row = a.w + static_cast<size_t>(r) * a.row_bytes;
      float s[kLanes] = {};
      for (int64_t c = 0; c < kpad; ++c) {
        const float w = c < a.k ? weight_at(a.type, row, c) : 0.0f;
        const float xv = c < a.k ? x[c] : 0.0f;
        s[c % kLanes] = std::fma(w, xv, s[c % kLanes]);
      }
      a.y[t * a.y_stride + r] = reduce16(s);
    }
  }
}

float* tile_scratch(size_t floats) {
  thread_local std::vector<float> buf;
  if (buf.size() < floats + 16) buf.resize(floats + 16);
  auto addr = reinterpret_cast<uintptr_t>(buf.data());
  return buf.data() + ((64 - addr % 64) % 64) / 4;
}

#ifdef TESSERA_FX86
// ------------------------------------------------------------------ AVX-512

TESSERA_AVX512 inline __m512 load_w16(QuantType type, const uint8_t* row, int64_t c) {
  switch (type) {
    case QuantType::kF16:
      return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + 2 * c)));
    case QuantType::kBF16:
      return _mm512_castsi512_ps(_mm512_slli_epi32(
          _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + 2 * c))), 16));
    default: return _mm512_loadu_ps(reinterpret_cast<const float*>(row) + c);
  }
}

TESSERA_AVX512 inline __m512 load_w16_masked(QuantType type, const uint8_t* row, int64_t c, __mmask16 m) {
  switch (type) {
    case QuantType::kF16: return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, row + 2 * c));
    case QuantType::kBF16:
      return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, row + 2 * c)), 16));
    default: return _mm512_maskz_loadu_ps(m, reinterpret_cast<const float*>(row) + c);
  }
}

TESSERA_AVX512 inline float reduce16_avx512(__m512 s) {
  const __m256 t = _mm256_add_ps(_mm512_castps512_ps256(s), _mm512_extractf32x8_ps(s, 1));
  const __m128 u = _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
  const __m128 v = _mm_add_ps(u, _mm_movehl_ps(u, u));
  return _mm_cvtss_f32(_mm_add_ss(v, _mm_movehdup_ps(v)));
}

// `next`, `next_bytes`: the following rows, prefetched while these four are computed (four
// interleaved streams are more than the hardware prefetchers keep ahead of). Non-temporal:
// each weight byte is used once per matmul (this alone gave +40% decode speed on Zen 5).
template <QuantType kType>
TESSERA_AVX512 void gemv4_avx512(const FMatmulArgs& a, const uint8_t* const* rows, float* out,
                                 const uint8_t* next, size_t next_bytes) {
  __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
  const int64_t kfull = a.k / kLanes * kLanes;
  const size_t elem = kType == QuantType::kF32 ? 4 : 2;
  // Prefetch lines of `next` at the pace this loop consumes lines of its rows.
  const size_t step_bytes = 4 * kLanes * elem;
  size_t pf = 0;
  int64_t c = 0;
  for (; c < kfull; c += kLanes) {
    if (pf < next_bytes) {
      for (size_t e = pf + step_bytes; pf < e; pf += 64) _mm_prefetch(reinterpret_cast<const char*>(next + pf), _MM_HINT_NTA);
    }
    const __m512 xv = _mm512_loadu_ps(a.x + c);
    for (int r = 0; r < 4; ++r) acc[r] = _mm512_fmadd_ps(load_w16(kType, rows[r], c), xv, acc[r]);
  }
  if (c < a.k) {
    const auto m = static_cast<__mmask16>((1u << (a.k - c)) - 1u);
    const __m512 xv = _mm512_maskz_loadu_ps(m, a.x + c);
    for (int r = 0; r < 4; ++r) acc[r] = _mm512_fmadd_ps(load_w16_masked(kType, rows[r], c, m), xv, acc[r]);
  }
  for (int r = 0; r < 4; ++r) out[r] = reduce16_avx512(acc[r]);
}

// acc[r][t] over the tile rows w[r] (fp32, row stride ldw) and tokens x[t] (row stride k).
template <int TN>
TESSERA_AVX512 void mk_4xT_avx512(const float* w, int64_t ldw, const float* x, int64_t k, float* out,
                                  int64_t out_stride) {
  __m512 acc[4][TN];
  for (auto& row : acc)
    for (auto& v : row) v = _mm512_setzero_ps();
  const int64_t kfull = k / kLanes * kLanes;
  int64_t c = 0;
  for (; c < kfull; c += kLanes) {
    __m512 wv[4];
    for (int r = 0; r < 4; ++r) wv[r] = _mm512_loadu_ps(w + r * ldw + c);
    for (int t = 0; t < TN; ++t) {
      const __m512 xv = _mm512_loadu_ps(x + t * k + c);
      for (int r = 0; r < 4; ++r) acc[r][t] = _mm512_fmadd_ps(wv[r], xv, acc[r][t]);
    }
  }
  if (c < k) {
    const auto m = static_cast<__mmask16>((1u << (k - c)) - 1u);
    __m512 wv[4];
    for (int r = 0; r < 4; ++r) wv[r] = _mm512_maskz_loadu_ps(m, w + r * ldw + c);
    for (int t = 0; t < TN; ++t) {
      const __m512 xv = _mm512_maskz_loadu_ps(m, x + t * k + c);
      for (int r = 0; r < 4; ++r) acc[r][t] = _mm512_fmadd_ps(wv[r], xv, acc[r][t]);
    }
  }
  for (int t = 0; t < TN; ++t)
    for (int r = 0; r < 4; ++r) out[t * out_stride + r] = reduce16_avx512(acc[r][t]);
}

TESSERA_AVX512 void mk_4xT_dispatch(int tn, const float* w, int64_t ldw, const float* x, int64_t k, float* out,
                                    int64_t out_stride) {
  switch (tn) {
    case 1: return mk_4xT_avx512<1>(w, ldw, x, k, out, out_stride);
    case 2: return mk_4xT_avx512<2>(w, ldw, x, k, out, out_stride);
    case 3: return mk_4xT_avx512<3>(w, ldw, x, k, out, out_stride);
    case 4: return mk_4xT_avx512<4>(w, ldw, x, k, out, out_stride);
    case 5: return mk_4xT_avx512<5>(w, ldw, x, k, out, out_stride);
    default: return mk_4xT_avx512<6>(w, ldw, x, k, out, out_stride);
  }
}

TESSERA_AVX512 void widen_rows_avx512(QuantType type, const uint8_t* row, int64_t k, float* dst) {
  const int64_t kfull = k / kLanes * kLanes;
  int64_t c = 0;
  for (; c < kfull; c += kLanes) _mm512_storeu_ps(dst + c, load_w16(type, row, c));
  if (c < k) {
    const auto m = static_cast<__mmask16>((1u << (k - c)) - 1u);
    _mm512_mask_storeu_ps(dst + c, m, load_w16_masked(type, row, c, m));
  }
}

TESSERA_AVX512 void fmatmul_avx512(const FMatmulArgs& a, int64_t r0, int64_t r1) {
  if (a.n_tokens == 1) {
    for (int64_t g = r0; g < r1; g += 4) {
      const int n_valid = static_cast<int>(std::min<int64_t>(4, r1 - g));
      const uint8_t* rows[4];
      for (int r = 0; r < 4; ++r) rows[r] = a.w + static_cast<size_t>(g + std::min(r, n_valid - 1)) * a.row_bytes;
      float out[4];
      // Prefetch two quads ahead: one is too short a lead for DRAM latency.
      constexpr int64_t kAhead = 8;
      const uint8_t* next = a.w + static_cast<size_t>(g + kAhead) * a.row_bytes;
      const size_t next_bytes = g + kAhead < r1 ? static_cast<size_t>(std::min<int64_t>(4, r1 - g - kAhead)) * a.row_bytes : 0;
      switch (a.type) {
        case QuantType::kF16: gemv4_avx512<QuantType::kF16>(a, rows, out, next, next_bytes); break;
        case QuantType::kBF16: gemv4_avx512<QuantType::kBF16>(a, rows, out, next, next_bytes); break;
        default: gemv4_avx512<QuantType::kF32>(a, rows, out, next, next_bytes); break;
      }
      std::memcpy(a.y + g, out, static_cast<size_t>(n_valid) * 4);
    }
    return;
  }
  constexpr int64_t kTile = 16;
  float* tile = tile_scratch(static_cast<size_t>(kTile * a.k));
  float out[6 * 4];
  for (int64_t g0 = r0; g0 < r1; g0 += kTile) {
    const int64_t n_rows = std::min<int64_t>(kTile, r1 - g0);
    const int64_t n_quads = (n_rows + 3) / 4;
    const float* base;
    int64_t ldw;
    if (a.type == QuantType::kF32 && n_rows % 4 == 0) {  // used in place
      base = reinterpret_cast<const float*>(a.w + static_cast<size_t>(g0) * a.row_bytes);
      ldw = static_cast<int64_t>(a.row_bytes / 4);
    } else {
      // Widened rows; a partial quad repeats its last row (results dropped).
      for (int64_t r = 0; r < 4 * n_quads; ++r)
        widen_rows_avx512(a.type, a.w + static_cast<size_t>(g0 + std::min(r, n_rows - 1)) * a.row_bytes, a.k,
                          tile + r * a.k);
      base = tile;
      ldw = a.k;
    }
    for (int64_t t0 = 0; t0 < a.n_tokens; t0 += 6) {
      const int tn = static_cast<int>(std::min<int64_t>(6, a.n_tokens - t0));
      for (int64_t q = 0; q < n_quads; ++q) {
        const int n_valid = static_cast<int>(std::min<int64_t>(4, n_rows - 4 * q));
        mk_4xT_dispatch(tn, base + 4 * q * ldw, ldw, a.x + t0 * a.k, a.k, out, 4);
        for (int t = 0; t < tn; ++t)
          std::memcpy(a.y + (t0 + t) * a.y_stride + g0 + 4 * q, out + t * 4, static_cast<size_t>(n_valid) * 4);
      }
    }
  }
}

// ------------------------------------------------------------------ AVX2 (16 lanes as 2 x 8)

TESSERA_AVX2 inline __m256 load_w8(QuantType type, const uint8_t* row, int64_t c) {
  switch (type) {
    case QuantType::kF16: return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 2 * c)));
    case QuantType::kBF16:
      return _mm256_castsi256_ps(_mm256_slli_epi32(
          _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 2 * c))), 16));
    default: return _mm256_loadu_ps(reinterpret_cast<const float*>(row) + c);
  }
}

TESSERA_AVX2 inline float reduce16_avx2(__m256 lo, __m256 hi) {
  const __m256 t = _mm256_add_ps(lo, hi);
  const __m128 u = _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
  const __m128 v = _mm_add_ps(u, _mm_movehl_ps(u, u));
  return _mm_cvtss_f32(_mm_add_ss(v, _mm_movehdup_ps(v)));
}

// The zero-padded tail of a row (< 16 elements) as two 8-lane halves.
inline void tail16(QuantType type, const uint8_t* row, const float* x, int64_t c, int64_t k, float* w16,
                   float* x16) {
  for (int i = 0; i < kLanes; ++i) {
    w16[i] = c + i < k ? weight_at(type, row, c + i) : 0.0f;
    x16[i] = c + i < k ? x[c + i] : 0.0f;
  }
}

TESSERA_AVX2 void fmatmul_avx2(const FMatmulArgs& a, int64_t r0, int64_t r1) {
  const int64_t kfull = a.k / kLanes * kLanes;
  // Two rows per pass share the activation loads.
  for (int64_t t = 0; t < a.n_tokens; ++t) {
    const float* x = a.x + t * a.k;
    for (int64_t g = r0; g < r1; g += 2) {
      const int n_valid = static_cast<int>(std::min<int64_t>(2, r1 - g));
      const uint8_t* rows[2] = {a.w + static_cast<size_t>(g) * a.row_bytes,
                                a.w + static_cast<size_t>(g + n_valid - 1) * a.row_bytes};
      __m256 lo[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()}, hi[2] = {lo[0], lo[0]};
      int64_t c = 0;
      for (; c < kfull; c += kLanes) {
        const __m256 x0 = _mm256_loadu_ps(x + c), x1 = _mm256_loadu_ps(x + c + 8);
        for (int r = 0; r < 2; ++r) {
          lo[r] = _mm256_fmadd_ps(load_w8(a.type, rows[r], c), x0, lo[r]);
          hi[r] = _mm256_fmadd_ps(load_w8(a.type, rows[r], c + 8), x1, hi[r]);
        }
      }
      if (c < a.k) {
        for (int r = 0; r < 2; ++r) {
          alignas(32) float w16[kLanes], x16[kLanes];
          tail16(a.type, rows[r], x, c, a.k, w16, x16);
          lo[r] = _mm256_fmadd_ps(_mm256_load_ps(w16), _mm256_load_ps(x16), lo[r]);
          hi[r] = _mm256_fmadd_ps(_mm256_load_ps(w16 + 8), _mm256_load_ps(x16 + 8), hi[r]);
        }
      }
      for (int r = 0; r < n_valid; ++r) a.y[t * a.y_stride + g + r] = reduce16_avx2(lo[r], hi[r]);
    }
  }
}
#endif  // TESSERA_FX86

}  // namespace

bool is_float_weight(QuantType type) {
  return type == QuantType::kF32 || type == QuantType::kF16 || type == QuantType::kBF16;
}

void fmatmul(const FMatmulArgs& a, int64_t r0, int64_t r1) {
#ifdef TESSERA_FX86
  switch (active_isa()) {
    case Isa::kAvx512: return fmatmul_avx512(a, r0, r1);
    case Isa::kAvx2: return fmatmul_avx2(a, r0, r1);
    case Isa::kScalar: break;
  }
#endif
  fmatmul_scalar(a, r0, r1);
}

}  // namespace tessera::cpu
