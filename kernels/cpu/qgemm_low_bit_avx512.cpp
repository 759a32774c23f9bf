// AVX-512 (BW, VNNI) integer-dot kernels for the low-bit GGUF formats Q2_K, Q3_K, TQ1_0,
// TQ2_0 (the arithmetic is in qgemm.h): the AVX2 scheme (qgemm_low_bit_avx2.cpp) on 64-byte
// vectors. A 256-superblock is 4 vectors of 64 consecutive elements: the 2-bit planes of
// Q2_K / Q3_K / TQ2_0 take a 32-byte half of the plane bytes in both halves of a vector, shifted
// by 2s and 2s + 2 (srlv); Q3_K's high bits come from a byte test of the mask; TQ1_0's digits
// from two unsigned byte compares. vpdpwssd adds the scaled pmaddwd parts, vpdpbusd the
// unscaled ternary dots. One horizontal sum per block and token, then the contract's scalar
// fmas: bit-identical to the scalar and AVX2 paths.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/cpu/qgemm.h"

#if defined(__x86_64__)
#include <immintrin.h>

#define TESSERA_AVX512 \
  __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,avx2,fma,f16c")))
#define TESSERA_AVX512_INLINE inline __attribute__((always_inline)) TESSERA_AVX512

namespace tessera::cpu {
namespace {

constexpr int kTokens = 8;  // tokens per pass over a row (the accumulators stay in the 32 registers)

// pshufb indices spreading the 16 scales (broadcast to every 128-bit lane) over the int16 lanes
// of chunk c (elements 64c..64c+63): 128-bit lane k holds sub-block 4c + k. zx: zero-extended
// (Q2_K); dup: the byte twice, sign-extended by a shift (Q3_K).
struct ScaleIndex {
  alignas(64) std::array<std::array<int8_t, 64>, 4> zx{};
  alignas(64) std::array<std::array<int8_t, 64>, 4> dup{};
};
constexpr ScaleIndex make_scale_index() {
  ScaleIndex ix;
  for (int c = 0; c < 4; ++c)
    for (int i = 0; i < 64; ++i) {
      const auto s = static_cast<int8_t>(4 * c + i / 16);
      ix.zx[c][i] = i % 2 == 0 ? s : static_cast<int8_t>(-128);
      ix.dup[c][i] = s;
    }
  return ix;
}
constexpr ScaleIndex kScaleIndex = make_scale_index();

TESSERA_AVX512_INLINE __m512i load64(const void* p) { return _mm512_loadu_si512(p); }
TESSERA_AVX512_INLINE __m256i load32(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }

TESSERA_AVX512_INLINE float f16c(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}

TESSERA_AVX512_INLINE __m256i fold(__m512i v) {
  return _mm256_add_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64(v, 1));
}

TESSERA_AVX512_INLINE int32_t hsum(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
  return _mm_cvtsi128_si32(s);
}

TESSERA_AVX512_INLINE void hsum2(__m256i a, __m256i b, int32_t* sa, int32_t* sb) {
  __m256i h = _mm256_hadd_epi32(a, b);
  h = _mm256_hadd_epi32(h, h);
  const __m128i s = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
  *sa = _mm_cvtsi128_si32(s);
  *sb = _mm_extract_epi32(s, 1);
}

// The 16 signed Q3_K scales as int8 (see qgemm_low_bit_avx2.cpp).
TESSERA_AVX512_INLINE __m128i q3_k_scales(const uint8_t* blk) {
  const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 94));
  const __m128i m4 = _mm_set1_epi8(0x0F);
  const __m128i a = _mm_shuffle_epi8(v, _mm_setr_epi8(2, 3, 4, 5, 6, 7, 8, 9, 2, 3, 4, 5, 6, 7, 8, 9));
  const __m128i low = _mm_blend_epi16(_mm_and_si128(a, m4), _mm_and_si128(_mm_srli_epi16(a, 4), m4), 0xF0);
  const __m128i b = _mm_shuffle_epi8(v, _mm_setr_epi8(10, 11, 12, 13, 10, 11, 12, 13, 10, 11, 12, 13, 10, 11, 12, 13));
  const __m128i high = _mm_and_si128(_mm_srlv_epi32(b, _mm_setr_epi32(0, 2, 4, 6)), _mm_set1_epi8(3));
  return _mm_sub_epi8(_mm_or_si128(low, _mm_slli_epi16(high, 4)), _mm_set1_epi8(32));
}

// 2-bit levels of chunk c = 2h + j (elements 64c..64c+63) from the plane's 32 bytes of half h
// in both halves of `half2`: planes 2j (lower half) and 2j + 1 (upper half).
TESSERA_AVX512_INLINE __m512i plane_chunk(__m512i half2, int j) {
  const __m512i shift = _mm512_inserti64x4(_mm512_set1_epi16(static_cast<int16_t>(4 * j)),
                                           _mm256_set1_epi16(static_cast<int16_t>(4 * j + 2)), 1);
  return _mm512_and_si512(_mm512_srlv_epi16(half2, shift), _mm512_set1_epi8(3));
}

