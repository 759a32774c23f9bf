// AVX-512 VNNI integer-dot kernels for GGUF block weights (the arithmetic is in qgemm.h).
//
// Layout trick: 16 weight rows are processed together, each in one 32-bit lane. A 32-element
// unit of the 16 rows is transposed ("interleaved") into 8 vectors W[g], g = 0..7, where lane r
// of W[g] holds the unsigned levels of elements 4g..4g+3 of row r. vpdpbusd(acc, W[g],
// broadcast(x[4g..4g+3])) then adds the 4-element partial dot of every row to its lane, so 8
// instructions give the exact integer dot of the unit for 16 rows, with no horizontal sums,
// and the per-row float update (acc = fma(isum, dw * dx, acc)) is one vector operation.
//
// Decode (one token) builds the interleaved units in registers and consumes them at once.
// Batched decode (2..kSmallBatch tokens) does the same with every token's dot taken from each
// unit (Q8_0 / Q4_0 / Q5_0, and Q4_K up to 4 tokens), or builds a chunk of blocks into an L1
// tile and runs every token over it before the next chunk. Prefill builds a whole 16-row tile
// once and runs it against up to 8 tokens at a time, with the batched-decode micro-kernels on
// block-major activations. Each weight byte is read from memory once per matmul in every mode.
//
// The load-time formats reuse the scheme: I8_CH is Q8_0 with one scale per row, I4_G128's
// 32-element sub-blocks are Q4_0 nibbles with a per-row zero point instead of the constant 8.
#include <algorithm>
#include <cstring>
#include <vector>

#include "kernels/cpu/cpu_info.h"
#include "kernels/cpu/qgemm.h"
#include "kernels/cpu/weight_prefetch.h"

#if defined(__x86_64__)
#include <immintrin.h>

#define TESSERA_AVX512 \
  __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,avx512vbmi,avx2,fma,f16c")))
#define TESSERA_AVX512_INLINE inline __attribute__((always_inline)) TESSERA_AVX512

namespace tessera::cpu {
namespace {

constexpr int kRows = 16;

// Byte i (0..3) of each 32-bit lane of v, sign-extended: the Q6_K scales, four to a lane.
TESSERA_AVX512_INLINE __m512i lane_sbyte(__m512i v, int i) { return _mm512_srai_epi32(_mm512_slli_epi32(v, 24 - 8 * i), 24); }

// ------------------------------------------------------------------ transposes

// out[d] lane r = dword d of the 16 bytes at p[r] + off (d = 0..3).
TESSERA_AVX512_INLINE void tr16x4(const uint8_t* const* p, size_t off, __m512i* out) {
  __m512i z[4];
  for (int i = 0; i < 4; ++i) {
    const __m256i a = _mm256_inserti128_si256(
        _mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p[4 * i] + off))),
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(p[4 * i + 1] + off)), 1);
    const __m256i b = _mm256_inserti128_si256(
        _mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p[4 * i + 2] + off))),
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(p[4 * i + 3] + off)), 1);
    z[i] = _mm512_inserti64x4(_mm512_castsi256_si512(a), b, 1);
  }
  // z[i] lane 4r' + d = row 4i + r', dword d. P: [dword d0 of 8 rows | dword d1 of 8 rows].
  const __m512i idx_lo = _mm512_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28, 1, 5, 9, 13, 17, 21, 25, 29);
  const __m512i idx_hi = _mm512_setr_epi32(2, 6, 10, 14, 18, 22, 26, 30, 3, 7, 11, 15, 19, 23, 27, 31);
  const __m512i p0 = _mm512_permutex2var_epi32(z[0], idx_lo, z[1]);
  const __m512i p1 = _mm512_permutex2var_epi32(z[2], idx_lo, z[3]);
  const __m512i q0 = _mm512_permutex2var_epi32(z[0], idx_hi, z[1]);
  const __m512i q1 = _mm512_permutex2var_epi32(z[2], idx_hi, z[3]);
  out[0] = _mm512_shuffle_i64x2(p0, p1, 0x44);
  out[1] = _mm512_shuffle_i64x2(p0, p1, 0xEE);
  out[2] = _mm512_shuffle_i64x2(q0, q1, 0x44);
  out[3] = _mm512_shuffle_i64x2(q0, q1, 0xEE);
}

// out[d] lane r = dword d of the 32 bytes at p[r] + off (d = 0..7).
TESSERA_AVX512_INLINE void tr16x8(const uint8_t* const* p, size_t off, __m512i* out) {
  __m512i z[8];
  for (int i = 0; i < 8; ++i)
    z[i] = _mm512_inserti64x4(
        _mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p[2 * i] + off))),
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p[2 * i + 1] + off)), 1);
  // z[i] lane j = row 2i + j / 8, dword j % 8.
  // Stage 1 (rows 4i..4i+3): lane 4d + r' = row r', dword d (L: d 0..3, H: d 4..7).
  const __m512i i1l = _mm512_setr_epi32(0, 8, 16, 24, 1, 9, 17, 25, 2, 10, 18, 26, 3, 11, 19, 27);
  const __m512i i1h = _mm512_setr_epi32(4, 12, 20, 28, 5, 13, 21, 29, 6, 14, 22, 30, 7, 15, 23, 31);
  __m512i l[4], h[4];
  for (int i = 0; i < 4; ++i) {
    l[i] = _mm512_permutex2var_epi32(z[2 * i], i1l, z[2 * i + 1]);
    h[i] = _mm512_permutex2var_epi32(z[2 * i], i1h, z[2 * i + 1]);
  }
  // Stage 2 (rows 8j..8j+7): lane 8d' + r'' = row r'', dword d' of the pair taken.
  const __m512i i2a = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23);
  const __m512i i2b = _mm512_setr_epi32(8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31);
  __m512i s2[8];
  for (int j = 0; j < 2; ++j) {
    s2[0 + j] = _mm512_permutex2var_epi32(l[2 * j], i2a, l[2 * j + 1]);  // d 0, 1
    s2[2 + j] = _mm512_permutex2var_epi32(l[2 * j], i2b, l[2 * j + 1]);  // d 2, 3
    s2[4 + j] = _mm512_permutex2var_epi32(h[2 * j], i2a, h[2 * j + 1]);  // d 4, 5
    s2[6 + j] = _mm512_permutex2var_epi32(h[2 * j], i2b, h[2 * j + 1]);  // d 6, 7
  }
  for (int q = 0; q < 4; ++q) {
    out[2 * q] = _mm512_shuffle_i64x2(s2[2 * q], s2[2 * q + 1], 0x44);
    out[2 * q + 1] = _mm512_shuffle_i64x2(s2[2 * q], s2[2 * q + 1], 0xEE);
  }
}

// 16 fp16 values at base + vindex[r] + off, gathered as dwords that start there (the two
// bytes after the value must belong to the block).
TESSERA_AVX512_INLINE __m512 gather_f16_lo(const uint8_t* base, __m512i vindex, size_t off) {
  const __m512i v = _mm512_i32gather_epi32(vindex, base + off, 1);
  return _mm512_cvtph_ps(_mm512_cvtepi32_epi16(v));
}

// 16 fp16 values at p[r] + off, assembled in general-purpose registers (vector gathers are
// slow on some CPUs, e.g. Zen; the scalar work runs on otherwise idle integer ports).
TESSERA_AVX512_INLINE uint64_t pack4_u16(const uint8_t* const* p, size_t off) {
  uint16_t h[4];
  for (int r = 0; r < 4; ++r) std::memcpy(&h[r], p[r] + off, 2);
  return static_cast<uint64_t>(h[0]) | static_cast<uint64_t>(h[1]) << 16 | static_cast<uint64_t>(h[2]) << 32 |
         static_cast<uint64_t>(h[3]) << 48;
}

TESSERA_AVX512_INLINE __m512 load16_f16(const uint8_t* const* p, size_t off) {
  const __m256i v = _mm256_set_epi64x(static_cast<long long>(pack4_u16(p + 12, off)),
                                      static_cast<long long>(pack4_u16(p + 8, off)),
                                      static_cast<long long>(pack4_u16(p + 4, off)),
                                      static_cast<long long>(pack4_u16(p, off)));
  return _mm512_cvtph_ps(v);
}

// The same for a value at the end of a block: the dword starts two bytes before it.
TESSERA_AVX512_INLINE __m512 gather_f16_hi(const uint8_t* base, __m512i vindex, size_t off) {
  const __m512i v = _mm512_i32gather_epi32(vindex, base + off - 2, 1);
  return _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(v, 16)));
}

