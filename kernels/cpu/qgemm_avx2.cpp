// AVX2 integer-dot kernels for GGUF block weights: the AVX-512 scheme (qgemm_avx512.cpp) on 8
// rows per vector, with maddubs + madd in place of vpdpbusd. maddubs saturates its 16-bit
// pair sums, so levels must stay below 128: Q8_0 keeps its signed bytes and moves the sign onto
// the activation (|w| * sign(x, w)); the other formats' levels are at most 63.
// Same integer sums, same float operations: bit-identical to the scalar and AVX-512 paths.
// Decode and batched decode (1..kSmallBatch tokens) build a chunk of blocks into an L1 tile and
// run every token over it; prefill builds the whole row tile first. The tokens always come
// block-major (PackedActs, qgemm.h). R16 matrices (re-laid at load) are read as stored, an
// 8-row half of a 16-row group per vector, with no transposes.
#include <algorithm>
#include <cstring>
#include <vector>

#include "kernels/cpu/cpu_info.h"
#include "kernels/cpu/qgemm.h"
#include "kernels/cpu/weight_prefetch.h"

#if defined(__x86_64__)
#include <immintrin.h>

#define TESSERA_AVX2 __attribute__((target("avx2,fma,f16c")))
#define TESSERA_AVX2_INLINE inline __attribute__((always_inline)) TESSERA_AVX2

namespace tessera::cpu {
namespace {

constexpr int kRows = 8;
constexpr size_t kUnit = 256;  // 8 dword groups x 8 rows x 4 bytes

// out[d] lane r = dword d of the 16 bytes at p[r] + off (d = 0..3).
TESSERA_AVX2_INLINE void tr8x4(const uint8_t* const* p, size_t off, __m256i* out) {
  __m256i y[4];
  for (int i = 0; i < 4; ++i)
    y[i] = _mm256_inserti128_si256(
        _mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p[i] + off))),
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(p[i + 4] + off)), 1);
  const __m256i t0 = _mm256_unpacklo_epi32(y[0], y[1]), t1 = _mm256_unpackhi_epi32(y[0], y[1]);
  const __m256i t2 = _mm256_unpacklo_epi32(y[2], y[3]), t3 = _mm256_unpackhi_epi32(y[2], y[3]);
  out[0] = _mm256_unpacklo_epi64(t0, t2);
  out[1] = _mm256_unpackhi_epi64(t0, t2);
  out[2] = _mm256_unpacklo_epi64(t1, t3);
  out[3] = _mm256_unpackhi_epi64(t1, t3);
}

// out[d] lane r = dword d of the 32 bytes at p[r] + off (d = 0..7).
TESSERA_AVX2_INLINE void tr8x8(const uint8_t* const* p, size_t off, __m256i* out) {
  __m256i r[8];
  for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p[i] + off));
  __m256i t[8], u[8];
  for (int i = 0; i < 4; ++i) {
    t[2 * i] = _mm256_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm256_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 2; ++i) {
    u[4 * i + 0] = _mm256_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
    u[4 * i + 1] = _mm256_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
    u[4 * i + 2] = _mm256_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
    u[4 * i + 3] = _mm256_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
  }
  for (int d = 0; d < 4; ++d) {
    out[d] = _mm256_permute2x128_si256(u[d], u[4 + d], 0x20);
    out[d + 4] = _mm256_permute2x128_si256(u[d], u[4 + d], 0x31);
  }
}

TESSERA_AVX2_INLINE __m256 gather_f16_lo(const uint8_t* base, __m256i vindex, size_t off) {
  const __m256i v = _mm256_i32gather_epi32(reinterpret_cast<const int*>(base + off), vindex, 1);
  const __m256i w = _mm256_and_si256(v, _mm256_set1_epi32(0xFFFF));
  const __m128i packed = _mm_packus_epi32(_mm256_castsi256_si128(w), _mm256_extracti128_si256(w, 1));
  return _mm256_cvtph_ps(packed);
}

TESSERA_AVX2_INLINE __m256 gather_f16_hi(const uint8_t* base, __m256i vindex, size_t off) {
  const __m256i v = _mm256_i32gather_epi32(reinterpret_cast<const int*>(base + off - 2), vindex, 1);
  const __m256i w = _mm256_srli_epi32(v, 16);
  const __m128i packed = _mm_packus_epi32(_mm256_castsi256_si128(w), _mm256_extracti128_si256(w, 1));
  return _mm256_cvtph_ps(packed);
}

// The two fp16 halves of each dword -> 8 floats (low or high halves).
TESSERA_AVX2_INLINE __m256 f16_half(__m256i v, bool high) {
  const __m256i w = high ? _mm256_srli_epi32(v, 16) : _mm256_and_si256(v, _mm256_set1_epi32(0xFFFF));
  return _mm256_cvtph_ps(_mm_packus_epi32(_mm256_castsi256_si128(w), _mm256_extracti128_si256(w, 1)));
}

TESSERA_AVX2_INLINE __m256i bcast_x4(const int8_t* x) {
  int32_t v;
  std::memcpy(&v, x, 4);
  return _mm256_set1_epi32(v);
}

struct Rows {
  const uint8_t* p[kRows];
  __m256i vindex;
  size_t trailer = 0;  // I8_CH: byte offset of the row scale
  // An R16 matrix (kernels/cpu/qgemm.h): the 16-row group's interleaved blocks, and which
  // 8 of its rows these are (half 0: rows 0..7, half 1: rows 8..15).
  const uint8_t* group = nullptr;
  size_t half = 0;
};

