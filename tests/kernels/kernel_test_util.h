// Helpers shared by the CPU kernel tests: seeded data, the ISA paths this CPU has, and the
// check that every ISA path, thread count and batch composition gives the same bits.
#pragma once

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/thread_pool.h"
#include "kernels/cpu/vec.h"

namespace tessera::test {

inline std::vector<float> gaussian(int64_t n, uint32_t seed, float sigma = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, sigma);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = dist(rng);
  return v;
}

// Scalar, then AVX2 and AVX-512 when this CPU has them.
inline std::vector<cpu::Isa> supported_isas() {
  std::vector<cpu::Isa> out = {cpu::Isa::kScalar};
  if (cpu::detected_isa() >= cpu::Isa::kAvx2) out.push_back(cpu::Isa::kAvx2);
  if (cpu::detected_isa() >= cpu::Isa::kAvx512) out.push_back(cpu::Isa::kAvx512);
  return out;
}

// Restores the ISA cap when a test ends, whatever happened.
struct IsaGuard {
  ~IsaGuard() { cpu::set_max_isa(cpu::Isa::kAvx512); }
};

inline bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// For a matmul of `rows` outputs over `k` inputs and `n_tokens` tokens of x: on every ISA path,
// 1 and 3 threads and no pool give the same bits, every path equals the first (scalar) one,
// the first passes `check_reference(y)`, and each token alone (the decode path) equals its row
// of the batch. `run(x, n_tokens, pool)` returns n_tokens x rows outputs.
template <class Run, class CheckReference>
void expect_same_bits_everywhere(const Run& run, const CheckReference& check_reference, const std::vector<float>& x,
                                 int64_t rows, int64_t k, int64_t n_tokens, const std::string& what) {
  ThreadPool pool1(ThreadPoolOptions{.num_threads = 1});
  ThreadPool pool3(ThreadPoolOptions{.num_threads = 3});
  std::vector<float> canonical;
  for (cpu::Isa isa : supported_isas()) {
    cpu::set_max_isa(isa);
    const std::string at = what + " isa " + cpu::isa_name(isa);
    const std::vector<float> y1 = run(x, n_tokens, &pool1);
    ASSERT_TRUE(same_bits(y1, run(x, n_tokens, &pool3))) << at << ": 1 vs 3 threads";
    ASSERT_TRUE(same_bits(y1, run(x, n_tokens, nullptr))) << at << ": pool vs none";
    if (canonical.empty()) {
      canonical = y1;
      check_reference(y1);
    } else {
      ASSERT_TRUE(same_bits(y1, canonical)) << at << " differs from scalar";
    }
    if (n_tokens > 1) {
      for (int64_t t = 0; t < n_tokens; ++t) {
        std::vector<float> xt(x.begin() + t * k, x.begin() + (t + 1) * k);
        const std::vector<float> one = run(xt, 1, &pool3);
        ASSERT_EQ(std::memcmp(one.data(), y1.data() + t * rows, static_cast<size_t>(rows) * 4), 0)
            << at << " token " << t << " alone";
      }
    }
  }
}

}  // namespace tessera::test
