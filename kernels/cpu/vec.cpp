#include "kernels/cpu/vec.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "common/dtype.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define TESSERA_X86 1
#define TESSERA_AVX2 __attribute__((target("avx2,fma,f16c")))
#endif

namespace tessera::cpu {
namespace {

Isa g_max_isa = Isa::kAvx512;

Isa detect_isa() {
#ifdef TESSERA_X86
  __builtin_cpu_init();
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                    __builtin_cpu_supports("f16c");
  if (!avx2) return Isa::kScalar;
  const bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl") &&
                      __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512vbmi");
  return avx512 ? Isa::kAvx512 : Isa::kAvx2;
#else
  return Isa::kScalar;
#endif
}

inline bool use_avx2() { return simd_enabled(); }

// ---- scalar canonical order: element i goes to partial sum i % 8 for the full groups of 8;
// the remaining n % 8 products are added one by one after the partial sums are combined.
struct ScalarAcc {
  float s[8] = {};
  void add8(const float* a, const float* b, int64_t n8) {  // n8 % 8 == 0
    for (int64_t i = 0; i < n8; i += 8)
      for (int l = 0; l < 8; ++l) s[l] += a[i + l] * b[i + l];
  }
  float reduce() const {
    return ((s[0] + s[4]) + (s[1] + s[5])) + ((s[2] + s[6]) + (s[3] + s[7]));
  }
};

float dot_f32_scalar(const float* a, const float* b, int64_t n) {
  ScalarAcc acc;
  const int64_t n8 = n - n % 8;
  acc.add8(a, b, n8);
  float sum = acc.reduce();
  for (int64_t i = n8; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

// Fused scalar dots: dequantize a chunk (a multiple of 8 elements) at a time into a local
// buffer and feed the same accumulator, so the order equals dot_f32_scalar's.
template <typename Decode>
float dot_chunked_scalar(const float* x, int64_t n, int64_t chunk, Decode decode) {
  float buf[256];
  ScalarAcc acc;
  const int64_t n8 = n - n % 8;
  int64_t i = 0;
  for (; i < n8; i += chunk) {
    const int64_t len = n8 - i < chunk ? n8 - i : chunk;
    decode(i, len, buf);
    acc.add8(buf, x + i, len);
  }
  float sum = acc.reduce();
  if (n8 < n) {
    decode(n8, n - n8, buf);
    for (int64_t j = 0; j < n - n8; ++j) sum += buf[j] * x[n8 + j];
  }
  return sum;
}

#ifdef TESSERA_X86
// ---- AVX2 canonical order: four 8-lane partial sums; element i of each 32-element step goes
// to sum (i / 8) % 4; a trailing group of 8 goes to sum 0; then ((s0 + s1) + (s2 + s3)) is
// reduced across lanes and the last n % 8 products are added one by one with fma.
TESSERA_AVX2 inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

TESSERA_AVX2 inline float finish(__m256 a0, __m256 a1, __m256 a2, __m256 a3) {
  return hsum(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
}

TESSERA_AVX2 float dot_f32_avx2(const float* a, const float* b, int64_t n) {
  __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
    s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
    s2 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 16), _mm256_loadu_ps(b + i + 16), s2);
    s3 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 24), _mm256_loadu_ps(b + i + 24), s3);
  }
  for (; i + 8 <= n; i += 8) s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
  float sum = finish(s0, s1, s2, s3);
  for (; i < n; ++i) sum = std::fma(a[i], b[i], sum);
  return sum;
}

