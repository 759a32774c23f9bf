// Conversions between fp32 and the QuantType byte layouts: portable scalar decoders (the
// reference) and AVX2 instances that agree with them bit for bit.
//
// GGUF block layouts (ggml's, little-endian, no padding):
//   Q8_0  34 B / 32:  f16 d | i8 qs[32]                          x = d * qs[j]
//   Q4_0  18 B / 32:  f16 d | u8 qs[16]                          x = (nib - 8) * d
//                     element j < 16: low nibble of qs[j]; element j + 16: high nibble
//   Q5_0  22 B / 32:  f16 d | u8 qh[4] | u8 qs[16]               x = ((nib | hb << 4) - 16) * d
//                     qh read as little-endian u32, bit j = high bit of element j
//   Q4_K 144 B / 256: f16 d | f16 dmin | u8 scales[12] | u8 qs[128]
//   Q5_K 176 B / 256: f16 d | f16 dmin | u8 scales[12] | u8 qh[32] | u8 qs[128]
//                     8 sub-blocks of 32, x = d * sc[s] * q - dmin * m[s] (sc, m: 6-bit)
//                     each 64-element chunk c uses 32 bytes of qs: low nibbles are elements
//                     64c .. 64c+31, high nibbles 64c+32 .. 64c+63; Q5_K's fifth bit of
//                     element 64c + l is bit 2c of qh[l], of element 64c + 32 + l bit 2c + 1.
//   Q6_K 210 B / 256: u8 ql[128] | u8 qh[64] | i8 scales[16] | f16 d
//                     x = d * scales[e / 16] * (q6 - 32); per 128-element half h (ql += 64h,
//                     qh += 32h), for l < 32: element l and l+64 take the low / high nibble of
//                     ql[l], elements l+32 and l+96 those of ql[l+32], and their top two bits
//                     are bits 0-1, 4-5 (l, l+64) and 2-3, 6-7 (l+32, l+96) of qh[l].
//   The 2-bit plane of Q2_K / Q3_K / TQ2_0 (64 B): element 128h + 32s + l is bits 2s, 2s+1 of
//   byte 32h + l.
//   Q2_K   84 B / 256: u8 scales[16] | u8 qs[64] | f16 d | f16 dmin
//                     16 sub-blocks of 16, x = (d * (sc & 15)) * q - dmin * (sc >> 4), q 0..3
//   Q3_K  110 B / 256: u8 hmask[32] | u8 qs[64] | u8 scales[12] | f16 d
//                     x = (d * sc) * (q2 - 4 * !hbit), hbit = bit e / 32 of hmask[e % 32];
//                     sc signed 6-bit of sub-block e / 16 (packing at cpu::q3_k_scale, qgemm.h)
//   TQ1_0  54 B / 256: u8 qs[48] | u8 qh[4] | f16 d     x = d * t, t in {-1, 0, 1},
//                     five (qh: four) base-3 digits per byte (packing at tq1_trit)
//   TQ2_0  66 B / 256: u8 qs[64] | f16 d                x = d * (q2 - 1)
//   These four have scalar decoders only; matmul reads them with the integer-dot kernels
//   (kernels/cpu/qgemm.h); kernels/cuda/gguf_gemm.cu's decode_low_bit repeats them element by
//   element.
#include "kernels/quant.h"
#include "kernels/cpu/int_quant.h"
#include "kernels/cpu/qgemm.h"
#include "kernels/cpu/quant_fit.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "common/check.h"
#include "kernels/cpu/vec.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define TESSERA_X86 1
#define TESSERA_AVX2 __attribute__((target("avx2,fma,f16c")))
#endif

// The block decoders are inlined into a portable and an AVX2 instance of each row decoder;
// the compiler vectorises the latter. Both compute every element with the same single
// operations (fp contraction is off for this file), so they agree bit for bit.
#define TESSERA_DEQUANT_INLINE inline __attribute__((always_inline))

