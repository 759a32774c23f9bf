// Internal interface of the integer-dot matmul kernels for GGUF block weights (Q8_0, Q4_0,
// Q5_0, Q4_K, Q5_K, Q6_K, and the low-bit Q2_K, Q3_K, TQ1_0, TQ2_0): activations are quantized
// to int8 per block once per matmul and every weight block is dotted with them in integer
// arithmetic.
//
// Canonical arithmetic (the contract every ISA path implements exactly, so results are
// bit-identical across scalar / AVX2 / AVX-512, thread counts, and batch composition):
//
// Activations (one row x of k fp32 values per token), blocks of kActBlock32 (32-element weight
// formats) or kActBlock256 (K-quants and the low-bit formats):
//   amax = max |x_i| over the block; id = amax != 0 ? 127 / amax : 0;
//   q_i = round_to_nearest_even(x_i * id)   (in [-127, 127]);
//   d = fp16_round(amax / 127) for 32-blocks, 1 / id for 256-blocks (0 when amax == 0),
//   stored with the sums of every 16 consecutive q (bsum16). These are the scales llama.cpp's
//   q8_0 / q8_K activation blocks carry, so both engines see the same quantized activations
//   and differ only by float summation order (greedy tokens then agree on the same file).
//
// Output y[t, r] = acc after walking the row's blocks in order, acc starting at +0.0f:
//   Q8_0 / Q4_0 / Q5_0, per 32-block b with weight scale dw (fp16 -> fp32, exact):
//     isum = sum_j w_j * q_j with w the signed level (Q8_0 int8, Q4_0 nibble - 8,
//            Q5_0 five bits - 16), exact in int32;
//     acc = fma((float)isum, dw * dx_b, acc)
//   Q4_K / Q5_K, per 256-superblock with d, dmin and 6-bit sc[8], m[8]:
//     isum = sum_s sc[s] * sum_{j in s} level_j * q_j;   msum = sum_s m[s] * bsum32[s]
//     acc = fma((float)isum, d * dx, acc); acc = fma((float)(-msum), dmin * dx, acc)
//   Q6_K, per 256-superblock with d and int8 sc[16] per 16 elements:
//     isum = sum_g sc[g] * sum_{j in g} (level_j - 32) * q_j;  acc = fma((float)isum, d * dx, acc)
//   I8_CH (load-time INT8, one fp32 scale s per row), per 32-block b:
//     isum = sum_j w_j * q_j (int8 levels);  acc = fma((float)isum, s * dx_b, acc)
//   I4_G128 (load-time INT4, fp16 d and zero z per 128-group), per 32-block b of group b / 4:
//     isum = sum_j level_j * q_j - z * bsum32_b;  acc = fma((float)isum, d * dx_b, acc)
//   (I8_CH / I4_G128 walk 32-element blocks: kernel_block_elems() is 32 for them).
//   The low-bit formats, per 256-superblock (block layouts in kernels/cpu/quant.cpp), with
//   dot16_s(u, q) = sum of u_j * q_j over the 16 elements of sub-block s (s = 0..15) and
//   bsum256 = sum_s bsum16[s]:
//   Q2_K, fp16 d, dmin, 4-bit sc[16] (low nibble) and m[16] (high nibble), levels u in 0..3:
//     isum = sum_s sc[s] * dot16_s(u, q);   msum = sum_s m[s] * bsum16[s]
//     acc = fma((float)isum, d * dx, acc); acc = fma((float)(-msum), dmin * dx, acc)
//   Q3_K, fp16 d, signed 6-bit scales sc[s] = stored - 32 (q3_k_scale), u = low2 | hbit << 2
//     in 0..7 (hbit from the high-bit mask; the level is u - 4):
//     isum = sum_s sc[s] * (dot16_s(u, q) - 4 * bsum16[s]);  acc = fma((float)isum, d * dx, acc)
//   TQ2_0, fp16 d, stored 2-bit u in 0..3 (the level is u - 1; trit + 1 for valid blocks):
//     isum = sum_j u_j * q_j - bsum256;  acc = fma((float)isum, d * dx, acc)
//   TQ1_0, fp16 d, u = the base-3 digit 0..2 of its byte (tq1_digit; the trit is u - 1):
//     isum = sum_j u_j * q_j - bsum256;  acc = fma((float)isum, d * dx, acc)
//   These four are computed one row at a time along k by every path (no R16 layouts): the
//   integer sums are the same whatever the SIMD width, and the float operations of a block
//   are scalar: d * dx (and dmin * dx) rounded, then the fmas in the order above. |isum| stays
//   below 2^24, so (float)isum is exact (Q3_K's is the largest: 16 * 32 * 16 * 4 * 127 < 2^22).
// All integer sums are exact (bounded well inside int32); every float operation is one IEEE
// fp32 rounding, so any order of the integer work gives the same bits.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>