TESSERA_AVX512_INLINE __m512i bcast_x4(const int8_t* x) {
  int32_t v;
  std::memcpy(&v, x, 4);
  return _mm512_set1_epi32(v);
}

// ------------------------------------------------------------------ tiles
//
// A tile holds, for 16 rows, interleaved units (512 bytes each: W[0..7]) and per-row scales.
//   Q32 (Q8_0 / Q4_0 / Q5_0): per block: 1 unit, dw[16] floats.
//   K-affine (Q4_K / Q5_K):   per super-block: 8 units, sc[8][16], m[8][16] int32, d[16], dmin[16].
//   Q6_K:                     per super-block: 8 units, sc[16][16] int32, d[16].
struct Rows {
  const uint8_t* p[kRows];  // row pointers (invalid rows repeat the last valid one)
  __m512i vindex;           // byte offset of each row from p[0]
  size_t trailer = 0;       // I8_CH: byte offset of the row scale
  const uint8_t* group = nullptr;  // Q8_0_R16 / Q4_0_R16: the group's interleaved blocks (qgemm.h)
};

// Reads of the 16 rows' bytes at byte offset `off` of every row (the same field of each row's
// block): transposed from the rows, or, for an R16 matrix (kernels/cpu/qgemm.h), loaded as
// stored: there the field at block byte x of block b sits at group + 16 * (b * block_bytes + x)
// with lane r = row r (dwords: 64-byte vectors, fp16 fields: 16 halves).
// out[d] lane r = dword d of the 16 (x4) or 32 (x8) bytes at row r + off.
TESSERA_AVX512_INLINE void rows16x4(const Rows& rows, size_t off, __m512i* out) {
  if (rows.group == nullptr) return tr16x4(rows.p, off, out);
  for (int d = 0; d < 4; ++d) out[d] = _mm512_loadu_si512(rows.group + kRows * off + 64 * d);
}
TESSERA_AVX512_INLINE void rows16x8(const Rows& rows, size_t off, __m512i* out) {
  if (rows.group == nullptr) return tr16x8(rows.p, off, out);
  for (int d = 0; d < 8; ++d) out[d] = _mm512_loadu_si512(rows.group + kRows * off + 64 * d);
}
// Lane r = the dword at row r + off.
TESSERA_AVX512_INLINE __m512i rows_dword(const Rows& rows, size_t off) {
  if (rows.group == nullptr) return _mm512_i32gather_epi32(rows.vindex, rows.p[0] + off, 1);
  return _mm512_loadu_si512(rows.group + kRows * off);
}
// Lane r = the fp16 value at row r + off; `at_end`: the field ends its row's block (a gather
// reads the dword before it).
TESSERA_AVX512_INLINE __m512 rows_f16(const Rows& rows, size_t off, bool at_end = false) {
  if (rows.group != nullptr)
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(rows.group + kRows * off)));
  return at_end ? gather_f16_hi(rows.p[0], rows.vindex, off) : load16_f16(rows.p, off);
}

struct TileLayout {
  size_t units_per_block;    // interleaved units per weight block
  size_t scale_bytes;        // per block
  size_t block_stride() const { return units_per_block * 512 + scale_bytes; }
};

TileLayout tile_layout(QuantType t) {
  switch (t) {
    case QuantType::kQ4_K:
    case QuantType::kQ5_K: return {8, 8 * 64 * 2 + 64 * 2};
    case QuantType::kQ6_K: return {8, 16 * 64 + 64};
    case QuantType::kI4_G128: return {1, 128};  // dw[16] floats, -z[16] int32
    default: return {1, 64};
  }
}

TESSERA_AVX512_INLINE void store_unit(uint8_t* dst, const __m512i* w) {
  for (int g = 0; g < 8; ++g) _mm512_store_si512(reinterpret_cast<__m512i*>(dst + 64 * g), w[g]);
}

// Writes blocks [b0, b1) to `tile`; with tile == nullptr, leaves the one block b0's unit in
// `out` instead (the decode path).
TESSERA_AVX512_INLINE void build_q32(QuantType type, const Rows& rows, int64_t b0, int64_t b1, uint8_t* tile,
                                     __m512i* out = nullptr) {
  const __m512i m4 = _mm512_set1_epi8(0x0F);
  const size_t bb = type == QuantType::kQ8_0 ? 34 : type == QuantType::kQ4_0 ? 18 : 22;
  for (int64_t b = b0; b < b1; ++b, tile += 512 + 64) {
    const size_t off = static_cast<size_t>(b) * bb;
    __m512i w[8];
    if (type == QuantType::kQ8_0) {
      rows16x8(rows, off + 2, w);
      const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
      for (int g = 0; g < 8; ++g) w[g] = _mm512_xor_si512(w[g], flip);
    } else if (type == QuantType::kQ4_0) {
      __m512i d[4];
      rows16x4(rows, off + 2, d);
      for (int g = 0; g < 4; ++g) {
        w[g] = _mm512_and_si512(d[g], m4);
        w[g + 4] = _mm512_and_si512(_mm512_srli_epi16(d[g], 4), m4);
      }
    } else {  // Q5_0: nibbles as Q4_0, fifth bit of element j from bit j of qh
      __m512i d[4];
      rows16x4(rows, off + 6, d);
      const __m512i qh = rows_dword(rows, off + 2);
      const __m512i spread = _mm512_set1_epi32(0x00204081);
      const __m512i ones = _mm512_set1_epi32(0x01010101);
      for (int g = 0; g < 8; ++g) {
        // 4 bits of qh -> bit 0 of 4 bytes: multiply by 1 + 2^7 + 2^14 + 2^21 and mask.
        const __m512i bits = _mm512_and_si512(_mm512_srli_epi32(qh, 4 * g), _mm512_set1_epi32(0xF));
        const __m512i hb = _mm512_slli_epi32(_mm512_and_si512(_mm512_mullo_epi32(bits, spread), ones), 4);
        const __m512i nib = g < 4 ? _mm512_and_si512(d[g], m4)
                                  : _mm512_and_si512(_mm512_srli_epi16(d[g - 4], 4), m4);
        w[g] = _mm512_or_si512(nib, hb);
      }
    }
    if (tile == nullptr) {
      for (int g = 0; g < 8; ++g) out[g] = w[g];
      return;
    }
    store_unit(tile, w);
    _mm512_store_ps(reinterpret_cast<float*>(tile + 512), rows_f16(rows, off));
  }
}

TESSERA_AVX512 void build_k_affine(QuantType type, const Rows& rows, int64_t b0, int64_t b1, uint8_t* tile) {
  const bool q5 = type == QuantType::kQ5_K;
  const size_t bb = q5 ? 176 : 144;
  const __m512i m4 = _mm512_set1_epi8(0x0F);
  const __m512i m6 = _mm512_set1_epi32(63);
  const __m512i lsb = _mm512_set1_epi8(0x01);
  const size_t stride = tile_layout(type).block_stride();
  for (int64_t b = b0; b < b1; ++b, tile += stride) {
    const size_t off = static_cast<size_t>(b) * bb;
    __m512i qh[8];
    if (q5) rows16x8(rows, off + 16, qh);
    for (int c = 0; c < 4; ++c) {
      __m512i d[8], lo[8], hi[8];
      rows16x8(rows, off + (q5 ? 48 : 16) + 32 * static_cast<size_t>(c), d);
      for (int g = 0; g < 8; ++g) {
        lo[g] = _mm512_and_si512(d[g], m4);
        hi[g] = _mm512_and_si512(_mm512_srli_epi16(d[g], 4), m4);
        if (q5) {
          lo[g] = _mm512_or_si512(lo[g], _mm512_slli_epi16(_mm512_and_si512(_mm512_srli_epi16(qh[g], 2 * c), lsb), 4));
          hi[g] = _mm512_or_si512(hi[g], _mm512_slli_epi16(_mm512_and_si512(_mm512_srli_epi16(qh[g], 2 * c + 1), lsb), 4));
        }
      }
      store_unit(tile + 512 * (2 * c), lo);
      store_unit(tile + 512 * (2 * c + 1), hi);
    }
    // Header: d, dmin (dword 0), scales[0..3], [4..7], [8..11] (dwords 1..3).
    __m512i hd[4];
    rows16x4(rows, off, hd);
    auto* sc = reinterpret_cast<int32_t*>(tile + 4096);
    auto* mm = sc + 8 * 16;
    auto* df = reinterpret_cast<float*>(mm + 8 * 16);
    for (int s = 0; s < 4; ++s) {
      _mm512_store_si512(sc + 16 * s, _mm512_and_si512(_mm512_srli_epi32(hd[1], 8 * s), m6));
      _mm512_store_si512(mm + 16 * s, _mm512_and_si512(_mm512_srli_epi32(hd[2], 8 * s), m6));
      const __m512i lo4 = _mm512_srli_epi32(hd[3], 8 * s);
      const __m512i top_sc = _mm512_and_si512(_mm512_srli_epi32(hd[1], 8 * s + 6), _mm512_set1_epi32(3));
      const __m512i top_m = _mm512_and_si512(_mm512_srli_epi32(hd[2], 8 * s + 6), _mm512_set1_epi32(3));
      _mm512_store_si512(sc + 16 * (s + 4), _mm512_or_si512(_mm512_and_si512(lo4, _mm512_set1_epi32(0xF)),
                                                             _mm512_slli_epi32(top_sc, 4)));
      _mm512_store_si512(mm + 16 * (s + 4), _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(lo4, 4), _mm512_set1_epi32(0xF)),
                                                             _mm512_slli_epi32(top_m, 4)));
    }
    const __m512i dd = hd[0];
    _mm512_store_ps(df, _mm512_cvtph_ps(_mm512_cvtepi32_epi16(dd)));
    _mm512_store_ps(df + 16, _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(dd, 16))));
  }
}