// Three dot products sharing the weight loads; each accumulates exactly as dot_f32_avx2.
TESSERA_AVX2 void dot3_f32_avx2(const float* w, const float* x0, const float* x1, const float* x2,
                                int64_t n, float* out) {
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  __m256 b0 = a0, b1 = a0, b2 = a0, b3 = a0;
  __m256 c0 = a0, c1 = a0, c2 = a0, c3 = a0;
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    __m256 v = _mm256_loadu_ps(w + i);
    a0 = _mm256_fmadd_ps(v, _mm256_loadu_ps(x0 + i), a0);
    b0 = _mm256_fmadd_ps(v, _mm256_loadu_ps(x1 + i), b0);
    c0 = _mm256_fmadd_ps(v, _mm256_loadu_ps(x2 + i), c0);
    v = _mm256_loadu_ps(w + i + 8);
    a1 = _mm256_fmadd_ps(v, _mm256_loadu_ps(x0 + i + 8), a1);
    b1 = _mm256_fmadd_ps(v, _mm256_loadu_ps(x1 + i + 8), b1);
    c1 = _mm256_fmadd_ps(v, _mm256_loadu_ps(x2 + i + 8), c1);
    v = _mm256_loadu_ps(w + i + 16);
    a2 = _mm256_fmadd_ps(v, _mm256_loadu_ps(x0 + i + 16), a2);
    b2 = _mm256_fmadd_ps(v, _mm256_loadu_ps(x1 + i + 16), b2);
    c2 = _mm256_fmadd_ps(v, _mm256_loadu_ps(x2 + i + 16), c2);
    v = _mm256_loadu_ps(w + i + 24);
    a3 = _mm256_fmadd_ps(v, _mm256_loadu_ps(x0 + i + 24), a3);
    b3 = _mm256_fmadd_ps(v, _mm256_loadu_ps(x1 + i + 24), b3);
    c3 = _mm256_fmadd_ps(v, _mm256_loadu_ps(x2 + i + 24), c3);
  }
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(w + i);
    a0 = _mm256_fmadd_ps(v, _mm256_loadu_ps(x0 + i), a0);
    b0 = _mm256_fmadd_ps(v, _mm256_loadu_ps(x1 + i), b0);
    c0 = _mm256_fmadd_ps(v, _mm256_loadu_ps(x2 + i), c0);
  }
  float sa = finish(a0, a1, a2, a3), sb = finish(b0, b1, b2, b3), sc = finish(c0, c1, c2, c3);
  for (; i < n; ++i) {
    sa = std::fma(w[i], x0[i], sa);
    sb = std::fma(w[i], x1[i], sb);
    sc = std::fma(w[i], x2[i], sc);
  }
  out[0] = sa;
  out[1] = sb;
  out[2] = sc;
}

TESSERA_AVX2 void axpy_f32_avx2(float a, const float* x, float* y, int64_t n) {
  const __m256 va = _mm256_set1_ps(a);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
  for (; i < n; ++i) y[i] = std::fma(a, x[i], y[i]);
}

TESSERA_AVX2 inline __m256 load_f16x8(const uint8_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

TESSERA_AVX2 inline __m256 load_bf16x8(const uint8_t* p) {
  const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
}

TESSERA_AVX2 float dot_f16_avx2(const void* row, const float* x, int64_t n) {
  const auto* w = static_cast<const uint8_t*>(row);
  __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    s0 = _mm256_fmadd_ps(load_f16x8(w + 2 * i), _mm256_loadu_ps(x + i), s0);
    s1 = _mm256_fmadd_ps(load_f16x8(w + 2 * i + 16), _mm256_loadu_ps(x + i + 8), s1);
    s2 = _mm256_fmadd_ps(load_f16x8(w + 2 * i + 32), _mm256_loadu_ps(x + i + 16), s2);
    s3 = _mm256_fmadd_ps(load_f16x8(w + 2 * i + 48), _mm256_loadu_ps(x + i + 24), s3);
  }
  for (; i + 8 <= n; i += 8) s0 = _mm256_fmadd_ps(load_f16x8(w + 2 * i), _mm256_loadu_ps(x + i), s0);
  float sum = finish(s0, s1, s2, s3);
  for (; i < n; ++i) {
    uint16_t h;
    std::memcpy(&h, w + 2 * i, 2);
    sum = std::fma(fp16_to_f32(h), x[i], sum);
  }
  return sum;
}

TESSERA_AVX2 float dot_bf16_avx2(const void* row, const float* x, int64_t n) {
  const auto* w = static_cast<const uint8_t*>(row);
  __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    s0 = _mm256_fmadd_ps(load_bf16x8(w + 2 * i), _mm256_loadu_ps(x + i), s0);
    s1 = _mm256_fmadd_ps(load_bf16x8(w + 2 * i + 16), _mm256_loadu_ps(x + i + 8), s1);
    s2 = _mm256_fmadd_ps(load_bf16x8(w + 2 * i + 32), _mm256_loadu_ps(x + i + 16), s2);
    s3 = _mm256_fmadd_ps(load_bf16x8(w + 2 * i + 48), _mm256_loadu_ps(x + i + 24), s3);
  }
  for (; i + 8 <= n; i += 8) s0 = _mm256_fmadd_ps(load_bf16x8(w + 2 * i), _mm256_loadu_ps(x + i), s0);
  float sum = finish(s0, s1, s2, s3);
  for (; i < n; ++i) {
    uint16_t h;
    std::memcpy(&h, w + 2 * i, 2);
    sum = std::fma(bf16_to_f32(h), x[i], sum);
  }
  return sum;
}

// d * q for 8 int8 values at p: the same single rounding as the scalar dequantizer.
TESSERA_AVX2 inline __m256 q8x8(const uint8_t* p, __m256 d) {
  const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
  return _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b)));
}

