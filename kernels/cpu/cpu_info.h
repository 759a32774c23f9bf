// What the CPU kernels know of the processor they run on, and the per-CPU choices made from it
// (kernels/cpu/vec.h picks the instruction set; this picks the variants within it).
//
// Kernel variants never change results (every path computes the same bits, kernels/cpu/
// qgemm.h); they change speed, and what is fastest differs between CPUs of the same ISA:
//   R16 prefetch: the 16-row interleaved matrices (qgemm.h) are read as one contiguous stream.
//     On AMD Zen 4 the hardware prefetchers keep ahead of it and software prefetches on top cost
//     10-40% of batch-1 decode; on Intel Xeons (Sapphire / Granite Rapids class) the L2
//     streamer stops at every 4 KiB page and one core keeps too few misses in flight: a
//     prefetch (to L1) 2 KiB ahead of the read position doubles Q4_K_M decode
//     (bench/results/cpu_vs_llama_cpp_intel.md).
//   Float-weight streams (F32 / F16 / BF16 weights read once per matmul, kernels/cpu/fgemm.h):
//     the rows ahead are prefetched non-temporally on AMD (+40% batch-1 decode on Zen 5) and
//     into L2 on Intel, where the non-temporal hint made an Emerald Rapids Xeon decode at 37% of
//     the speed (bench/results/fgemm-intel-variants.md).
//   Float panels: the blocked GEMM keeps F16 / BF16 weights 16-bit in its panels and widens
//     them in the inner loop on AMD, where the conversion issues beside the fma; on Intel it
//     takes an fma port, so the panels are widened to fp32 once when packed.
// The defaults come from the CPU's vendor; a measurement on the machine may replace them
// (kernels/cpu/kernel_tune.h, cached per CPU); TESSERA_CPU_PREFETCH=<bytes> (0: none) overrides.
#pragma once

#include <cstddef>
#include <string>

namespace tessera::cpu {

struct CpuInfo {
  std::string vendor;  // CPUID vendor string: GenuineIntel, AuthenticAMD, ...; "" off x86
  std::string brand;   // the model name (CPUID brand string)
  int family = 0;      // display family and model, as /proc/cpuinfo prints them
  int model = 0;
  bool intel() const { return vendor == "GenuineIntel"; }
  bool amd() const { return vendor == "AuthenticAMD" || vendor == "HygonGenuine"; }
};

// Read once (CPUID).
const CpuInfo& cpu_info();

struct KernelTuning {
  // Bytes ahead of the read position that decode prefetches (into L1) in an R16 matrix; 0: none.
  size_t r16_prefetch_bytes = 0;
  // Float-weight streams prefetch the rows ahead into L2 (true) or non-temporally (false).
  bool float_prefetch_l2 = false;
  // The blocked float GEMM widens F16 / BF16 panels to fp32 when packing them.
  bool float_panels_fp32 = false;
  std::string source;  // why: "Intel default", "AMD default", "TESSERA_CPU_PREFETCH", ...
};

// The choice for `cpu` given TESSERA_CPU_PREFETCH's value `env` (nullptr: unset): the vendor's
// default, or env's byte count rounded up to a cache line.
KernelTuning choose_kernel_tuning(const CpuInfo& cpu, const char* env);

// TESSERA_CPU_FLOAT_PREFETCH (l2 | nta) and TESSERA_CPU_FLOAT_PANELS (fp32 | stored), values
// `prefetch` and `panels` (nullptr or "": unset), over t's float-weight variants; a malformed
// value is reported on stderr and ignored.
void apply_float_overrides(KernelTuning* t, const char* prefetch, const char* panels);

// choose_kernel_tuning(cpu_info(), getenv("TESSERA_CPU_PREFETCH")) with apply_float_overrides, once;
// a malformed TESSERA_CPU_PREFETCH is reported on stderr and ignored (the default is kept).
const KernelTuning& kernel_tuning();

// Replaces the R16 prefetch distance (tests cover both variants on any CPU; benchmarks compare
// them). Not thread-safe with concurrent kernels; call before starting work, as set_max_isa.
void set_r16_prefetch_bytes(size_t bytes);
// Replaces the float-weight variants (same use and caveat).
void set_float_variants(bool prefetch_l2, bool panels_fp32);
// Replaces the whole choice (kernels/cpu/kernel_tune.h: a measured or cached one), same caveat.
void set_kernel_tuning(const KernelTuning& tuning);

// One line for start-up logs and benchmark tables: model name, vendor, family / model, the
// active ISA and the tuning, e.g. "Intel(R) Xeon(R) ... (GenuineIntel family 6 model 143),
// isa avx512, r16 prefetch 2048 B (Intel default)".
std::string describe_cpu();

}  // namespace tessera::cpu