// Levels of the four 32-element quarters of one Q6_K half from its transposed low bytes
// (a: ql[0..31], c: ql[32..63]) and high bits (qh): quarter q takes nibble q / 2 of a (q even)
// or c (q odd), and bits 2q..2q+1 of qh as its bits 4..5.
TESSERA_AVX512_INLINE void q6_unpack(const __m512i* a, const __m512i* c, const __m512i* qh, __m512i (*u)[8]) {
  const __m512i m4 = _mm512_set1_epi8(0x0F);
  const __m512i m30 = _mm512_set1_epi8(0x30);
  for (int g = 0; g < 8; ++g) {
    // ternlog 0xCA = A ? B : C bitwise, with A = 0x0F per byte: the low nibble from B, the
    // rest from C (bits 4..5 already shifted into place, zero elsewhere).
    const __m512i h0 = _mm512_and_si512(_mm512_slli_epi16(qh[g], 4), m30);
    const __m512i h1 = _mm512_and_si512(_mm512_slli_epi16(qh[g], 2), m30);
    const __m512i h2 = _mm512_and_si512(qh[g], m30);
    const __m512i h3 = _mm512_and_si512(_mm512_srli_epi16(qh[g], 2), m30);
    u[0][g] = _mm512_ternarylogic_epi32(m4, a[g], h0, 0xCA);
    u[1][g] = _mm512_ternarylogic_epi32(m4, c[g], h1, 0xCA);
    u[2][g] = _mm512_ternarylogic_epi32(m4, _mm512_srli_epi16(a[g], 4), h2, 0xCA);
    u[3][g] = _mm512_ternarylogic_epi32(m4, _mm512_srli_epi16(c[g], 4), h3, 0xCA);
  }
}

TESSERA_AVX512 void build_q6_k(const Rows& rows, int64_t b0, int64_t b1, uint8_t* tile) {
  const size_t stride = tile_layout(QuantType::kQ6_K).block_stride();
  const __m512i m4 = _mm512_set1_epi8(0x0F);
  const __m512i m30 = _mm512_set1_epi8(0x30);
  for (int64_t b = b0; b < b1; ++b, tile += stride) {
    const size_t off = static_cast<size_t>(b) * 210;
    // In address order, as gemv_q6_k_r16 reads (the streamers follow an R16 group's blocks):
    // the nibbles of ql into the four quarters' units, then qh's bits 4..5 ORed in, then the
    // scales and d. The same units as q6_unpack gives.
    for (int h = 0; h < 2; ++h) {
      __m512i a[8], c[8];
      rows16x8(rows, off + 64 * static_cast<size_t>(h), a);
      rows16x8(rows, off + 64 * static_cast<size_t>(h) + 32, c);
      __m512i u[4][8];
      for (int g = 0; g < 8; ++g) {
        u[0][g] = _mm512_and_si512(a[g], m4);
        u[1][g] = _mm512_and_si512(c[g], m4);
        u[2][g] = _mm512_and_si512(_mm512_srli_epi16(a[g], 4), m4);
        u[3][g] = _mm512_and_si512(_mm512_srli_epi16(c[g], 4), m4);
      }
      for (int q = 0; q < 4; ++q) store_unit(tile + 512 * (4 * h + q), u[q]);
    }
    for (int h = 0; h < 2; ++h) {
      __m512i qh[8];
      rows16x8(rows, off + 128 + 32 * static_cast<size_t>(h), qh);
      for (int q = 0; q < 4; ++q) {
        auto* unit = reinterpret_cast<__m512i*>(tile + 512 * (4 * h + q));
        for (int g = 0; g < 8; ++g) {
          const __m512i hq = q == 0   ? _mm512_slli_epi16(qh[g], 4)
                             : q == 1 ? _mm512_slli_epi16(qh[g], 2)
                             : q == 2 ? qh[g]
                                      : _mm512_srli_epi16(qh[g], 2);
          // ternlog 0xF8 = A | (B & C): the unit's nibbles, qh's bits 4..5 (C = 0x30) ORed in.
          _mm512_store_si512(unit + g, _mm512_ternarylogic_epi32(_mm512_load_si512(unit + g), hq, m30, 0xF8));
        }
      }
    }
    __m512i s[4];
    rows16x4(rows, off + 192, s);
    auto* sc = reinterpret_cast<int32_t*>(tile + 4096);
    for (int g = 0; g < 16; ++g)
      _mm512_store_si512(sc + 16 * g, lane_sbyte(s[g / 4], g % 4));
    _mm512_store_ps(reinterpret_cast<float*>(sc + 256), rows_f16(rows, off + 208, /*at_end=*/true));
  }
}

// I8_CH: 32-blocks of int8 levels (+128 as Q8_0), dw = the row scale.
// I4_G128: 32-block b = sub-block b % 4 of group b / 4, nibbles as Q4_0; dw = d, and -z per row.
TESSERA_AVX512 void build_int(QuantType type, const Rows& rows, int64_t b0, int64_t b1, uint8_t* tile) {
  const __m512i m4 = _mm512_set1_epi8(0x0F);
  const size_t stride = tile_layout(type).block_stride();
  __m512 row_scale = _mm512_setzero_ps();
  if (type == QuantType::kI8_CH) {
    row_scale = _mm512_castsi512_ps(rows_dword(rows, rows.trailer));
  }
  for (int64_t b = b0; b < b1; ++b, tile += stride) {
    __m512i w[8];
    if (type == QuantType::kI8_CH) {
      rows16x8(rows, static_cast<size_t>(b) * 32, w);
      const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
      for (int g = 0; g < 8; ++g) w[g] = _mm512_xor_si512(w[g], flip);
      store_unit(tile, w);
      _mm512_store_ps(reinterpret_cast<float*>(tile + 512), row_scale);
      continue;
    }
    const size_t grp = static_cast<size_t>(b / 4) * 68;
    __m512i d[4];
    rows16x4(rows, grp + 4 + 16 * static_cast<size_t>(b % 4), d);
    for (int g = 0; g < 4; ++g) {
      w[g] = _mm512_and_si512(d[g], m4);
      w[g + 4] = _mm512_and_si512(_mm512_srli_epi16(d[g], 4), m4);
    }
    store_unit(tile, w);
    const __m512i hdr = rows_dword(rows, grp);
    _mm512_store_ps(reinterpret_cast<float*>(tile + 512), _mm512_cvtph_ps(_mm512_cvtepi32_epi16(hdr)));
    const __m512i z = _mm512_and_si512(_mm512_srli_epi32(hdr, 16), _mm512_set1_epi32(0xFF));
    _mm512_store_si512(tile + 576, _mm512_sub_epi32(_mm512_setzero_si512(), z));
  }
}

TESSERA_AVX512 void build_tile(QuantType type, const Rows& rows, int64_t b0, int64_t b1, uint8_t* tile) {
  switch (type) {
    case QuantType::kI8_CH:
    case QuantType::kI4_G128: return build_int(type, rows, b0, b1, tile);
    case QuantType::kQ4_K:
    case QuantType::kQ5_K: return build_k_affine(type, rows, b0, b1, tile);
    case QuantType::kQ6_K: return build_q6_k(rows, b0, b1, tile);
    default: return build_q32(type, rows, b0, b1, tile);
  }
}