// Reads of the 8 rows' bytes at byte offset `off` of every row (the same field of each row's
// block): transposed from the rows, or, in an R16 group, loaded as stored: there dword d of
// the field at block byte x sits at group + 16 * x + 64 * d (lane r = row r, rows 8..15 in
// the upper 32 bytes), an fp16 field as 16 halves at group + 16 * x.
// out[d] lane r = dword d of the 16 (x4) or 32 (x8) bytes at row r + off.
TESSERA_AVX2_INLINE void rows8x4(const Rows& rows, size_t off, __m256i* out) {
  if (rows.group == nullptr) return tr8x4(rows.p, off, out);
  const uint8_t* at = rows.group + 16 * off + 32 * rows.half;
  for (int d = 0; d < 4; ++d) out[d] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(at + 64 * d));
}
TESSERA_AVX2_INLINE void rows8x8(const Rows& rows, size_t off, __m256i* out) {
  if (rows.group == nullptr) return tr8x8(rows.p, off, out);
  const uint8_t* at = rows.group + 16 * off + 32 * rows.half;
  for (int d = 0; d < 8; ++d) out[d] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(at + 64 * d));
}
// Lane r = the dword at row r + off.
TESSERA_AVX2_INLINE __m256i rows_dword(const Rows& rows, size_t off) {
  if (rows.group == nullptr) return _mm256_i32gather_epi32(reinterpret_cast<const int*>(rows.p[0] + off), rows.vindex, 1);
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(rows.group + 16 * off + 32 * rows.half));
}
// Lane r = the fp16 value at row r + off; `at_end`: the field ends its row's block (a gather
// reads the dword before it).
TESSERA_AVX2_INLINE __m256 rows_f16(const Rows& rows, size_t off, bool at_end = false) {
  if (rows.group != nullptr)
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(rows.group + 16 * off + 16 * rows.half)));
  return at_end ? gather_f16_hi(rows.p[0], rows.vindex, off) : gather_f16_lo(rows.p[0], rows.vindex, off);
}

struct TileLayout {
  size_t units_per_block;
  size_t scale_bytes;
  size_t block_stride() const { return units_per_block * kUnit + scale_bytes; }
};

TileLayout tile_layout(QuantType t) {
  switch (t) {
    case QuantType::kQ4_K:
    case QuantType::kQ5_K: return {8, 8 * 32 + 4 * 32 + 2 * 32};  // sc2[8][8], mp[4][8], d[8], dmin[8]
    case QuantType::kQ6_K: return {8, 16 * 32 + 8 * 32 + 32};  // sc2[16][8], scp[8][8], d[8]
    case QuantType::kI4_G128: return {1, 64};  // dw[8] floats, -z[8] int32
    default: return {1, 32};
  }
}

TESSERA_AVX2_INLINE void store_unit(uint8_t* dst, const __m256i* w) {
  for (int g = 0; g < 8; ++g) _mm256_store_si256(reinterpret_cast<__m256i*>(dst + 32 * g), w[g]);
}

TESSERA_AVX2 void build_q32(QuantType type, const Rows& rows, int64_t b0, int64_t b1, uint8_t* tile) {
  const __m256i m4 = _mm256_set1_epi8(0x0F);
  const size_t bb = type == QuantType::kQ8_0 ? 34 : type == QuantType::kQ4_0 ? 18 : 22;
  for (int64_t b = b0; b < b1; ++b, tile += kUnit + 32) {
    const size_t off = static_cast<size_t>(b) * bb;
    __m256i w[8];
    if (type == QuantType::kQ8_0) {
      rows8x8(rows, off + 2, w);
    } else if (type == QuantType::kQ4_0) {
      __m256i d[4];
      rows8x4(rows, off + 2, d);
      for (int g = 0; g < 4; ++g) {
        w[g] = _mm256_and_si256(d[g], m4);
        w[g + 4] = _mm256_and_si256(_mm256_srli_epi16(d[g], 4), m4);
      }
    } else {
      __m256i d[4];
      rows8x4(rows, off + 6, d);
      const __m256i qh = rows_dword(rows, off + 2);
      const __m256i spread = _mm256_set1_epi32(0x00204081);
      const __m256i ones = _mm256_set1_epi32(0x01010101);
      for (int g = 0; g < 8; ++g) {
        const __m256i bits = _mm256_and_si256(_mm256_srli_epi32(qh, 4 * g), _mm256_set1_epi32(0xF));
        const __m256i hb = _mm256_slli_epi32(_mm256_and_si256(_mm256_mullo_epi32(bits, spread), ones), 4);
        const __m256i nib = g < 4 ? _mm256_and_si256(d[g], m4)
                                  : _mm256_and_si256(_mm256_srli_epi16(d[g - 4], 4), m4);
        w[g] = _mm256_or_si256(nib, hb);
      }
    }
    store_unit(tile, w);
    _mm256_store_ps(reinterpret_cast<float*>(tile + kUnit), rows_f16(rows, off));
  }
}

