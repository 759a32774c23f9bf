// Reference conversion between fp32 and every QuantType (ggml byte layouts for GGUF types).
// Exact: the ground truth the fast kernels and the CUDA backend are tested against. On AVX2
// CPUs dequantize_row runs vectorised decoders that give bit-identical results to the
// portable scalar ones. Thread-safe (no shared state).
#pragma once

#include <cstdint>

#include "common/dtype.h"

namespace tessera {

// dst[0, k) = the k elements of one row stored in `type` at src. k % block_elems == 0.
void dequantize_row(QuantType type, const void* src, float* dst, int64_t k);

// Stores k fp32 values as one row of `type` (round to nearest; for K-quants the scale search
// follows the reference quantizers closely enough that dequantize(quantize(x)) has the usual
// error of that format). Supports F32, F16, BF16, Q8_0, Q4_0, Q5_0, Q4_K, Q5_K, Q6_K.
void quantize_row(QuantType type, const float* src, void* dst, int64_t k);

// Whether quantize_row supports `type`.
bool can_quantize(QuantType type);

}  // namespace tessera
