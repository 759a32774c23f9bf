// Float-weight matmul kernels (arithmetic in fgemm.h).
//
// Decode (one token): 4 rows at a time share each activation load; F16 / BF16 are widened in
// registers. Batches on AVX-512: a blocked GEMM (fmatmul_batch_avx512) whose register tile is
// 4 weight rows x 6 tokens. Batches on AVX2 and scalar run row by row.
#include "kernels/cpu/fgemm.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

#include "kernels/cpu/cpu_info.h"
#include "kernels/cpu/vec.h"

#if defined(__x86_64__)
#include <immintrin.h>
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

// Prefetch of a weight line read once per matmul: non-temporal (this alone gave +40% decode
// speed on Zen 5), or into L2 (`l2`: Intel, where the non-temporal hint loses; cpu_info.h).
TESSERA_AVX512 inline void prefetch_stream(const uint8_t* p, bool l2) {
  if (l2) {
    _mm_prefetch(reinterpret_cast<const char*>(p), _MM_HINT_T1);
  } else {
    _mm_prefetch(reinterpret_cast<const char*>(p), _MM_HINT_NTA);
  }
}

// `next`, `next_bytes`: the following rows, prefetched while these four are computed (four
// interleaved streams are more than the hardware prefetchers keep ahead of), `l2` as in
// prefetch_stream.
template <QuantType kType>
TESSERA_AVX512 void gemv4_avx512(const FMatmulArgs& a, const uint8_t* const* rows, float* out,
                                 const uint8_t* next, size_t next_bytes, bool l2) {
  __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
  const int64_t kfull = a.k / kLanes * kLanes;
  const size_t elem = kType == QuantType::kF32 ? 4 : 2;
  // Prefetch lines of `next` at the pace this loop consumes lines of its rows.
  const size_t step_bytes = 4 * kLanes * elem;
  size_t pf = 0;
  int64_t c = 0;
  for (; c < kfull; c += kLanes) {
    if (pf < next_bytes) {
      for (size_t e = pf + step_bytes; pf < e; pf += 64) prefetch_stream(next + pf, l2);
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

// ---- Small batches (2..kSmallTokens tokens: decode steps of concurrent sequences). The
// blocked GEMM below packs every row into a panel first, a second pass over the weights that
// costs as much as the matrix-vector step itself when the batch is small. Here the weights
// stream straight from memory as in gemv4: 4 rows x up to 6 tokens per pass (24 accumulators),
// further token groups of the same quad re-read its rows from L1. Every output keeps the
// canonical arithmetic (lane c % 16, one fma per element in increasing c, reduce16).
constexpr int64_t kSmallTokens = 16;

template <QuantType kType, int kT>
TESSERA_AVX512 void small4_avx512(const FMatmulArgs& a, const uint8_t* const* rows, int64_t t0, float* out,
                                  const uint8_t* next, size_t next_bytes, bool l2) {
  __m512 acc[4][kT];
  for (int r = 0; r < 4; ++r)
    for (int t = 0; t < kT; ++t) acc[r][t] = _mm512_setzero_ps();
  const int64_t kfull = a.k / kLanes * kLanes;
  const size_t elem = kType == QuantType::kF32 ? 4 : 2;
  const size_t step_bytes = 4 * kLanes * elem;
  size_t pf = 0;
  const float* x = a.x + t0 * a.k;
  int64_t c = 0;
  for (; c < kfull; c += kLanes) {
    if (pf < next_bytes) {
      for (size_t e = pf + step_bytes; pf < e; pf += 64) prefetch_stream(next + pf, l2);
    }
    __m512 w[4];
    for (int r = 0; r < 4; ++r) w[r] = load_w16(kType, rows[r], c);
    for (int t = 0; t < kT; ++t) {
      const __m512 xv = _mm512_loadu_ps(x + t * a.k + c);
      for (int r = 0; r < 4; ++r) acc[r][t] = _mm512_fmadd_ps(w[r], xv, acc[r][t]);
    }
  }
  if (c < a.k) {
    const auto m = static_cast<__mmask16>((1u << (a.k - c)) - 1u);
    __m512 w[4];
    for (int r = 0; r < 4; ++r) w[r] = load_w16_masked(kType, rows[r], c, m);
    for (int t = 0; t < kT; ++t) {
      const __m512 xv = _mm512_maskz_loadu_ps(m, x + t * a.k + c);
      for (int r = 0; r < 4; ++r) acc[r][t] = _mm512_fmadd_ps(w[r], xv, acc[r][t]);
    }
  }
  for (int t = 0; t < kT; ++t)
    for (int r = 0; r < 4; ++r) out[t * 4 + r] = reduce16_avx512(acc[r][t]);
}

template <QuantType kType>
TESSERA_AVX512 void fmatmul_small_avx512(const FMatmulArgs& a, int64_t r0, int64_t r1) {
  const bool l2 = kernel_tuning().float_prefetch_l2;
  for (int64_t g = r0; g < r1; g += 4) {
    const int n_valid = static_cast<int>(std::min<int64_t>(4, r1 - g));
    const uint8_t* rows[4];
    for (int r = 0; r < 4; ++r) rows[r] = a.w + static_cast<size_t>(g + std::min(r, n_valid - 1)) * a.row_bytes;
    constexpr int64_t kAhead = 8;
    const uint8_t* next = a.w + static_cast<size_t>(g + kAhead) * a.row_bytes;
    const size_t next_bytes =
        g + kAhead < r1 ? static_cast<size_t>(std::min<int64_t>(4, r1 - g - kAhead)) * a.row_bytes : 0;
    float out[6 * 4];
    for (int64_t t0 = 0; t0 < a.n_tokens; t0 += 6) {
      const int tn = static_cast<int>(std::min<int64_t>(6, a.n_tokens - t0));
      // Only the first token group streams the weights (and prefetches the next quad).
      const size_t nb = t0 == 0 ? next_bytes : 0;
      switch (tn) {
        case 1: small4_avx512<kType, 1>(a, rows, t0, out, next, nb, l2); break;
        case 2: small4_avx512<kType, 2>(a, rows, t0, out, next, nb, l2); break;
        case 3: small4_avx512<kType, 3>(a, rows, t0, out, next, nb, l2); break;
        case 4: small4_avx512<kType, 4>(a, rows, t0, out, next, nb, l2); break;
        case 5: small4_avx512<kType, 5>(a, rows, t0, out, next, nb, l2); break;
        default: small4_avx512<kType, 6>(a, rows, t0, out, next, nb, l2); break;
      }
      for (int t = 0; t < tn; ++t) std::memcpy(a.y + (t0 + t) * a.y_stride + g, out + t * 4, static_cast<size_t>(n_valid) * 4);
    }
  }
}

// ---- Batches (n_tokens > 1): a blocked GEMM with the canonical arithmetic.
//
// Each output y[t][r] needs its own 16-lane accumulator (the partial sums of fgemm.h), so the
// register tile is 4 weight rows x up to 6 tokens (24 zmm accumulators, 10 loads per 24 fma),
// and the 16 partial sums of 16 outputs are reduced together at the end (fold*_avx512).
// Streaming whole rows through that tile pulls both operands from L2 or further on every step
// (the previous kernel reached 55-65% of fma peak on Zen 5), so the loops are blocked:
//   rows   in blocks of kBlockRows within a thread's share (gemm.cpp splits rows by thread),
//   tokens in blocks of kBlockTokens,
//   k      in balanced chunks of at most kBlockSteps * 16 columns.
// The weight rows of a block are copied once into a thread-local panel (quad-interleaved,
// zero-padded past k; F16 / BF16 stay 16-bit and are widened in the tile, exactly, or are
// widened when packed: PanelElem below), the 6-token
// slice of the activations of a chunk stays in L1 while every quad of the panel passes it, and
// the accumulators of each tile are parked in a thread-local buffer between chunks (storing
// and reloading fp32 values changes no bit).
constexpr int64_t kQuadRows = 4;
constexpr int64_t kGroupTokens = 6;
// Sizes for a 1 MB L2 and a 48 KB L1 (Zen 4/5; tuned on Zen 5): the panel (at most
// kPanelBytes) and the parked accumulators (48 x 144 x 64 B = 432 KB) stay in L2, the 6-token
// activation slice (at most 24 KB) and the quad being used (at most 16 KB) in L1.
constexpr int64_t kBlockRows = 48;     // a multiple of kQuadRows
constexpr int64_t kBlockTokens = 144;  // a multiple of kGroupTokens
constexpr int64_t kBlockSteps = 64;    // longest k chunk: 1024 columns
constexpr size_t kPanelBytes = 448 * 1024;
// A block of fewer rows (not below this) is taken when that lets one panel hold whole rows.
constexpr int64_t kMinResidentRows = 32;
constexpr int64_t kTileFloats = kQuadRows * kGroupTokens * kLanes;

float* aligned_floats(std::vector<float>& buf, size_t floats) {
  if (buf.size() < floats + 16) buf.resize(floats + 16);
  auto addr = reinterpret_cast<uintptr_t>(buf.data());
  return buf.data() + ((64 - addr % 64) % 64) / 4;
}

// A panel holds weights of type kPanel: F16 and BF16 weights as stored (kPanel = kType: half
// the bytes in L2 and on the way to L1; the tile widens them, exactly, with instructions that
// issue beside the fma on Zen 4/5), or widened to fp32 when packed (kPanel = F32: on Intel the
// widening takes an fma port, kernels/cpu/cpu_info.h); F32 weights always as fp32.
template <QuantType kPanel>
using PanelElem = std::conditional_t<kPanel == QuantType::kF32, float, uint16_t>;

// Column step s of a row into a panel slot: 16 values, zeros past k.
template <QuantType kType, QuantType kPanel>
TESSERA_AVX512 inline void pack_step(const uint8_t* row, int64_t c, int64_t valid, PanelElem<kPanel>* dst) {
  if constexpr (kPanel != QuantType::kF32) {
    const auto m = static_cast<__mmask16>((1u << std::min<int64_t>(valid, kLanes)) - 1u);
    const __m256i v = valid >= kLanes ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + 2 * c))
                      : valid > 0     ? _mm256_maskz_loadu_epi16(m, row + 2 * c)
                                      : _mm256_setzero_si256();
    _mm256_store_si256(reinterpret_cast<__m256i*>(dst), v);
  } else {
    const __m512 v = valid >= kLanes ? load_w16(kType, row, c)
                     : valid > 0     ? load_w16_masked(kType, row, c, static_cast<__mmask16>((1u << valid) - 1u))
                                     : _mm512_setzero_ps();
    _mm512_store_ps(dst, v);
  }
}

// Columns [c0, c0 + 16 * steps) of rows [row0, row0 + n_rows) into
// panel[quad][step][row of quad][16]; zeros past k and for rows past n_rows.
template <QuantType kType, QuantType kPanel>
TESSERA_AVX512 void pack_panel_avx512(const FMatmulArgs& a, int64_t row0, int64_t n_rows, int64_t c0, int64_t steps,
                                      PanelElem<kPanel>* panel) {
  const int64_t n_quads = (n_rows + kQuadRows - 1) / kQuadRows;
  for (int64_t r = 0; r < n_quads * kQuadRows; ++r) {
    PanelElem<kPanel>* dst = panel + (r / kQuadRows) * steps * kQuadRows * kLanes + (r % kQuadRows) * kLanes;
    const uint8_t* row = a.w + static_cast<size_t>(row0 + std::min(r, n_rows - 1)) * a.row_bytes;
    for (int64_t s = 0; s < steps; ++s) {
      const int64_t c = c0 + s * kLanes;
      const int64_t valid = r < n_rows ? std::clamp<int64_t>(a.k - c, 0, kLanes) : 0;
      pack_step<kType, kPanel>(row, c, valid, dst + s * kQuadRows * kLanes);
    }
  }
}

// The reduction of fgemm.h for 16 accumulators at once (same additions, same order):
// fold8: [a | b] -> t = s_i + s_(i+8) of a (lanes 0-7) and of b (lanes 8-15).
TESSERA_AVX512 inline __m512 fold8_avx512(__m512 a, __m512 b) {
  return _mm512_add_ps(_mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(1, 0, 1, 0)),
                       _mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(3, 2, 3, 2)));
}
// fold4: two fold8 results -> u = t_i + t_(i+4) of a, b, c, d in 128-bit blocks 0..3.
TESSERA_AVX512 inline __m512 fold4_avx512(__m512 ab, __m512 cd) {
  return _mm512_add_ps(_mm512_shuffle_f32x4(ab, cd, _MM_SHUFFLE(2, 0, 2, 0)),
                       _mm512_shuffle_f32x4(ab, cd, _MM_SHUFFLE(3, 1, 3, 1)));
}
// u[r] (block b = item b of row r) -> block b holds the four results (v_0 + v_1) of rows 0..3.
// (v_i = u_i + u_(i+2) of two rows side by side, then v_0 + v_1 of four rows.)
TESSERA_AVX512 inline __m512 fold2_avx512(__m512 a, __m512 b) {
  return _mm512_add_ps(_mm512_shuffle_ps(a, b, _MM_SHUFFLE(1, 0, 1, 0)),
                       _mm512_shuffle_ps(a, b, _MM_SHUFFLE(3, 2, 3, 2)));
}
TESSERA_AVX512 inline __m512 fold_rows_avx512(const __m512* u) {
  const __m512 v01 = fold2_avx512(u[0], u[1]), v23 = fold2_avx512(u[2], u[3]);
  return _mm512_add_ps(_mm512_shuffle_ps(v01, v23, _MM_SHUFFLE(2, 0, 2, 0)),
                       _mm512_shuffle_ps(v01, v23, _MM_SHUFFLE(3, 1, 3, 1)));
}

