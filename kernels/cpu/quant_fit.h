// Helpers shared by the round-to-nearest encoders (quant.cpp) and the importance-weighted
// ones (quant_weighted.cpp): fp16 stores, rounding, and the packers that write per-element
// levels and sub-block scales into the GGUF block layouts documented at the top of quant.cpp.
// Internal to kernels/cpu; every function is pure (thread-safe).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "common/dtype.h"

namespace tessera::quant_fit {

constexpr int kQk = 32;    // elements per block of the 32-blocks
constexpr int kQkK = 256;  // elements per K-quant super-block

// Stores f as fp16 and returns the value the reader will see.
inline float store_f16(uint8_t* p, float f) {
  const uint16_t h = f32_to_fp16(f);
  std::memcpy(p, &h, 2);
  return fp16_to_f32(h);
}

// rne(v) clamped to [lo, hi] (|lo|, |hi| < 2^22); NaN gives lo. Clamping first gives the same
// result as rounding first (both are monotone and lo, hi are integers); in range, adding and
// subtracting 1.5 * 2^23 rounds to nearest even in one float add each, where nearbyint is a
// library call on baseline x86-64 (the encoders' inner loop).
inline int clamp_round(float v, int lo, int hi) {
  if (!(v >= static_cast<float>(lo))) return lo;  // also catches NaN
  if (v > static_cast<float>(hi)) return hi;
  constexpr float kRoundMagic = 12582912.0f;  // 1.5 * 2^23
  return static_cast<int>((v + kRoundMagic) - kRoundMagic);
}

// The element of largest magnitude, with its sign (so the extreme lands on the format's
// extra negative level, e.g. -8 for Q4_0).
inline float signed_absmax(const float* x, int n) {
  float best = 0.0f, amax = 0.0f;
  for (int i = 0; i < n; ++i) {
    if (std::fabs(x[i]) > amax) {
      amax = std::fabs(x[i]);
      best = x[i];
    }
  }
  return best;
}

// The 12 scale bytes of Q4_K / Q5_K from 6-bit scales and mins of the 8 sub-blocks (the
// inverse of unpack_scale_min in quant.cpp).
inline void pack_scale_min(uint8_t* s, const int* sc, const int* m) {
  std::memset(s, 0, 12);
  for (int j = 0; j < 8; ++j) {
    if (j < 4) {
      s[j] |= static_cast<uint8_t>(sc[j] & 63);
      s[j + 4] |= static_cast<uint8_t>(m[j] & 63);
    } else {
      s[j + 4] = static_cast<uint8_t>((sc[j] & 0xF) | ((m[j] & 0xF) << 4));
      s[j - 4] |= static_cast<uint8_t>((sc[j] >> 4) << 6);
      s[j] |= static_cast<uint8_t>((m[j] >> 4) << 6);
    }
  }
}

// Sets the 2-bit field of element e in the shared plane layout (see plane2); qs pre-zeroed.
inline void set_plane2(uint8_t* qs, int e, int v) {
  qs[32 * (e / 128) + e % 32] |= static_cast<uint8_t>((v & 3) << (2 * ((e / 32) % 4)));
}

// ---- Level packers: L holds unsigned levels (the stored codes) of one block.

// Q4_0: 16 bytes of nibbles from L[32] (0..15).
inline void pack_q4_0_levels(const int* L, uint8_t* qs) {
  for (int j = 0; j < 16; ++j) qs[j] = static_cast<uint8_t>(L[j] | (L[j + 16] << 4));
}

// Q5_0: qh (4 bytes) and qs (16 bytes) from L[32] (0..31).
inline void pack_q5_0_levels(const int* L, uint8_t* qh_bytes, uint8_t* qs) {
  uint32_t qh = 0;
  for (int j = 0; j < 16; ++j) {
    const int lo = L[j], hi = L[j + 16];
    qs[j] = static_cast<uint8_t>((lo & 0xF) | ((hi & 0xF) << 4));
    qh |= static_cast<uint32_t>(lo >> 4) << j;
    qh |= static_cast<uint32_t>(hi >> 4) << (j + 16);
  }
  std::memcpy(qh_bytes, &qh, 4);
}

// Q4_K: the 128 bytes of qs from L[256] (0..15).
inline void pack_q4_k_levels(const int* L, uint8_t* qs) {
  for (int c = 0; c < 4; ++c)
    for (int l = 0; l < 32; ++l)
      qs[32 * c + l] = static_cast<uint8_t>(L[64 * c + l] | (L[64 * c + 32 + l] << 4));
}

// Q5_K: qh (32 bytes) and qs (128 bytes) from L[256] (0..31).
inline void pack_q5_k_levels(const int* L, uint8_t* qh, uint8_t* qs) {
  std::memset(qh, 0, 32);
  for (int c = 0; c < 4; ++c) {
    for (int l = 0; l < 32; ++l) {
      const int lo = L[64 * c + l], hi = L[64 * c + 32 + l];
      qs[32 * c + l] = static_cast<uint8_t>((lo & 0xF) | ((hi & 0xF) << 4));
      qh[l] |= static_cast<uint8_t>(((lo >> 4) << (2 * c)) | ((hi >> 4) << (2 * c + 1)));
    }
  }
}

// Q6_K: ql (128 bytes) and qh (64 bytes) at dst from L[256] (0..63).
inline void pack_q6_k_levels(const int* levels, uint8_t* dst) {
  for (int h = 0; h < 2; ++h) {
    uint8_t* ql = dst + 64 * h;
    uint8_t* qh = dst + 128 + 32 * h;
    const int* L = levels + 128 * h;
    for (int l = 0; l < 32; ++l) {
      ql[l] = static_cast<uint8_t>((L[l] & 0xF) | ((L[l + 64] & 0xF) << 4));
      ql[l + 32] = static_cast<uint8_t>((L[l + 32] & 0xF) | ((L[l + 96] & 0xF) << 4));
      qh[l] = static_cast<uint8_t>((L[l] >> 4) | ((L[l + 32] >> 4) << 2) | ((L[l + 64] >> 4) << 4) |
                                   ((L[l + 96] >> 4) << 6));
    }
  }
}

// Q3_K: hmask, qs and the packed scales (the first 108 bytes of the block) from the signed
// 6-bit sub-block scales q[16] (-32..31) and L[256] (0..7, the level plus 4).
inline void pack_q3_k(const int* q, const int* L, uint8_t* dst) {
  uint8_t* hmask = dst;
  uint8_t* qs = dst + 32;
  uint8_t* sc = dst + 96;
  std::memset(dst, 0, 108);
  for (int i = 0; i < 16; ++i) {
    const int u = q[i] + 32;  // 0..63, packed as q3_k_scale reads it
    sc[i % 8] |= static_cast<uint8_t>((u & 0xF) << (i < 8 ? 0 : 4));
    sc[8 + i % 4] |= static_cast<uint8_t>((u >> 4) << (2 * (i / 4)));
  }
  for (int e = 0; e < kQkK; ++e) {
    set_plane2(qs, e, L[e] & 3);
    hmask[e % 32] |= static_cast<uint8_t>((L[e] >> 2) << (e / 32));
  }
}

// n digits (t + 1) of the trits at t[0], t[stride], ... as one TQ1_0 byte (see tq1_trit).
inline uint8_t pack_trits(const int* t, int stride, int n) {
  int v = 0;
  for (int p = 0; p < 5; ++p) v = 3 * v + (p < n ? t[p * stride] + 1 : 0);
  return static_cast<uint8_t>((v * 256 + 242) / 243);
}

// TQ1_0: the 52 bytes before d from the trits t[256] (-1..1).
inline void pack_tq1_0(const int* t, uint8_t* dst) {
  for (int l = 0; l < 32; ++l) dst[l] = pack_trits(t + l, 32, 5);
  for (int l = 0; l < 16; ++l) dst[32 + l] = pack_trits(t + 160 + l, 16, 5);
  for (int l = 0; l < 4; ++l) dst[48 + l] = pack_trits(t + 240 + l, 4, 4);
}

// TQ2_0: the 64 bytes before d from the trits t[256] (-1..1).
inline void pack_tq2_0(const int* t, uint8_t* dst) {
  std::memset(dst, 0, 64);
  for (int e = 0; e < kQkK; ++e) set_plane2(dst, e, t[e] + 1);
}

}  // namespace tessera::quant_fit