// ------------------------------------------------------------------ decode (one token)
//
// The same units as the tiles, consumed in registers as soon as they are built. `pf` walks the
// next row group's bytes (contiguous), prefetched a little per block: the 16 interleaved row
// streams of this group are more than the hardware prefetchers keep ahead of.
using Prefetch = WeightPrefetch;  // kernels/cpu/weight_prefetch.h

struct Token1 {
  const int8_t* q;
  const float* d;
  const int16_t* bsum;
};

template <QuantType kType>
TESSERA_AVX512 __m512 gemv_q32(const Rows& rows, int64_t nb, const Token1& x, Prefetch pf) {
  constexpr size_t bb = kType == QuantType::kQ8_0 ? 34 : kType == QuantType::kQ4_0 ? 18 : 22;
  constexpr int offset = kType == QuantType::kQ8_0 ? 128 : kType == QuantType::kQ4_0 ? 8 : 16;
  const __m512i m4 = _mm512_set1_epi8(0x0F);
  __m512 acc = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    pf.tick();
    const size_t off = static_cast<size_t>(b) * bb;
    const int8_t* xb = x.q + 32 * b;
    __m512i ia = _mm512_set1_epi32(-offset * (x.bsum[2 * b] + x.bsum[2 * b + 1]));
    if constexpr (kType == QuantType::kQ8_0) {
      __m512i w[8];
      rows16x8(rows, off + 2, w);
      const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
      for (int g = 0; g < 8; ++g) ia = _mm512_dpbusd_epi32(ia, _mm512_xor_si512(w[g], flip), bcast_x4(xb + 4 * g));
    } else if constexpr (kType == QuantType::kQ4_0) {
      __m512i d[4];
      rows16x4(rows, off + 2, d);
      for (int g = 0; g < 4; ++g) {
        ia = _mm512_dpbusd_epi32(ia, _mm512_and_si512(d[g], m4), bcast_x4(xb + 4 * g));
        ia = _mm512_dpbusd_epi32(ia, _mm512_and_si512(_mm512_srli_epi16(d[g], 4), m4), bcast_x4(xb + 16 + 4 * g));
      }
    } else {
      __m512i w[8];
      build_q32(kType, rows, b, b + 1, nullptr, w);
      for (int g = 0; g < 8; ++g) ia = _mm512_dpbusd_epi32(ia, w[g], bcast_x4(xb + 4 * g));
    }
    const __m512 dw = rows_f16(rows, off);
    acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ia), _mm512_mul_ps(dw, _mm512_set1_ps(x.d[b])), acc);
  }
  return acc;
}

template <bool kQ5>
TESSERA_AVX512 __m512 gemv_k_affine(const Rows& rows, int64_t nb, const Token1& x, Prefetch pf) {
  constexpr size_t bb = kQ5 ? 176 : 144;
  const __m512i m4 = _mm512_set1_epi8(0x0F);
  const __m512i m6 = _mm512_set1_epi32(63), m3 = _mm512_set1_epi32(3), mf = _mm512_set1_epi32(0xF);
  const __m512i lsb = _mm512_set1_epi8(0x01);
  __m512 acc = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    pf.tick();
    const size_t off = static_cast<size_t>(b) * bb;
    __m512i hd[4];
    rows16x4(rows, off, hd);
    __m512i sc[8], mm[8];
    for (int s = 0; s < 4; ++s) {
      sc[s] = _mm512_and_si512(_mm512_srli_epi32(hd[1], 8 * s), m6);
      mm[s] = _mm512_and_si512(_mm512_srli_epi32(hd[2], 8 * s), m6);
      const __m512i lo4 = _mm512_srli_epi32(hd[3], 8 * s);
      sc[s + 4] = _mm512_or_si512(_mm512_and_si512(lo4, mf),
                                  _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(hd[1], 8 * s + 6), m3), 4));
      mm[s + 4] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(lo4, 4), mf),
                                  _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(hd[2], 8 * s + 6), m3), 4));
    }
    __m512i qh[8];
    if constexpr (kQ5) rows16x8(rows, off + 16, qh);
    const int8_t* xb = x.q + 256 * b;
    __m512i tot = _mm512_setzero_si512();
    for (int c = 0; c < 4; ++c) {
      __m512i d[8];
      rows16x8(rows, off + (kQ5 ? 48 : 16) + 32 * static_cast<size_t>(c), d);
      __m512i ilo = _mm512_setzero_si512(), ihi = _mm512_setzero_si512();
      for (int g = 0; g < 8; ++g) {
        __m512i lo = _mm512_and_si512(d[g], m4);
        __m512i hi = _mm512_and_si512(_mm512_srli_epi16(d[g], 4), m4);
        if constexpr (kQ5) {
          lo = _mm512_or_si512(lo, _mm512_slli_epi16(_mm512_and_si512(_mm512_srli_epi16(qh[g], 2 * c), lsb), 4));
          hi = _mm512_or_si512(hi, _mm512_slli_epi16(_mm512_and_si512(_mm512_srli_epi16(qh[g], 2 * c + 1), lsb), 4));
        }
        ilo = _mm512_dpbusd_epi32(ilo, lo, bcast_x4(xb + 64 * c + 4 * g));
        ihi = _mm512_dpbusd_epi32(ihi, hi, bcast_x4(xb + 64 * c + 32 + 4 * g));
      }
      tot = _mm512_add_epi32(tot, _mm512_add_epi32(_mm512_mullo_epi32(ilo, sc[2 * c]), _mm512_mullo_epi32(ihi, sc[2 * c + 1])));
    }
    __m512i ms = _mm512_setzero_si512();
    const int16_t* bs = x.bsum + 16 * b;
    for (int s = 0; s < 8; ++s) ms = _mm512_add_epi32(ms, _mm512_mullo_epi32(mm[s], _mm512_set1_epi32(bs[2 * s] + bs[2 * s + 1])));
    const __m512 dx = _mm512_set1_ps(x.d[b]);
    const __m512 d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(hd[0]));
    const __m512 dmin = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(hd[0], 16)));
    acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(tot), _mm512_mul_ps(d, dx), acc);
    acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_setzero_si512(), ms)), _mm512_mul_ps(dmin, dx), acc);
  }
  return acc;
}

TESSERA_AVX512 __m512 gemv_q6_k(const Rows& rows, int64_t nb, const Token1& x, Prefetch pf) {
  __m512 acc = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    pf.tick();
    const size_t off = static_cast<size_t>(b) * 210;
    __m512i s4[4];
    rows16x4(rows, off + 192, s4);
    const int8_t* xb = x.q + 256 * b;
    const int16_t* bs = x.bsum + 16 * b;
    __m512i tot = _mm512_setzero_si512();
    for (int h = 0; h < 2; ++h) {
      __m512i a[8], c[8], qh[8];
      rows16x8(rows, off + 64 * static_cast<size_t>(h), a);
      rows16x8(rows, off + 64 * static_cast<size_t>(h) + 32, c);
      rows16x8(rows, off + 128 + 32 * static_cast<size_t>(h), qh);
      __m512i u[4][8];
      q6_unpack(a, c, qh, u);
      for (int q = 0; q < 4; ++q) {
        for (int half = 0; half < 2; ++half) {
          const int grp = 8 * h + 2 * q + half;  // 16-element group
          __m512i ia = _mm512_set1_epi32(-32 * bs[grp]);
          for (int g = 4 * half; g < 4 * half + 4; ++g) ia = _mm512_dpbusd_epi32(ia, u[q][g], bcast_x4(xb + 32 * (4 * h + q) + 4 * g));
          const __m512i scv = lane_sbyte(s4[grp / 4], grp % 4);
          tot = _mm512_add_epi32(tot, _mm512_mullo_epi32(ia, scv));
        }
      }
    }
    const __m512 d = rows_f16(rows, off + 208, /*at_end=*/true);
    acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(tot), _mm512_mul_ps(d, _mm512_set1_ps(x.d[b])), acc);
  }
  return acc;
}

