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
// error of that format; the ternary TQ1_0 / TQ2_0 take the least-squares-best threshold and
// scale per block). Supports the float formats, every GGUF block format (common/dtype.h's
// table) and I8_CH, I4_G128 (see can_quantize).
void quantize_row(QuantType type, const float* src, void* dst, int64_t k);

// Whether quantize_row supports `type`.
bool can_quantize(QuantType type);

// ---- Importance-weighted (calibrated) quantization (kernels/cpu/quant_weighted.cpp)
//
// Like quantize_row, but the encoder minimises the importance-weighted squared error
// sum_j importance[j] * (src[j] - dequantized[j])^2 instead of the plain one. importance holds
// k non-negative finite values, one per element of the row (for a weight matrix: per input
// column, e.g. the mean of x_j^2 of the activations entering it on calibration text); only
// their ratios matter. Each value is floored at 1e-2 * mean(importance) so that columns never
// seen active are still fitted; an all-zero importance row is treated as uniform.
// importance == nullptr behaves exactly like quantize_row (same bytes, same checks).
// Under uniform importance the error is that of quantize_row or lower (the scale searches try
// what quantize_row tries and more). Deterministic; thread-safe (no shared state). Costs about
// 1.5-3x quantize_row (bench/results/quant_weighted.md).
// A negative or non-finite importance value, or k % block_elems != 0, stops the process (as
// quantize_row's checks do); so does a type without a weighted encoder when importance is
// given (see can_quantize_weighted).
void quantize_row_weighted(QuantType type, const float* src, const float* importance, void* dst,
                           int64_t k);

// Whether quantize_row_weighted takes importance for `type`: the GGUF block formats with a
// weighted encoder (kernels/cpu/quant_weighted.cpp), and F32 / F16 / BF16 (where every element
// is stored independently, so the importance cannot change the result).
bool can_quantize_weighted(QuantType type);

// ---- INT8 per-channel (I8_CH) and INT4 group-wise (I4_G128) weights (kernels/cpu/int_quant.cpp)
//
// Round to nearest (RTN), the grids Tessera quantizes float checkpoints to at load:
//   I8_CH, per row:   s = amax / 127 (fp32, stored as is), level = clamp(rne(w / s), -127, 127).
//   I4_G128 asymmetric (default), per group of 128: lo = min(0, min w), hi = max(0, max w),
//     d = fp16(hi - lo) / 15), z = clamp(rne(-lo / d), 0, 15), level = clamp(rne(w / d) + z, 0, 15).
//   I4_G128 symmetric: d = fp16(2 * amax / 15), z = 8, level = clamp(rne(w / d) + 8, 0, 15)
//     (GPTQ's symmetric grid). An all-zero group stores d = 0, z = 0, levels 0.
// The value of a level is (level - z) * d, d widened from fp16 exactly. AWQ / GPTQ checkpoints
// are converted into the same layout (model/int4_checkpoint.cpp). kInt4Group, Int4Group and
// Int4Grid are in common/dtype.h.

// Quantizes 128 floats.
void rtn_int4_group(const float* x, Int4Grid grid, Int4Group* g);
// The 68 bytes of one I4_G128 block (layout in common/dtype.h; the same bytes as its
// write_int4_group) and back.
void pack_int4_group(const Int4Group& g, uint8_t* dst);
void unpack_int4_group(const uint8_t* src, Int4Group* g);
// One I4_G128 row of k floats (k % 128 == 0) with the given grid; quantize_row uses kAsymmetric.
void quantize_row_int4(const float* src, void* dst, int64_t k, Int4Grid grid);

}  // namespace tessera