TESSERA_AVX2 void build_k_affine(QuantType type, const Rows& rows, int64_t b0, int64_t b1, uint8_t* tile) {
  const bool q5 = type == QuantType::kQ5_K;
  const size_t bb = q5 ? 176 : 144;
  const __m256i m4 = _mm256_set1_epi8(0x0F);
  const __m256i m6 = _mm256_set1_epi32(63);
  const __m256i lsb = _mm256_set1_epi8(0x01);
  const size_t stride = tile_layout(type).block_stride();
  for (int64_t b = b0; b < b1; ++b, tile += stride) {
    const size_t off = static_cast<size_t>(b) * bb;
    __m256i qh[8];
    if (q5) rows8x8(rows, off + 16, qh);
    for (int c = 0; c < 4; ++c) {
      __m256i d[8], lo[8], hi[8];
      rows8x8(rows, off + (q5 ? 48 : 16) + 32 * static_cast<size_t>(c), d);
      for (int g = 0; g < 8; ++g) {
        lo[g] = _mm256_and_si256(d[g], m4);
        hi[g] = _mm256_and_si256(_mm256_srli_epi16(d[g], 4), m4);
        if (q5) {
          lo[g] = _mm256_or_si256(lo[g], _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh[g], 2 * c), lsb), 4));
          hi[g] = _mm256_or_si256(hi[g], _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh[g], 2 * c + 1), lsb), 4));
        }
      }
      store_unit(tile + kUnit * (2 * c), lo);
      store_unit(tile + kUnit * (2 * c + 1), hi);
    }
    __m256i hd[4];
    rows8x4(rows, off, hd);
    __m256i sc[8], mm[8];
    const __m256i m3 = _mm256_set1_epi32(3), mf = _mm256_set1_epi32(0xF);
    for (int s = 0; s < 4; ++s) {
      sc[s] = _mm256_and_si256(_mm256_srli_epi32(hd[1], 8 * s), m6);
      mm[s] = _mm256_and_si256(_mm256_srli_epi32(hd[2], 8 * s), m6);
      const __m256i lo4 = _mm256_srli_epi32(hd[3], 8 * s);
      const __m256i top_sc = _mm256_and_si256(_mm256_srli_epi32(hd[1], 8 * s + 6), m3);
      const __m256i top_m = _mm256_and_si256(_mm256_srli_epi32(hd[2], 8 * s + 6), m3);
      sc[s + 4] = _mm256_or_si256(_mm256_and_si256(lo4, mf), _mm256_slli_epi32(top_sc, 4));
      mm[s + 4] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(lo4, 4), mf), _mm256_slli_epi32(top_m, 4));
    }
    // Scales in both halves of each lane (sc2[8][8]), mins in pairs (mp[4][8]: m[2j] | m[2j+1]
    // << 16), both as the pmaddwd operands of k_affine_block; then d[8], dmin[8].
    auto* sc2 = reinterpret_cast<__m256i*>(tile + 8 * kUnit);
    auto* mp = sc2 + 8;
    auto* df = reinterpret_cast<float*>(mp + 4);
    for (int s = 0; s < 8; ++s) _mm256_store_si256(sc2 + s, _mm256_or_si256(sc[s], _mm256_slli_epi32(sc[s], 16)));
    for (int j = 0; j < 4; ++j) _mm256_store_si256(mp + j, _mm256_or_si256(mm[2 * j], _mm256_slli_epi32(mm[2 * j + 1], 16)));
    _mm256_store_ps(df, f16_half(hd[0], false));
    _mm256_store_ps(df + 8, f16_half(hd[0], true));
  }
}

// Byte i (0..3) of each 32-bit lane of v, sign-extended: the Q6_K scales, four to a lane.
TESSERA_AVX2_INLINE __m256i lane_sbyte(__m256i v, int i) { return _mm256_srai_epi32(_mm256_slli_epi32(v, 24 - 8 * i), 24); }

// The 16 signed scales of a Q6_K block's 8 rows, as the pmaddwd operands of q6_k_block: in both
// halves of each lane (sc2[16][8]), then in pairs (scp[8][8]: sc[2j] | sc[2j + 1] << 16).
TESSERA_AVX2_INLINE void store_q6_scales(const Rows& rows, size_t off, int32_t* out) {
  __m256i s[4];
  rows8x4(rows, off + 192, s);
  const __m256i lo16 = _mm256_set1_epi32(0xFFFF);
  __m256i sc[16];
  for (int g = 0; g < 16; ++g) {
    sc[g] = lane_sbyte(s[g / 4], g % 4);
    _mm256_store_si256(reinterpret_cast<__m256i*>(out + 8 * g),
                       _mm256_or_si256(_mm256_and_si256(sc[g], lo16), _mm256_slli_epi32(sc[g], 16)));
  }
  for (int j = 0; j < 8; ++j)
    _mm256_store_si256(reinterpret_cast<__m256i*>(out + 8 * (16 + j)),
                       _mm256_or_si256(_mm256_and_si256(sc[2 * j], lo16), _mm256_slli_epi32(sc[2 * j + 1], 16)));
}

TESSERA_AVX2 void build_q6_k(const Rows& rows, int64_t b0, int64_t b1, uint8_t* tile) {
  const __m256i m4 = _mm256_set1_epi8(0x0F);
  const __m256i m2 = _mm256_set1_epi8(0x03);
  const size_t stride = tile_layout(QuantType::kQ6_K).block_stride();
  for (int64_t b = b0; b < b1; ++b, tile += stride) {
    const size_t off = static_cast<size_t>(b) * 210;
    // In address order (see q6_k_fused): ql's nibbles into the quarters' units, then qh's
    // bits 4..5 ORed in, then the scales and d.
    for (int h = 0; h < 2; ++h) {
      __m256i a[8], c[8];
      rows8x8(rows, off + 64 * static_cast<size_t>(h), a);
      rows8x8(rows, off + 64 * static_cast<size_t>(h) + 32, c);
      __m256i u[4][8];
      for (int g = 0; g < 8; ++g) {
        u[0][g] = _mm256_and_si256(a[g], m4);
        u[1][g] = _mm256_and_si256(c[g], m4);
        u[2][g] = _mm256_and_si256(_mm256_srli_epi16(a[g], 4), m4);
        u[3][g] = _mm256_and_si256(_mm256_srli_epi16(c[g], 4), m4);
      }
      for (int q = 0; q < 4; ++q) store_unit(tile + kUnit * (4 * h + q), u[q]);
    }
    for (int h = 0; h < 2; ++h) {
      __m256i qh[8];
      rows8x8(rows, off + 128 + 32 * static_cast<size_t>(h), qh);
      for (int q = 0; q < 4; ++q) {
        auto* unit = reinterpret_cast<__m256i*>(tile + kUnit * (4 * h + q));
        for (int g = 0; g < 8; ++g) {
          const __m256i hq = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh[g], 2 * q), m2), 4);
          _mm256_store_si256(unit + g, _mm256_or_si256(_mm256_load_si256(unit + g), hq));
        }
      }
    }
    auto* scales = reinterpret_cast<int32_t*>(tile + 8 * kUnit);
    store_q6_scales(rows, off, scales);
    _mm256_store_ps(reinterpret_cast<float*>(scales + 24 * 8), rows_f16(rows, off + 208, /*at_end=*/true));
  }
}