// 128-bit block b of v (the intrinsic takes an immediate; this folds to one instruction when
// b is known at compile time).
TESSERA_AVX512 inline __m128 block128_avx512(__m512 v, int b) {
  switch (b) {
    case 0: return _mm512_castps512_ps128(v);
    case 1: return _mm512_extractf32x4_ps(v, 1);
    case 2: return _mm512_extractf32x4_ps(v, 2);
    default: return _mm512_extractf32x4_ps(v, 3);
  }
}

struct TileJob {
  const void* wq;       // quad panel: [step][4][16] of PanelElem
  int64_t full_steps;   // steps with 16 valid columns
  __mmask16 tail;       // valid columns of one more step (0: none)
  const float* x;       // token 0 of the group at the chunk's first column
  int64_t ldx;
  float* acc;           // kTileFloats parked accumulators
  bool first, last;     // chunk 0 (start from zero) / final chunk (reduce and write y)
  float* y;             // y of token 0, row 0 of the quad
  int64_t y_stride;
  int n_rows;           // valid rows of the quad
};

template <QuantType kType>
TESSERA_AVX512 inline __m512 load_panel(const PanelElem<kType>* w) {
  if constexpr (kType == QuantType::kF32) {
    return _mm512_load_ps(w);
  } else {
    const __m256i h = _mm256_load_si256(reinterpret_cast<const __m256i*>(w));
    if constexpr (kType == QuantType::kF16) return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
}

template <QuantType kType, int TN>
TESSERA_AVX512 void tile_4xT_avx512(const TileJob& j) {
  using P = PanelElem<kType>;
  __m512 acc[kQuadRows][TN];
  for (int r = 0; r < kQuadRows; ++r)
    for (int t = 0; t < TN; ++t)
      acc[r][t] = j.first ? _mm512_setzero_ps() : _mm512_load_ps(j.acc + (r * kGroupTokens + t) * kLanes);
  const P* w = static_cast<const P*>(j.wq);
  const float* x = j.x;
#pragma GCC unroll 2
  for (int64_t s = 0; s < j.full_steps; ++s, w += kQuadRows * kLanes, x += kLanes) {
    __m512 wv[kQuadRows];
    for (int r = 0; r < kQuadRows; ++r) wv[r] = load_panel<kType>(w + r * kLanes);
    for (int t = 0; t < TN; ++t) {
      const __m512 xv = _mm512_loadu_ps(x + t * j.ldx);
      for (int r = 0; r < kQuadRows; ++r) acc[r][t] = _mm512_fmadd_ps(wv[r], xv, acc[r][t]);
    }
  }
  if (j.tail != 0) {
    __m512 wv[kQuadRows];
    for (int r = 0; r < kQuadRows; ++r) wv[r] = load_panel<kType>(w + r * kLanes);
    for (int t = 0; t < TN; ++t) {
      const __m512 xv = _mm512_maskz_loadu_ps(j.tail, x + t * j.ldx);
      for (int r = 0; r < kQuadRows; ++r) acc[r][t] = _mm512_fmadd_ps(wv[r], xv, acc[r][t]);
    }
  }
  if (!j.last) {
    for (int r = 0; r < kQuadRows; ++r)
      for (int t = 0; t < TN; ++t) _mm512_store_ps(j.acc + (r * kGroupTokens + t) * kLanes, acc[r][t]);
    return;
  }
  const auto row_mask = static_cast<__mmask8>((1u << j.n_rows) - 1u);
  for (int t0 = 0; t0 < TN; t0 += 4) {
    __m512 u[kQuadRows];
    for (int r = 0; r < kQuadRows; ++r) {
      __m512 v[4];
      for (int i = 0; i < 4; ++i) v[i] = t0 + i < TN ? acc[r][t0 + i] : _mm512_setzero_ps();
      u[r] = fold4_avx512(fold8_avx512(v[0], v[1]), fold8_avx512(v[2], v[3]));
    }
    const __m512 res = fold_rows_avx512(u);
    for (int b = 0; b < 4 && t0 + b < TN; ++b)
      _mm_mask_storeu_ps(j.y + (t0 + b) * j.y_stride, row_mask, block128_avx512(res, b));
  }
}

template <QuantType kType>
TESSERA_AVX512 void tile_dispatch_avx512(int tn, const TileJob& j) {
  switch (tn) {
    case 1: return tile_4xT_avx512<kType, 1>(j);
    case 2: return tile_4xT_avx512<kType, 2>(j);
    case 3: return tile_4xT_avx512<kType, 3>(j);
    case 4: return tile_4xT_avx512<kType, 4>(j);
    case 5: return tile_4xT_avx512<kType, 5>(j);
    default: return tile_4xT_avx512<kType, 6>(j);
  }
}

// Software prefetch into L2 of a block of weight rows (columns [b0, b1) in bytes), a few
// lines per call, so that packing them later does not wait on DRAM: the rows of a chunk are
// short strided pieces that the hardware prefetchers do not run ahead on.
class WeightPrefetch {
 public:
  WeightPrefetch() = default;
  // Rows [row0, row0 + n_rows) (none when n_rows <= 0), bytes [b0, b1) of each, over `calls`
  // calls of step().
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

// Per-thread buffers of the batch path: grown on first use, then reused (no allocation per
// call). One set per thread for every weight type.
struct BatchScratch {
  std::vector<float> panel, parked;
};

BatchScratch& batch_scratch() {
  thread_local BatchScratch scratch;
  return scratch;
}

// Loop order: row blocks, token blocks, k chunks, 6-token groups, quads. When the panel of a
// whole row block (all its k chunks) fits kPanelBytes, it is packed once and reused by every
// token block ("resident"); longer rows are packed chunk by chunk, again for each token block.
template <QuantType kType, QuantType kPanel>
TESSERA_AVX512 void fmatmul_batch_avx512(const FMatmulArgs& a, int64_t r0, int64_t r1) {
  constexpr int64_t kQuads = kBlockRows / kQuadRows;
  constexpr int64_t kGroups = kBlockTokens / kGroupTokens;
  const size_t elem = kType == QuantType::kF32 ? 4 : 2;
  const int64_t k_steps = (a.k + kLanes - 1) / kLanes;
  const int64_t n_chunks = (k_steps + kBlockSteps - 1) / kBlockSteps;
  const int64_t chunk_steps = (k_steps + n_chunks - 1) / n_chunks;  // balanced chunks
  using P = PanelElem<kPanel>;
  const size_t row_panel_bytes = static_cast<size_t>(n_chunks * chunk_steps * kLanes) * sizeof(P);
  const int64_t fit_rows = static_cast<int64_t>(kPanelBytes / row_panel_bytes) / kQuadRows * kQuadRows;
  const int64_t block_rows = fit_rows >= kMinResidentRows ? std::min(kBlockRows, fit_rows) : kBlockRows;
  const int64_t slot_elems = block_rows * chunk_steps * kLanes;
  const bool resident = static_cast<size_t>(n_chunks * slot_elems) * sizeof(P) <= kPanelBytes;
  BatchScratch& scratch = batch_scratch();
  const size_t panel_elems = static_cast<size_t>((resident ? n_chunks : 1) * slot_elems);
  P* panel = reinterpret_cast<P*>(aligned_floats(scratch.panel, (panel_elems * sizeof(P) + 3) / 4));
  float* parked = aligned_floats(scratch.parked, static_cast<size_t>(kQuads * kGroups * kTileFloats));
  auto chunk_bytes = [&](int64_t s0, int64_t steps, size_t* b0, size_t* b1) {
    *b0 = static_cast<size_t>(s0 * kLanes) * elem;
    *b1 = static_cast<size_t>(std::min(a.k, (s0 + steps) * kLanes)) * elem;
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
        const int64_t c0 = s0 * kLanes;
        P* slot = panel + (resident ? ci * slot_elems : 0);
        if (!resident || tb == 0) pack_panel_avx512<kType, kPanel>(a, rb, n_rows, c0, steps, slot);
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
        j.full_steps = std::min(steps, (a.k - c0) / kLanes);
        j.tail = j.full_steps < steps ? static_cast<__mmask16>((1u << (a.k % kLanes)) - 1u) : 0;
        j.ldx = a.k;
        j.first = ci == 0;
        j.last = ci == n_chunks - 1;
        j.y_stride = a.y_stride;
        for (int64_t g = 0; g < n_groups; ++g) {
          const int64_t t0 = tb + g * kGroupTokens;
          const int tn = static_cast<int>(std::min(kGroupTokens, a.n_tokens - t0));
          j.x = a.x + t0 * a.k + c0;
          if (resident || 2 * g >= n_groups) prefetch.step();
          for (int64_t q = 0; q < n_quads; ++q) {
            j.wq = slot + q * steps * kQuadRows * kLanes;
            j.acc = parked + (g * kQuads + q) * kTileFloats;
            j.y = a.y + t0 * a.y_stride + rb + q * kQuadRows;
            j.n_rows = static_cast<int>(std::min(kQuadRows, n_rows - q * kQuadRows));
            tile_dispatch_avx512<kPanel>(tn, j);
          }
        }
      }
    }
  }
}

