// Float-weight matmul: the fp32 kernels (cpu::fmatmul, active ISA) against the bf16 compute
// mode (cpu::convert_acts_bf16 + cpu::fmatmul_bf16), F16 weights, 1 and 2 threads.
// Prints GFLOP/s (2 * rows * k * n_tokens per call); the bf16 time includes converting the
// activations. Each figure is the median of `reps` measurements of at least 30 ms each, by
// process CPU time / threads ("cpu": less sensitive to other jobs taking the cores, though it
// counts the pool's spin-waits) and by wall time.
//
// Usage: build/bin/tessera-bench-fgemm-bf16 [reps] [tokens,...]   (built with TESSERA_BUILD_BENCH;
// tokens default to 1,16,128,512)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <functional>
#include <random>
#include <vector>

#include "common/dtype.h"
#include "common/thread_pool.h"
#include "kernels/cpu/fgemm.h"
#include "kernels/cpu/fgemm_bf16.h"
#include "kernels/cpu/vec.h"

namespace {

using tessera::QuantType;
using tessera::ThreadPool;
namespace cpu = tessera::cpu;

struct Times {
  double wall_s, cpu_s;  // per call; cpu_s: process CPU time / threads
};

double cpu_seconds() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

Times time_per_call(const std::function<void()>& fn, int threads) {
  using Clock = std::chrono::steady_clock;
  fn();  // warm-up
  int64_t calls = 0;
  const auto start = Clock::now();
  const double cpu0 = cpu_seconds();
  double elapsed = 0;
  do {
    fn();
    ++calls;
    elapsed = std::chrono::duration<double>(Clock::now() - start).count();
  } while (elapsed < 0.03);
  const auto n = static_cast<double>(calls);
  return {elapsed / n, (cpu_seconds() - cpu0) / threads / n};
}

// Median GFLOP/s by wall time and by CPU time.
struct Rate {
  double wall, cpu;
};

Rate median_gflops(const std::function<void()>& fn, double flops, int reps, int threads) {
  std::vector<double> wall, cpu;
  for (int i = 0; i < reps; ++i) {
    const Times t = time_per_call(fn, threads);
    wall.push_back(flops / t.wall_s * 1e-9);
    cpu.push_back(flops / t.cpu_s * 1e-9);
  }
  std::sort(wall.begin(), wall.end());
  std::sort(cpu.begin(), cpu.end());
  return {wall[wall.size() / 2], cpu[cpu.size() / 2]};
}

// Rows [0, rows) on one thread (pool == nullptr) or split by 16-row groups over the pool.
void for_rows(ThreadPool* pool, int64_t rows, const std::function<void(int64_t, int64_t)>& fn) {
  if (pool == nullptr) return fn(0, rows);
  pool->parallel_for(rows, cpu::kFRowGroup, [&fn](int64_t b, int64_t e, int) { fn(b, e); });
}

}  // namespace

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::atoi(argv[1]) : 5;
  std::vector<int64_t> token_counts;
  for (const char* p = argc > 2 ? argv[2] : "1,16,128,512"; *p != '\0';) {
    char* end = nullptr;
    const long n = std::strtol(p, &end, 10);
    if (end == p || n <= 0) {
      std::fprintf(stderr, "tokens: expected a comma-separated list of positive counts, got '%s'\n", argv[2]);
      return 2;
    }
    token_counts.push_back(n);
    p = *end == ',' ? end + 1 : end;
  }
  if (!cpu::has_bf16_dot()) {
    std::printf("this CPU has no AVX512_BF16; nothing to compare\n");
    return 1;
  }
  std::printf("fp32 path isa %s; F16 weights; GFLOP/s, median of %d\n", cpu::isa_name(cpu::active_isa()), reps);
  std::printf("%-10s %6s %3s | %8s %8s %7s | %8s %8s %7s\n", "rows x k", "tokens", "thr", "fp32 cpu", "bf16 cpu",
              "speedup", "fp32 wall", "bf16 wall", "speedup");
  ThreadPool pool2(tessera::ThreadPoolOptions{.num_threads = 2});
  const int64_t shapes[][2] = {{768, 768}, {2048, 768}, {768, 2048}, {32000, 768}};
  std::mt19937 rng(1);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  for (const auto& shape : shapes) {
    const int64_t rows = shape[0], k = shape[1];
    std::vector<uint16_t> w(static_cast<size_t>(rows * k));
    for (auto& v : w) v = tessera::f32_to_fp16(0.05f * dist(rng));
    for (int64_t n : token_counts) {
      std::vector<float> x(static_cast<size_t>(n * k)), y(static_cast<size_t>(n * rows));
      for (auto& v : x) v = dist(rng);
      std::vector<uint16_t> xb(cpu::bf16_acts_bytes(n, k) / 2 + 32);
      uint16_t* xb_aligned = xb.data() + ((64 - reinterpret_cast<uintptr_t>(xb.data()) % 64) % 64) / 2;
      cpu::FMatmulArgs a;
      a.type = QuantType::kF16;
      a.w = reinterpret_cast<const uint8_t*>(w.data());
      a.row_bytes = static_cast<size_t>(k) * 2;
      a.k = k;
      a.x = x.data();
      a.n_tokens = n;
      a.y = y.data();
      a.y_stride = rows;
      const double flops = 2.0 * static_cast<double>(rows * k * n);
      for (ThreadPool* pool : {static_cast<ThreadPool*>(nullptr), &pool2}) {
        const int threads = pool == nullptr ? 1 : 2;
        const Rate f32 = median_gflops([&] { for_rows(pool, rows, [&](int64_t b, int64_t e) { cpu::fmatmul(a, b, e); }); },
                                         flops, reps, threads);
        const Rate bf16 = median_gflops(
            [&] {
              if (pool != nullptr && n >= 8) {
                pool->parallel_for(n, 1, [&](int64_t b, int64_t e, int) { cpu::convert_acts_bf16(x.data(), k, b, e, xb_aligned); });
              } else {
                cpu::convert_acts_bf16(x.data(), k, 0, n, xb_aligned);
              }
              for_rows(pool, rows, [&](int64_t b, int64_t e) { cpu::fmatmul_bf16(a, xb_aligned, b, e); });
            },
            flops, reps, threads);
        std::printf("%5ldx%-4ld %6ld %3d | %8.1f %8.1f %6.2fx | %8.1f %8.1f %6.2fx\n", static_cast<long>(rows),
                    static_cast<long>(k), static_cast<long>(n), threads, f32.cpu, bf16.cpu, bf16.cpu / f32.cpu, f32.wall,
                    bf16.wall, bf16.wall / f32.wall);
        std::fflush(stdout);
      }
    }
  }
  return 0;
}