// I8_CH: 32-blocks of int8 levels (signed, as Q8_0), dw = the row scale.
// I4_G128: 32-block b = sub-block b % 4 of group b / 4, nibbles as Q4_0; dw = d, and -z per row.
TESSERA_AVX2 void build_int(QuantType type, const Rows& rows, int64_t b0, int64_t b1, uint8_t* tile) {
  const __m256i m4 = _mm256_set1_epi8(0x0F);
  const size_t stride = tile_layout(type).block_stride();
  __m256 row_scale = _mm256_setzero_ps();
  if (type == QuantType::kI8_CH) {
    row_scale = _mm256_castsi256_ps(rows_dword(rows, rows.trailer));
  }
  for (int64_t b = b0; b < b1; ++b, tile += stride) {
    __m256i w[8];
    if (type == QuantType::kI8_CH) {
      rows8x8(rows, static_cast<size_t>(b) * 32, w);
      store_unit(tile, w);
      _mm256_store_ps(reinterpret_cast<float*>(tile + kUnit), row_scale);
      continue;
    }
    const size_t grp = static_cast<size_t>(b / 4) * 68;
    __m256i d[4];
    rows8x4(rows, grp + 4 + 16 * static_cast<size_t>(b % 4), d);
    for (int g = 0; g < 4; ++g) {
      w[g] = _mm256_and_si256(d[g], m4);
      w[g + 4] = _mm256_and_si256(_mm256_srli_epi16(d[g], 4), m4);
    }
    store_unit(tile, w);
    const __m256i hdr = rows_dword(rows, grp);
    _mm256_store_ps(reinterpret_cast<float*>(tile + kUnit), f16_half(hdr, false));
    const __m256i z = _mm256_and_si256(_mm256_srli_epi32(hdr, 16), _mm256_set1_epi32(0xFF));
    _mm256_store_si256(reinterpret_cast<__m256i*>(tile + kUnit + 32), _mm256_sub_epi32(_mm256_setzero_si256(), z));
  }
}

void build_tile(QuantType type, const Rows& rows, int64_t b0, int64_t b1, uint8_t* tile) {
  switch (type) {
    case QuantType::kI8_CH:
    case QuantType::kI4_G128: return build_int(type, rows, b0, b1, tile);
    case QuantType::kQ4_K:
    case QuantType::kQ5_K: return build_k_affine(type, rows, b0, b1, tile);
    case QuantType::kQ6_K: return build_q6_k(rows, b0, b1, tile);
    default: return build_q32(type, rows, b0, b1, tile);
  }
}

// ---- the K-quant super-block kernels (every mode: decode, batched decode, prefill). The
// tokens of block b come from PackedActs (qgemm.h): their 256 activations at constant offsets,
// their scales, and the per-block activation sums (aux):
struct BlockActs {
  const int8_t* q0;
  const float* d0;
  const int32_t* aux;
  const int8_t* q(int t) const { return q0 + 256 * t; }
  float dx(int t) const { return d0[t]; }
  // Q4_K / Q5_K: bsum32[2j] | bsum32[2j + 1] << 16 (int16 pairs, j = 0..3).
  int32_t k_pair(int t, int j) const { return aux[4 * t + j]; }
  // Q6_K: bsum16[g] (aux = -32 * bsum16, g = 0..15).
  int bsum16(int t, int g) const { return -(aux[16 * t + g] >> 5); }
};
// A sub-block's dword groups are summed in int16, kSum at a time (see bk_q32), and one madd
// with the scale in both halves of each lane gives sc * (dot) exactly: the same integers as
// sum_s sc[s] * dot[s] taken one by one, so the same bits as the other paths.

// One Q4_K / Q5_K super-block; mins as sum_j pmaddwd(m[2j] | m[2j+1] << 16, k_pair(t, j)).
template <int T, int kSum>
TESSERA_AVX2_INLINE void k_affine_block(const uint8_t* tile, const BlockActs& x, __m256* out) {
  const auto* sc2 = reinterpret_cast<const __m256i*>(tile + 8 * kUnit);
  const auto* mp = sc2 + 8;
  const auto* df = reinterpret_cast<const float*>(mp + 4);
  const __m256 d = _mm256_load_ps(df), dmin = _mm256_load_ps(df + 8);
  // One token at a time over the block (its units reloaded from L1 per token): few live
  // registers, where every token's int16 sums kept across the groups spilled them.
  for (int t = 0; t < T; ++t) {
    const int8_t* xt = x.q(t);
    __m256i tot = _mm256_setzero_si256();
    for (int s = 0; s < 8; ++s) {
      const uint8_t* u = tile + kUnit * s;
      __m256i p16 = _mm256_setzero_si256();
      for (int g = 0; g < 8; ++g) {
        const __m256i p = _mm256_maddubs_epi16(_mm256_load_si256(reinterpret_cast<const __m256i*>(u + 32 * g)),
                                               bcast_x4(xt + 32 * s + 4 * g));
        p16 = g % kSum == 0 ? p : _mm256_add_epi16(p16, p);
        if (g % kSum == kSum - 1) tot = _mm256_add_epi32(tot, _mm256_madd_epi16(p16, _mm256_load_si256(sc2 + s)));
      }
    }
    __m256i ms = _mm256_setzero_si256();
    for (int j = 0; j < 4; ++j)
      ms = _mm256_add_epi32(ms, _mm256_madd_epi16(_mm256_load_si256(mp + j), _mm256_set1_epi32(x.k_pair(t, j))));
    const __m256 dxv = _mm256_set1_ps(x.dx(t));
    const __m256 acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(tot), _mm256_mul_ps(d, dxv), out[t]);
    out[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_setzero_si256(), ms)),
                             _mm256_mul_ps(dmin, dxv), acc);
  }
}

