// AVX2 integer-dot kernels for the low-bit GGUF formats Q2_K, Q3_K, TQ1_0, TQ2_0 (the
// arithmetic is in qgemm.h). One row at a time along k: a 256-superblock's levels are unpacked
// into 8 vectors of 32 bytes whose bytes are 32 consecutive elements, so each is dotted with a
// plain load of the activations (maddubs; the levels are at most 7, so no pair sum saturates),
// for up to kTokens tokens while the levels are in registers. Per-sub-block scales are int16
// lanes of a pmaddwd operand (pshufb of the 16 scales), so the vector holds exact
// sc[s] * dot parts; one horizontal sum per block and token gives isum (and Q2_K's msum), then
// the two scalar fmas of the contract. Same integers, same float operations, same order as
// the scalar and AVX-512 paths: bit-identical results.
// Activations always come block-major (PackedActs): token t of block b at a constant offset.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/cpu/qgemm.h"

#if defined(__x86_64__)
#include <immintrin.h>

#define TESSERA_AVX2 __attribute__((target("avx2,fma,f16c")))
#define TESSERA_AVX2_INLINE inline __attribute__((always_inline)) TESSERA_AVX2

namespace tessera::cpu {
namespace {

constexpr int kTokens = 4;  // tokens per pass over a row

// pshufb indices that spread the 16 scales of a super-block over the int16 lanes of chunk c
// (elements 32c..32c+31: sub-blocks 2c in lanes 0..7, 2c + 1 in lanes 8..15). zx: the scale
// zero-extended (Q2_K, 0..15); dup: the scale byte twice, sign-extended by a shift (Q3_K).
struct ScaleIndex {
  alignas(32) std::array<std::array<int8_t, 32>, 8> zx{};
  alignas(32) std::array<std::array<int8_t, 32>, 8> dup{};
};
constexpr ScaleIndex make_scale_index() {
  ScaleIndex ix;
  for (int c = 0; c < 8; ++c)
    for (int i = 0; i < 32; ++i) {
      const auto s = static_cast<int8_t>(2 * c + i / 16);
      ix.zx[c][i] = i % 2 == 0 ? s : static_cast<int8_t>(-128);
      ix.dup[c][i] = s;
    }
  return ix;
}
constexpr ScaleIndex kScaleIndex = make_scale_index();

TESSERA_AVX2_INLINE __m256i load32(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }

TESSERA_AVX2_INLINE float f16c(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}

TESSERA_AVX2_INLINE int32_t hsum(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
  return _mm_cvtsi128_si32(s);
}

// The sums of a's and b's 8 lanes (exact: every partial sum is a sum of the lanes).
TESSERA_AVX2_INLINE void hsum2(__m256i a, __m256i b, int32_t* sa, int32_t* sb) {
  __m256i h = _mm256_hadd_epi32(a, b);  // a01 a23 b01 b23 | a45 a67 b45 b67
  h = _mm256_hadd_epi32(h, h);          // a0-3 b0-3 .. | a4-7 b4-7 ..
  const __m128i s = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
  *sa = _mm_cvtsi128_si32(s);
  *sb = _mm_extract_epi32(s, 1);
}

// The 16 signed Q3_K scales (q3_k_scale) as int8, from the 12 bytes at blk + 96 (read as the
// 16 bytes at blk + 94, which end the block).
TESSERA_AVX2_INLINE __m128i q3_k_scales(const uint8_t* blk) {
  const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 94));
  const __m128i m4 = _mm_set1_epi8(0x0F);
  const __m128i a = _mm_shuffle_epi8(v, _mm_setr_epi8(2, 3, 4, 5, 6, 7, 8, 9, 2, 3, 4, 5, 6, 7, 8, 9));
  const __m128i low = _mm_blend_epi16(_mm_and_si128(a, m4), _mm_and_si128(_mm_srli_epi16(a, 4), m4), 0xF0);
  const __m128i b = _mm_shuffle_epi8(v, _mm_setr_epi8(10, 11, 12, 13, 10, 11, 12, 13, 10, 11, 12, 13, 10, 11, 12, 13));
  // Scale j takes bits 2(j / 4).. of byte 8 + j % 4: one shift per dword j / 4.
  const __m128i high = _mm_and_si128(_mm_srlv_epi32(b, _mm_setr_epi32(0, 2, 4, 6)), _mm_set1_epi8(3));
  return _mm_sub_epi8(_mm_or_si128(low, _mm_slli_epi16(high, 4)), _mm_set1_epi8(32));
}