// R16 Q6_K decode, reading each block's bytes in address order: the low nibbles (ql, block
// bytes 0..127), then the high bits (qh, 128..191), then the scales and d. The unpacking above
// needs ql and qh of a half together, which walks 0-1023, 2048-2559, 1024-2047, 2560-3071 and
// the scales at 3072 first in every 3360-byte block: on Zen 4 the L2 streamer does not follow
// that order from DRAM (6 GB/s from L3, 5 GB/s from DRAM, against 32 / 18 for Q4_K). Here every
// 16-element group keeps its own int32 sum over both passes, (lo + 16 * hi2) . x being
// lo . x + (hi2 << 4) . x: twice the dots, the same exact integers.
TESSERA_AVX512 __m512 gemv_q6_k_r16(const Rows& rows, int64_t nb, const Token1& x, Prefetch pf) {
  const __m512i m4 = _mm512_set1_epi8(0x0F);
  const __m512i m30 = _mm512_set1_epi8(0x30);
  __m512 acc = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    pf.tick();
    const uint8_t* at = rows.group + kRows * static_cast<size_t>(b) * 210;  // dword d of byte x: at + 16x + 64d
    const int8_t* xb = x.q + 256 * b;
    const int16_t* bs = x.bsum + 16 * b;
    __m512i ia[16];
    for (int grp = 0; grp < 16; ++grp) ia[grp] = _mm512_set1_epi32(-32 * bs[grp]);
    // ql: byte 64h + 32j + 4g + i holds element 128h + 32(j + 2n) + 4g + i in nibble n.
    for (int h = 0; h < 2; ++h) {
      for (int j = 0; j < 2; ++j) {
        for (int g = 0; g < 8; ++g) {
          const __m512i v = _mm512_loadu_si512(at + kRows * (64 * h + 32 * j) + 64 * g);
          const int q0 = j, q1 = j + 2;  // quarters of the low and high nibble
          ia[8 * h + 2 * q0 + g / 4] = _mm512_dpbusd_epi32(ia[8 * h + 2 * q0 + g / 4], _mm512_and_si512(v, m4),
                                                           bcast_x4(xb + 32 * (4 * h + q0) + 4 * g));
          ia[8 * h + 2 * q1 + g / 4] =
              _mm512_dpbusd_epi32(ia[8 * h + 2 * q1 + g / 4], _mm512_and_si512(_mm512_srli_epi16(v, 4), m4),
                                  bcast_x4(xb + 32 * (4 * h + q1) + 4 * g));
        }
      }
    }
    // qh: byte 128 + 32h + 4g + i holds bits 4..5 of element 128h + 32q + 4g + i at bits 2q..2q+1.
    for (int h = 0; h < 2; ++h) {
      for (int g = 0; g < 8; ++g) {
        const __m512i v = _mm512_loadu_si512(at + kRows * (128 + 32 * h) + 64 * g);
        const __m512i hq[4] = {_mm512_and_si512(_mm512_slli_epi16(v, 4), m30), _mm512_and_si512(_mm512_slli_epi16(v, 2), m30),
                               _mm512_and_si512(v, m30), _mm512_and_si512(_mm512_srli_epi16(v, 2), m30)};
        for (int q = 0; q < 4; ++q)
          ia[8 * h + 2 * q + g / 4] =
              _mm512_dpbusd_epi32(ia[8 * h + 2 * q + g / 4], hq[q], bcast_x4(xb + 32 * (4 * h + q) + 4 * g));
      }
    }
    __m512i tot = _mm512_setzero_si512();
    for (int d = 0; d < 4; ++d) {
      const __m512i s4 = _mm512_loadu_si512(at + kRows * 192 + 64 * d);
      for (int i = 0; i < 4; ++i)
        tot = _mm512_add_epi32(tot, _mm512_mullo_epi32(ia[4 * d + i], lane_sbyte(s4, i)));
    }
    const __m512 d = rows_f16(rows, static_cast<size_t>(b) * 210 + 208, /*at_end=*/true);
    acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(tot), _mm512_mul_ps(d, _mm512_set1_ps(x.d[b])), acc);
  }
  return acc;
}

// I8_CH: the Q8_0 scheme with one scale per row for every block.
TESSERA_AVX512 __m512 gemv_i8_ch(const Rows& rows, int64_t nb, const Token1& x, Prefetch pf) {
  const __m512 s = _mm512_castsi512_ps(rows_dword(rows, rows.trailer));
  const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
  __m512 acc = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    pf.tick();
    const int8_t* xb = x.q + 32 * b;
    __m512i ia = _mm512_set1_epi32(-128 * (x.bsum[2 * b] + x.bsum[2 * b + 1]));
    __m512i w[8];
    rows16x8(rows, static_cast<size_t>(b) * 32, w);
    for (int g = 0; g < 8; ++g) ia = _mm512_dpbusd_epi32(ia, _mm512_xor_si512(w[g], flip), bcast_x4(xb + 4 * g));
    acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ia), _mm512_mul_ps(s, _mm512_set1_ps(x.d[b])), acc);
  }
  return acc;
}

// I4_G128: per group, d and -z of the 16 rows, then four Q4_0-like 32-blocks.
TESSERA_AVX512 __m512 gemv_i4_g128(const Rows& rows, int64_t nb, const Token1& x, Prefetch pf) {
  const __m512i m4 = _mm512_set1_epi8(0x0F);
  __m512 acc = _mm512_setzero_ps();
  for (int64_t grp = 0; grp < nb / 4; ++grp) {
    const size_t off = static_cast<size_t>(grp) * 68;
    const __m512i hdr = rows_dword(rows, off);
    const __m512 dw = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(hdr));
    const __m512i nz = _mm512_sub_epi32(_mm512_setzero_si512(),
                                        _mm512_and_si512(_mm512_srli_epi32(hdr, 16), _mm512_set1_epi32(0xFF)));
    for (int64_t sb = 0; sb < 4; ++sb) {
      pf.tick();
      const int64_t b = 4 * grp + sb;
      const int8_t* xb = x.q + 32 * b;
      __m512i ia = _mm512_mullo_epi32(nz, _mm512_set1_epi32(x.bsum[2 * b] + x.bsum[2 * b + 1]));
      __m512i d[4];
      rows16x4(rows, off + 4 + 16 * static_cast<size_t>(sb), d);
      for (int g = 0; g < 4; ++g) {
        ia = _mm512_dpbusd_epi32(ia, _mm512_and_si512(d[g], m4), bcast_x4(xb + 4 * g));
        ia = _mm512_dpbusd_epi32(ia, _mm512_and_si512(_mm512_srli_epi16(d[g], 4), m4), bcast_x4(xb + 16 + 4 * g));
      }
      acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ia), _mm512_mul_ps(dw, _mm512_set1_ps(x.d[b])), acc);
    }
  }
  return acc;
}

TESSERA_AVX512 __m512 gemv_rows(QuantType type, const Rows& rows, int64_t nb, const Token1& x, Prefetch pf) {
  switch (type) {
    case QuantType::kI8_CH: return gemv_i8_ch(rows, nb, x, pf);
    case QuantType::kI4_G128: return gemv_i4_g128(rows, nb, x, pf);
    case QuantType::kQ8_0: return gemv_q32<QuantType::kQ8_0>(rows, nb, x, pf);
    case QuantType::kQ4_0: return gemv_q32<QuantType::kQ4_0>(rows, nb, x, pf);
    case QuantType::kQ5_0: return gemv_q32<QuantType::kQ5_0>(rows, nb, x, pf);
    case QuantType::kQ4_K: return gemv_k_affine<false>(rows, nb, x, pf);
    case QuantType::kQ5_K: return gemv_k_affine<true>(rows, nb, x, pf);
    default: return rows.group != nullptr ? gemv_q6_k_r16(rows, nb, x, pf) : gemv_q6_k(rows, nb, x, pf);
  }
}

uint8_t* tile_scratch(size_t bytes) {
  thread_local std::vector<uint8_t> buf;
  if (buf.size() < bytes + 64) buf.resize(bytes + 64);
  auto addr = reinterpret_cast<uintptr_t>(buf.data());
  return buf.data() + ((64 - addr % 64) % 64);
}

TESSERA_AVX512 void store_rows(float* y, __m512 v, int n_valid) {
  _mm512_mask_storeu_ps(y, static_cast<__mmask16>((1u << n_valid) - 1u), v);
}

