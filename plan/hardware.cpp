#include "plan/hardware.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <memory>
#include <vector>

#include "common/strings.h"
#include "common/thread_pool.h"

namespace tessera {
namespace {

constexpr uint64_t kMiB = 1ull << 20;
constexpr uint64_t kGiB = 1ull << 30;

// Nominal figures from the vendors' datasheets. Memory is the capacity nvidia-smi reports (what
// cudaMemGetInfo sees before the context). Launch costs are typical host-side costs of
// cudaLaunchKernel and of a kernel node inside a CUDA graph; hop latencies are one ring step of
// an NCCL-style all-reduce with the low-latency protocol. They are estimates, said so in the bill.
LinkSpec nvlink3() { return {"NVLink 3 (600 GB/s total, 300 GB/s per direction)", 300e9, 2e-6}; }
LinkSpec nvlink4() { return {"NVLink 4 (900 GB/s total, 450 GB/s per direction)", 450e9, 2e-6}; }
LinkSpec pcie4() { return {"PCIe 4.0 x16 (32 GB/s per direction)", 32e9, 5e-6}; }
LinkSpec pcie5() { return {"PCIe 5.0 x16 (64 GB/s per direction)", 64e9, 5e-6}; }

CardSpec gpu(std::string name, std::string description, uint64_t memory, double bandwidth, double peak,
             LinkSpec fast, LinkSpec slow) {
  CardSpec c;
  c.name = std::move(name);
  c.description = std::move(description);
  c.memory_bytes = memory;
  c.runtime_reserve_bytes = kGiB;
  c.memory_bandwidth = bandwidth;
  c.peak_flops = peak;
  c.activation_bytes = 2;
  c.launch_s = 5e-6;
  c.graph_node_s = 1e-6;
  c.graph_launch_s = 10e-6;
  c.fast_link = std::move(fast);
  c.slow_link = std::move(slow);
  c.source = "datasheet";
  return c;
}

std::vector<CardSpec> presets() {
  return {
      gpu("A100-40GB", "NVIDIA A100 SXM4 40GB (HBM2, 1555 GB/s, 312 TFLOPS FP16 dense)", 40960 * kMiB, 1555e9,
          312e12, nvlink3(), pcie4()),
      gpu("A100-80GB", "NVIDIA A100 SXM4 80GB (HBM2e, 2039 GB/s, 312 TFLOPS FP16 dense)", 81920 * kMiB, 2039e9,
          312e12, nvlink3(), pcie4()),
      gpu("H100-80GB", "NVIDIA H100 SXM5 80GB (HBM3, 3350 GB/s, 989 TFLOPS FP16 dense)", 81559 * kMiB, 3350e9,
          989e12, nvlink4(), pcie5()),
      gpu("H200-141GB", "NVIDIA H200 SXM 141GB (HBM3e, 4800 GB/s, 989 TFLOPS FP16 dense)", 143771 * kMiB, 4800e9,
          989e12, nvlink4(), pcie5()),
  };
}

// The largest cache level of cpu0 from sysfs ("32768K"); sysconf as a fallback. In a VM sysconf
// may report the host's whole L3 rather than the slice this CPU shares, so sysfs comes first.
uint64_t last_level_cache_bytes() {
  uint64_t best = 0;
  for (int index = 0; index < 8; ++index) {
    std::ifstream in(fmt::format("/sys/devices/system/cpu/cpu0/cache/index{}/size", index));
    std::string text;
    if (!(in >> text) || text.empty()) continue;
    char* end = nullptr;
    uint64_t v = std::strtoull(text.c_str(), &end, 10);
    if (end && (*end == 'K' || *end == 'k')) v <<= 10;
    if (end && (*end == 'M' || *end == 'm')) v <<= 20;
    best = std::max(best, v);
  }
  if (best == 0) {
    long v = ::sysconf(_SC_LEVEL3_CACHE_SIZE);
    if (v > 0) best = static_cast<uint64_t>(v);
  }
  return best;
}

// Sums 64-bit words with four 32-byte vector accumulators: enough independent loads in flight
// that one core is limited by memory, not by the loop.
using U64x4 = uint64_t __attribute__((vector_size(32)));

#define TESSERA_SUM_WORDS_BODY                                         \
  U64x4 a{}, b{}, c{}, d{};                                            \
  int64_t i = 0;                                                       \
  for (; i + 16 <= n; i += 16) {                                       \
    U64x4 x, y, z, w;                                                  \
    std::memcpy(&x, p + i, 32);                                        \
    std::memcpy(&y, p + i + 4, 32);                                    \
    std::memcpy(&z, p + i + 8, 32);                                    \
    std::memcpy(&w, p + i + 12, 32);                                   \
    a += x;                                                            \
    b += y;                                                            \
    c += z;                                                            \
    d += w;                                                            \
  }                                                                    \
  U64x4 s = a + b + c + d;                                             \
  uint64_t total = s[0] + s[1] + s[2] + s[3];                          \
  for (; i < n; ++i) total += p[i];                                    \
  return total;

__attribute__((target("avx2"))) uint64_t sum_words_avx2(const uint64_t* p, int64_t n) { TESSERA_SUM_WORDS_BODY }
uint64_t sum_words_generic(const uint64_t* p, int64_t n) { TESSERA_SUM_WORDS_BODY }
#undef TESSERA_SUM_WORDS_BODY

// FP32 multiply-adds on eight independent 8-wide accumulators (enough to cover FMA latency).
using F32x8 = float __attribute__((vector_size(32)));

#define TESSERA_FMA_BODY                                                              \
  F32x8 acc[8];                                                                       \
  for (int k = 0; k < 8; ++k) acc[k] = F32x8{} + seed * static_cast<float>(k + 1);    \
  const F32x8 m = F32x8{} + 0.999999f, add = F32x8{} + 1e-7f;                          \
  for (int64_t it = 0; it < iters; ++it)                                              \
    for (int k = 0; k < 8; ++k) acc[k] = acc[k] * m + add;                            \
  float out = 0;                                                                      \
  for (int k = 0; k < 8; ++k)                                                         \
    for (int j = 0; j < 8; ++j) out += acc[k][j];                                     \
  return out;

__attribute__((target("avx2,fma"))) float fma_loop_avx2(int64_t iters, float seed) { TESSERA_FMA_BODY }
float fma_loop_generic(int64_t iters, float seed) { TESSERA_FMA_BODY }
#undef TESSERA_FMA_BODY

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};

}  // namespace