// One Q6_K super-block: sum_g sc[g] * (dot[g] - 32 * bsum16[g]) as the scaled dots (pairs of
// dword groups summed in int16: levels < 64) minus 32 * sum_j pmaddwd(sc pair j, bsum16 pair j);
// the tile holds sc in both halves of each lane (sc2[16][8]) and in pairs (scp[8][8]), then d.
template <int T>
TESSERA_AVX2_INLINE void q6_k_block(const uint8_t* tile, const BlockActs& x, __m256* out) {
  const auto* sc2 = reinterpret_cast<const __m256i*>(tile + 8 * kUnit);
  const auto* scp = sc2 + 16;
  // Tokens inner (each pair of weight vectors serves all T): the int16 sums are transient
  // here, so only the T int32 totals stay live.
  __m256i tot[T];
  for (int t = 0; t < T; ++t) tot[t] = _mm256_setzero_si256();
  for (int grp = 0; grp < 16; ++grp) {
    const __m256i scv = _mm256_load_si256(sc2 + grp);
    const uint8_t* u = tile + kUnit * (grp / 2) + (kUnit / 2) * (grp % 2);
    for (int g = 0; g < 4; g += 2) {
      const __m256i w0 = _mm256_load_si256(reinterpret_cast<const __m256i*>(u + 32 * g));
      const __m256i w1 = _mm256_load_si256(reinterpret_cast<const __m256i*>(u + 32 * g + 32));
      for (int t = 0; t < T; ++t) {
        const int8_t* xq = x.q(t) + 16 * grp + 4 * g;
        const __m256i p = _mm256_add_epi16(_mm256_maddubs_epi16(w0, bcast_x4(xq)), _mm256_maddubs_epi16(w1, bcast_x4(xq + 4)));
        tot[t] = _mm256_add_epi32(tot[t], _mm256_madd_epi16(p, scv));
      }
    }
  }
  const __m256 d = _mm256_load_ps(reinterpret_cast<const float*>(scp + 8));
  for (int t = 0; t < T; ++t) {
    __m256i ms = _mm256_setzero_si256();
    for (int j = 0; j < 8; ++j) {
      const auto pair = static_cast<int32_t>((static_cast<uint32_t>(x.bsum16(t, 2 * j)) & 0xFFFFu) |
                                             (static_cast<uint32_t>(x.bsum16(t, 2 * j + 1)) << 16));
      ms = _mm256_add_epi32(ms, _mm256_madd_epi16(_mm256_load_si256(scp + j), _mm256_set1_epi32(pair)));
    }
    tot[t] = _mm256_sub_epi32(tot[t], _mm256_slli_epi32(ms, 5));
    out[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(tot[t]), _mm256_mul_ps(d, _mm256_set1_ps(x.dx(t))), out[t]);
  }
}

TESSERA_AVX2_INLINE __m256i r16_dvec(const uint8_t* at, size_t field, int d) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(at + 16 * field + 64 * d));
}