#include "common/dtype.h"

namespace tessera::cpu {

constexpr int64_t kActBlock32 = 32;
constexpr int64_t kActBlock256 = 256;

// Whether `type` has an integer-dot kernel, and its activation block size (32 or 256).
bool has_qdot(QuantType type);
int64_t act_block(QuantType type);
// Elements per block the kernels walk (the format's block, or 32 for I8_CH / I4_G128).
int64_t kernel_block_elems(QuantType type);

// Activations quantized for one matmul: n_tokens rows of k values.
struct QuantizedActs {
  const int8_t* q = nullptr;      // [n_tokens][k]
  const float* d = nullptr;       // [n_tokens][k / block]
  const int16_t* bsum = nullptr;  // [n_tokens][k / 16]: sums of 16 consecutive q
  int64_t k = 0;
  int64_t block = 32;
};

// Bytes of scratch quantize_acts needs for n_tokens rows of k (k % block == 0).
size_t acts_bytes(int64_t n_tokens, int64_t k, int64_t block);

// Lays out the QuantizedActs view over `scratch` (acts_bytes() bytes, 64-byte aligned).
QuantizedActs acts_view(void* scratch, int64_t n_tokens, int64_t k, int64_t block);

// Quantizes tokens [t0, t1) of x ([n_tokens, k] fp32) into the view's storage.
void quantize_acts(const float* x, int64_t t0, int64_t t1, const QuantizedActs& acts);

// One matmul piece: rows [r0, r1) of the weight against every token.
struct QMatmulArgs {
  QuantType type = QuantType::kQ8_0;
  const uint8_t* w = nullptr;  // row 0 of the weight slice
  size_t row_bytes = 0;
  int64_t k = 0;
  QuantizedActs acts;
  int64_t n_tokens = 0;
  float* y = nullptr;          // y[t * y_stride + r]
  int64_t y_stride = 0;
};

// Rows a thread should take at a time (the AVX-512 kernels work on 16 rows, the R16 groups).
constexpr int64_t kQRowGroup = 16;

// ---- the 16-row interleaved layouts (QuantType k*_R16), for the SIMD kernels
//
// The AVX-512 kernels take 16 rows at a time (AVX2: 8) and transpose each field of a block of
// the rows into vectors whose lane r belongs to row r (tr16x4 / tr16x8, gathers) before the
// integer dots: tens of shuffles, inserts and loads per block, which single-thread decode is
// bound by. Re-laid at load, a block of a group of 16 rows is one contiguous piece of
// 16 * block_bytes with every field already transposed: the field at block byte x sits at
// 16 * x, as 64-byte vectors of dwords (vector d, lane r = bytes [x + 4d, x + 4d + 4) of row r;
// its lower and upper 32 bytes are the AVX2 vectors of rows 0..7 and 8..15) or, for an fp16
// field (the Q8_0 / Q4_0 / Q5_0 scale, the Q6_K d), as the 16 rows' halves. Group g, block b
// starts at (g * nb + b) * 16 * block_bytes: a group takes the bytes of its 16 rows in the
// file, so sizes and row-range pointers (at multiples of 16 rows) are unchanged. The
// arithmetic is the base format's (same bits); matmul runs these on the AVX-512 kernels when
// AVX-512 is active and on the AVX2 ones otherwise (also under a scalar cap), so they are made
// where either is active.
bool is_r16(QuantType type);
QuantType r16_base(QuantType type);  // kQ4_0_R16 -> kQ4_0, ...; other types unchanged
// The R16 type of a Q8_0 / Q4_0 / Q5_0 / Q4_K / Q5_K / Q6_K / I8_CH / I4_G128 matrix of `rows`
// rows (I8_CH's row scale is one more dword field after the blocks); nullopt for other types or
// rows % 16 != 0.
std::optional<QuantType> r16_of(QuantType type, int64_t rows);
// Re-lays `rows` rows (a multiple of 16) of k columns of such a matrix (row stride
// row_bytes(type, k)) into dst (the same number of bytes).
void repack_r16(QuantType type, const uint8_t* src, int64_t rows, int64_t k, uint8_t* dst);
// Row `row` of a matrix in a 16-row layout (`data`: the matrix's first byte; `type` the R16 or
// base type) back in its base format's layout: row_bytes(type, k) bytes to dst.
void unpack_r16_row(QuantType type, const uint8_t* data, int64_t row, int64_t k, uint8_t* dst);

// Q2_K, Q3_K, TQ1_0, TQ2_0 (the row-at-a-time kernels of qgemm_low_bit_{avx2,avx512}.cpp;
// qmatmul_avx2 / qmatmul_avx512 hand these types to them).
bool is_low_bit(QuantType type);
void qmatmul_low_bit_avx2(const QMatmulArgs& a, int64_t r0, int64_t r1);
void qmatmul_low_bit_avx512(const QMatmulArgs& a, int64_t r0, int64_t r1);

void qmatmul_scalar(const QMatmulArgs& a, int64_t r0, int64_t r1);
void qmatmul_avx2(const QMatmulArgs& a, int64_t r0, int64_t r1);
void qmatmul_avx512(const QMatmulArgs& a, int64_t r0, int64_t r1);

// ---- block-major activations (batched decode, 2..kSmallBatch tokens, and prefill; AVX2 also
// decode)
//
// The SIMD paths run a few tokens against each weight block right after building it (prefill:
// against the whole-row tile, a few tokens per pass), with the tokens' activations re-laid
// block-major so that a micro-kernel reaches token t of block b at a constant offset from one
// pointer, and with the per-block integer terms that depend only on the activations computed
// once per call (aux, exact int32):
//   Q8_0 / Q4_0 / Q5_0 / I8_CH: aux[0] = -offset * bsum32 (offset 128, 8, 16, 128: the signed
//     level is the stored unsigned level minus it; AVX2 keeps Q8_0 / I8_CH levels signed and
//     does not use it);  I4_G128: aux[0] = bsum32;
//   Q4_K / Q5_K: aux[j] = bsum32[2j] | bsum32[2j + 1] << 16 (j = 0..3, int16 pairs for pmaddwd);
//   Q6_K: aux[g] = -32 * bsum16[g] (g = 0..15).
//   Q2_K / Q3_K: aux[j] = bsum16[2j] | bsum16[2j + 1] << 16 (j = 0..7: the 16 bsum16 as int16,
//     in order, for pmaddwd with the 16 mins or scales);  TQ1_0 / TQ2_0: aux[0] = bsum256.
constexpr int64_t kSmallBatch = 16;

struct PackedActs {
  const int8_t* q = nullptr;      // [nb][n][block] (nb = k / block)
  const float* d = nullptr;       // [nb][n]
  const int32_t* aux = nullptr;   // [nb][n][n_aux]
  int n = 0;                      // tokens
  int n_aux = 0;
  int64_t block = 0;
};

// aux values per token and block of `type` (see above).
int packed_aux_per_block(QuantType type);

// Packs all a.n_tokens tokens of a.acts into `scratch` (packed_acts_bytes(), 64-byte aligned).
size_t packed_acts_bytes(const QMatmulArgs& a);
PackedActs pack_acts(const QMatmulArgs& a, void* scratch);

// Quantizers per ISA (bit-identical); quantize_acts dispatches.
void quantize_acts_scalar(const float* x, int64_t t0, int64_t t1, const QuantizedActs& acts);
void quantize_acts_avx2(const float* x, int64_t t0, int64_t t1, const QuantizedActs& acts);
void quantize_acts_avx512(const float* x, int64_t t0, int64_t t1, const QuantizedActs& acts);

// The stored activation scale of a block (see above); `id` = 127 / amax or 0.
inline float act_scale(float amax, float id, int64_t block) {
  if (amax == 0.0f) return 0.0f;
  if (block == kActBlock256) return 1.0f / id;
  return fp16_to_f32(f32_to_fp16(amax / 127.0f));
}

// ---- block field access shared by the scalar and SIMD paths

inline float f16_at(const uint8_t* p) {
  uint16_t h;
  __builtin_memcpy(&h, p, 2);
  return fp16_to_f32(h);
}

// 6-bit scale and min of sub-block j (0..7) of a Q4_K / Q5_K super-block (12 packed bytes).
inline void k_scale_min(const uint8_t* s, int j, int* sc, int* m) {
  if (j < 4) {
    *sc = s[j] & 63;
    *m = s[j + 4] & 63;
  } else {
    *sc = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
    *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

// The signed 6-bit scale of Q3_K sub-block j (0..15) from its 12 packed bytes: stored + 32,
// the low 4 bits in the low (j < 8) or high nibble of byte j % 8, the top 2 bits at bits
// 2(j / 4), 2(j / 4) + 1 of byte 8 + j % 4.
inline int q3_k_scale(const uint8_t* s, int j) {
  const int low = j < 8 ? s[j] & 0xF : s[j - 8] >> 4;
  const int high = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
  return (low | (high << 4)) - 32;
}

// Base-3 digit p (0..4, most significant first) of a TQ1_0 byte, 0..2 (the trit plus one):
// the top trit of byte * 3^p mod 256, i.e. ((byte * 3^p mod 256) * 3) >> 8.
inline int tq1_digit(uint8_t byte, int p) {
  static constexpr uint8_t kPow3[5] = {1, 3, 9, 27, 81};
  const auto shifted = static_cast<uint8_t>(byte * kPow3[p]);
  return (shifted * 3) >> 8;
}

}  // namespace tessera::cpu
