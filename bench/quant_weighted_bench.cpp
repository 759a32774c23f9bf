// tessera-bench-quant-weighted: the time of quantize_row_weighted (importance-weighted
// encoders) against quantize_row (round to nearest) per 256 elements, for every format with a
// weighted encoder (thread CPU time), on N(0, 0.02) rows with log-normal importance; one thread. Also the time a
// model of --params linear weights would take at load on --threads threads (linear estimate).
// Results: bench/results/quant_weighted.md.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <random>
#include <vector>

#include "kernels/quant.h"

namespace {

// CPU time of this thread: the work itself, also on a machine shared with other jobs.
double thread_seconds() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

}  // namespace

int main(int argc, char** argv) {
  using namespace tessera;
  double params = 170e6;  // Gemma-3-270M's linear weights
  int threads = 2;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--params") == 0) params = std::atof(argv[i + 1]);
    else if (std::strcmp(argv[i], "--threads") == 0) threads = std::atoi(argv[i + 1]);
  }
  constexpr int64_t kRow = 2048, kRows = 64;
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  std::lognormal_distribution<float> lognormal(0.0f, 1.5f);
  std::vector<float> x(kRow * kRows), imp(kRow);
  for (float& v : x) v = normal(rng);
  for (float& v : imp) v = lognormal(rng);
  const QuantType types[] = {QuantType::kQ8_0, QuantType::kQ4_0, QuantType::kQ5_0, QuantType::kQ4_K,
                             QuantType::kQ5_K, QuantType::kQ6_K, QuantType::kQ2_K, QuantType::kQ3_K,
                             QuantType::kTQ1_0, QuantType::kTQ2_0};
  std::printf("| type | RTN us/256 | weighted us/256 | x | weighted load of %.0fM weights on %d threads, s |\n",
              params / 1e6, threads);
  std::printf("|---|---|---|---|---|\n");
  for (QuantType t : types) {
    std::vector<uint8_t> out(row_bytes(t, kRow));
    double us[2];
    for (int weighted = 0; weighted < 2; ++weighted) {
      double best = 1e30;
      for (int rep = 0; rep < 3; ++rep) {
        const double t0 = thread_seconds();
        for (int64_t r = 0; r < kRows; ++r) {
          if (weighted)
            quantize_row_weighted(t, x.data() + r * kRow, imp.data(), out.data(), kRow);
          else
            quantize_row(t, x.data() + r * kRow, out.data(), kRow);
        }
        best = std::min(best, thread_seconds() - t0);
      }
      us[weighted] = best * 1e6 / (static_cast<double>(kRow * kRows) / 256);
    }
    std::printf("| %s | %.2f | %.2f | %.1f | %.1f |\n", quant_name(t).data(), us[0], us[1], us[1] / us[0],
                us[1] * 1e-6 * params / 256 / threads);
  }
  return 0;
}