// ------------------------------------------------------------------ batched decode (2..16 tokens)
//
// A whole-row tile (prefill) stores and reloads every weight byte expanded ~2x and streams the
// weights with no compute to hide the misses behind; at a few tokens nothing amortizes that.
// Here the tile is built a chunk at a time into an L1 buffer (one K-quant super-block, 8 blocks
// of the 32-element formats) and every token runs over the chunk before the next is built,
// the next row group prefetched per block as in decode. Each weight byte is read from memory
// once per matmul. The tokens come block-major (PackedActs, qgemm.h): token t of block b sits
// at a constant offset from one pointer per block, which keeps the micro-kernels' addressing
// out of the general-purpose registers. Same integer sums, same float operations in the same
// order as the other paths.
// Q8_0 / Q4_0 / Q5_0 (aux: the offset term, precomputed) and, kRowZero, I4_G128 (aux: the
// activation block sum, times the row's zero point here); tiles: unit, dw[16] (, -z[16]).
// These micro-kernels also run prefill over its whole-row tile (8 tokens at a time).
template <int T, bool kRowZero>
TESSERA_AVX512_INLINE void bk_q32(const uint8_t* tile, int64_t nblk, const PackedActs& x, int t0, __m512* out) {
  // Accumulators in locals: `tile` is a byte pointer that may alias `out`, so updating out[]
  // in the loop would make the compiler store and reload it every block.
  __m512 acc[T];
  for (int t = 0; t < T; ++t) acc[t] = out[t];
  const int8_t* q = x.q + static_cast<int64_t>(t0) * 32;
  const float* dx = x.d + t0;
  const int32_t* aux = x.aux + t0;
  const int64_t qstep = static_cast<int64_t>(x.n) * 32;
  for (int64_t b = 0; b < nblk; ++b, tile += 512 + (kRowZero ? 128 : 64), q += qstep, dx += x.n, aux += x.n) {
    __m512i ia[T];
    if constexpr (kRowZero) {
      const __m512i nz = _mm512_load_si512(tile + 576);
      for (int t = 0; t < T; ++t) ia[t] = _mm512_mullo_epi32(nz, _mm512_set1_epi32(aux[t]));
    } else {
      for (int t = 0; t < T; ++t) ia[t] = _mm512_set1_epi32(aux[t]);
    }
    for (int g = 0; g < 8; ++g) {
      const __m512i w = _mm512_load_si512(reinterpret_cast<const __m512i*>(tile + 64 * g));
      for (int t = 0; t < T; ++t) ia[t] = _mm512_dpbusd_epi32(ia[t], w, bcast_x4(q + 32 * t + 4 * g));
    }
    const __m512 dw = _mm512_load_ps(reinterpret_cast<const float*>(tile + 512));
    for (int t = 0; t < T; ++t)
      acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ia[t]), _mm512_mul_ps(dw, _mm512_set1_ps(dx[t])), acc[t]);
  }
  for (int t = 0; t < T; ++t) out[t] = acc[t];
}

// One Q4_K / Q5_K super-block (the tile of build_k_affine). The mins term is
// sum_j pmaddwd(m[2j] | m[2j+1] << 16, aux[j]): the same exact integer as sum_s m[s] * bsum32[s].
template <int T>
TESSERA_AVX512_INLINE void bk_k_affine(const uint8_t* tile, const PackedActs& x, int64_t b, int t0, __m512* out) {
  const int8_t* q = x.q + (b * x.n + t0) * 256;
  const float* dx = x.d + b * x.n + t0;
  const int32_t* aux = x.aux + (b * x.n + t0) * 4;
  const auto* sc = reinterpret_cast<const int32_t*>(tile + 4096);
  const auto* mm = sc + 8 * 16;
  const auto* df = reinterpret_cast<const float*>(mm + 8 * 16);
  __m512i tot[T];
  for (int t = 0; t < T; ++t) tot[t] = _mm512_setzero_si512();
  for (int s = 0; s < 8; ++s) {
    __m512i ia[T];
    for (int t = 0; t < T; ++t) ia[t] = _mm512_setzero_si512();
    const uint8_t* u = tile + 512 * s;
    for (int g = 0; g < 8; ++g) {
      const __m512i w = _mm512_load_si512(reinterpret_cast<const __m512i*>(u + 64 * g));
      for (int t = 0; t < T; ++t) ia[t] = _mm512_dpbusd_epi32(ia[t], w, bcast_x4(q + 256 * t + 32 * s + 4 * g));
    }
    const __m512i scv = _mm512_load_si512(sc + 16 * s);
    for (int t = 0; t < T; ++t) tot[t] = _mm512_add_epi32(tot[t], _mm512_mullo_epi32(ia[t], scv));
  }
  __m512i mp[4];
  for (int j = 0; j < 4; ++j)
    mp[j] = _mm512_or_si512(_mm512_load_si512(mm + 32 * j), _mm512_slli_epi32(_mm512_load_si512(mm + 32 * j + 16), 16));
  const __m512 d = _mm512_load_ps(df), dmin = _mm512_load_ps(df + 16);
  for (int t = 0; t < T; ++t) {
    __m512i ms = _mm512_setzero_si512();
    for (int j = 0; j < 4; ++j) ms = _mm512_dpwssd_epi32(ms, mp[j], _mm512_set1_epi32(aux[4 * t + j]));
    const __m512 dxv = _mm512_set1_ps(dx[t]);
    __m512 acc = out[t];
    acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(tot[t]), _mm512_mul_ps(d, dxv), acc);
    out[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_setzero_si512(), ms)),
                             _mm512_mul_ps(dmin, dxv), acc);
  }
}

// One Q6_K super-block (the tile of build_q6_k); aux[g] = -32 * bsum16[g] starts each group.
template <int T>
TESSERA_AVX512_INLINE void bk_q6_k(const uint8_t* tile, const PackedActs& x, int64_t b, int t0, __m512* out) {
  const int8_t* q = x.q + (b * x.n + t0) * 256;
  const float* dx = x.d + b * x.n + t0;
  const int32_t* aux = x.aux + (b * x.n + t0) * 16;
  const auto* sc = reinterpret_cast<const int32_t*>(tile + 4096);
  __m512i tot[T];
  for (int t = 0; t < T; ++t) tot[t] = _mm512_setzero_si512();
  for (int grp = 0; grp < 16; ++grp) {
    __m512i ia[T];
    for (int t = 0; t < T; ++t) ia[t] = _mm512_set1_epi32(aux[16 * t + grp]);
    const uint8_t* u = tile + 512 * (grp / 2) + 256 * (grp % 2);
    for (int g = 0; g < 4; ++g) {
      const __m512i w = _mm512_load_si512(reinterpret_cast<const __m512i*>(u + 64 * g));
      for (int t = 0; t < T; ++t) ia[t] = _mm512_dpbusd_epi32(ia[t], w, bcast_x4(q + 256 * t + 16 * grp + 4 * g));
    }
    const __m512i scv = _mm512_load_si512(sc + 16 * grp);
    for (int t = 0; t < T; ++t) tot[t] = _mm512_add_epi32(tot[t], _mm512_mullo_epi32(ia[t], scv));
  }
  const __m512 d = _mm512_load_ps(reinterpret_cast<const float*>(sc + 256));
  for (int t = 0; t < T; ++t)
    out[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(tot[t]), _mm512_mul_ps(d, _mm512_set1_ps(dx[t])), out[t]);
}

// Q8_0 / Q4_0 / Q5_0: no tile at all. A block's unit (8 vectors) is built in registers as in
// decode and every token's dot is taken from it at once; the up to 16 accumulators stay in
// registers across the row, and the prefetch ticks once per block as in decode (a tile chunk
// of these short blocks gathers more misses than the build can hide).
template <QuantType kType, int T>
TESSERA_AVX512_INLINE void fused_q32(const Rows& rows, int64_t nb, const PackedActs& x, Prefetch& pf, __m512* out) {
  constexpr size_t bb = kType == QuantType::kQ8_0 ? 34 : kType == QuantType::kQ4_0 ? 18 : 22;
  __m512 acc[T];
  for (int t = 0; t < T; ++t) acc[t] = _mm512_setzero_ps();
  const int8_t* q = x.q;
  const float* dx = x.d;
  const int32_t* aux = x.aux;
  const int64_t qstep = static_cast<int64_t>(T) * 32;
  for (int64_t b = 0; b < nb; ++b, q += qstep, dx += T, aux += T) {
    pf.tick();
    __m512i w[8];
    build_q32(kType, rows, b, b + 1, nullptr, w);
    const __m512 dw = rows_f16(rows, static_cast<size_t>(b) * bb);
    for (int t = 0; t < T; ++t) {
      __m512i ia = _mm512_set1_epi32(aux[t]);
      for (int g = 0; g < 8; ++g) ia = _mm512_dpbusd_epi32(ia, w[g], bcast_x4(q + 32 * t + 4 * g));
      acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ia), _mm512_mul_ps(dw, _mm512_set1_ps(dx[t])), acc[t]);
    }
  }
  for (int t = 0; t < T; ++t) out[t] = acc[t];
}