TESSERA_AVX512_INLINE __m512i bcast_half(const uint8_t* p) { return _mm512_broadcast_i64x4(load32(p)); }

// Bytes times 3 (mod 256).
TESSERA_AVX512_INLINE __m512i times3(__m512i m) { return _mm512_add_epi8(m, _mm512_add_epi8(m, m)); }
TESSERA_AVX512_INLINE __m256i times3(__m256i m) { return _mm256_add_epi8(m, _mm256_add_epi8(m, m)); }
TESSERA_AVX512_INLINE __m128i times3(__m128i m) { return _mm_add_epi8(m, _mm_add_epi8(m, m)); }

// The top base-3 digit of each byte m: (m * 3) >> 8 = (m >= 86) + (m >= 171).
TESSERA_AVX512_INLINE __m512i top_digit(__m512i m) {
  const __m512i one = _mm512_set1_epi8(1);
  const __m512i u = _mm512_maskz_mov_epi8(_mm512_cmpge_epu8_mask(m, _mm512_set1_epi8(86)), one);
  return _mm512_mask_add_epi8(u, _mm512_cmpge_epu8_mask(m, _mm512_set1_epi8(static_cast<char>(171))), u, one);
}

// The 4 TQ1_0 high bytes times 3^p (mod 256, bytewise) in dword p = 0..3.
TESSERA_AVX512_INLINE __m128i tq1_high(const uint8_t* qh) {
  uint32_t h;
  std::memcpy(&h, qh, 4);
  uint32_t v[4];
  for (uint32_t p = 0, c = 1; p < 4; ++p, c *= 3)
    v[p] = ((h & 0x00FF00FFu) * c & 0x00FF00FFu) | ((h & 0xFF00FF00u) * c & 0xFF00FF00u);
  return _mm_setr_epi32(static_cast<int>(v[0]), static_cast<int>(v[1]), static_cast<int>(v[2]), static_cast<int>(v[3]));
}

struct BlockTokens {
  const int8_t* q;
  const float* dx;
  const int32_t* aux;
};

template <int T>
TESSERA_AVX512_INLINE void dot_scaled(__m512i u, __m512i scv, int c, const BlockTokens& x, __m512i* iv) {
  for (int t = 0; t < T; ++t)
    iv[t] = _mm512_dpwssd_epi32(iv[t], _mm512_maddubs_epi16(u, load64(x.q + 256 * t + 64 * c)), scv);
}
template <int T>
TESSERA_AVX512_INLINE void dot_plain(__m512i u, int c, const BlockTokens& x, __m512i* iv) {
  for (int t = 0; t < T; ++t) iv[t] = _mm512_dpbusd_epi32(iv[t], u, load64(x.q + 256 * t + 64 * c));
}

template <int T>
TESSERA_AVX512_INLINE void q2_k_block(const uint8_t* blk, const BlockTokens& x, float* acc) {
  const __m128i sm = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk));
  const __m512i sc = _mm512_broadcast_i32x4(_mm_and_si128(sm, _mm_set1_epi8(0x0F)));
  __m512i iv[T];
  for (int t = 0; t < T; ++t) iv[t] = _mm512_setzero_si512();
  for (int h = 0; h < 2; ++h) {
    const __m512i half2 = bcast_half(blk + 16 + 32 * h);
    for (int j = 0; j < 2; ++j) {
      const int c = 2 * h + j;
      dot_scaled<T>(plane_chunk(half2, j), _mm512_shuffle_epi8(sc, load64(kScaleIndex.zx[c].data())), c, x, iv);
    }
  }
  const __m256i m16 = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(sm, 4), _mm_set1_epi8(0x0F)));
  const float d = f16c(blk + 80), dmin = f16c(blk + 82);
  for (int t = 0; t < T; ++t) {
    int32_t isum, msum;
    hsum2(fold(iv[t]), _mm256_madd_epi16(m16, load32(x.aux + 8 * t)), &isum, &msum);
    acc[t] = std::fma(static_cast<float>(isum), d * x.dx[t], acc[t]);
    acc[t] = std::fma(static_cast<float>(-msum), dmin * x.dx[t], acc[t]);
  }
}

