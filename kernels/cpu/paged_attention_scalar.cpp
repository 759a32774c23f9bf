// The scalar path of paged attention: the canonical arithmetic (kernels/cpu/paged_attention.cpp)
// written out one operation at a time, the reference the AVX2 and AVX-512 paths match bit for bit.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/cpu/exp_poly.h"
#include "kernels/cpu/fgemm.h"
#include "kernels/cpu/paged_attention_isa.h"

namespace tessera::cpu::attention {
namespace {

// exp(x) for x <= 0 (kernels/cpu/exp_poly.h); inputs below -87 are clamped (e^-87 ~ 1.6e-38,
// which is negligible next to the largest term, 1).
inline float exp_poly(float x) { return cpu::exp_poly_clamped(std::max(x, cpu::kExpPolyLo)); }

// The canonical reduction of 16 partial sums, the float matmuls' (kernels/cpu/fgemm.h).
using cpu::reduce16;

template <typename T>
void scores_scalar(const Item<T>& it) {
  for (int64_t j = 0; j < it.n; ++j) {
    for (int64_t g = 0; g < it.group; ++g) {
      float s[kLanes] = {};
      const float* q = it.q + g * it.hd;
      const int64_t pad = (it.hd + kLanes - 1) / kLanes * kLanes;
      for (int64_t i = 0; i < pad; ++i) {
        const float a = i < it.hd ? q[i] : 0.0f, b = i < it.hd ? widen_at(it.keys[j], i) : 0.0f;
        s[i % kLanes] = std::fma(a, b, s[i % kLanes]);
      }
      it.scores[g * it.n + j] = reduce16(s) * it.scale;
    }
  }
}

// e_j in place, returns 1 / sum.
float softmax_scalar(float* s, int64_t n) {
  float m = -INFINITY;
  for (int64_t j = 0; j < n; ++j) m = std::max(m, s[j]);
  float lanes[kLanes] = {};
  const int64_t pad = (n + kLanes - 1) / kLanes * kLanes;
  for (int64_t j = 0; j < pad; ++j) {
    const float e = j < n ? exp_poly(s[j] - m) : 0.0f;
    if (j < n) s[j] = e;
    lanes[j % kLanes] += e;
  }
  return 1.0f / reduce16(lanes);
}

template <typename T>
void values_scalar(const Item<T>& it, const float* inv) {
  for (int64_t g = 0; g < it.group; ++g) std::memset(it.out + g * it.hd, 0, static_cast<size_t>(it.hd) * 4);
  for (int64_t j = 0; j < it.n; ++j)
    for (int64_t g = 0; g < it.group; ++g) {
      const float p = it.scores[g * it.n + j] * inv[g];
      float* o = it.out + g * it.hd;
      for (int64_t i = 0; i < it.hd; ++i) o[i] = std::fma(p, widen_at(it.values[j], i), o[i]);
    }
}

}  // namespace

template <typename T>
void run_item_scalar(const Item<T>& it) {
  float inv[kMaxGroup];
  scores_scalar(it);
  for (int64_t g = 0; g < it.group; ++g) inv[g] = softmax_scalar(it.scores + g * it.n, it.n);
  values_scalar(it, inv);
}

template void run_item_scalar<float>(const Item<float>& it);
template void run_item_scalar<uint16_t>(const Item<uint16_t>& it);
template void run_item_scalar<int8_t>(const Item<int8_t>& it);

}  // namespace tessera::cpu::attention