std::vector<std::string> card_preset_names() {
  std::vector<std::string> names;
  for (const CardSpec& c : presets()) names.push_back(c.name);
  return names;
}

Result<CardSpec> card_preset(std::string_view name) {
  std::string key = ascii_lower(name);
  if (key == "a100") key = "a100-80gb";
  if (key == "h100") key = "h100-80gb";
  if (key == "h200") key = "h200-141gb";
  if (key.size() > 1 && key.back() == 'g') key += 'b';  // "a100-40g" -> "a100-40gb"
  for (CardSpec& c : presets())
    if (ascii_lower(c.name) == key) return std::move(c);
  std::string choices;
  for (const std::string& n : card_preset_names()) choices += n + ", ";
  return Status::not_found(fmt::format("unknown card '{}': choose one of {}cpu", name, choices));
}

Result<CpuProbe> probe_local_cpu(const CpuProbeOptions& options) {
  const auto t_start = std::chrono::steady_clock::now();
  CpuProbe probe;
  ThreadPool pool(ThreadPoolOptions{.num_threads = options.threads});
  probe.threads = pool.size();
  probe.llc_bytes = last_level_cache_bytes();
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGE_SIZE);
  probe.memory_bytes = pages > 0 && page > 0 ? static_cast<uint64_t>(pages) * static_cast<uint64_t>(page) : 0;

  uint64_t bytes = options.buffer_bytes;
  if (bytes == 0) bytes = std::clamp<uint64_t>(8 * probe.llc_bytes, 256 * kMiB, 2 * kGiB);
  bytes = std::max<uint64_t>(bytes, kMiB) / 4096 * 4096;
  probe.buffer_bytes = bytes;
  std::unique_ptr<uint64_t, FreeDeleter> buffer(static_cast<uint64_t*>(std::aligned_alloc(4096, bytes)));
  if (!buffer)
    return Status::resource_exhausted(
        fmt::format("bandwidth probe: cannot allocate a {} MiB buffer", bytes / kMiB));
  uint64_t* words = buffer.get();
  const auto n_words = static_cast<int64_t>(bytes / 8);
  const int64_t grain = 4096;
  // Each thread first-touches the part it will read, so its pages sit on its NUMA node.
  pool.parallel_for(n_words, grain, [&](int64_t b, int64_t e, int) {
    for (int64_t i = b; i < e; ++i) words[i] = static_cast<uint64_t>(i);
  });

  const bool avx2 = __builtin_cpu_supports("avx2");
  const bool fma = avx2 && __builtin_cpu_supports("fma");
  std::atomic<uint64_t> sink{0};
  double best = std::numeric_limits<double>::infinity();
  for (int pass = 0; pass < std::max(1, options.passes); ++pass) {
    const auto t0 = std::chrono::steady_clock::now();
    pool.parallel_for(n_words, grain, [&](int64_t b, int64_t e, int) {
      const uint64_t s = avx2 ? sum_words_avx2(words + b, e - b) : sum_words_generic(words + b, e - b);
      sink.fetch_add(s, std::memory_order_relaxed);
    });
    best = std::min(best, seconds_since(t0));
  }
  probe.read_bandwidth = static_cast<double>(bytes) / best;
  buffer.reset();

  // FMA throughput: each thread times its own loop (8 accumulators x 8 lanes x 2 FLOP per
  // iteration) and keeps its best of three; the rates add up. Timing each thread alone keeps a
  // thread that the OS parked for a moment from counting against the others.
  const int64_t iters = 1'000'000;
  std::vector<double> best_rate(static_cast<size_t>(probe.threads), 0.0);
  std::atomic<uint64_t> fsink{0};
  for (int pass = 0; pass < 3; ++pass) {
    pool.parallel_for(probe.threads, 1, [&](int64_t b, int64_t e, int) {
      for (int64_t t = b; t < e; ++t) {
        const auto t0 = std::chrono::steady_clock::now();
        const float r = fma ? fma_loop_avx2(iters, 1.0f + static_cast<float>(t))
                            : fma_loop_generic(iters, 1.0f + static_cast<float>(t));
        const double rate = static_cast<double>(iters) * 8 * 8 * 2 / seconds_since(t0);
        fsink.fetch_add(static_cast<uint64_t>(r), std::memory_order_relaxed);
        best_rate[static_cast<size_t>(t)] = std::max(best_rate[static_cast<size_t>(t)], rate);
      }
    });
  }
  for (double r : best_rate) probe.fma_flops += r;

  // Dispatch: the CPU backend's "kernel launch" is one parallel_for on a warm pool. The best of
  // 50 rounds of 20 calls, so a round in which another process held a core does not count.
  std::atomic<int64_t> counter{0};
  auto trivial = [&](int64_t b, int64_t e, int) { counter += e - b; };
  for (int i = 0; i < 100; ++i) pool.parallel_for(probe.threads, 1, trivial);
  double best_round = std::numeric_limits<double>::infinity();
  for (int round = 0; round < 50; ++round) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < 20; ++i) pool.parallel_for(probe.threads, 1, trivial);
    best_round = std::min(best_round, seconds_since(t0) / 20);
  }
  probe.dispatch_s = best_round;
  probe.seconds = seconds_since(t_start);
  return probe;
}

