// Matrix products with weights in any QuantType.
#pragma once

#include <cstdint>
#include <string>

#include "common/shard_options.h"
#include "common/status.h"
#include "common/tensor.h"

namespace tessera {

class ThreadPool;

// How matmuls with float weights (F32, F16, BF16) compute: MatmulPrecision (common/
// shard_options.h says what each mode does); process-wide (set it before the first matmul, as
// set_max_isa). Block-quantized weights are unaffected (integer dot products). Every mode is
// bit-identical across thread counts and batch compositions (each output's accumulation order
// is fixed), so a token alone and in a batch get the same logits.
// The mode; kBf16 on a CPU without AVX512_BF16 is an error (InvalidArgument naming the CPU).
Status set_matmul_precision(MatmulPrecision p);
MatmulPrecision matmul_precision();
// What weights of `type` compute with under the current mode: "bf16" or "fp32" (float types),
// "int8-dot" (block formats), for logs and /metrics.
const char* matmul_compute_for(QuantType type);

// Sets the matmul precision for a scope and restores the previous one after it (eval's models
// take turns; tests that compare float matmuls against the fp32 reference pin kFp32).
// An unsupported mode (kBf16 without AVX512_BF16) leaves the current one.
class MatmulPrecisionScope {
 public:
  explicit MatmulPrecisionScope(MatmulPrecision p) : saved_(matmul_precision()) { (void)set_matmul_precision(p); }
  ~MatmulPrecisionScope() { (void)set_matmul_precision(saved_); }
  MatmulPrecisionScope(const MatmulPrecisionScope&) = delete;
  MatmulPrecisionScope& operator=(const MatmulPrecisionScope&) = delete;

 private:
  MatmulPrecision saved_;
};

// y[t, r] = sum_c x[t, c] * W[r, c]  for t < n_tokens, r < W.rows(), c < W.cols().
// W: 2-D TensorView [rows, cols] row-major in any QuantType; x: fp32 [n_tokens, cols];
// y: fp32 [n_tokens, rows], overwritten. fp32 accumulation. `pool` may be null (one thread).
void matmul(const TensorView& w, const float* x, int64_t n_tokens, float* y, ThreadPool* pool);

// Same, writing rows [row_begin, row_end) of W only, to y[t, r - row_begin] with row stride
// `y_stride` (lets a caller compute a vocabulary slice of the LM head).
void matmul_rows(const TensorView& w, int64_t row_begin, int64_t row_end, const float* x,
                 int64_t n_tokens, float* y, int64_t y_stride, ThreadPool* pool);

}  // namespace tessera
