#include "kernels/cpu/cpu_info.h"

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string_view>

#include <fmt/format.h>

#include "kernels/cpu/vec.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

namespace tessera::cpu {
namespace {

// Bytes ahead in an R16 stream on Intel: measured 512..3072 on a Xeon (family 6, AVX-512 + AMX),
// 110M Q6_K decode at 1 / 2 threads: 94 / 212, 102 / 240, 115 / 293, 119 / 337, 115 / 281 tok/s
// (none: 72.4 at 1 thread in the same sweep; 72.9 / 148.9 in a paired run against 114.5 / 245.6
// with 2048).
constexpr size_t kIntelR16Prefetch = 2048;

CpuInfo read_cpu_info() {
  CpuInfo info;
#if defined(__x86_64__) || defined(__i386__)
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid(0, &a, &b, &c, &d) != 0) {
    char v[13] = {};
    std::memcpy(v, &b, 4);
    std::memcpy(v + 4, &d, 4);
    std::memcpy(v + 8, &c, 4);
    info.vendor = v;
  }
  if (__get_cpuid(1, &a, &b, &c, &d) != 0) {
    const int base_family = static_cast<int>((a >> 8) & 0xF), base_model = static_cast<int>((a >> 4) & 0xF);
    info.family = base_family == 0xF ? base_family + static_cast<int>((a >> 20) & 0xFF) : base_family;
    info.model = base_family == 0x6 || base_family == 0xF ? (static_cast<int>((a >> 16) & 0xF) << 4) | base_model
                                                          : base_model;
  }
  unsigned max_ext = 0;
  if (__get_cpuid(0x80000000u, &max_ext, &b, &c, &d) != 0 && max_ext >= 0x80000004u) {
    char brand[49] = {};
    for (unsigned i = 0; i < 3; ++i) {
      unsigned r[4];
      __get_cpuid(0x80000002u + i, &r[0], &r[1], &r[2], &r[3]);
      std::memcpy(brand + 16 * i, r, 16);
    }
    std::string_view s(brand);
    while (!s.empty() && s.front() == ' ') s.remove_prefix(1);
    while (!s.empty() && (s.back() == ' ' || s.back() == '\0')) s.remove_suffix(1);
    info.brand = std::string(s);
  }
#endif
  return info;
}

}  // namespace

KernelTuning choose_kernel_tuning(const CpuInfo& cpu, const char* env) {
  KernelTuning t;
  if (cpu.intel()) {
    t.r16_prefetch_bytes = kIntelR16Prefetch;
    t.float_prefetch_l2 = true;
    t.float_panels_fp32 = true;
    t.source = "Intel default";
  } else {
    t.source = cpu.amd() ? "AMD default" : "default";
  }
  if (env != nullptr && *env != '\0') {
    char* end = nullptr;
    const unsigned long long v = std::strtoull(env, &end, 10);
    if (end == env || *end != '\0' || v > (1ull << 20)) {
      std::fprintf(stderr, "warning: TESSERA_CPU_PREFETCH=%s is not a byte count in [0, 1048576]; using %zu (%s)\n",
                   env, t.r16_prefetch_bytes, t.source.c_str());
    } else {
      t.r16_prefetch_bytes = static_cast<size_t>(v + 63) / 64 * 64;
      t.source = "TESSERA_CPU_PREFETCH";
    }
  }
  return t;
}

void apply_float_overrides(KernelTuning* t, const char* prefetch, const char* panels) {
  const auto apply = [](const char* name, const char* value, const char* yes, const char* no, bool* field) {
    if (value == nullptr || *value == '\0') return;
    if (std::strcmp(value, yes) == 0 || std::strcmp(value, no) == 0) {
      *field = std::strcmp(value, yes) == 0;
    } else {
      std::fprintf(stderr, "warning: %s=%s is not %s or %s; keeping %s\n", name, value, yes, no, *field ? yes : no);
    }
  };
  apply("TESSERA_CPU_FLOAT_PREFETCH", prefetch, "l2", "nta", &t->float_prefetch_l2);
  apply("TESSERA_CPU_FLOAT_PANELS", panels, "fp32", "stored", &t->float_panels_fp32);
}

const CpuInfo& cpu_info() {
  static const CpuInfo kInfo = read_cpu_info();
  return kInfo;
}

namespace {
KernelTuning& tuning_slot() {
  static KernelTuning tuning = [] {
    KernelTuning t = choose_kernel_tuning(cpu_info(), std::getenv("TESSERA_CPU_PREFETCH"));
    apply_float_overrides(&t, std::getenv("TESSERA_CPU_FLOAT_PREFETCH"), std::getenv("TESSERA_CPU_FLOAT_PANELS"));
    return t;
  }();
  return tuning;
}
}  // namespace

const KernelTuning& kernel_tuning() { return tuning_slot(); }

void set_r16_prefetch_bytes(size_t bytes) {
  tuning_slot().r16_prefetch_bytes = (bytes + 63) / 64 * 64;
  tuning_slot().source = "set by the caller";
}

void set_float_variants(bool prefetch_l2, bool panels_fp32) {
  tuning_slot().float_prefetch_l2 = prefetch_l2;
  tuning_slot().float_panels_fp32 = panels_fp32;
}

void set_kernel_tuning(const KernelTuning& tuning) {
  tuning_slot() = tuning;
  tuning_slot().r16_prefetch_bytes = (tuning.r16_prefetch_bytes + 63) / 64 * 64;
}

std::string describe_cpu() {
  const CpuInfo& c = cpu_info();
  const KernelTuning& t = kernel_tuning();
  const std::string prefetch =
      t.r16_prefetch_bytes > 0 ? fmt::format("{} B", t.r16_prefetch_bytes) : std::string("off");
  return fmt::format("{} ({} family {} model {}), isa {}, r16 prefetch {} ({}), float streams prefetch {}, "
                     "float panels {}",
                     c.brand.empty() ? "unknown CPU" : c.brand, c.vendor.empty() ? "?" : c.vendor, c.family, c.model,
                     isa_name(active_isa()), prefetch, t.source, t.float_prefetch_l2 ? "L2" : "non-temporal",
                     t.float_panels_fp32 ? "fp32" : "as stored");
}

}  // namespace tessera::cpu