template <int T>
TESSERA_AVX512_INLINE void q3_k_block(const uint8_t* blk, const BlockTokens& x, float* acc) {
  const __m128i sc8 = q3_k_scales(blk);
  const __m512i sc = _mm512_broadcast_i32x4(sc8);
  const __m512i hm = bcast_half(blk);  // bit p of byte l: the high bit of element 32p + l
  const __m512i four = _mm512_set1_epi8(4);
  __m512i iv[T];
  for (int t = 0; t < T; ++t) iv[t] = _mm512_setzero_si512();
  for (int h = 0; h < 2; ++h) {
    const __m512i half2 = bcast_half(blk + 32 + 32 * h);
    for (int j = 0; j < 2; ++j) {
      const int c = 2 * h + j;
      // Elements 64c + l: bit 2c of hmask byte l (lower half), 64c + 32 + l: bit 2c + 1.
      const __m512i bit = _mm512_inserti64x4(_mm512_set1_epi8(static_cast<char>(1 << (2 * c))),
                                             _mm256_set1_epi8(static_cast<char>(1 << (2 * c + 1))), 1);
      const __m512i low = plane_chunk(half2, j);
      const __m512i u = _mm512_mask_add_epi8(low, _mm512_test_epi8_mask(hm, bit), low, four);
      dot_scaled<T>(u, _mm512_srai_epi16(_mm512_shuffle_epi8(sc, load64(kScaleIndex.dup[c].data())), 8), c, x, iv);
    }
  }
  const __m256i sc16 = _mm256_cvtepi8_epi16(sc8);
  const float d = f16c(blk + 108);
  for (int t = 0; t < T; ++t) {
    const __m256i corr = _mm256_madd_epi16(sc16, load32(x.aux + 8 * t));
    const int32_t isum = hsum(_mm256_sub_epi32(fold(iv[t]), _mm256_slli_epi32(corr, 2)));
    acc[t] = std::fma(static_cast<float>(isum), d * x.dx[t], acc[t]);
  }
}

template <int T>
TESSERA_AVX512_INLINE void tq_finish(const __m512i* iv, float d, const BlockTokens& x, float* acc) {
  for (int t = 0; t < T; ++t) {
    const int32_t isum = hsum(fold(iv[t])) - x.aux[t];
    acc[t] = std::fma(static_cast<float>(isum), d * x.dx[t], acc[t]);
  }
}

template <int T>
TESSERA_AVX512_INLINE void tq2_0_block(const uint8_t* blk, const BlockTokens& x, float* acc) {
  __m512i iv[T];
  for (int t = 0; t < T; ++t) iv[t] = _mm512_setzero_si512();
  for (int h = 0; h < 2; ++h) {
    const __m512i half2 = bcast_half(blk + 32 * h);
    for (int j = 0; j < 2; ++j) dot_plain<T>(plane_chunk(half2, j), 2 * h + j, x, iv);
  }
  tq_finish<T>(iv, f16c(blk + 64), x, acc);
}

// Chunks: [digit 0 | 1] and [2 | 3] of bytes 0-31 (elements 0..127), [digit 4 of bytes 0-31 |
// digits 0, 1 of bytes 32-47] (128..191), [digits 2, 3 of bytes 32-47 | digit 4 of bytes 32-47,
// the 4 high bytes' digits 0..3] (192..255).
template <int T>
TESSERA_AVX512_INLINE void tq1_0_block(const uint8_t* blk, const BlockTokens& x, float* acc) {
  __m512i iv[T];
  for (int t = 0; t < T; ++t) iv[t] = _mm512_setzero_si512();
  const __m512i v = bcast_half(blk);
  __m512i m = _mm512_mask_blend_epi64(0xF0, v, times3(v));  // bytes * [1 | 3]
  dot_plain<T>(top_digit(m), 0, x, iv);
  m = times3(times3(m));  // [9 | 27]
  dot_plain<T>(top_digit(m), 1, x, iv);
  m = times3(times3(m));  // [81 | -]
  const __m128i w = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 32));
  const __m256i w01 = _mm256_set_m128i(times3(w), w);
  dot_plain<T>(top_digit(_mm512_inserti64x4(m, w01, 1)), 2, x, iv);
  const __m256i w23 = times3(times3(w01));
  const __m128i w4 = _mm256_castsi256_si128(times3(times3(w23)));
  const __m256i tail = _mm256_set_m128i(tq1_high(blk + 48), w4);
  dot_plain<T>(top_digit(_mm512_inserti64x4(_mm512_castsi256_si512(w23), tail, 1)), 3, x, iv);
  tq_finish<T>(iv, f16c(blk + 52), x, acc);
}

template <QuantType kType, int T>
TESSERA_AVX512 void row_pass(const uint8_t* row, size_t block_bytes, int64_t nb, const PackedActs& x, int t0, float* y,
                             int64_t y_stride) {
  float acc[T];
  for (int t = 0; t < T; ++t) acc[t] = 0.0f;
  for (int64_t b = 0; b < nb; ++b) {
    const int64_t i = b * x.n + t0;
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
TESSERA_AVX512 void rows_of(const QMatmulArgs& a, const PackedActs& x, int64_t r0, int64_t r1) {
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
        case 4: row_pass<kType, 4>(row, bb, nb, x, t0, y, a.y_stride); break;
        case 5: row_pass<kType, 5>(row, bb, nb, x, t0, y, a.y_stride); break;
        case 6: row_pass<kType, 6>(row, bb, nb, x, t0, y, a.y_stride); break;
        case 7: row_pass<kType, 7>(row, bb, nb, x, t0, y, a.y_stride); break;
        default: row_pass<kType, 8>(row, bb, nb, x, t0, y, a.y_stride); break;
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

void qmatmul_low_bit_avx512(const QMatmulArgs& a, int64_t r0, int64_t r1) {
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
void qmatmul_low_bit_avx512(const QMatmulArgs& a, int64_t r0, int64_t r1) { qmatmul_scalar(a, r0, r1); }
}  // namespace tessera::cpu

#endif