// One Q6_K super-block of an R16 group's half against one token, the levels unpacked in
// registers and consumed at once (decode): no tile stores and reloads. The block is read in
// address order (ql, then qh, then the scales and d), as gemv_q6_k_r16 of the AVX-512 path
// does: reading the scales at the block's end first defeats the hardware streamers (Zen 4:
// 3.7 GB/s from DRAM in that order). So the scales come last: each of the 16 groups keeps
// its dot minus 32 * bsum16 in int32 (acc[g]; ql's nibbles and qh's 2-bit parts summed apart,
// in int16 over a group's 4 dword vectors: < 2^15), and sum_g sc[g] * acc[g] ends the block.
// The same integer as build_q6_k + q6_k_block<1>, the same float operations: the same bits.
TESSERA_AVX2_INLINE void q6_k_fused(const Rows& rows, int64_t b, const BlockActs& x, __m256* out) {
  const size_t off = static_cast<size_t>(b) * 210;
  const uint8_t* at = rows.group + 16 * off + 32 * rows.half;  // dword vector d of byte x: at + 16x + 64d
  const __m256i m4 = _mm256_set1_epi8(0x0F), m2 = _mm256_set1_epi8(0x03);
  const __m256i ones = _mm256_set1_epi16(1), sixteen = _mm256_set1_epi16(16);
  const int8_t* xq = x.q(0);
  __m256i acc[16];
  // ql: byte 64h + 32j + 4g + i holds element 128h + 32(j + 2n) + 4g + i in nibble n (quarter
  // q = j + 2n, group 8h + 2q + g / 4).
  for (int h = 0; h < 2; ++h) {
    for (int j = 0; j < 2; ++j) {
      for (int gq = 0; gq < 2; ++gq) {
        __m256i lo16 = _mm256_setzero_si256(), hi16 = _mm256_setzero_si256();
        for (int g = 4 * gq; g < 4 * gq + 4; ++g) {
          const __m256i v = r16_dvec(at, 64 * h + 32 * j, g);
          lo16 = _mm256_add_epi16(lo16, _mm256_maddubs_epi16(_mm256_and_si256(v, m4), bcast_x4(xq + 32 * (4 * h + j) + 4 * g)));
          hi16 = _mm256_add_epi16(hi16, _mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16(v, 4), m4),
                                                             bcast_x4(xq + 32 * (4 * h + j + 2) + 4 * g)));
        }
        const int glo = 8 * h + 2 * j + gq, ghi = glo + 4;
        acc[glo] = _mm256_add_epi32(_mm256_madd_epi16(lo16, ones), _mm256_set1_epi32(x.aux[glo]));
        acc[ghi] = _mm256_add_epi32(_mm256_madd_epi16(hi16, ones), _mm256_set1_epi32(x.aux[ghi]));
      }
    }
  }
  // qh: byte 128 + 32h + 4g + i holds bits 4..5 of element 128h + 32q + 4g + i at bits 2q..2q+1.
  for (int h = 0; h < 2; ++h) {
    for (int gq = 0; gq < 2; ++gq) {
      __m256i t16[4];
      for (auto& t : t16) t = _mm256_setzero_si256();
      for (int g = 4 * gq; g < 4 * gq + 4; ++g) {
        const __m256i v = r16_dvec(at, 128 + 32 * h, g);
        for (int q = 0; q < 4; ++q)
          t16[q] = _mm256_add_epi16(t16[q], _mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16(v, 2 * q), m2),
                                                                 bcast_x4(xq + 32 * (4 * h + q) + 4 * g)));
      }
      for (int q = 0; q < 4; ++q) acc[8 * h + 2 * q + gq] = _mm256_add_epi32(acc[8 * h + 2 * q + gq], _mm256_madd_epi16(t16[q], sixteen));
    }
  }
  __m256i tot = _mm256_setzero_si256();
  for (int d = 0; d < 4; ++d) {
    const __m256i s4 = r16_dvec(at, 192, d);
    for (int i = 0; i < 4; ++i)
      tot = _mm256_add_epi32(tot, _mm256_mullo_epi32(acc[4 * d + i], lane_sbyte(s4, i)));
  }
  const __m256 d = rows_f16(rows, off + 208, /*at_end=*/true);
  out[0] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(tot), _mm256_mul_ps(d, _mm256_set1_ps(x.dx(0))), out[0]);
}

// ---- the 32-element formats. In decode and batched decode (1..kSmallBatch tokens) the tile
// is built a chunk at a time (8 blocks; one super-block for the K-quants) and every token runs
// over it before the next chunk is built, instead of building the whole row tile first (see
// qgemm_avx512.cpp). Tokens come block-major (PackedActs, qgemm.h), at constant offsets.
// Unsigned levels below 2^L: a maddubs pair sum is at most 2 * (2^L - 1) * 127, so kSum = 8
// (L = 4) or 4 (L = 5) dword groups can be added in int16 before one madd widens them (exact;
// the same integer as the dot4 chain, fewer instructions).
// kRowZero: I4_G128, as Q4_0 with a per-row zero point (tile: unit, dw, -z; aux is then the
// activation block sum, times the zero point here).
// Exact 4-element dot per lane (levels < 128, see the file comment).
TESSERA_AVX2_INLINE __m256i dot4(__m256i w, __m256i x) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(w, x), _mm256_set1_epi16(1));
}

template <int T, bool kSigned, int kSum = 1, bool kRowZero = false>
TESSERA_AVX2_INLINE void bk_q32(const uint8_t* tile, int64_t nblk, const int8_t* q, const float* dx,
                                const int32_t* aux, int n, __m256* out) {
  // Accumulators in locals, loaded and stored as whole vectors (an aggregate copy of out[]
  // is done in 16-byte halves that the full-width reloads then stall on).
  __m256 acc[T];
  for (int t = 0; t < T; ++t) acc[t] = _mm256_loadu_ps(reinterpret_cast<const float*>(out + t));
  const int64_t qstep = static_cast<int64_t>(n) * 32;
  for (int64_t b = 0; b < nblk; ++b, tile += kUnit + (kRowZero ? 64 : 32), q += qstep, dx += n, aux += n) {
    __m256i ia[T];
    if constexpr (kSigned) {
      for (int t = 0; t < T; ++t) ia[t] = _mm256_setzero_si256();
      for (int g = 0; g < 8; ++g) {
        const __m256i w = _mm256_load_si256(reinterpret_cast<const __m256i*>(tile + 32 * g));
        const __m256i wa = _mm256_abs_epi8(w);
        for (int t = 0; t < T; ++t)
          ia[t] = _mm256_add_epi32(ia[t], dot4(wa, _mm256_sign_epi8(bcast_x4(q + 32 * t + 4 * g), w)));
      }
    } else {
      // One token at a time over the block's 8 dword groups (the unit is reloaded from L1 per
      // token): few live registers, where keeping every token's int16 sums across the groups
      // spilled them on the 16 AVX2 registers.
      const __m256i nz = kRowZero ? _mm256_load_si256(reinterpret_cast<const __m256i*>(tile + kUnit + 32))
                                  : _mm256_setzero_si256();
      for (int t = 0; t < T; ++t) {
        const int8_t* xt = q + 32 * t;
        __m256i i32 = kRowZero ? _mm256_mullo_epi32(nz, _mm256_set1_epi32(aux[t])) : _mm256_set1_epi32(aux[t]);
        __m256i p16 = _mm256_setzero_si256();
        for (int g = 0; g < 8; ++g) {
          const __m256i p = _mm256_maddubs_epi16(_mm256_load_si256(reinterpret_cast<const __m256i*>(tile + 32 * g)),
                                                 bcast_x4(xt + 4 * g));
          p16 = g % kSum == 0 ? p : _mm256_add_epi16(p16, p);
          if (g % kSum == kSum - 1) i32 = _mm256_add_epi32(i32, _mm256_madd_epi16(p16, _mm256_set1_epi16(1)));
        }
        ia[t] = i32;
      }
    }
    const __m256 dw = _mm256_load_ps(reinterpret_cast<const float*>(tile + kUnit));
    for (int t = 0; t < T; ++t)
      acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(ia[t]), _mm256_mul_ps(dw, _mm256_set1_ps(dx[t])), acc[t]);
  }
  for (int t = 0; t < T; ++t) _mm256_storeu_ps(reinterpret_cast<float*>(out + t), acc[t]);
}