namespace tessera {
namespace {

using quant_fit::clamp_round;
using quant_fit::kQk;
using quant_fit::kQkK;
using quant_fit::signed_absmax;
using quant_fit::store_f16;

inline float load_f16(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return fp16_to_f32(h);
}

// 6-bit scale and min of sub-block j (0..7) from the 12 packed bytes of Q4_K / Q5_K:
// sub-blocks 0-3 use the low 6 bits of bytes j (scale) and j+4 (min); sub-blocks 4-7 take their
// low 4 bits from byte j+4 (scale: low nibble, min: high nibble) and their top 2 bits from the
// top 2 bits of bytes j-4 (scale) and j (min).
inline void unpack_scale_min(const uint8_t* s, int j, int* sc, int* m) {
  if (j < 4) {
    *sc = s[j] & 63;
    *m = s[j + 4] & 63;
  } else {
    *sc = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
    *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

// ---------------------------------------------------------------- dequantize

TESSERA_DEQUANT_INLINE void dequant_q8_0(const uint8_t* src, float* dst, int64_t nb) {
  for (int64_t b = 0; b < nb; ++b, src += 34, dst += kQk) {
    const float d = load_f16(src);
    const auto* qs = reinterpret_cast<const int8_t*>(src + 2);
    for (int j = 0; j < kQk; ++j) dst[j] = d * static_cast<float>(qs[j]);
  }
}

TESSERA_DEQUANT_INLINE void dequant_q4_0(const uint8_t* src, float* dst, int64_t nb) {
  for (int64_t b = 0; b < nb; ++b, src += 18, dst += kQk) {
    const float d = load_f16(src);
    const uint8_t* qs = src + 2;
    for (int j = 0; j < 16; ++j) {
      dst[j] = static_cast<float>((qs[j] & 0xF) - 8) * d;
      dst[j + 16] = static_cast<float>((qs[j] >> 4) - 8) * d;
    }
  }
}

TESSERA_DEQUANT_INLINE void dequant_q5_0(const uint8_t* src, float* dst, int64_t nb) {
  for (int64_t b = 0; b < nb; ++b, src += 22, dst += kQk) {
    const float d = load_f16(src);
    uint32_t qh;
    std::memcpy(&qh, src + 2, 4);
    const uint8_t* qs = src + 6;
    for (int j = 0; j < 16; ++j) {
      const int lo = (qs[j] & 0xF) | static_cast<int>(((qh >> j) & 1u) << 4);
      const int hi = (qs[j] >> 4) | static_cast<int>(((qh >> (j + 16)) & 1u) << 4);
      dst[j] = static_cast<float>(lo - 16) * d;
      dst[j + 16] = static_cast<float>(hi - 16) * d;
    }
  }
}

// Shared by Q4_K and Q5_K; qh == nullptr for Q4_K.
TESSERA_DEQUANT_INLINE void dequant_k_affine(const uint8_t* hdr, const uint8_t* qh, const uint8_t* qs, float* dst) {
  const float d = load_f16(hdr);
  const float dmin = load_f16(hdr + 2);
  const uint8_t* scales = hdr + 4;
  for (int c = 0; c < 4; ++c) {  // 64-element chunks
    int sc0, m0, sc1, m1;
    unpack_scale_min(scales, 2 * c, &sc0, &m0);
    unpack_scale_min(scales, 2 * c + 1, &sc1, &m1);
    const float d0 = d * static_cast<float>(sc0), mm0 = dmin * static_cast<float>(m0);
    const float d1 = d * static_cast<float>(sc1), mm1 = dmin * static_cast<float>(m1);
    const uint8_t* q = qs + 32 * c;
    for (int l = 0; l < 32; ++l) {
      int lo = q[l] & 0xF, hi = q[l] >> 4;
      if (qh != nullptr) {
        lo |= ((qh[l] >> (2 * c)) & 1) << 4;
        hi |= ((qh[l] >> (2 * c + 1)) & 1) << 4;
      }
      dst[64 * c + l] = d0 * static_cast<float>(lo) - mm0;
      dst[64 * c + 32 + l] = d1 * static_cast<float>(hi) - mm1;
    }
  }
}

TESSERA_DEQUANT_INLINE void dequant_q4_k(const uint8_t* src, float* dst, int64_t nb) {
  for (int64_t b = 0; b < nb; ++b, src += 144, dst += kQkK)
    dequant_k_affine(src, nullptr, src + 16, dst);
}

TESSERA_DEQUANT_INLINE void dequant_q5_k(const uint8_t* src, float* dst, int64_t nb) {
  for (int64_t b = 0; b < nb; ++b, src += 176, dst += kQkK)
    dequant_k_affine(src, src + 16, src + 48, dst);
}

TESSERA_DEQUANT_INLINE void dequant_q6_k(const uint8_t* src, float* dst, int64_t nb) {
  for (int64_t b = 0; b < nb; ++b, src += 210, dst += kQkK) {
    const float d = load_f16(src + 208);
    const auto* sc = reinterpret_cast<const int8_t*>(src + 192);
    float ds[16];  // d * scale, rounded once as in x = (d * scale) * q
    for (int i = 0; i < 16; ++i) ds[i] = d * static_cast<float>(sc[i]);
    for (int h = 0; h < 2; ++h) {
      const uint8_t* ql = src + 64 * h;
      const uint8_t* qh = src + 128 + 32 * h;
      for (int g = 0; g < 4; ++g) {  // 32-element groups of this half, see the layout above
        const uint8_t* lb = ql + 32 * (g % 2);
        const int shift = g < 2 ? 0 : 4;
        for (int part = 0; part < 2; ++part) {
          const float scale = ds[8 * h + 2 * g + part];
          float* y = dst + 128 * h + 32 * g + 16 * part;
          for (int l = 16 * part; l < 16 * part + 16; ++l) {
            const int q = (((lb[l] >> shift) & 0xF) | (((qh[l] >> (2 * g)) & 3) << 4)) - 32;
            y[l - 16 * part] = scale * static_cast<float>(q);
          }
        }
      }
    }
  }
}

// Q2_K, Q3_K, TQ1_0, TQ2_0 share one 2-bit plane layout: 64 bytes, element 128h + 32s + l
// (h < 2, s < 4, l < 32) in bits 2s, 2s + 1 of byte 32h + l.
TESSERA_DEQUANT_INLINE int plane2(const uint8_t* qs, int e) {
  return (qs[32 * (e / 128) + e % 32] >> (2 * ((e / 32) % 4))) & 3;
}

TESSERA_DEQUANT_INLINE void dequant_q2_k(const uint8_t* src, float* dst, int64_t nb) {
  for (int64_t b = 0; b < nb; ++b, src += 84, dst += kQkK) {
    const uint8_t* scales = src;  // sub-block i of 16: scale = low nibble, min = high nibble
    const uint8_t* qs = src + 16;
    const float d = load_f16(src + 80), dmin = load_f16(src + 82);
    for (int i = 0; i < 16; ++i) {
      const float dl = d * static_cast<float>(scales[i] & 0xF);  // rounded once, as ggml does
      const float ml = dmin * static_cast<float>(scales[i] >> 4);
      for (int e = 16 * i; e < 16 * i + 16; ++e) dst[e] = dl * static_cast<float>(plane2(qs, e)) - ml;
    }
  }
}

// The signed 6-bit scale of Q3_K sub-block j (0..15): kernels/cpu/qgemm.h, shared with matmul.
using cpu::q3_k_scale;

TESSERA_DEQUANT_INLINE void dequant_q3_k(const uint8_t* src, float* dst, int64_t nb) {
  for (int64_t b = 0; b < nb; ++b, src += 110, dst += kQkK) {
    const uint8_t* hmask = src;  // bit e / 32 of byte e % 32: the third bit of element e
    const uint8_t* qs = src + 32;
    const uint8_t* scales = src + 96;
    const float d = load_f16(src + 108);
    for (int i = 0; i < 16; ++i) {
      const float dl = d * static_cast<float>(q3_k_scale(scales, i));
      for (int e = 16 * i; e < 16 * i + 16; ++e) {
        const int high = (hmask[e % 32] >> (e / 32)) & 1;  // level = low2 + 4 * high, minus 4
        dst[e] = dl * static_cast<float>(plane2(qs, e) - (high ? 0 : 4));
      }
    }
  }
}

// TQ1_0 packs trits t + 1 (0..2) in base 3, most significant digit first, as a byte
// ceil(n * 256 / 243): digit p of a byte is the top trit of byte * 3^p (mod 256), read as
// (b * 3) >> 8. Bytes 0-31 hold elements 32p + l (p < 5), bytes 32-47 elements 160 + 16p + l,
// and the 4 bytes of qh elements 240 + 4p + l (p < 4, a fifth digit of 0).
TESSERA_DEQUANT_INLINE int tq1_trit(uint8_t byte, int p) { return cpu::tq1_digit(byte, p) - 1; }

TESSERA_DEQUANT_INLINE void dequant_tq1_0(const uint8_t* src, float* dst, int64_t nb) {
  for (int64_t b = 0; b < nb; ++b, src += 54, dst += kQkK) {
    const uint8_t* qs = src;
    const uint8_t* qh = src + 48;
    const float d = load_f16(src + 52);
    for (int p = 0; p < 5; ++p)
      for (int l = 0; l < 32; ++l) dst[32 * p + l] = d * static_cast<float>(tq1_trit(qs[l], p));
    for (int p = 0; p < 5; ++p)
      for (int l = 0; l < 16; ++l) dst[160 + 16 * p + l] = d * static_cast<float>(tq1_trit(qs[32 + l], p));
    for (int p = 0; p < 4; ++p)
      for (int l = 0; l < 4; ++l) dst[240 + 4 * p + l] = d * static_cast<float>(tq1_trit(qh[l], p));
  }
}

TESSERA_DEQUANT_INLINE void dequant_tq2_0(const uint8_t* src, float* dst, int64_t nb) {
  for (int64_t b = 0; b < nb; ++b, src += 66, dst += kQkK) {
    const float d = load_f16(src + 64);
    for (int e = 0; e < kQkK; ++e) dst[e] = d * static_cast<float>(plane2(src, e) - 1);
  }
}

#ifdef TESSERA_X86
// AVX2 instances of the block decoders: Q8_0 and the Q5 formats by compiler vectorisation of
// the inlined scalar code (see TESSERA_DEQUANT_INLINE), the most common formats by hand.
// Each element gets the same single operations as in the scalar decoder.

// fp16 -> fp32 in one instruction (exact, like fp16_to_f32, which is a call per block).
TESSERA_AVX2 inline float load_f16_f16c(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}

// Converts 32 bytes (int8 or uint8 values per kSigned) to floats, times `scale_lo` for
// elements 0-15 and `scale_hi` for 16-31, minus `offset`; stores 32 floats at y.
template <bool kSigned, bool kOffset>
TESSERA_AVX2 inline void store32(__m256i bytes, __m256 scale_lo, __m256 scale_hi, __m256 offset,
                                 float* y) {
  const __m128i lo = _mm256_castsi256_si128(bytes);
  const __m128i hi = _mm256_extracti128_si256(bytes, 1);
  const __m128i parts[4] = {lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)};
  for (int p = 0; p < 4; ++p) {
    const __m256i w = kSigned ? _mm256_cvtepi8_epi32(parts[p]) : _mm256_cvtepu8_epi32(parts[p]);
    __m256 v = _mm256_mul_ps(p < 2 ? scale_lo : scale_hi, _mm256_cvtepi32_ps(w));
    if (kOffset) v = _mm256_sub_ps(v, offset);
    _mm256_storeu_ps(y + 8 * p, v);
  }
}

TESSERA_AVX2 void dequant_q4_0_avx2(const uint8_t* src, float* dst, int64_t nb) {
  const __m128i mask = _mm_set1_epi8(0xF), eight = _mm_set1_epi8(8);
  for (int64_t b = 0; b < nb; ++b, src += 18, dst += kQk) {
    const __m256 d = _mm256_set1_ps(load_f16_f16c(src));
    const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 2));
    const __m128i lo = _mm_sub_epi8(_mm_and_si128(q, mask), eight);
    const __m128i hi = _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(q, 4), mask), eight);
    store32<true, false>(_mm256_set_m128i(hi, lo), d, d, d, dst);
  }
}

