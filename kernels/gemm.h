// Matrix products with weights in any QuantType.
#pragma once

#include <cstdint>

#include "common/tensor.h"

namespace tessera {

class ThreadPool;

// y[t, r] = sum_c x[t, c] * W[r, c]  for t < n_tokens, r < W.rows(), c < W.cols().
// W: 2-D TensorView [rows, cols] row-major in any QuantType; x: fp32 [n_tokens, cols];
// y: fp32 [n_tokens, rows], overwritten. fp32 accumulation. `pool` may be null (one thread).
void matmul(const TensorView& w, const float* x, int64_t n_tokens, float* y, ThreadPool* pool);

// Same, writing rows [row_begin, row_end) of W only, to y[t, r - row_begin] with row stride
// `y_stride` (lets a caller compute a vocabulary slice of the LM head).
void matmul_rows(const TensorView& w, int64_t row_begin, int64_t row_end, const float* x,
                 int64_t n_tokens, float* y, int64_t y_stride, ThreadPool* pool);

}  // namespace tessera