CardSpec cpu_card(const CpuProbe& p) {
  CardSpec c;
  c.name = "cpu";
  c.description = fmt::format("this machine's CPU, {} threads (last-level cache {} MiB)", p.threads,
                              p.llc_bytes / kMiB);
  c.is_cpu = true;
  c.memory_bytes = p.memory_bytes;
  c.runtime_reserve_bytes = 0;
  c.memory_bandwidth = p.read_bandwidth;
  c.peak_flops = p.fma_flops;
  c.activation_bytes = 4;  // the CPU forward pass keeps activations, norms and KV in fp32
  c.launch_s = p.dispatch_s;
  c.graph_node_s = 0;
  c.graph_launch_s = 0;
  // Ranks on one host exchange through shared memory: a copy reads and writes each byte, so
  // half the read bandwidth; a hop is a thread hand-off (a few microseconds).
  c.fast_link = {"host memory (half the measured read bandwidth)", p.read_bandwidth / 2, 5e-6};
  c.slow_link = c.fast_link;
  c.source = fmt::format("measured: read {:.1f} GB/s over a {} MiB buffer, FP32 FMA {:.1f} GFLOP/s, "
                         "parallel_for {:.2f} us, {} threads",
                         p.read_bandwidth / 1e9, p.buffer_bytes / kMiB, p.fma_flops / 1e9, p.dispatch_s * 1e6,
                         p.threads);
  return c;
}

}  // namespace tessera