TESSERA_AVX2 void dequant_q4_k_avx2(const uint8_t* src, float* dst, int64_t nb) {
  const __m256i mask = _mm256_set1_epi8(0xF);
  for (int64_t b = 0; b < nb; ++b, src += 144, dst += kQkK) {
    const float d = load_f16_f16c(src), dmin = load_f16_f16c(src + 2);
    for (int c = 0; c < 4; ++c) {
      int sc0, m0, sc1, m1;
      unpack_scale_min(src + 4, 2 * c, &sc0, &m0);
      unpack_scale_min(src + 4, 2 * c + 1, &sc1, &m1);
      const __m256 d0 = _mm256_set1_ps(d * static_cast<float>(sc0));
      const __m256 o0 = _mm256_set1_ps(dmin * static_cast<float>(m0));
      const __m256 d1 = _mm256_set1_ps(d * static_cast<float>(sc1));
      const __m256 o1 = _mm256_set1_ps(dmin * static_cast<float>(m1));
      const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + 16 + 32 * c));
      store32<false, true>(_mm256_and_si256(q, mask), d0, d0, o0, dst + 64 * c);
      store32<false, true>(_mm256_and_si256(_mm256_srli_epi16(q, 4), mask), d1, d1, o1,
                           dst + 64 * c + 32);
    }
  }
}

