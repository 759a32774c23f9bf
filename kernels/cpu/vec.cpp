#include "kernels/cpu/vec.h"

#include <algorithm>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

namespace tessera::cpu {
namespace {

Isa g_max_isa = Isa::kAvx512;

Isa detect_isa() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  // F16C from CPUID leaf 1 (ECX bit 29): clang's __builtin_cpu_supports does not know "f16c".
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  const bool f16c = __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & bit_F16C) != 0;
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c;
  if (!avx2) return Isa::kScalar;
  const bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl") &&
                      __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512vbmi");
  return avx512 ? Isa::kAvx512 : Isa::kAvx2;
#else
  return Isa::kScalar;
#endif
}

}  // namespace

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::kScalar: return "scalar";
    case Isa::kAvx2: return "avx2";
    case Isa::kAvx512: return "avx512";
  }
  return "?";
}

Isa detected_isa() {
  static const Isa kIsa = detect_isa();
  return kIsa;
}

Isa active_isa() { return std::min(detected_isa(), g_max_isa); }

void set_max_isa(Isa isa) { g_max_isa = isa; }

bool has_avx2() { return detected_isa() >= Isa::kAvx2; }

void set_force_scalar(bool force) { g_max_isa = force ? Isa::kScalar : Isa::kAvx512; }

bool simd_enabled() { return active_isa() >= Isa::kAvx2; }

}  // namespace tessera::cpu
