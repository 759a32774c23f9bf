#include "kernels/cpu/kernel_tune.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <random>
#include <sstream>

#include <unistd.h>

#if defined(__x86_64__)
#include <emmintrin.h>
#endif

#include <fmt/format.h>

#include "common/dtype.h"
#include "common/huge_pages.h"
#include "kernels/cpu/qgemm.h"
#include "kernels/cpu/vec.h"

namespace tessera::cpu {
namespace {

// "dram": timed with the matrix evicted from the caches before every pass (earlier versions
// timed it cache-resident, which picked 4 KiB on a Zen 4 where DRAM-sized models run fastest
// with none); lines of the older field are not read, so such a cache is measured again.
constexpr std::string_view kField = "\tr16_prefetch_dram=";

// The candidates measured: none, and 1..4 KiB ahead (the Intel sweep of cpu_info.cpp found its
// best at 2 KiB, within a few percent of 1.5 and 3 KiB).
const std::vector<size_t> kCandidates = {0, 1024, 2048, 4096};

// A measurement matrix past every L2 (8192 x 4096 Q4_K: 18.9 MB), a few passes per candidate,
// each read from DRAM as decode reads a model larger than the caches.
constexpr int64_t kRows = 8192, kCols = 4096;
constexpr int kReps = 5;
constexpr double kMinGain = 0.05;

std::string read_file(const std::string& path) {
  std::ifstream f(path);
  if (!f) return {};
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// Written to a temporary file then renamed: concurrent processes never see half a file.
void write_file(const std::string& path, const std::string& text) {
  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(path).parent_path(), ec);
  const std::string tmp = fmt::format("{}.{}.tmp", path, static_cast<long>(::getpid()));
  {
    std::ofstream f(tmp);
    if (!f) {
      std::fprintf(stderr, "warning: cannot write the CPU tuning cache %s\n", tmp.c_str());
      return;
    }
    f << text;
  }
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    std::fprintf(stderr, "warning: cannot write the CPU tuning cache %s: %s\n", path.c_str(), ec.message().c_str());
    std::filesystem::remove(tmp, ec);
  }
}

// Writes back and drops the lines of [p, p + n) from every cache level, so the next pass streams
// them from memory.
void evict(const uint8_t* p, size_t n) {
#if defined(__x86_64__)
  for (size_t i = 0; i < n; i += 64) _mm_clflush(p + i);
  _mm_mfence();
#else
  (void)p;
  (void)n;
#endif
}

}  // namespace

std::string tuning_cache_key(const CpuInfo& cpu, std::string_view isa) {
  std::string brand = cpu.brand;
  for (char& c : brand)
    if (c == '\t' || c == '\n') c = ' ';
  return fmt::format("{}/{}/{}/{}/{}", cpu.vendor.empty() ? "?" : cpu.vendor, cpu.family, cpu.model, isa, brand);
}

std::string tuning_cache_path() {
  const char* dir = std::getenv("TESSERA_CACHE_DIR");
  if (dir != nullptr && *dir != '\0') return std::string(dir) + "/cpu-tuning.tsv";
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  if (xdg != nullptr && *xdg != '\0') return std::string(xdg) + "/tessera/cpu-tuning.tsv";
  const char* home = std::getenv("HOME");
  if (home != nullptr && *home != '\0') return std::string(home) + "/.cache/tessera/cpu-tuning.tsv";
  return {};
}

std::optional<size_t> cached_r16_prefetch(std::string_view text, std::string_view key) {
  std::optional<size_t> found;
  while (!text.empty()) {
    const size_t nl = text.find('\n');
    const std::string_view line = text.substr(0, nl);
    text = nl == std::string_view::npos ? std::string_view() : text.substr(nl + 1);
    if (line.size() <= key.size() + kField.size() || line.substr(0, key.size()) != key ||
        line.substr(key.size(), kField.size()) != kField)
      continue;
    const std::string value(line.substr(key.size() + kField.size()));
    char* end = nullptr;
    const unsigned long long v = std::strtoull(value.c_str(), &end, 10);
    if (end == value.c_str() || *end != '\0' || v > (1ull << 20) || v % 64 != 0) return std::nullopt;
    found = static_cast<size_t>(v);
  }
  return found;
}

std::string with_cached_r16_prefetch(std::string_view text, std::string_view key, size_t bytes) {
  std::string out;
  while (!text.empty()) {
    const size_t nl = text.find('\n');
    const std::string_view line = text.substr(0, nl);
    text = nl == std::string_view::npos ? std::string_view() : text.substr(nl + 1);
    if (line.empty() || (line.size() > key.size() && line.substr(0, key.size()) == key && line[key.size()] == '\t'))
      continue;
    out.append(line);
    out.push_back('\n');
  }
  out += fmt::format("{}{}{}\n", key, kField, bytes);
  return out;
}

size_t pick_r16_prefetch(const std::vector<PrefetchTiming>& timings, size_t default_bytes, double min_gain) {
  const PrefetchTiming* best = nullptr;
  const PrefetchTiming* def = nullptr;
  for (const PrefetchTiming& t : timings) {
    if (t.seconds <= 0) continue;
    if (best == nullptr || t.seconds < best->seconds) best = &t;
    if (t.bytes == default_bytes) def = &t;
  }
  if (best == nullptr) return default_bytes;
  if (def == nullptr || def->seconds > best->seconds * (1.0 + min_gain)) return best->bytes;
  return default_bytes;
}