TESSERA_AVX512 void fmatmul_avx512(const FMatmulArgs& a, int64_t r0, int64_t r1) {
  if (a.n_tokens == 1) {
    const bool l2 = kernel_tuning().float_prefetch_l2;
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
        case QuantType::kF16: gemv4_avx512<QuantType::kF16>(a, rows, out, next, next_bytes, l2); break;
        case QuantType::kBF16: gemv4_avx512<QuantType::kBF16>(a, rows, out, next, next_bytes, l2); break;
        default: gemv4_avx512<QuantType::kF32>(a, rows, out, next, next_bytes, l2); break;
      }
      std::memcpy(a.y + g, out, static_cast<size_t>(n_valid) * 4);
    }
    return;
  }
  if (a.n_tokens <= kSmallTokens) {
    switch (a.type) {
      case QuantType::kF16: return fmatmul_small_avx512<QuantType::kF16>(a, r0, r1);
      case QuantType::kBF16: return fmatmul_small_avx512<QuantType::kBF16>(a, r0, r1);
      default: return fmatmul_small_avx512<QuantType::kF32>(a, r0, r1);
    }
  }
  const bool widen = kernel_tuning().float_panels_fp32;
  switch (a.type) {
    case QuantType::kF16:
      return widen ? fmatmul_batch_avx512<QuantType::kF16, QuantType::kF32>(a, r0, r1)
                   : fmatmul_batch_avx512<QuantType::kF16, QuantType::kF16>(a, r0, r1);
    case QuantType::kBF16:
      return widen ? fmatmul_batch_avx512<QuantType::kBF16, QuantType::kF32>(a, r0, r1)
                   : fmatmul_batch_avx512<QuantType::kBF16, QuantType::kBF16>(a, r0, r1);
    default: return fmatmul_batch_avx512<QuantType::kF32, QuantType::kF32>(a, r0, r1);
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

bool is_float_weight(QuantType type) { return quant_traits(type).cpu == CpuMatmul::kFloat; }

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