// Bytes times 3 (mod 256).
TESSERA_AVX2_INLINE __m256i times3(__m256i m) { return _mm256_add_epi8(m, _mm256_add_epi8(m, m)); }
TESSERA_AVX2_INLINE __m128i times3(__m128i m) { return _mm_add_epi8(m, _mm_add_epi8(m, m)); }

// The top base-3 digit of each byte m: (m * 3) >> 8 = (m >= 86) + (m >= 171).
TESSERA_AVX2_INLINE __m256i top_digit(__m256i m) {
  const __m256i ge86 = _mm256_cmpeq_epi8(_mm256_max_epu8(m, _mm256_set1_epi8(86)), m);
  const __m256i ge171 = _mm256_cmpeq_epi8(_mm256_max_epu8(m, _mm256_set1_epi8(static_cast<char>(171))), m);
  return _mm256_sub_epi8(_mm256_setzero_si256(), _mm256_add_epi8(ge86, ge171));
}

// The 4 TQ1_0 high bytes times 3^p (mod 256, bytewise) in dword p = 0..3: elements 240 + 4p + l.
TESSERA_AVX2_INLINE __m128i tq1_high(const uint8_t* qh) {
  uint32_t h;
  std::memcpy(&h, qh, 4);
  uint32_t v[4];
  for (uint32_t p = 0, c = 1; p < 4; ++p, c *= 3)  // even and odd bytes apart: no carries between
    v[p] = ((h & 0x00FF00FFu) * c & 0x00FF00FFu) | ((h & 0xFF00FF00u) * c & 0xFF00FF00u);
  return _mm_setr_epi32(static_cast<int>(v[0]), static_cast<int>(v[1]), static_cast<int>(v[2]), static_cast<int>(v[3]));
}

// The tokens of one block: token t's 256 activations at q + 256 t, its scale dx[t], its aux
// (qgemm.h: Q2_K / Q3_K 8 int16 pairs of bsum16, TQ bsum256) at aux + n_aux t.
struct BlockTokens {
  const int8_t* q;
  const float* dx;
  const int32_t* aux;
};

// The unpacked levels of chunk c (elements 32c..32c+31) against every token.
template <int T>
TESSERA_AVX2_INLINE void dot_scaled(__m256i u, __m256i scv, int c, const BlockTokens& x, __m256i* iv) {
  for (int t = 0; t < T; ++t)
    iv[t] = _mm256_add_epi32(iv[t], _mm256_madd_epi16(_mm256_maddubs_epi16(u, load32(x.q + 256 * t + 32 * c)), scv));
}
template <int T>
TESSERA_AVX2_INLINE void dot_plain(__m256i u, int c, const BlockTokens& x, __m256i* p16) {
  for (int t = 0; t < T; ++t)
    p16[t] = _mm256_add_epi16(p16[t], _mm256_maddubs_epi16(u, load32(x.q + 256 * t + 32 * c)));
}

template <int T>
TESSERA_AVX2_INLINE void q2_k_block(const uint8_t* blk, const BlockTokens& x, float* acc) {
  const __m256i m3 = _mm256_set1_epi8(3);
  const __m128i sm = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk));
  const __m256i sc = _mm256_broadcastsi128_si256(_mm_and_si128(sm, _mm_set1_epi8(0x0F)));
  __m256i iv[T];
  for (int t = 0; t < T; ++t) iv[t] = _mm256_setzero_si256();
  for (int h = 0; h < 2; ++h) {
    const __m256i qs = load32(blk + 16 + 32 * h);
    for (int s = 0; s < 4; ++s) {
      const int c = 4 * h + s;
      const __m256i u = _mm256_and_si256(_mm256_srli_epi16(qs, 2 * s), m3);
      dot_scaled<T>(u, _mm256_shuffle_epi8(sc, load32(kScaleIndex.zx[c].data())), c, x, iv);
    }
  }
  const __m256i m16 = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(sm, 4), _mm_set1_epi8(0x0F)));
  const float d = f16c(blk + 80), dmin = f16c(blk + 82);
  for (int t = 0; t < T; ++t) {
    int32_t isum, msum;
    hsum2(iv[t], _mm256_madd_epi16(m16, load32(x.aux + 8 * t)), &isum, &msum);
    acc[t] = std::fma(static_cast<float>(isum), d * x.dx[t], acc[t]);
    acc[t] = std::fma(static_cast<float>(-msum), dmin * x.dx[t], acc[t]);
  }
}

