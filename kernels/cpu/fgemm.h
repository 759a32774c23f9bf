// Internal interface of the float-weight matmul kernels (F32, F16, BF16 weights, fp32
// activations, fp32 accumulation).
//
// Canonical arithmetic, shared by the scalar, AVX2 and AVX-512 paths (bit-identical results
// for any ISA, thread count, or batch composition): the row is padded with zeros to a multiple
// of 16; element c goes to partial sum c % 16 with one fma per element in increasing c; the 16
// partial sums s are then reduced as t_i = s_i + s_(i+8), u_i = t_i + t_(i+4),
// v_i = u_i + u_(i+2), result = v_0 + v_1.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/dtype.h"

namespace tessera::cpu {

struct FMatmulArgs {
  QuantType type = QuantType::kF32;  // F32, F16 or BF16
  const uint8_t* w = nullptr;        // row 0 of the weight slice
  size_t row_bytes = 0;
  int64_t k = 0;
  const float* x = nullptr;          // [n_tokens, k]
  int64_t n_tokens = 0;
  float* y = nullptr;                // y[t * y_stride + r]
  int64_t y_stride = 0;
};

// Rows a thread should take at a time.
constexpr int64_t kFRowGroup = 16;

// The canonical reduction of 16 partial sums above (the bf16 kernels of fgemm_bf16.h use it too).
inline float reduce16(const float* s) {
  float t[8], u[4], v[2];
  for (int i = 0; i < 8; ++i) t[i] = s[i] + s[i + 8];
  for (int i = 0; i < 4; ++i) u[i] = t[i] + t[i + 4];
  for (int i = 0; i < 2; ++i) v[i] = u[i] + u[i + 2];
  return v[0] + v[1];
}

bool is_float_weight(QuantType type);
void fmatmul(const FMatmulArgs& a, int64_t r0, int64_t r1);  // dispatches on active_isa()

}  // namespace tessera::cpu