// Blocks [b, b + nblk) of the chunk tile against tokens [t0, t0 + T).
template <int T>
TESSERA_AVX2 void run_batch_t(QuantType type, const uint8_t* tile, int64_t b, int64_t nblk, const PackedActs& x,
                              int t0, __m256* acc) {
  const int64_t i = b * x.n + t0;  // (block, token) index of the first pair
  const int8_t* q = x.q + i * x.block;
  const float* dx = x.d + i;
  const int32_t* aux = x.aux + i * x.n_aux;
  switch (type) {
    case QuantType::kQ4_K: return k_affine_block<T, 8>(tile, BlockActs{q, dx, aux}, acc);
    case QuantType::kQ5_K: return k_affine_block<T, 4>(tile, BlockActs{q, dx, aux}, acc);
    case QuantType::kQ6_K: return q6_k_block<T>(tile, BlockActs{q, dx, aux}, acc);
    case QuantType::kQ8_0:
    case QuantType::kI8_CH: return bk_q32<T, true>(tile, nblk, q, dx, aux, x.n, acc);
    case QuantType::kI4_G128: return bk_q32<T, false, 8, true>(tile, nblk, q, dx, aux, x.n, acc);
    case QuantType::kQ4_0: return bk_q32<T, false, 8>(tile, nblk, q, dx, aux, x.n, acc);
    default: return bk_q32<T, false, 4>(tile, nblk, q, dx, aux, x.n, acc);  // Q5_0
  }
}

TESSERA_AVX2 void run_batch(QuantType type, int n_tok, const uint8_t* tile, int64_t b, int64_t nblk,
                            const PackedActs& x, int t0, __m256* acc) {
  switch (n_tok) {
    case 1: return run_batch_t<1>(type, tile, b, nblk, x, t0, acc);
    case 2: return run_batch_t<2>(type, tile, b, nblk, x, t0, acc);
    case 3: return run_batch_t<3>(type, tile, b, nblk, x, t0, acc);
    default: return run_batch_t<4>(type, tile, b, nblk, x, t0, acc);
  }
}

uint8_t* pack_scratch(size_t bytes) {
  thread_local std::vector<uint8_t> buf;
  if (buf.size() < bytes + 64) buf.resize(bytes + 64);
  auto addr = reinterpret_cast<uintptr_t>(buf.data());
  return buf.data() + ((64 - addr % 64) % 64);
}

uint8_t* tile_scratch(size_t bytes) {
  thread_local std::vector<uint8_t> buf;
  if (buf.size() < bytes + 64) buf.resize(bytes + 64);
  auto addr = reinterpret_cast<uintptr_t>(buf.data());
  return buf.data() + ((64 - addr % 64) % 64);
}

TESSERA_AVX2 void store_rows(float* y, __m256 v, int n_valid) {
  alignas(32) float tmp[8];
  _mm256_store_ps(tmp, v);
  std::memcpy(y, tmp, static_cast<size_t>(n_valid) * 4);
}

}  // namespace

TESSERA_AVX2 void quantize_acts_avx2(const float* x, int64_t t0, int64_t t1, const QuantizedActs& acts) {
  const int64_t k = acts.k, blk = acts.block, nb = k / blk;
  const __m256 sign = _mm256_set1_ps(-0.0f);
  for (int64_t t = t0; t < t1; ++t) {
    const float* xt = x + t * k;
    auto* q = const_cast<int8_t*>(acts.q) + t * k;
    auto* d = const_cast<float*>(acts.d) + t * nb;
    auto* bs = const_cast<int16_t*>(acts.bsum) + t * (k / 16);
    for (int64_t b = 0; b < nb; ++b) {
      const float* xb = xt + b * blk;
      __m256 m = _mm256_setzero_ps();
      for (int64_t j = 0; j < blk; j += 8) m = _mm256_max_ps(m, _mm256_andnot_ps(sign, _mm256_loadu_ps(xb + j)));
      __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
      m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
      m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
      const float amax = _mm_cvtss_f32(m4);
      const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
      d[b] = act_scale(amax, id, blk);
      const __m256 vid = _mm256_set1_ps(id);
      for (int64_t j = 0; j < blk; j += 16) {
        const __m256i v0 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xb + j), vid));
        const __m256i v1 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xb + j + 8), vid));
        const __m256i w16 = _mm256_permute4x64_epi64(_mm256_packs_epi32(v0, v1), 0xD8);
        const __m128i b8 = _mm_packs_epi16(_mm256_castsi256_si128(w16), _mm256_extracti128_si256(w16, 1));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(q + b * blk + j), b8);
        __m256i s = _mm256_add_epi32(v0, v1);
        __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
        s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4E));
        s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xB1));
        bs[(b * blk + j) / 16] = static_cast<int16_t>(_mm_cvtsi128_si32(s4));
      }
    }
  }
}

