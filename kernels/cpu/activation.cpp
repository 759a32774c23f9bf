// SwiGLU with a fixed exp polynomial instead of libm, so the scalar, AVX2 and AVX-512 paths
// give the same bits (the result feeds the int8 quantization of the down projection's input,
// where a last-bit difference could move a rounding boundary).
//   silu(g) = g * (1 / (1 + e)), e = exp_poly(-g); out = silu(g) * up
// exp_poly(x), x clamped to [-87, 88]: x = n ln2 + r, degree-7 Taylor polynomial in r, times 2^n.
#include "kernels/activation.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/cpu/vec.h"

#if defined(__x86_64__)
#include <immintrin.h>
#define TESSERA_ACT_X86 1
#define TESSERA_AVX2 __attribute__((target("avx2,fma,f16c")))
#define TESSERA_AVX512 __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c")))
#endif

namespace tessera {
namespace {

constexpr float kLo = -87.0f, kHi = 88.0f;
constexpr float kLog2e = 1.44269504088896341f;
constexpr float kLn2Hi = 0.693359375f;
constexpr float kLn2Lo = -2.12194440e-4f;
constexpr float kC[8] = {1.0f / 5040, 1.0f / 720, 1.0f / 120, 1.0f / 24, 1.0f / 6, 0.5f, 1.0f, 1.0f};

inline float exp_poly(float x) {
  x = std::min(std::max(x, kLo), kHi);
  const float n = std::nearbyint(x * kLog2e);
  float r = std::fma(n, -kLn2Hi, x);
  r = std::fma(n, -kLn2Lo, r);
  float p = kC[0];
  for (int i = 1; i < 8; ++i) p = std::fma(p, r, kC[i]);
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, 4);
  return p * scale;
}

inline float silu_mul1(float g, float u) { return g * (1.0f / (1.0f + exp_poly(-g))) * u; }

#ifdef TESSERA_ACT_X86
TESSERA_AVX512 void silu_mul_avx512(const float* gate, const float* up, float* out, int64_t n) {
  const __m512 one = _mm512_set1_ps(1.0f);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 g = _mm512_loadu_ps(gate + i);
    __m512 x = _mm512_min_ps(_mm512_max_ps(_mm512_sub_ps(_mm512_setzero_ps(), g), _mm512_set1_ps(kLo)),
                             _mm512_set1_ps(kHi));
    const __m512 nn = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(kLog2e)),
                                           _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fmadd_ps(nn, _mm512_set1_ps(-kLn2Hi), x);
    r = _mm512_fmadd_ps(nn, _mm512_set1_ps(-kLn2Lo), r);
    __m512 p = _mm512_set1_ps(kC[0]);
    for (int c = 1; c < 8; ++c) p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kC[c]));
    const __m512i bits = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(nn), _mm512_set1_epi32(127)), 23);
    const __m512 e = _mm512_mul_ps(p, _mm512_castsi512_ps(bits));
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
    __m256 x = _mm256_min_ps(_mm256_max_ps(_mm256_sub_ps(_mm256_setzero_ps(), g), _mm256_set1_ps(kLo)),
                             _mm256_set1_ps(kHi));
    const __m256 nn = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(kLog2e)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fmadd_ps(nn, _mm256_set1_ps(-kLn2Hi), x);
    r = _mm256_fmadd_ps(nn, _mm256_set1_ps(-kLn2Lo), r);
    __m256 p = _mm256_set1_ps(kC[0]);
    for (int c = 1; c < 8; ++c) p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kC[c]));
    const __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(nn), _mm256_set1_epi32(127)), 23);
    const __m256 e = _mm256_mul_ps(p, _mm256_castsi256_ps(bits));
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

}  // namespace tessera
