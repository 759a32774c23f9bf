// SwiGLU with a fixed exp polynomial instead of libm, so the scalar, AVX2 and AVX-512 paths
// give the same bits (the result feeds the int8 quantization of the down projection's input,
// where a last-bit difference could move a rounding boundary).
//   silu(g) = g * (1 / (1 + e)), e = exp_poly(-g); out = silu(g) * up
// exp_poly(x): x clamped to [-87, 88], then the polynomial of kernels/cpu/exp_poly.h.
// GeGLU (gelu_tanh_mul) is a scalar loop over std::tanh.
#include "kernels/activation.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "common/dtype.h"
#include "kernels/cpu/exp_poly.h"
#include "kernels/cpu/vec.h"

#if defined(__x86_64__)
#include <immintrin.h>
#define TESSERA_ACT_X86 1
#define TESSERA_AVX2 __attribute__((target("avx2,fma,f16c")))
#define TESSERA_AVX512 __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c")))
#endif

namespace tessera {
namespace {

using cpu::kExpPolyHi;
using cpu::kExpPolyLo;

inline float exp_poly(float x) { return cpu::exp_poly_clamped(std::min(std::max(x, kExpPolyLo), kExpPolyHi)); }

inline float silu_mul1(float g, float u) { return g * (1.0f / (1.0f + exp_poly(-g))) * u; }

#ifdef TESSERA_ACT_X86
TESSERA_AVX512 void silu_mul_avx512(const float* gate, const float* up, float* out, int64_t n) {
  const __m512 one = _mm512_set1_ps(1.0f);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 g = _mm512_loadu_ps(gate + i);
    const __m512 x = _mm512_min_ps(_mm512_max_ps(_mm512_sub_ps(_mm512_setzero_ps(), g), _mm512_set1_ps(kExpPolyLo)),
                                   _mm512_set1_ps(kExpPolyHi));
    const __m512 e = cpu::exp_poly_clamped_avx512(x);
    const __m512 s = _mm512_mul_ps(g, _mm512_div_ps(one, _mm512_add_ps(one, e)));
    _mm512_storeu_ps(out + i, _mm512_mul_ps(s, _mm512_loadu_ps(up + i)));
  }
  for (; i < n; ++i) out[i] = silu_mul1(gate[i], up[i]);
}

TESSERA_AVX2 void silu_mul_avx2(const float* gate, const float* up, float* out, int64_t n) {
  const __m256 one = _mm256_set1_ps(1.0f);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 g = _mm256_loadu_ps(gate + i);
    const __m256 x = _mm256_min_ps(_mm256_max_ps(_mm256_sub_ps(_mm256_setzero_ps(), g), _mm256_set1_ps(kExpPolyLo)),
                                   _mm256_set1_ps(kExpPolyHi));
    const __m256 e = cpu::exp_poly_clamped_avx2(x);
    const __m256 s = _mm256_mul_ps(g, _mm256_div_ps(one, _mm256_add_ps(one, e)));
    _mm256_storeu_ps(out + i, _mm256_mul_ps(s, _mm256_loadu_ps(up + i)));
  }
  for (; i < n; ++i) out[i] = silu_mul1(gate[i], up[i]);
}
#endif

}  // namespace

void silu_mul(const float* gate, const float* up, float* out, int64_t n_tokens, int64_t dim) {
  const int64_t n = n_tokens * dim;
#ifdef TESSERA_ACT_X86
  switch (cpu::active_isa()) {
    case cpu::Isa::kAvx512: return silu_mul_avx512(gate, up, out, n);
    case cpu::Isa::kAvx2: return silu_mul_avx2(gate, up, out, n);
    case cpu::Isa::kScalar: break;
  }
#endif
  for (int64_t i = 0; i < n; ++i) out[i] = silu_mul1(gate[i], up[i]);
}