TESSERA_AVX2 void qmatmul_avx2(const QMatmulArgs& args, int64_t r0, int64_t r1) {
  if (is_low_bit(args.type)) return qmatmul_low_bit_avx2(args, r0, r1);  // qgemm_low_bit_avx2.cpp
  // R16 matrices run as their base format, each 16-row group as two halves of 8 rows read
  // from the group's blocks as stored (r0 starts a group: matmul_rows checks it). Decode and
  // batched decode walk the group's stream once, both halves per chunk, prefetched as the
  // AVX-512 kernels do (weight_prefetch.h).
  const bool r16 = is_r16(args.type);
  QMatmulArgs a = args;
  a.type = r16_base(args.type);
  const QuantType type = a.type;
  const int64_t nb = a.k / kernel_block_elems(type);
  const TileLayout lay = tile_layout(type);
  const size_t stride = lay.block_stride();
  // Decode and batched decode build a chunk of blocks at a time (it stays in L1); larger batches
  // (prefill) build the whole row tile once and run every token over it.
  const bool whole = a.n_tokens > kSmallBatch;
  const int64_t chunk = whole ? nb : (lay.units_per_block == 1 ? 8 : 1);
  uint8_t* tile = tile_scratch(stride * static_cast<size_t>(chunk));
  // Every mode runs the micro-kernels on block-major activations (qgemm.h, PackedActs).
  const PackedActs packed = pack_acts(a, pack_scratch(packed_acts_bytes(a)));
  const int64_t step = r16 ? kQRowGroup : kRows;
  const size_t ahead = kernel_tuning().r16_prefetch_bytes;
  for (int64_t g0 = r0; g0 < r1; g0 += step) {
    // The 8-row sets of this step: one, or an R16 group's halves (the second only if it has
    // valid rows).
    const int n_sets = r16 && r1 - g0 > kRows ? 2 : 1;
    Rows rows[2];
    int n_valid[2];
    for (int h = 0; h < n_sets; ++h) {
      const int64_t first = g0 + kRows * h;
      n_valid[h] = static_cast<int>(std::min<int64_t>(kRows, r1 - first));
      alignas(32) int32_t offs[kRows];
      for (int r = 0; r < kRows; ++r) {
        offs[r] = static_cast<int32_t>(static_cast<size_t>(std::min(r, n_valid[h] - 1)) * a.row_bytes);
        rows[h].p[r] = a.w + static_cast<size_t>(first) * a.row_bytes + static_cast<size_t>(offs[r]);
      }
      rows[h].vindex = _mm256_load_si256(reinterpret_cast<const __m256i*>(offs));
      rows[h].trailer = row_block_bytes(type, a.k);
      if (r16) {
        rows[h].group = a.w + static_cast<size_t>(g0) * a.row_bytes;  // a.w and g0 start groups
        rows[h].half = static_cast<size_t>(h);
      }
    }
    WeightPrefetch pf;
    if (r16 && !whole) pf = WeightPrefetch::r16_stream(a.w, g0, r1, a.row_bytes, kQRowGroup, nb, ahead);
    if (!whole) {
      // R16 Q6_K decode unpacks in registers (q6_k_fused); everything else builds the chunk tile.
      const bool fused_q6 = r16 && type == QuantType::kQ6_K && packed.n == 1;
      __m256 acc[2][kSmallBatch];
      for (auto& set : acc)
        for (auto& v : set) v = _mm256_setzero_ps();
      for (int64_t b = 0; b < nb; b += chunk) {
        const int64_t e = std::min(nb, b + chunk);
        for (int64_t i = b; i < e; ++i) pf.tick();
        for (int h = 0; h < n_sets; ++h) {
          if (fused_q6) {
            const int64_t i = b * packed.n;
            q6_k_fused(rows[h], b, BlockActs{packed.q + i * packed.block, packed.d + i, packed.aux + i * packed.n_aux},
                       acc[h]);
            continue;
          }
          build_tile(type, rows[h], b, e, tile);
          for (int t0 = 0; t0 < packed.n; t0 += 4)
            run_batch(type, std::min(4, packed.n - t0), tile, b, e - b, packed, t0, acc[h] + t0);
        }
      }
      for (int h = 0; h < n_sets; ++h)
        for (int t = 0; t < packed.n; ++t) store_rows(a.y + t * a.y_stride + g0 + kRows * h, acc[h][t], n_valid[h]);
      continue;
    }
    // Prefill: the whole row tile, then every token over it, 4 at a time.
    const bool per_block = lay.units_per_block > 1;  // the K-quant kernels take one block
    for (int h = 0; h < n_sets; ++h) {
      build_tile(type, rows[h], 0, nb, tile);
      // 4 tokens per pass; 2 for the signed formats, whose kernel keeps every token's sums
      // across the groups (110M Q8_0 prompt: 333 tok/s at 4, 388 at 2, 350 at 3).
      const int tg = (type == QuantType::kQ8_0 || type == QuantType::kI8_CH) ? 2 : 4;
      for (int t0 = 0; t0 < packed.n; t0 += tg) {
        const int n_tok = std::min(tg, packed.n - t0);
        __m256 acc[4];
        for (auto& v : acc) v = _mm256_setzero_ps();
        if (per_block) {
          for (int64_t b = 0; b < nb; ++b) run_batch(type, n_tok, tile + static_cast<size_t>(b) * stride, b, 1, packed, t0, acc);
        } else {
          run_batch(type, n_tok, tile, 0, nb, packed, t0, acc);
        }
        for (int t = 0; t < n_tok; ++t) store_rows(a.y + (t0 + t) * a.y_stride + g0 + kRows * h, acc[t], n_valid[h]);
      }
    }
  }
}

}  // namespace tessera::cpu

#else

namespace tessera::cpu {
void quantize_acts_avx2(const float* x, int64_t t0, int64_t t1, const QuantizedActs& acts) {
  quantize_acts_scalar(x, t0, t1, acts);
}
void qmatmul_avx2(const QMatmulArgs& a, int64_t r0, int64_t r1) { qmatmul_scalar(a, r0, r1); }
}  // namespace tessera::cpu

#endif