TESSERA_AVX2 void dequant_q6_k_avx2(const uint8_t* src, float* dst, int64_t nb) {
  const __m256i mask4 = _mm256_set1_epi8(0xF), mask2 = _mm256_set1_epi8(3);
  const __m256i bias = _mm256_set1_epi8(32);
  for (int64_t b = 0; b < nb; ++b, src += 210, dst += kQkK) {
    const float d = load_f16_f16c(src + 208);
    const auto* sc = reinterpret_cast<const int8_t*>(src + 192);
    for (int h = 0; h < 2; ++h) {
      const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + 128 + 32 * h));
      for (int g = 0; g < 4; ++g) {
        const __m256i lb =
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + 64 * h + 32 * (g % 2)));
        const __m256i low = _mm256_and_si256(g < 2 ? lb : _mm256_srli_epi16(lb, 4), mask4);
        const __m256i top = _mm256_and_si256(_mm256_srli_epi16(qh, 2 * g), mask2);
        const __m256i q = _mm256_sub_epi8(_mm256_or_si256(low, _mm256_slli_epi16(top, 4)), bias);
        const int si = 8 * h + 2 * g;
        store32<true, false>(q, _mm256_set1_ps(d * static_cast<float>(sc[si])),
                             _mm256_set1_ps(d * static_cast<float>(sc[si + 1])), _mm256_setzero_ps(),
                             dst + 128 * h + 32 * g);
      }
    }
  }
}

TESSERA_AVX2 void dequant_q8_0_avx2(const uint8_t* __restrict s, float* __restrict d, int64_t nb) {
  dequant_q8_0(s, d, nb);
}
TESSERA_AVX2 void dequant_q5_0_avx2(const uint8_t* __restrict s, float* __restrict d, int64_t nb) {
  dequant_q5_0(s, d, nb);
}
TESSERA_AVX2 void dequant_q5_k_avx2(const uint8_t* __restrict s, float* __restrict d, int64_t nb) {
  dequant_q5_k(s, d, nb);
}
TESSERA_AVX2 void dequant_f16_avx2(const uint8_t* s, float* d, int64_t k) {
  int64_t i = 0;
  for (; i + 8 <= k; i += 8)
    _mm256_storeu_ps(d + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 2 * i))));
  for (; i < k; ++i) d[i] = load_f16(s + 2 * i);
}
#endif

// ---------------------------------------------------------------- quantize: 32-blocks

// Symmetric scale search for x ~= scale * q, q in [qmin, qmax] (qmin = -qmax - 1): the extreme
// element is mapped near either end of the range over a fan of step sizes, each followed by a
// least-squares rescale; returns the best (signed) scale. Beats plain round-to-nearest by a
// few percent of RMS error at 4-6 bits.
float fit_symmetric(const float* x, int n, int qmax) {
  const int qmin = -qmax - 1;
  const float v = signed_absmax(x, n);
  if (v == 0.0f) return 0.0f;
  double sxx = 0;
  for (int i = 0; i < n; ++i) sxx += static_cast<double>(x[i]) * x[i];
  float best_scale = v / static_cast<float>(qmin);
  double best_err = INFINITY;
  for (int side = 0; side < 2; ++side) {
    for (int step = -9; step <= 9; ++step) {
      const float levels = static_cast<float>(side == 0 ? qmin : qmax) + 0.1f * static_cast<float>(step);
      const float inv = levels / v;
      double sqx = 0, sqq = 0;
      for (int i = 0; i < n; ++i) {
        const int q = clamp_round(x[i] * inv, qmin, qmax);
        sqx += static_cast<double>(q) * x[i];
        sqq += static_cast<double>(q) * q;
      }
      if (sqq <= 0) continue;
      const double err = sxx - sqx * sqx / sqq;
      if (err < best_err) {
        best_err = err;
        best_scale = static_cast<float>(sqx / sqq);
      }
    }
  }
  return best_scale;
}

