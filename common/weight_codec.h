// The arithmetic that loading weights may need (dequantizing a row, quantizing one at load for
// `--quant`), as an interface the loader's caller provides: model/ reads and lays out weights
// but computes no format itself (it links common only). kernels/weight_codec.h's
// cpu_weight_codec() is the implementation every loader passes (WeightLoadOptions::codec). It
// lives in common/ because both sides use it: model/ calls it, kernels/ implements it, and
// neither may include the other (ARCHITECTURE.md).
#pragma once

#include <cstdint>

#include "common/dtype.h"

namespace tessera {

// Plain functions, thread-safe (called for many rows in parallel), with kernels/quant.h's
// contracts: a row of k elements, k a multiple of the type's block_elems.
struct WeightCodec {
  // dst[0, k) = the k elements of one row stored in `type` at src.
  void (*dequantize_row)(QuantType type, const void* src, float* dst, int64_t k);
  // One row of `type` from k floats, round to nearest.
  void (*quantize_row)(QuantType type, const float* src, void* dst, int64_t k);
  // One I4_G128 row on the given grid (quantize_row makes the asymmetric one).
  void (*quantize_row_int4)(const float* src, void* dst, int64_t k, Int4Grid grid);
  // Like quantize_row, weighted by `importance` (k values; nullptr: exactly quantize_row).
  void (*quantize_row_weighted)(QuantType type, const float* src, const float* importance, void* dst,
                                int64_t k);
  // Whether quantize_row_weighted takes importance for `type`.
  bool (*can_quantize_weighted)(QuantType type);
};

}  // namespace tessera
