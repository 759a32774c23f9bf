// Float-weight matmul in the opt-in "bf16" compute mode: weights (F16, BF16, F32) and fp32
// activations are rounded to bf16 and multiplied with VDPBF16PS (AVX512_BF16), two
// multiply-adds per fp32 lane and instruction, twice the rate of the fp32 fma kernels of
// fgemm.h. Accuracy is that of bf16 inputs (8 significant bits) with fp32 accumulation.
//
// Canonical arithmetic (the AVX-512 path and fmatmul_bf16_reference give the same bits):
//   - rounding to bf16 (round_to_bf16, the rule of VCVTNE2PS2BF16): NaN -> its top 16 bits
//     with the quiet bit set; zero and fp32 denormals -> zero of the same sign; anything else
//     round to nearest even (values past the largest bf16 become infinity).
//   - weights: F16 -> fp32 (exact) -> round_to_bf16; BF16 as stored; F32 -> round_to_bf16.
//     Activations -> round_to_bf16. Both are zero-padded to kpad, a multiple of 32.
//   - element pair (2i, 2i+1) goes to fp32 partial sum s[i % 16] (s starts at +0) through one
//     VDPBF16PS step, for i = 0, 1, ..., kpad/2 - 1 in increasing order. One step, as Intel's
//     SDM pseudo-code states it (each line an fp32 fma, round to nearest even, inputs that are
//     denormal read as zero, denormal results flushed to zero of the same sign, MXCSR ignored):
//       s = fma(w[2i+1], x[2i+1], s);  s = fma(w[2i], x[2i], s);
//     (products of two bf16 values are exact in fp32 unless they under- or overflow.)
//   - the 16 partial sums are reduced as fgemm.h does (reduce16, plain fp32 adds under the
//     default MXCSR): t_i = s_i + s_(i+8), u_i = t_i + t_(i+4), v_i = u_i + u_(i+2), v_0 + v_1.
// Each output has its own accumulation chain in that order, so results are bit-identical for
// any row split between threads and for a token alone or anywhere in a batch. Zen 4's
// VDPBF16PS matches this pseudo-code bit for bit (tests/kernels/fgemm_bf16_test.cpp checks it,
// denormal and overflow ranges included).
//
// Paths (fgemm_bf16.cpp): 1..64 tokens stream the weight rows 4 at a time and round them in
// registers; more tokens run a blocked GEMM over bf16 panels of the weights (4 rows x 6 tokens
// register tiles). Without AVX512_BF16, fmatmul_bf16 runs the scalar reference (same bits, slow).
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/cpu/fgemm.h"

namespace tessera::cpu {

// Columns of one VDPBF16PS step (16 fp32 lanes x 2); rows of converted data are padded to it.
constexpr int64_t kBf16StepCols = 32;

inline int64_t bf16_kpad(int64_t k) { return (k + kBf16StepCols - 1) / kBf16StepCols * kBf16StepCols; }

// True when the CPU has AVX512F, BW, DQ, VL and AVX512_BF16 (CPUID leaf 7 subleaf 1, EAX bit 5)
// and the OS saves zmm state (XCR0); false off x86. Computed once. Independent of set_max_isa().
bool has_bf16_dot();

// The multiply-add rate of VDPBF16PS over that of the fp32 fma (zmm), measured once per
// process with register-only loops (about 1 ms; the best of 5 alternating passes each); 0
// without AVX512_BF16. About 2 on Zen 4 / 5 (one VDPBF16PS of 32 products per cycle, as many
// cycles as one fma of 16); 0.5 on Intel Xeons of the Sapphire / Emerald Rapids class (one
// VDPBF16PS every second cycle against two fma per cycle).
double bf16_dot_speedup();
// The matmul precision "auto" takes bf16 where the dot product pays: bf16_dot_speedup() >= 1.5.
constexpr double kBf16DotMinSpeedup = 1.5;
bool bf16_dot_pays();

// The canonical fp32 -> bf16 rounding above (bits of a bf16 value).
uint16_t round_to_bf16(float f);

// Bytes that convert_acts_bf16 writes for n_tokens x k activations: n_tokens rows of
// bf16_kpad(k) bf16 values.
size_t bf16_acts_bytes(int64_t n_tokens, int64_t k);

// Activations x[n_tokens][k] (fp32) -> dst[t][kpad] (bf16, round_to_bf16, zeros in
// [k, kpad)), for tokens [t0, t1) only (callers may split tokens over threads). dst is the
// start of the whole buffer (row t at dst + t * kpad); 64-byte alignment is faster, not needed.
void convert_acts_bf16(const float* x, int64_t k, int64_t t0, int64_t t1, uint16_t* dst);

// y[t * a.y_stride + r] for rows [r0, r1) of the weight and every token t < a.n_tokens
// (a.type F32, F16 or BF16; a.x is not read). xb: the activations converted by
// convert_acts_bf16 (all a.n_tokens rows, row stride bf16_kpad(a.k)). Thread-safe for
// disjoint row ranges; uses per-thread scratch that persists between calls.
void fmatmul_bf16(const FMatmulArgs& a, const uint16_t* xb, int64_t r0, int64_t r1);

// The canonical arithmetic in scalar C++ (for tests; about 100x slower).
void fmatmul_bf16_reference(const FMatmulArgs& a, const uint16_t* xb, int64_t r0, int64_t r1);

}  // namespace tessera::cpu
