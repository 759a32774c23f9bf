// Helpers shared by the CPU kernel tests: seeded data, the ISA paths this CPU has, and the
// check that every ISA path, thread count and batch composition gives the same bits.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/tensor.h"
#include "common/thread_pool.h"
#include "kernels/cpu/vec.h"
#include "kernels/gemm.h"
#include "kernels/quant.h"

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

// A weight matrix quantized from N(0, sigma) values, its dequantized values, and a view of it.
// The bytes have no slack after the last row: kernels must never read past the tensor.
struct TestMatrix {
  std::vector<uint8_t> bytes;
  std::vector<float> deq;  // [rows, cols]
  TensorView view;
};

// quantize(src_row, dst_row, cols) writes one row in `type`'s layout.
template <class QuantizeRow>
TestMatrix make_test_matrix(QuantType type, int64_t rows, int64_t cols, uint32_t seed, float sigma,
                            const QuantizeRow& quantize) {
  TestMatrix m;
  const auto src = gaussian(rows * cols, seed, sigma);
  const size_t rb = row_bytes(type, cols);
  m.bytes.resize(rb * static_cast<size_t>(rows));
  m.deq.resize(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r) {
    quantize(src.data() + r * cols, m.bytes.data() + r * rb, cols);
    dequantize_row(type, m.bytes.data() + r * rb, m.deq.data() + r * cols, cols);
  }
  m.view = make_view(m.bytes.data(), type, {rows, cols});
  return m;
}

inline TestMatrix make_test_matrix(QuantType type, int64_t rows, int64_t cols, uint32_t seed, float sigma) {
  return make_test_matrix(type, rows, cols, seed, sigma,
                          [type](const float* src, uint8_t* dst, int64_t n) { quantize_row(type, src, dst, n); });
}

inline std::vector<float> run_matmul(const TestMatrix& m, const std::vector<float>& x, int64_t n_tokens,
                                     ThreadPool* pool) {
  std::vector<float> y(static_cast<size_t>(n_tokens * m.view.rows()), NAN);
  matmul(m.view, x.data(), n_tokens, y.data(), pool);
  return y;
}

// y against the fp64 product of the dequantized weights. With int8 activations in blocks of
// `act_block` elements (0: float activations), each activation is off by at most half a step of
// its block's grid (amax / 254) plus the fp16 rounding of the block scale (amax * 2^-11), times
// |w|; plus fp32 accumulation error. Rounding errors of independent activations partly cancel,
// so the typical error must also sit well below that worst case (a systematic error, e.g. a
// wrong offset, would not).
inline void expect_near_reference(const TestMatrix& m, const std::vector<float>& x, int64_t n_tokens,
                                  const std::vector<float>& y, int64_t act_block, const std::string& what) {
  const int64_t rows = m.view.rows(), cols = m.view.cols();
  double sq_err = 0, sq_bound = 0;
  for (int64_t t = 0; t < n_tokens; ++t) {
    for (int64_t r = 0; r < rows; ++r) {
      double ref = 0, mag = 0, bound = 0, amax = 0;
      for (int64_t c = 0; c < cols; ++c) {
        const double w = m.deq[static_cast<size_t>(r * cols + c)];
        const double xv = x[static_cast<size_t>(t * cols + c)];
        ref += w * xv;
        mag += std::fabs(w * xv);
        if (act_block > 0) {
          if (c % act_block == 0) {
            amax = 0;
            for (int64_t j = c; j < c + act_block; ++j)
              amax = std::max(amax, std::fabs(static_cast<double>(x[static_cast<size_t>(t * cols + j)])));
          }
          bound += std::fabs(w) * amax * (1.0 / 254 + 1.0 / 2048);
        }
      }
      const double got = y[static_cast<size_t>(t * rows + r)];
      ASSERT_NEAR(got, ref, bound + 4e-6 * mag + 1e-6) << what << " token " << t << " row " << r;
      sq_err += (got - ref) * (got - ref);
      sq_bound += bound * bound;
    }
  }
  if (act_block > 0 && sq_bound > 0) {
    EXPECT_LT(std::sqrt(sq_err / sq_bound), 0.5) << what;
  }
}

// For a matmul of `rows` outputs over `k` inputs and `n_tokens` tokens of x: on every ISA path,
// 1 and 3 threads and no pool give the same bits, every path equals the first (scalar) one,
// the first passes `check_reference(y)`, and each token alone (the decode path) equals its row
// of the batch. `run(x, n_tokens, pool)` returns n_tokens x rows outputs.
template <class Run, class CheckReference>
void expect_same_bits_everywhere(const Run& run, const CheckReference& check_reference, const std::vector<float>& x,
                                 int64_t rows, int64_t k, int64_t n_tokens, const std::string& what) {
  static ThreadPool pool1(ThreadPoolOptions{.num_threads = 1});  // one pair for the whole binary
  static ThreadPool pool3(ThreadPoolOptions{.num_threads = 3});
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