template <QuantType kType>
TESSERA_AVX512 void fused_q32_n(const Rows& rows, int64_t nb, const PackedActs& x, Prefetch& pf, __m512* acc) {
  switch (x.n) {
    case 2: return fused_q32<kType, 2>(rows, nb, x, pf, acc);
    case 3: return fused_q32<kType, 3>(rows, nb, x, pf, acc);
    case 4: return fused_q32<kType, 4>(rows, nb, x, pf, acc);
    case 5: return fused_q32<kType, 5>(rows, nb, x, pf, acc);
    case 6: return fused_q32<kType, 6>(rows, nb, x, pf, acc);
    case 7: return fused_q32<kType, 7>(rows, nb, x, pf, acc);
    case 8: return fused_q32<kType, 8>(rows, nb, x, pf, acc);
    case 9: return fused_q32<kType, 9>(rows, nb, x, pf, acc);
    case 10: return fused_q32<kType, 10>(rows, nb, x, pf, acc);
    case 11: return fused_q32<kType, 11>(rows, nb, x, pf, acc);
    case 12: return fused_q32<kType, 12>(rows, nb, x, pf, acc);
    case 13: return fused_q32<kType, 13>(rows, nb, x, pf, acc);
    case 14: return fused_q32<kType, 14>(rows, nb, x, pf, acc);
    case 15: return fused_q32<kType, 15>(rows, nb, x, pf, acc);
    default: return fused_q32<kType, 16>(rows, nb, x, pf, acc);
  }
}

// Scale (sc) or min (m) of sub-block s (0..7) of 16 Q4_K / Q5_K rows from the transposed
// header hd (tr16x4 of the first 16 bytes), as build_k_affine stores them.
TESSERA_AVX512_INLINE __m512i k_scale_of(const __m512i* hd, int s) {
  const __m512i m6 = _mm512_set1_epi32(63), m3 = _mm512_set1_epi32(3), mf = _mm512_set1_epi32(0xF);
  if (s < 4) return _mm512_and_si512(_mm512_srli_epi32(hd[1], 8 * s), m6);
  const int u = s - 4;
  return _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(hd[3], 8 * u), mf),
                         _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(hd[1], 8 * u + 6), m3), 4));
}

TESSERA_AVX512_INLINE __m512i k_min_of(const __m512i* hd, int s) {
  const __m512i m6 = _mm512_set1_epi32(63), m3 = _mm512_set1_epi32(3), mf = _mm512_set1_epi32(0xF);
  if (s < 4) return _mm512_and_si512(_mm512_srli_epi32(hd[2], 8 * s), m6);
  const int u = s - 4;
  return _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(hd[3], 8 * u + 4), mf),
                         _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(hd[2], 8 * u + 6), m3), 4));
}

// Q4_K at 2..4 tokens: the decode walk (gemv_k_affine) with T tokens per unit; the scales of
// a 64-element chunk are extracted when it is reached and the mins at the end, which leaves
// the registers for the 4T accumulators. More tokens take the chunk tile (register budget).
template <int T>
TESSERA_AVX512_INLINE void fused_q4_k(const Rows& rows, int64_t nb, const PackedActs& x, Prefetch& pf, __m512* out) {
  const __m512i m4 = _mm512_set1_epi8(0x0F);
  __m512 acc[T];
  for (int t = 0; t < T; ++t) acc[t] = _mm512_setzero_ps();
  const int8_t* q = x.q;
  const float* dx = x.d;
  const int32_t* aux = x.aux;
  for (int64_t b = 0; b < nb; ++b, q += 256 * T, dx += T, aux += 4 * T) {
    pf.tick();
    const size_t off = static_cast<size_t>(b) * 144;
    __m512i hd[4];
    rows16x4(rows, off, hd);
    __m512i tot[T];
    for (int t = 0; t < T; ++t) tot[t] = _mm512_setzero_si512();
    for (int c = 0; c < 4; ++c) {
      __m512i d[8];
      rows16x8(rows, off + 16 + 32 * static_cast<size_t>(c), d);
      __m512i ilo[T], ihi[T];
      for (int t = 0; t < T; ++t) ilo[t] = ihi[t] = _mm512_setzero_si512();
      for (int g = 0; g < 8; ++g) {
        const __m512i lo = _mm512_and_si512(d[g], m4);
        const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(d[g], 4), m4);
        for (int t = 0; t < T; ++t) {
          ilo[t] = _mm512_dpbusd_epi32(ilo[t], lo, bcast_x4(q + 256 * t + 64 * c + 4 * g));
          ihi[t] = _mm512_dpbusd_epi32(ihi[t], hi, bcast_x4(q + 256 * t + 64 * c + 32 + 4 * g));
        }
      }
      const __m512i sl = k_scale_of(hd, 2 * c), sh = k_scale_of(hd, 2 * c + 1);
      for (int t = 0; t < T; ++t)
        tot[t] = _mm512_add_epi32(tot[t], _mm512_add_epi32(_mm512_mullo_epi32(ilo[t], sl), _mm512_mullo_epi32(ihi[t], sh)));
    }
    __m512i mp[4];
    for (int j = 0; j < 4; ++j) mp[j] = _mm512_or_si512(k_min_of(hd, 2 * j), _mm512_slli_epi32(k_min_of(hd, 2 * j + 1), 16));
    const __m512 d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(hd[0]));
    const __m512 dmin = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(hd[0], 16)));
    for (int t = 0; t < T; ++t) {
      __m512i ms = _mm512_setzero_si512();
      for (int j = 0; j < 4; ++j) ms = _mm512_dpwssd_epi32(ms, mp[j], _mm512_set1_epi32(aux[4 * t + j]));
      const __m512 dxv = _mm512_set1_ps(dx[t]);
      acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(tot[t]), _mm512_mul_ps(d, dxv), acc[t]);
      acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_setzero_si512(), ms)),
                               _mm512_mul_ps(dmin, dxv), acc[t]);
    }
  }
  for (int t = 0; t < T; ++t) out[t] = acc[t];
}

// Blocks [b, b + nblk) of the chunk tile against tokens [t0, t0 + T).
template <int T>
TESSERA_AVX512 void run_batch_t(QuantType type, const uint8_t* tile, int64_t b, int64_t nblk, const PackedActs& x,
                                int t0, __m512* acc) {
  switch (type) {
    case QuantType::kQ4_K:
    case QuantType::kQ5_K: return bk_k_affine<T>(tile, x, b, t0, acc);
    case QuantType::kQ6_K: return bk_q6_k<T>(tile, x, b, t0, acc);
    default: {
      PackedActs xb = x;
      xb.q += b * x.n * 32;
      xb.d += b * x.n;
      xb.aux += b * x.n;
      if (type == QuantType::kI4_G128) return bk_q32<T, true>(tile, nblk, xb, t0, acc);
      return bk_q32<T, false>(tile, nblk, xb, t0, acc);
    }
  }
}

TESSERA_AVX512 void run_batch(QuantType type, int n_tok, const uint8_t* tile, int64_t b, int64_t nblk,
                              const PackedActs& x, int t0, __m512* acc) {
  switch (n_tok) {
    case 1: return run_batch_t<1>(type, tile, b, nblk, x, t0, acc);
    case 2: return run_batch_t<2>(type, tile, b, nblk, x, t0, acc);
    case 3: return run_batch_t<3>(type, tile, b, nblk, x, t0, acc);
    case 4: return run_batch_t<4>(type, tile, b, nblk, x, t0, acc);
    case 5: return run_batch_t<5>(type, tile, b, nblk, x, t0, acc);
    case 6: return run_batch_t<6>(type, tile, b, nblk, x, t0, acc);
    case 7: return run_batch_t<7>(type, tile, b, nblk, x, t0, acc);
    default: return run_batch_t<8>(type, tile, b, nblk, x, t0, acc);
  }
}

uint8_t* pack_scratch(size_t bytes) {
  thread_local std::vector<uint8_t> buf;
  if (buf.size() < bytes + 64) buf.resize(bytes + 64);
  auto addr = reinterpret_cast<uintptr_t>(buf.data());
  return buf.data() + ((64 - addr % 64) % 64);
}