TESSERA_AVX2 float dot_q8_0_avx2(const void* row, const float* x, int64_t n) {
  const auto* w = static_cast<const uint8_t*>(row);
  __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
  for (int64_t i = 0; i < n; i += 32, w += 34) {
    uint16_t h;
    std::memcpy(&h, w, 2);
    const __m256 d = _mm256_set1_ps(_cvtsh_ss(h));
    s0 = _mm256_fmadd_ps(q8x8(w + 2, d), _mm256_loadu_ps(x + i), s0);
    s1 = _mm256_fmadd_ps(q8x8(w + 10, d), _mm256_loadu_ps(x + i + 8), s1);
    s2 = _mm256_fmadd_ps(q8x8(w + 18, d), _mm256_loadu_ps(x + i + 16), s2);
    s3 = _mm256_fmadd_ps(q8x8(w + 26, d), _mm256_loadu_ps(x + i + 24), s3);
  }
  return finish(s0, s1, s2, s3);
}
#endif  // TESSERA_X86

}  // namespace

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::kScalar: return "scalar";
    case Isa::kAvx2: return "avx2";
    case Isa::kAvx512: return "avx512";
  }
  return "?";
}

Isa detected_isa() {
  static const Isa kIsa = detect_isa();
  return kIsa;
}

Isa active_isa() { return std::min(detected_isa(), g_max_isa); }

void set_max_isa(Isa isa) { g_max_isa = isa; }

bool has_avx2() { return detected_isa() >= Isa::kAvx2; }

void set_force_scalar(bool force) { g_max_isa = force ? Isa::kScalar : Isa::kAvx512; }

bool simd_enabled() { return active_isa() >= Isa::kAvx2; }

float dot_f32(const float* a, const float* b, int64_t n) {
#ifdef TESSERA_X86
  if (use_avx2()) return dot_f32_avx2(a, b, n);
#endif
  return dot_f32_scalar(a, b, n);
}

void dot3_f32(const float* w, const float* x0, const float* x1, const float* x2, int64_t n,
              float* out) {
#ifdef TESSERA_X86
  if (use_avx2()) return dot3_f32_avx2(w, x0, x1, x2, n, out);
#endif
  out[0] = dot_f32_scalar(w, x0, n);
  out[1] = dot_f32_scalar(w, x1, n);
  out[2] = dot_f32_scalar(w, x2, n);
}

void axpy_f32(float a, const float* x, float* y, int64_t n) {
#ifdef TESSERA_X86
  if (use_avx2()) return axpy_f32_avx2(a, x, y, n);
#endif
  for (int64_t i = 0; i < n; ++i) y[i] += a * x[i];
}

float dot_f16_f32(const void* row, const float* x, int64_t n) {
#ifdef TESSERA_X86
  if (use_avx2()) return dot_f16_avx2(row, x, n);
#endif
  const auto* w = static_cast<const uint8_t*>(row);
  return dot_chunked_scalar(x, n, 256, [w](int64_t i, int64_t len, float* out) {
    for (int64_t j = 0; j < len; ++j) {
      uint16_t h;
      std::memcpy(&h, w + 2 * (i + j), 2);
      out[j] = fp16_to_f32(h);
    }
  });
}

float dot_bf16_f32(const void* row, const float* x, int64_t n) {
#ifdef TESSERA_X86
  if (use_avx2()) return dot_bf16_avx2(row, x, n);
#endif
  const auto* w = static_cast<const uint8_t*>(row);
  return dot_chunked_scalar(x, n, 256, [w](int64_t i, int64_t len, float* out) {
    for (int64_t j = 0; j < len; ++j) {
      uint16_t h;
      std::memcpy(&h, w + 2 * (i + j), 2);
      out[j] = bf16_to_f32(h);
    }
  });
}

float dot_q8_0_f32(const void* row, const float* x, int64_t n) {
#ifdef TESSERA_X86
  if (use_avx2()) return dot_q8_0_avx2(row, x, n);
#endif
  const auto* w = static_cast<const uint8_t*>(row);
  // Chunks are whole blocks (n % 32 == 0), so there is never a tail.
  return dot_chunked_scalar(x, n, 32, [w](int64_t i, int64_t len, float* out) {
    const uint8_t* b = w + (i / 32) * 34;
    uint16_t h;
    std::memcpy(&h, b, 2);
    const float d = fp16_to_f32(h);
    for (int64_t j = 0; j < len; ++j) out[j] = d * static_cast<float>(static_cast<int8_t>(b[2 + j]));
  });
}

}  // namespace tessera::cpu