// Symmetric scales of the 16 sub-blocks of 16 of a 256-element super-block (levels up to
// qmax), and the one of largest magnitude: Q6_K and Q3_K map it to the most negative
// super-block level so their scale range is used in full.
float fit_sub_block_scales(const float* x, int qmax, float scales[16]) {
  for (int s = 0; s < 16; ++s) scales[s] = fit_symmetric(x + 16 * s, 16, qmax);
  return signed_absmax(scales, 16);
}

void quant_q8_0(const float* x, uint8_t* dst, int64_t nb) {
  for (int64_t b = 0; b < nb; ++b, x += kQk, dst += 34) {
    float amax = 0.0f;
    for (int j = 0; j < kQk; ++j) amax = std::max(amax, std::fabs(x[j]));
    const float d = store_f16(dst, amax / 127.0f);
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    auto* qs = reinterpret_cast<int8_t*>(dst + 2);
    for (int j = 0; j < kQk; ++j) qs[j] = static_cast<int8_t>(clamp_round(x[j] * id, -127, 127));
  }
}

void quant_q4_0(const float* x, uint8_t* dst, int64_t nb) {
  for (int64_t b = 0; b < nb; ++b, x += kQk, dst += 18) {
    const float d = store_f16(dst, fit_symmetric(x, kQk, 7));
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    int levels[kQk];
    for (int j = 0; j < kQk; ++j) levels[j] = clamp_round(x[j] * id, -8, 7) + 8;
    quant_fit::pack_q4_0_levels(levels, dst + 2);
  }
}

void quant_q5_0(const float* x, uint8_t* dst, int64_t nb) {
  for (int64_t b = 0; b < nb; ++b, x += kQk, dst += 22) {
    const float d = store_f16(dst, fit_symmetric(x, kQk, 15));
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    int levels[kQk];
    for (int j = 0; j < kQk; ++j) levels[j] = clamp_round(x[j] * id, -16, 15) + 16;
    quant_fit::pack_q5_0_levels(levels, dst + 2, dst + 6);
  }
}

// ---------------------------------------------------------------- quantize: K-quants

struct AffineFit {
  float scale = 0.0f;  // >= 0
  float min = 0.0f;    // >= 0; x ~= scale * q - min, q in [0, nmax]
};

// Least-squares fit of x ~= scale * q + offset for fixed q, with offset <= 0 (the formats
// store a non-negative min that is subtracted). Returns the squared error.
float refit_affine(const float* x, const int* q, int n, float* scale, float* offset) {
  double sq = 0, sqq = 0, sx = 0, sqx = 0;
  for (int i = 0; i < n; ++i) {
    sq += q[i];
    sqq += static_cast<double>(q[i]) * q[i];
    sx += x[i];
    sqx += static_cast<double>(q[i]) * x[i];
  }
  const double det = n * sqq - sq * sq;
  double a = 0, b = 0;
  if (det > 0) {
    a = (n * sqx - sq * sx) / det;
    b = (sqq * sx - sq * sqx) / det;
  }
  if (det <= 0 || b > 0 || a <= 0) {  // pin the offset at 0 and fit the scale alone
    b = 0;
    a = sqq > 0 ? sqx / sqq : 0;
    if (a < 0) a = 0;
  }
  *scale = static_cast<float>(a);
  *offset = static_cast<float>(b);
  double err = 0;
  for (int i = 0; i < n; ++i) {
    const double e = a * q[i] + b - x[i];
    err += e * e;
  }
  return static_cast<float>(err);
}

// Scale search for one sub-block of an asymmetric K-quant: try a fan of step sizes around
// (max - min) / nmax, assign q by rounding, refit scale and offset by least squares, and keep
// the best; then a few assign/refit rounds on the winner.
AffineFit fit_affine(const float* x, int n, int nmax) {
  float lo = 0.0f, hi = x[0];
  for (int i = 0; i < n; ++i) {
    lo = std::min(lo, x[i]);
    hi = std::max(hi, x[i]);
  }
  AffineFit fit;
  if (!(hi > lo)) {  // constant non-positive sub-block
    fit.min = -lo;
    return fit;
  }
  int q[kQkK];
  auto assign = [&](float scale, float offset) {
    const float inv = scale > 0 ? 1.0f / scale : 0.0f;
    for (int i = 0; i < n; ++i) q[i] = clamp_round((x[i] - offset) * inv, 0, nmax);
  };
  float best_err = INFINITY, best_scale = (hi - lo) / static_cast<float>(nmax), best_off = lo;
  for (int step = -10; step <= 10; ++step) {
    const float levels = static_cast<float>(nmax) + 0.1f * static_cast<float>(step);
    const float scale0 = (hi - lo) / levels;
    assign(scale0, lo);
    float scale, offset;
    const float err = refit_affine(x, q, n, &scale, &offset);
    if (err < best_err && scale > 0) {
      best_err = err;
      best_scale = scale;
      best_off = offset;
    }
  }
  for (int iter = 0; iter < 3; ++iter) {
    assign(best_scale, best_off);
    float scale, offset;
    const float err = refit_affine(x, q, n, &scale, &offset);
    if (!(err < best_err) || !(scale > 0)) break;
    best_err = err;
    best_scale = scale;
    best_off = offset;
  }
  fit.scale = best_scale;
  fit.min = -best_off;
  return fit;
}

