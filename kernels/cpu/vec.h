// Internal vector primitives of the CPU kernels, with a runtime choice between an AVX2/FMA
// path and a portable scalar one (no -march flags: one binary runs on any x86-64 or other CPU).
//
// Reproducibility contract: on a given machine, dot_f32(dequantize(row), x) and the fused
// row-dot of every format (dot_f16_f32, dot_q8_0_f32, ...) return bit-identical results: they
// accumulate element i into the same lane of the same partial sum and reduce in the same
// order. So a token gives the same matmul output whether it is computed alone (decode, fused
// path) or in a batch (prefill, dequantize-once path).
#pragma once

#include <cstdint>

namespace tessera::cpu {

// Instruction-set levels of the kernels, chosen at run time (never by -march flags).
//   kAvx2:   AVX2 + FMA + F16C (Haswell, Zen 1 and later).
//   kAvx512: AVX-512 F/BW/DQ/VL + VNNI + VBMI (Ice Lake, Sapphire Rapids, Zen 4 and later).
enum class Isa : int { kScalar = 0, kAvx2 = 1, kAvx512 = 2 };

const char* isa_name(Isa isa);

// The best level this CPU (and OS) supports; computed once.
Isa detected_isa();

// The level the kernels use now: min(detected_isa(), the cap set below).
Isa active_isa();

// Caps the level (tests force each path that the CPU supports; benchmarks compare them).
// Not thread-safe with concurrent kernels; call before starting work.
void set_max_isa(Isa isa);

// True when the CPU (and OS) support AVX2, FMA and F16C; computed once.
bool has_avx2();

// Whether the kernels take a SIMD path now (active_isa() >= kAvx2).
bool simd_enabled();

// set_max_isa(kScalar) when force is true, else removes the cap.
void set_force_scalar(bool force);

// sum_i a[i] * b[i], fp32 accumulation in the canonical order.
float dot_f32(const float* a, const float* b, int64_t n);

// out[j] = dot_f32(w, xj, n) for j = 0, 1, 2 (bit-identical), sharing the loads of w.
void dot3_f32(const float* w, const float* x0, const float* x1, const float* x2, int64_t n,
              float* out);

// y[i] += a * x[i].
void axpy_f32(float a, const float* x, float* y, int64_t n);

// Fused dequantize + dot of one weight row with fp32 x (n elements; block formats: n a multiple
// of the block size). Bit-identical to dot_f32 over the dequantized row.
float dot_f16_f32(const void* row, const float* x, int64_t n);
float dot_bf16_f32(const void* row, const float* x, int64_t n);
float dot_q8_0_f32(const void* row, const float* x, int64_t n);

}  // namespace tessera::cpu