std::vector<PrefetchTiming> time_r16_prefetch(const std::vector<size_t>& candidates, int64_t rows, int64_t k,
                                              int reps) {
  std::vector<PrefetchTiming> out;
  const Isa isa = active_isa();
  if (isa == Isa::kScalar || rows <= 0 || rows % kQRowGroup != 0 || k <= 0 || k % 256 != 0) return out;
  // Random Q4_K blocks with finite scales (d, dmin = 2^-10), re-laid in 16-row groups.
  const size_t rb = row_bytes(QuantType::kQ4_K, k);
  // w on huge pages as the model's re-laid weights are (common/huge_pages.h).
  std::vector<uint8_t> file(static_cast<size_t>(rows) * rb);
  WeightBytes w(file.size());
  std::mt19937 rng(7);
  for (size_t i = 0; i < file.size(); i += 4) {
    const uint32_t v = rng();
    std::memcpy(&file[i], &v, std::min<size_t>(4, file.size() - i));
  }
  for (size_t b = 0; b < file.size(); b += 144) {
    const uint16_t h = 0x1400;
    std::memcpy(&file[b], &h, 2);
    std::memcpy(&file[b + 2], &h, 2);
  }
  repack_r16(QuantType::kQ4_K, file.data(), rows, k, w.data());
  std::vector<float> x(static_cast<size_t>(k)), y(static_cast<size_t>(rows));
  std::normal_distribution<float> dist;
  for (float& v : x) v = dist(rng);
  std::vector<uint8_t> scratch(acts_bytes(1, k, kActBlock256) + 64);
  void* base = scratch.data() + (64 - reinterpret_cast<uintptr_t>(scratch.data()) % 64) % 64;
  QMatmulArgs a;
  a.type = QuantType::kQ4_K_R16;
  a.w = w.data();
  a.row_bytes = rb;
  a.k = k;
  a.acts = acts_view(base, 1, k, kActBlock256);
  a.n_tokens = 1;
  a.y = y.data();
  a.y_stride = rows;
  quantize_acts(x.data(), 0, 1, a.acts);
  auto pass = [&] {
    if (isa == Isa::kAvx512)
      qmatmul_avx512(a, 0, rows);
    else
      qmatmul_avx2(a, 0, rows);
  };
  const KernelTuning saved = kernel_tuning();
  for (size_t c : candidates) out.push_back({c, 0.0});
  pass();  // warm-up: pages, scratch
  for (int r = 0; r < reps; ++r) {
    for (PrefetchTiming& t : out) {
      set_r16_prefetch_bytes(t.bytes);
      evict(w.data(), w.size());
      const auto t0 = std::chrono::steady_clock::now();
      pass();
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (t.seconds == 0 || s < t.seconds) t.seconds = s;
    }
  }
  set_kernel_tuning(saved);
  return out;
}

void tune_kernels() {
  static std::once_flag once;
  std::call_once(once, [] {
    const char* pf = std::getenv("TESSERA_CPU_PREFETCH");
    if (pf != nullptr && *pf != '\0') return;  // the override stands (kernel_tuning())
    const char* mode_env = std::getenv("TESSERA_CPU_TUNE");
    const std::string mode = mode_env != nullptr && *mode_env != '\0' ? mode_env : "cached";
    if (mode == "off" || mode == "0") return;
    if (mode != "cached" && mode != "measure") {
      std::fprintf(stderr, "warning: TESSERA_CPU_TUNE=%s is not cached, measure or off; using cached\n",
                   mode.c_str());
    }
    if (active_isa() == Isa::kScalar) return;
    const std::string key = tuning_cache_key(cpu_info(), isa_name(active_isa()));
    const std::string path = tuning_cache_path();
    const std::string text = path.empty() ? std::string() : read_file(path);
    const KernelTuning def = kernel_tuning();
    if (mode != "measure") {
      if (const std::optional<size_t> v = cached_r16_prefetch(text, key)) {
        KernelTuning t = def;
        t.r16_prefetch_bytes = *v;
        t.source = fmt::format("measured here, cached in {}", path);
        set_kernel_tuning(t);
        return;
      }
    }
    const std::vector<PrefetchTiming> t = time_r16_prefetch(kCandidates, kRows, kCols, kReps);
    if (t.empty()) return;
    const size_t pick = pick_r16_prefetch(t, def.r16_prefetch_bytes, kMinGain);
    std::string detail;
    for (const PrefetchTiming& p : t) detail += fmt::format("{}{} B {:.2f} ms", detail.empty() ? "" : ", ", p.bytes, p.seconds * 1e3);
    KernelTuning picked = def;
    picked.r16_prefetch_bytes = pick;
    picked.source = pick == def.r16_prefetch_bytes ? fmt::format("{}, kept by a measurement here: {}", def.source, detail)
                                                   : fmt::format("measured here: {}", detail);
    set_kernel_tuning(picked);
    if (!path.empty()) write_file(path, with_cached_r16_prefetch(text, key, pick));
  });
}

}  // namespace tessera::cpu