// Quantizes one 256-element super-block of Q4_K (nmax 15) or Q5_K (nmax 31): fills the
// header (d, dmin, scales) at hdr and the per-element levels L[256].
void quant_k_affine_levels(const float* x, int nmax, uint8_t* hdr, int* levels) {
  AffineFit fits[8];
  float max_scale = 0.0f, max_min = 0.0f;
  for (int s = 0; s < 8; ++s) {
    fits[s] = fit_affine(x + 32 * s, 32, nmax);
    max_scale = std::max(max_scale, fits[s].scale);
    max_min = std::max(max_min, fits[s].min);
  }
  const float d = store_f16(hdr, max_scale / 63.0f);
  const float dmin = store_f16(hdr + 2, max_min / 63.0f);
  int sc[8], m[8];
  for (int s = 0; s < 8; ++s) {
    sc[s] = d > 0 ? clamp_round(fits[s].scale / d, 0, 63) : 0;
    m[s] = dmin > 0 ? clamp_round(fits[s].min / dmin, 0, 63) : 0;
  }
  quant_fit::pack_scale_min(hdr + 4, sc, m);
  for (int s = 0; s < 8; ++s) {
    const float eff_scale = d * static_cast<float>(sc[s]);
    const float eff_min = dmin * static_cast<float>(m[s]);
    const float inv = eff_scale > 0 ? 1.0f / eff_scale : 0.0f;
    for (int i = 0; i < 32; ++i)
      levels[32 * s + i] = clamp_round((x[32 * s + i] + eff_min) * inv, 0, nmax);
  }
}

void quant_q4_k(const float* x, uint8_t* dst, int64_t nb) {
  int levels[kQkK];
  for (int64_t b = 0; b < nb; ++b, x += kQkK, dst += 144) {
    quant_k_affine_levels(x, 15, dst, levels);
    quant_fit::pack_q4_k_levels(levels, dst + 16);
  }
}

void quant_q5_k(const float* x, uint8_t* dst, int64_t nb) {
  int levels[kQkK];
  for (int64_t b = 0; b < nb; ++b, x += kQkK, dst += 176) {
    quant_k_affine_levels(x, 31, dst, levels);
    quant_fit::pack_q5_k_levels(levels, dst + 16, dst + 48);
  }
}

void quant_q6_k(const float* x, uint8_t* dst, int64_t nb) {
  int levels[kQkK];
  for (int64_t b = 0; b < nb; ++b, x += kQkK, dst += 210) {
    float scales[16];
    const float max_scale = fit_sub_block_scales(x, 31, scales);
    // The largest scale maps to -128 so the int8 range is used in full.
    const float d = store_f16(dst + 208, max_scale / -128.0f);
    auto* sc = reinterpret_cast<int8_t*>(dst + 192);
    for (int s = 0; s < 16; ++s) {
      const int q = d != 0.0f ? clamp_round(scales[s] / d, -128, 127) : 0;
      sc[s] = static_cast<int8_t>(q);
      const float eff = d * static_cast<float>(q);
      const float inv = eff != 0.0f ? 1.0f / eff : 0.0f;
      for (int i = 0; i < 16; ++i) levels[16 * s + i] = clamp_round(x[16 * s + i] * inv, -32, 31) + 32;
    }
    quant_fit::pack_q6_k_levels(levels, dst);
  }
}

// ---------------------------------------------------------------- quantize: 2-bit and ternary

using quant_fit::set_plane2;

// Q2_K: 16 sub-blocks of 16, x ~= d * sc * q - dmin * m with q in 0..3 and 4-bit sc, m.
// The per-sub-block affine fit is the same search as Q4_K / Q5_K's; the super-block scales
// map the largest sub-block scale and min to 15, and levels are re-assigned with the
// quantized scales.
void quant_q2_k(const float* x, uint8_t* dst, int64_t nb) {
  for (int64_t b = 0; b < nb; ++b, x += kQkK, dst += 84) {
    AffineFit fits[16];
    float max_scale = 0.0f, max_min = 0.0f;
    for (int i = 0; i < 16; ++i) {
      fits[i] = fit_affine(x + 16 * i, 16, 3);
      max_scale = std::max(max_scale, fits[i].scale);
      max_min = std::max(max_min, fits[i].min);
    }
    const float d = store_f16(dst + 80, max_scale / 15.0f);
    const float dmin = store_f16(dst + 82, max_min / 15.0f);
    uint8_t* qs = dst + 16;
    std::memset(qs, 0, 64);
    for (int i = 0; i < 16; ++i) {
      const int sc = d > 0 ? clamp_round(fits[i].scale / d, 0, 15) : 0;
      const int m = dmin > 0 ? clamp_round(fits[i].min / dmin, 0, 15) : 0;
      dst[i] = static_cast<uint8_t>(sc | (m << 4));
      const float eff_scale = d * static_cast<float>(sc), eff_min = dmin * static_cast<float>(m);
      const float inv = eff_scale > 0 ? 1.0f / eff_scale : 0.0f;
      for (int e = 16 * i; e < 16 * i + 16; ++e) set_plane2(qs, e, clamp_round((x[e] + eff_min) * inv, 0, 3));
    }
  }
}

