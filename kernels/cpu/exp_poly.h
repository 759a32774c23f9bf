// The fixed exp polynomial of the CPU kernels (SwiGLU in activation.cpp, softmax in
// paged_attention_{scalar,avx2,avx512}.cpp), one definition for the scalar, AVX2 and AVX-512
// paths so they give the same bits: x = n ln2 + r with |r| <= ln2 / 2 (ln2 split in a high and a
// low part), a degree-7 Taylor polynomial in r evaluated by Horner's rule with fma, times 2^n
// built in the exponent bits. Relative error below 1e-8 before rounding. The argument must
// already be clamped by the caller to [-87, 88] (2^n stays a normal float); the callers choose
// their clamps.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace tessera::cpu {

inline constexpr float kExpPolyLo = -87.0f;
inline constexpr float kExpPolyHi = 88.0f;

namespace exp_poly_detail {
inline constexpr float kLog2e = 1.44269504088896341f;
inline constexpr float kLn2Hi = 0.693359375f;
inline constexpr float kLn2Lo = -2.12194440e-4f;
inline constexpr float kC[8] = {1.0f / 5040, 1.0f / 720, 1.0f / 120, 1.0f / 24, 1.0f / 6, 0.5f, 1.0f, 1.0f};
}  // namespace exp_poly_detail

// exp(x) for x in [kExpPolyLo, kExpPolyHi].
inline float exp_poly_clamped(float x) {
  using namespace exp_poly_detail;
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

#if defined(__x86_64__)
__attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c"))) inline __m512 exp_poly_clamped_avx512(
    __m512 x) {
  using namespace exp_poly_detail;
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(kLog2e)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fmadd_ps(n, _mm512_set1_ps(-kLn2Hi), x);
  r = _mm512_fmadd_ps(n, _mm512_set1_ps(-kLn2Lo), r);
  __m512 p = _mm512_set1_ps(kC[0]);
  for (int i = 1; i < 8; ++i) p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kC[i]));
  const __m512i bits = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
  return _mm512_mul_ps(p, _mm512_castsi512_ps(bits));
}

__attribute__((target("avx2,fma,f16c"))) inline __m256 exp_poly_clamped_avx2(__m256 x) {
  using namespace exp_poly_detail;
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(kLog2e)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fmadd_ps(n, _mm256_set1_ps(-kLn2Hi), x);
  r = _mm256_fmadd_ps(n, _mm256_set1_ps(-kLn2Lo), r);
  __m256 p = _mm256_set1_ps(kC[0]);
  for (int i = 1; i < 8; ++i) p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kC[i]));
  const __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(bits));
}
#endif

}  // namespace tessera::cpu