// Accumulates tokens [0, x.n) of the row group into acc[0..x.n) (the fused kernels where they
// exist, else the chunk tile).
TESSERA_AVX512 void small_batch(QuantType type, const Rows& rows, int64_t nb, const PackedActs& x, Prefetch pf,
                                __m512* acc) {
  const int n = x.n;
  switch (type) {
    case QuantType::kQ8_0: return fused_q32_n<QuantType::kQ8_0>(rows, nb, x, pf, acc);
    case QuantType::kQ4_0: return fused_q32_n<QuantType::kQ4_0>(rows, nb, x, pf, acc);
    case QuantType::kQ5_0: return fused_q32_n<QuantType::kQ5_0>(rows, nb, x, pf, acc);
    case QuantType::kQ4_K:
      if (n == 2) return fused_q4_k<2>(rows, nb, x, pf, acc);
      if (n == 3) return fused_q4_k<3>(rows, nb, x, pf, acc);
      if (n == 4) return fused_q4_k<4>(rows, nb, x, pf, acc);
      break;
    default: break;
  }
  const size_t stride = tile_layout(type).block_stride();
  const int64_t chunk = tile_layout(type).units_per_block == 1 ? 8 : 1;
  uint8_t* tile = tile_scratch(stride * static_cast<size_t>(chunk));
  // Token groups of at most 8 (the micro-kernels' register budget), as even as possible.
  const int half = n <= 8 ? n : (n + 1) / 2;
  for (int t = 0; t < n; ++t) acc[t] = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; b += chunk) {
    const int64_t e = std::min(nb, b + chunk);
    for (int64_t i = b; i < e; ++i) pf.tick();
    build_tile(type, rows, b, e, tile);
    run_batch(type, half, tile, b, e - b, x, 0, acc);
    if (half < n) run_batch(type, n - half, tile, b, e - b, x, half, acc + half);
  }
}

}  // namespace

TESSERA_AVX512 void quantize_acts_avx512(const float* x, int64_t t0, int64_t t1, const QuantizedActs& acts) {
  const int64_t k = acts.k, blk = acts.block, nb = k / blk;
  const __m512 sign = _mm512_set1_ps(-0.0f);
  for (int64_t t = t0; t < t1; ++t) {
    const float* xt = x + t * k;
    auto* q = const_cast<int8_t*>(acts.q) + t * k;
    auto* d = const_cast<float*>(acts.d) + t * nb;
    auto* bs = const_cast<int16_t*>(acts.bsum) + t * (k / 16);
    for (int64_t b = 0; b < nb; ++b) {
      const float* xb = xt + b * blk;
      __m512 m = _mm512_setzero_ps();
      for (int64_t j = 0; j < blk; j += 16) m = _mm512_max_ps(m, _mm512_andnot_ps(sign, _mm512_loadu_ps(xb + j)));
      const float amax = _mm512_reduce_max_ps(m);
      const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
      d[b] = act_scale(amax, id, blk);
      const __m512 vid = _mm512_set1_ps(id);
      for (int64_t j = 0; j < blk; j += 16) {
        const __m512i v = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(xb + j), vid));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(q + b * blk + j), _mm512_cvtepi32_epi8(v));
        bs[(b * blk + j) / 16] = static_cast<int16_t>(_mm512_reduce_add_epi32(v));
      }
    }
  }
}

TESSERA_AVX512 void qmatmul_avx512(const QMatmulArgs& args, int64_t r0, int64_t r1) {
  if (is_low_bit(args.type)) return qmatmul_low_bit_avx512(args, r0, r1);  // qgemm_low_bit_avx512.cpp
  // R16 matrices run as their base format, reading each group's blocks as stored.
  const bool r16 = is_r16(args.type);
  QMatmulArgs a = args;
  a.type = r16_base(args.type);
  const QuantType type = a.type;
  const int64_t nb = a.k / kernel_block_elems(type);
  const TileLayout lay = tile_layout(type);
  const size_t stride = lay.block_stride();
  // Decode and batched decode build a few blocks at a time (they stay in L1); larger batches
  // (prefill) build the whole row tile once and run every token over it.
  const bool whole = a.n_tokens > kSmallBatch;
  uint8_t* tile = whole ? tile_scratch(stride * static_cast<size_t>(nb)) : nullptr;
  PackedActs packed;
  if (a.n_tokens > 1) packed = pack_acts(a, pack_scratch(packed_acts_bytes(a)));
  const size_t ahead = kernel_tuning().r16_prefetch_bytes;
  for (int64_t g0 = r0; g0 < r1; g0 += kRows) {
    const int n_valid = static_cast<int>(std::min<int64_t>(kRows, r1 - g0));
    Rows rows;
    alignas(64) int32_t offs[kRows];
    for (int r = 0; r < kRows; ++r) {
      offs[r] = static_cast<int32_t>(static_cast<size_t>(std::min(r, n_valid - 1)) * a.row_bytes);
      rows.p[r] = a.w + static_cast<size_t>(g0) * a.row_bytes + static_cast<size_t>(offs[r]);
    }
    rows.vindex = _mm512_load_si512(offs);
    rows.trailer = row_block_bytes(type, a.k);
    if (r16) rows.group = a.w + static_cast<size_t>(g0) * a.row_bytes;
    // Matrices read as 16 separate row streams: the next row group's bytes, prefetched a little
    // per block (see Prefetch). An R16 matrix is read as one contiguous stream: prefetched
    // `ahead` bytes in front of the read position where the CPU needs it (kernel_tuning(),
    // kernels/cpu/cpu_info.h: Intel yes, Zen 4 no - there software prefetches cost 10-40%).
    Prefetch pf;
    if (r16) {
      pf = Prefetch::r16_stream(a.w, g0, r1, a.row_bytes, kRows, nb, ahead);
    } else {
      pf.p = a.w + static_cast<size_t>(g0 + kRows) * a.row_bytes;
      pf.left = g0 + kRows < r1 ? static_cast<size_t>(std::min<int64_t>(kRows, r1 - g0 - kRows)) * a.row_bytes : 0;
      pf.step = (pf.left / static_cast<size_t>(nb) + 63) / 64 * 64;
    }
    if (a.n_tokens == 1) {
      const __m512 acc = gemv_rows(type, rows, nb, Token1{a.acts.q, a.acts.d, a.acts.bsum}, pf);
      store_rows(a.y + g0, acc, n_valid);
      continue;
    }
    if (!whole) {
      __m512 acc[kSmallBatch];
      small_batch(type, rows, nb, packed, pf, acc);
      for (int t = 0; t < packed.n; ++t) store_rows(a.y + t * a.y_stride + g0, acc[t], n_valid);
      continue;
    }
    {
      // Built a few blocks at a time while the next group's bytes are prefetched.
      constexpr int64_t kChunk = 4;
      for (int64_t b = 0; b < nb; b += kChunk) {
        const int64_t e = std::min(nb, b + kChunk);
        for (int64_t i = b; i < e; ++i) pf.tick();
        build_tile(type, rows, b, e, tile + static_cast<size_t>(b) * stride);
      }
    }
    // Every token over the tile, 8 at a time, through the batched-decode micro-kernels on the
    // block-major activations (one pointer per block, tokens at constant offsets).
    const bool per_block = lay.units_per_block > 1;  // the K-quant kernels take one block
    for (int t0 = 0; t0 < packed.n; t0 += 8) {
      const int n_tok = std::min(8, packed.n - t0);
      __m512 acc[8];
      for (auto& v : acc) v = _mm512_setzero_ps();
      if (per_block) {
        for (int64_t b = 0; b < nb; ++b) run_batch(type, n_tok, tile + static_cast<size_t>(b) * stride, b, 1, packed, t0, acc);
      } else {
        run_batch(type, n_tok, tile, 0, nb, packed, t0, acc);
      }
      for (int t = 0; t < n_tok; ++t) store_rows(a.y + (t0 + t) * a.y_stride + g0, acc[t], n_valid);
    }
  }
}

}  // namespace tessera::cpu

#else  // not x86-64: never dispatched

namespace tessera::cpu {
void quantize_acts_avx512(const float* x, int64_t t0, int64_t t1, const QuantizedActs& acts) {
  quantize_acts_scalar(x, t0, t1, acts);
}
void qmatmul_avx512(const QMatmulArgs& a, int64_t r0, int64_t r1) { qmatmul_scalar(a, r0, r1); }
}  // namespace tessera::cpu

#endif