// Q3_K: 16 sub-blocks of 16, x ~= d * sc * q with q in -4..3 and a signed 6-bit sc; the
// largest sub-block scale maps to -32 so the scale range is used in full (as for Q6_K).
void quant_q3_k(const float* x, uint8_t* dst, int64_t nb) {
  for (int64_t b = 0; b < nb; ++b, x += kQkK, dst += 110) {
    float scales[16];
    const float max_scale = fit_sub_block_scales(x, 3, scales);
    const float d = store_f16(dst + 108, max_scale / -32.0f);
    int q[16], levels[kQkK];
    for (int i = 0; i < 16; ++i) {
      q[i] = d != 0.0f ? clamp_round(scales[i] / d, -32, 31) : 0;
      const float eff = d * static_cast<float>(q[i]);
      const float inv = eff != 0.0f ? 1.0f / eff : 0.0f;
      for (int e = 16 * i; e < 16 * i + 16; ++e) levels[e] = clamp_round(x[e] * inv, -4, 3) + 4;  // 0..7
    }
    quant_fit::pack_q3_k(q, levels, dst);
  }
}

// Ternary fit of 256 values, x ~= d * t with t in {-1, 0, 1}: for a given count n of nonzero
// trits the best choice is the n largest |x| with d their mean magnitude, which removes
// (sum of those |x|)^2 / n of squared error, so the best n is found by one pass over the
// magnitudes in decreasing order. Exact for weights that already are ternary (BitNet).
// Returns d (fp16-rounded through `d_out`) and trits in t[256].
void fit_ternary(const float* x, uint8_t* d_out, int* t) {
  float mag[kQkK];
  for (int i = 0; i < kQkK; ++i) mag[i] = std::fabs(x[i]);
  std::sort(mag, mag + kQkK, [](float a, float b) { return a > b; });
  double sum = 0, best_gain = 0;
  int best_n = 0;
  double best_sum = 0;
  for (int n = 1; n <= kQkK; ++n) {
    sum += mag[n - 1];
    const double gain = sum * sum / n;
    if (gain > best_gain) {
      best_gain = gain;
      best_n = n;
      best_sum = sum;
    }
  }
  const float d = store_f16(d_out, best_n > 0 ? static_cast<float>(best_sum / best_n) : 0.0f);
  // The threshold between 0 and +-1 is the smallest kept magnitude; with ties the first come
  // keep their trit so exactly best_n are nonzero.
  const float threshold = best_n > 0 ? mag[best_n - 1] : INFINITY;
  int kept = 0;
  for (int i = 0; i < kQkK; ++i) {
    const bool keep = d != 0.0f && std::fabs(x[i]) >= threshold && kept < best_n && std::fabs(x[i]) > 0.0f;
    kept += keep;
    t[i] = keep ? (x[i] > 0 ? 1 : -1) : 0;
  }
}

void quant_tq2_0(const float* x, uint8_t* dst, int64_t nb) {
  int t[kQkK];
  for (int64_t b = 0; b < nb; ++b, x += kQkK, dst += 66) {
    fit_ternary(x, dst + 64, t);
    quant_fit::pack_tq2_0(t, dst);
  }
}

void quant_tq1_0(const float* x, uint8_t* dst, int64_t nb) {
  int t[kQkK];
  for (int64_t b = 0; b < nb; ++b, x += kQkK, dst += 54) {
    fit_ternary(x, dst + 52, t);
    quant_fit::pack_tq1_0(t, dst);
  }
}

void check_row_length(QuantType type, int64_t k) {
  const int be = quant_traits(type).block_elems;
  TESSERA_CHECK(k >= 0 && k % be == 0, "{} row of {} elements: not a multiple of {}", quant_name(type),
                k, be);
}

}  // namespace