// GeGLU: one scalar loop over libm's tanhf on every ISA (no SIMD path yet), in the order the header
// states.
namespace {

inline float gelu_tanh1(float x) {
  constexpr float kSqrt2OverPi = 0.7978845608f;
  const float c = x * x * x;
  const float t = std::tanh(kSqrt2OverPi * (x + 0.044715f * c));
  return 0.5f * x * (1.0f + t);
}

// G[h] = fp16(gelu_tanh(fp16 value h)), built on first use (thread-safe static init). One
// entry of padding: the vector paths gather 32-bit words at byte offset 2h.
const uint16_t* gelu_fp16_table() {
  static const std::vector<uint16_t> table = [] {
    std::vector<uint16_t> t(65536 + 1, 0);
    for (uint32_t h = 0; h < 65536; ++h) t[h] = f32_to_fp16(gelu_tanh1(fp16_to_f32(static_cast<uint16_t>(h))));
    return t;
  }();
  return table.data();
}

inline float gelu_grid1(const uint16_t* table, float x, float u) {
  if (x <= -10.0f) return 0.0f;
  if (x >= 10.0f) return x * u;
  if (x != x) return x;
  return fp16_to_f32(table[f32_to_fp16(x)]) * u;
}

#ifdef TESSERA_ACT_X86
// The scalar steps 16 (8) at a time: F16C's round-to-nearest-even conversions are the exact
// f32_to_fp16 / fp16_to_f32, and the table is read with a 32-bit gather.
TESSERA_AVX512 int64_t gelu_grid_avx512(const uint16_t* table, const float* gate, const float* up, float* out,
                                        int64_t n) {
  const __m512 lo = _mm512_set1_ps(-10.0f), hi = _mm512_set1_ps(10.0f);
  const __m512i low16 = _mm512_set1_epi32(0xFFFF);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 x = _mm512_loadu_ps(gate + i), u = _mm512_loadu_ps(up + i);
    const __m256i h = _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m512i idx = _mm512_cvtepu16_epi32(h);
    const __m512i g = _mm512_and_si512(_mm512_i32gather_epi32(idx, table, 2), low16);
    __m512 y = _mm512_mul_ps(_mm512_cvtph_ps(_mm512_cvtepi32_epi16(g)), u);
    y = _mm512_mask_mov_ps(y, _mm512_cmp_ps_mask(x, hi, _CMP_GE_OQ), _mm512_mul_ps(x, u));
    y = _mm512_mask_mov_ps(y, _mm512_cmp_ps_mask(x, lo, _CMP_LE_OQ), _mm512_setzero_ps());
    y = _mm512_mask_mov_ps(y, _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), x);
    _mm512_storeu_ps(out + i, y);
  }
  return i;
}

TESSERA_AVX2 int64_t gelu_grid_avx2(const uint16_t* table, const float* gate, const float* up, float* out,
                                    int64_t n) {
  const __m256 lo = _mm256_set1_ps(-10.0f), hi = _mm256_set1_ps(10.0f);
  const __m256i low16 = _mm256_set1_epi32(0xFFFF);
  const auto* words = reinterpret_cast<const int*>(table);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 x = _mm256_loadu_ps(gate + i), u = _mm256_loadu_ps(up + i);
    const __m128i h = _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m256i idx = _mm256_cvtepu16_epi32(h);
    const __m256i g = _mm256_and_si256(_mm256_i32gather_epi32(words, idx, 2), low16);
    const __m128i g16 = _mm_packus_epi32(_mm256_castsi256_si128(g), _mm256_extracti128_si256(g, 1));
    __m256 y = _mm256_mul_ps(_mm256_cvtph_ps(g16), u);
    y = _mm256_blendv_ps(y, _mm256_mul_ps(x, u), _mm256_cmp_ps(x, hi, _CMP_GE_OQ));
    y = _mm256_blendv_ps(y, _mm256_setzero_ps(), _mm256_cmp_ps(x, lo, _CMP_LE_OQ));
    y = _mm256_blendv_ps(y, x, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
    _mm256_storeu_ps(out + i, y);
  }
  return i;
}
#endif

}  // namespace

void gelu_tanh_mul(const float* gate, const float* up, float* out, int64_t n_tokens, int64_t dim) {
  const int64_t n = n_tokens * dim;
  for (int64_t i = 0; i < n; ++i) out[i] = gelu_tanh1(gate[i]) * up[i];
}

void gelu_tanh_mul_fp16_grid(const float* gate, const float* up, float* out, int64_t n_tokens, int64_t dim) {
  const uint16_t* table = gelu_fp16_table();
  const int64_t n = n_tokens * dim;
  int64_t i = 0;
#ifdef TESSERA_ACT_X86
  switch (cpu::active_isa()) {
    case cpu::Isa::kAvx512: i = gelu_grid_avx512(table, gate, up, out, n); break;
    case cpu::Isa::kAvx2: i = gelu_grid_avx2(table, gate, up, out, n); break;
    case cpu::Isa::kScalar: break;
  }
#endif
  for (; i < n; ++i) out[i] = gelu_grid1(table, gate[i], up[i]);
}

}  // namespace tessera