template <int T>
TESSERA_AVX2_INLINE void q3_k_block(const uint8_t* blk, const BlockTokens& x, float* acc) {
  const __m256i m3 = _mm256_set1_epi8(3), four = _mm256_set1_epi8(4);
  const __m128i sc8 = q3_k_scales(blk);
  const __m256i sc = _mm256_broadcastsi128_si256(sc8);
  const __m256i hm = load32(blk);  // bit c of byte l: the high bit of element 32c + l
  __m256i iv[T];
  for (int t = 0; t < T; ++t) iv[t] = _mm256_setzero_si256();
  for (int h = 0; h < 2; ++h) {
    const __m256i qs = load32(blk + 32 + 32 * h);
    for (int s = 0; s < 4; ++s) {
      const int c = 4 * h + s;
      const __m256i hb = c >= 2 ? _mm256_and_si256(_mm256_srli_epi16(hm, c - 2), four)
                                : _mm256_and_si256(_mm256_slli_epi16(hm, 2 - c), four);
      const __m256i u = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(qs, 2 * s), m3), hb);
      dot_scaled<T>(u, _mm256_srai_epi16(_mm256_shuffle_epi8(sc, load32(kScaleIndex.dup[c].data())), 8), c, x, iv);
    }
  }
  const __m256i sc16 = _mm256_cvtepi8_epi16(sc8);
  const float d = f16c(blk + 108);
  for (int t = 0; t < T; ++t) {
    const __m256i corr = _mm256_madd_epi16(sc16, load32(x.aux + 8 * t));  // sum_s sc[s] * bsum16[s], in pairs
    const int32_t isum = hsum(_mm256_sub_epi32(iv[t], _mm256_slli_epi32(corr, 2)));
    acc[t] = std::fma(static_cast<float>(isum), d * x.dx[t], acc[t]);
  }
}

template <int T>
TESSERA_AVX2_INLINE void tq_finish(const __m256i* p16, float d, const BlockTokens& x, float* acc) {
  for (int t = 0; t < T; ++t) {
    const int32_t isum = hsum(_mm256_madd_epi16(p16[t], _mm256_set1_epi16(1))) - x.aux[t];
    acc[t] = std::fma(static_cast<float>(isum), d * x.dx[t], acc[t]);
  }
}

// Levels 0..3: a token's 8 maddubs sums add up in int16 (at most 8 * 762).
template <int T>
TESSERA_AVX2_INLINE void tq2_0_block(const uint8_t* blk, const BlockTokens& x, float* acc) {
  const __m256i m3 = _mm256_set1_epi8(3);
  __m256i p16[T];
  for (int t = 0; t < T; ++t) p16[t] = _mm256_setzero_si256();
  for (int h = 0; h < 2; ++h) {
    const __m256i qs = load32(blk + 32 * h);
    for (int s = 0; s < 4; ++s) dot_plain<T>(_mm256_and_si256(_mm256_srli_epi16(qs, 2 * s), m3), 4 * h + s, x, p16);
  }
  tq_finish<T>(p16, f16c(blk + 64), x, acc);
}

// Digits: bytes 0-31 give elements 32p + l (p < 5); bytes 32-47 elements 160 + 16p + l, taken
// two digits per vector ([p | p + 1] covers 32 consecutive elements); the 4 bytes at 48
// elements 240 + 4p + l, next to digit 4 of bytes 32-47.
template <int T>
TESSERA_AVX2_INLINE void tq1_0_block(const uint8_t* blk, const BlockTokens& x, float* acc) {
  __m256i p16[T];
  for (int t = 0; t < T; ++t) p16[t] = _mm256_setzero_si256();
  __m256i m = load32(blk);
  for (int p = 0; p < 5; ++p, m = times3(m)) dot_plain<T>(top_digit(m), p, x, p16);
  const __m128i w = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 32));
  __m256i pair = _mm256_set_m128i(times3(w), w);  // digits 0 | 1
  dot_plain<T>(top_digit(pair), 5, x, p16);
  pair = times3(times3(pair));  // 2 | 3
  dot_plain<T>(top_digit(pair), 6, x, p16);
  const __m128i last = _mm256_castsi256_si128(times3(times3(pair)));  // digit 4
  dot_plain<T>(top_digit(_mm256_set_m128i(tq1_high(blk + 48), last)), 7, x, p16);
  tq_finish<T>(p16, f16c(blk + 52), x, acc);
}

