// Matrix products with weights in any QuantType.
#pragma once

#include <cstdint>
#include <string>

#include "common/status.h"
#include "common/tensor.h"

namespace tessera {

class ThreadPool;

// How matmuls with float weights (F32, F16, BF16) compute; process-wide (set it before the first
// matmul, as set_max_isa). Block-quantized weights are unaffected (integer dot products).
//   kFp32: fp32 fma on the widened weights (kernels/cpu/fgemm.h): fp32-accurate.
//   kBf16: weights and activations rounded to bf16, VDPBF16PS with fp32 accumulation
//          (kernels/cpu/fgemm_bf16.h): twice the multiply-adds per instruction; needs
//          AVX512_BF16 (Zen 4/5, Intel Cooper Lake and later).
//   kAuto: kBf16 for 16-bit weights (F16, BF16) where the CPU's bf16 dot product outruns its
//          fp32 fma (cpu::bf16_dot_pays(), measured at start-up: Zen 4/5), else kFp32 (also on
//          Intel Xeons with AVX512_BF16, where VDPBF16PS has half the fma's rate).
// Every mode is bit-identical across thread counts and batch compositions (each output's
// accumulation order is fixed), so a token alone and in a batch get the same logits.
enum class MatmulPrecision { kAuto, kFp32, kBf16 };

// "auto", "fp32", "bf16".
const char* matmul_precision_name(MatmulPrecision p);
// Parses a name; false for anything else.
bool parse_matmul_precision(const std::string& text, MatmulPrecision* out);
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