void dequantize_row(QuantType type, const void* src, float* dst, int64_t k) {
  check_row_length(type, k);
  const auto* s = static_cast<const uint8_t*>(src);
#ifdef TESSERA_X86
  if (cpu::simd_enabled()) {
    switch (type) {
      case QuantType::kF16: return dequant_f16_avx2(s, dst, k);
      case QuantType::kQ8_0: return dequant_q8_0_avx2(s, dst, k / kQk);
      case QuantType::kQ4_0: return dequant_q4_0_avx2(s, dst, k / kQk);
      case QuantType::kQ5_0: return dequant_q5_0_avx2(s, dst, k / kQk);
      case QuantType::kQ4_K: return dequant_q4_k_avx2(s, dst, k / kQkK);
      case QuantType::kQ5_K: return dequant_q5_k_avx2(s, dst, k / kQkK);
      case QuantType::kQ6_K: return dequant_q6_k_avx2(s, dst, k / kQkK);
      default: break;
    }
  }
#endif
  switch (type) {
    case QuantType::kF32:
      std::memcpy(dst, s, static_cast<size_t>(k) * 4);
      return;
    case QuantType::kF16:
      for (int64_t i = 0; i < k; ++i) dst[i] = load_f16(s + 2 * i);
      return;
    case QuantType::kBF16:
      for (int64_t i = 0; i < k; ++i) {
        uint16_t h;
        std::memcpy(&h, s + 2 * i, 2);
        dst[i] = bf16_to_f32(h);
      }
      return;
    case QuantType::kQ8_0: return dequant_q8_0(s, dst, k / kQk);
    case QuantType::kQ4_0: return dequant_q4_0(s, dst, k / kQk);
    case QuantType::kQ5_0: return dequant_q5_0(s, dst, k / kQk);
    case QuantType::kQ4_K: return dequant_q4_k(s, dst, k / kQkK);
    case QuantType::kQ5_K: return dequant_q5_k(s, dst, k / kQkK);
    case QuantType::kQ6_K: return dequant_q6_k(s, dst, k / kQkK);
    case QuantType::kQ2_K: return dequant_q2_k(s, dst, k / kQkK);
    case QuantType::kQ3_K: return dequant_q3_k(s, dst, k / kQkK);
    case QuantType::kTQ1_0: return dequant_tq1_0(s, dst, k / kQkK);
    case QuantType::kTQ2_0: return dequant_tq2_0(s, dst, k / kQkK);
    case QuantType::kI8:
      for (int64_t i = 0; i < k; ++i) dst[i] = static_cast<float>(static_cast<int8_t>(s[i]));
      return;
    case QuantType::kI32:
      for (int64_t i = 0; i < k; ++i) {
        int32_t v;
        std::memcpy(&v, s + 4 * i, 4);
        dst[i] = static_cast<float>(v);
      }
      return;
    case QuantType::kI8_CH: return cpu::dequant_i8_ch(s, dst, k);
    case QuantType::kI4_G128: return cpu::dequant_i4_g128(s, dst, k);
    case QuantType::kQ8_0_R16:
    case QuantType::kQ4_0_R16:
    case QuantType::kQ5_0_R16:
    case QuantType::kQ4_K_R16:
    case QuantType::kQ5_K_R16:
    case QuantType::kQ6_K_R16:
    case QuantType::kI8_CH_R16:
    case QuantType::kI4_G128_R16:  // rows are interleaved in groups of 16: only matmul reads them
    case QuantType::kCount: break;
  }
  TESSERA_CHECK(false, "dequantize_row: unsupported type {}", static_cast<int>(type));
}

bool can_quantize(QuantType type) {
  switch (type) {
    case QuantType::kF32:
    case QuantType::kF16:
    case QuantType::kBF16:
    case QuantType::kQ8_0:
    case QuantType::kQ4_0:
    case QuantType::kQ5_0:
    case QuantType::kQ4_K:
    case QuantType::kQ5_K:
    case QuantType::kQ6_K:
    case QuantType::kQ2_K:
    case QuantType::kQ3_K:
    case QuantType::kTQ1_0:
    case QuantType::kTQ2_0:
    case QuantType::kI8_CH:
    case QuantType::kI4_G128:
      return true;
    default:
      return false;
  }
}

void quantize_row(QuantType type, const float* src, void* dst, int64_t k) {
  check_row_length(type, k);
  auto* d = static_cast<uint8_t*>(dst);
  switch (type) {
    case QuantType::kF32:
      std::memcpy(d, src, static_cast<size_t>(k) * 4);
      return;
    case QuantType::kF16:
      for (int64_t i = 0; i < k; ++i) {
        const uint16_t h = f32_to_fp16(src[i]);
        std::memcpy(d + 2 * i, &h, 2);
      }
      return;
    case QuantType::kBF16:
      for (int64_t i = 0; i < k; ++i) {
        const uint16_t h = f32_to_bf16(src[i]);
        std::memcpy(d + 2 * i, &h, 2);
      }
      return;
    case QuantType::kQ8_0: return quant_q8_0(src, d, k / kQk);
    case QuantType::kQ4_0: return quant_q4_0(src, d, k / kQk);
    case QuantType::kQ5_0: return quant_q5_0(src, d, k / kQk);
    case QuantType::kQ4_K: return quant_q4_k(src, d, k / kQkK);
    case QuantType::kQ5_K: return quant_q5_k(src, d, k / kQkK);
    case QuantType::kQ6_K: return quant_q6_k(src, d, k / kQkK);
    case QuantType::kQ2_K: return quant_q2_k(src, d, k / kQkK);
    case QuantType::kQ3_K: return quant_q3_k(src, d, k / kQkK);
    case QuantType::kTQ1_0: return quant_tq1_0(src, d, k / kQkK);
    case QuantType::kTQ2_0: return quant_tq2_0(src, d, k / kQkK);
    case QuantType::kI8_CH: return cpu::quantize_row_i8_ch(src, d, k);
    case QuantType::kI4_G128: return quantize_row_int4(src, d, k, Int4Grid::kAsymmetric);
    default: break;
  }
  TESSERA_CHECK(false, "quantize_row: {} is not supported", quant_name(type));
}

}  // namespace tessera
