// Run-time instruction-set selection for the CPU kernels (no -march flags: one binary runs on
// any x86-64 or other CPU; the AVX2 / AVX-512 functions carry target attributes and are only
// called when the CPU has the features).
//
// Every kernel family defines one canonical arithmetic that all its ISA paths implement
// exactly (kernels/cpu/qgemm.h, fgemm.h, paged_attention.cpp, activation.cpp), so the level in
// use changes speed, never results. Tests cap the level to cover each path.
#pragma once

#include <cstdint>

namespace tessera::cpu {

// Instruction-set levels of the kernels.
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

}  // namespace tessera::cpu