// Tokens [t0, t0 + T) of x against one row: y[t * y_stride] for t < T.
template <QuantType kType, int T>
TESSERA_AVX2 void row_pass(const uint8_t* row, size_t block_bytes, int64_t nb, const PackedActs& x, int t0, float* y,
                           int64_t y_stride) {
  float acc[T];
  for (int t = 0; t < T; ++t) acc[t] = 0.0f;
  for (int64_t b = 0; b < nb; ++b) {
    const int64_t i = b * x.n + t0;  // (block, token) index of the first pair
    const BlockTokens bt{x.q + i * 256, x.d + i, x.aux + i * x.n_aux};
    const uint8_t* blk = row + static_cast<size_t>(b) * block_bytes;
    if constexpr (kType == QuantType::kQ2_K) q2_k_block<T>(blk, bt, acc);
    if constexpr (kType == QuantType::kQ3_K) q3_k_block<T>(blk, bt, acc);
    if constexpr (kType == QuantType::kTQ1_0) tq1_0_block<T>(blk, bt, acc);
    if constexpr (kType == QuantType::kTQ2_0) tq2_0_block<T>(blk, bt, acc);
  }
  for (int t = 0; t < T; ++t) y[t * y_stride] = acc[t];
}

template <QuantType kType>
TESSERA_AVX2 void rows_of(const QMatmulArgs& a, const PackedActs& x, int64_t r0, int64_t r1) {
  const auto bb = static_cast<size_t>(quant_traits(kType).block_bytes);
  const int64_t nb = a.k / kActBlock256;
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* row = a.w + static_cast<size_t>(r) * a.row_bytes;
    for (int t0 = 0; t0 < x.n; t0 += kTokens) {
      float* y = a.y + t0 * a.y_stride + r;
      switch (std::min(kTokens, x.n - t0)) {
        case 1: row_pass<kType, 1>(row, bb, nb, x, t0, y, a.y_stride); break;
        case 2: row_pass<kType, 2>(row, bb, nb, x, t0, y, a.y_stride); break;
        case 3: row_pass<kType, 3>(row, bb, nb, x, t0, y, a.y_stride); break;
        default: row_pass<kType, 4>(row, bb, nb, x, t0, y, a.y_stride); break;
      }
    }
  }
}

uint8_t* pack_scratch(size_t bytes) {
  thread_local std::vector<uint8_t> buf;
  if (buf.size() < bytes + 64) buf.resize(bytes + 64);
  auto addr = reinterpret_cast<uintptr_t>(buf.data());
  return buf.data() + ((64 - addr % 64) % 64);
}

}  // namespace

void qmatmul_low_bit_avx2(const QMatmulArgs& a, int64_t r0, int64_t r1) {
  const PackedActs x = pack_acts(a, pack_scratch(packed_acts_bytes(a)));
  switch (a.type) {
    case QuantType::kQ2_K: return rows_of<QuantType::kQ2_K>(a, x, r0, r1);
    case QuantType::kQ3_K: return rows_of<QuantType::kQ3_K>(a, x, r0, r1);
    case QuantType::kTQ1_0: return rows_of<QuantType::kTQ1_0>(a, x, r0, r1);
    case QuantType::kTQ2_0: return rows_of<QuantType::kTQ2_0>(a, x, r0, r1);
    default: return qmatmul_scalar(a, r0, r1);
  }
}

}  // namespace tessera::cpu

#else

namespace tessera::cpu {
void qmatmul_low_bit_avx2(const QMatmulArgs& a, int64_t r0, int64_t r1) { qmatmul_scalar(a, r0, r1); }
}  // namespace tessera::cpu

#endif
