// The float-weight matmul (kernels/cpu/fgemm.h) on batches: the AVX-512 path is a blocked GEMM
// (row blocks, token blocks, k chunks with parked accumulators, partial register tiles, panels
// kept for a whole row or packed chunk by chunk), so the shapes here cross every block edge:
// token counts around the 6-token tile and the 144-token block, odd row counts around the
// 4-row tile and the 48-row block, k around the 16-lane step and the 1024-column chunk. Every
// result must equal, bit for bit, the canonical arithmetic of fgemm.h computed here
// independently, on every ISA and every per-CPU variant of the AVX-512 kernels, with and without
// threads, alone or in a batch; and it must be close to the fp64 product.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/tensor.h"
#include "common/thread_pool.h"
#include "kernels/cpu/cpu_info.h"
#include "kernels/cpu/vec.h"
#include "kernels/gemm.h"
#include "kernels/quant.h"
#include "tests/kernels/kernel_test_util.h"

namespace tessera {
namespace {

using test::gaussian;
using test::IsaGuard;
using test::same_bits;
using test::supported_isas;

using Weights = test::TestMatrix;

Weights make_weights(QuantType type, int64_t rows, int64_t k, uint32_t seed) {
  return test::make_test_matrix(type, rows, k, seed, 0.3f);
}

// fgemm.h: zero-pad to a multiple of 16, element c into partial sum c % 16 by one fma each in
// increasing c, then the fixed pairwise reduction of the 16 partial sums.
float canonical_dot(const float* w, const float* x, int64_t k) {
  float s[16] = {};
  const int64_t kpad = (k + 15) / 16 * 16;
  for (int64_t c = 0; c < kpad; ++c) {
    const float wv = c < k ? w[c] : 0.0f, xv = c < k ? x[c] : 0.0f;
    s[c % 16] = std::fma(wv, xv, s[c % 16]);
  }
  float t[8], u[4];
  for (int i = 0; i < 8; ++i) t[i] = s[i] + s[i + 8];
  for (int i = 0; i < 4; ++i) u[i] = t[i] + t[i + 4];
  const float v0 = u[0] + u[2], v1 = u[1] + u[3];
  return v0 + v1;
}

std::vector<float> run(const Weights& w, const std::vector<float>& x, int64_t n_tokens, ThreadPool* pool) {
  return test::run_matmul(w, x, n_tokens, pool);
}

struct Shape {
  int64_t rows, k, n_tokens;
};

// Checks one shape on every ISA: bits of the canonical arithmetic, threads, fp64 closeness.
void check_shape(QuantType type, const Shape& s, ThreadPool* pool) {
  const std::string what = std::string(quant_name(type)) + " rows " + std::to_string(s.rows) + " k " +
                           std::to_string(s.k) + " tokens " + std::to_string(s.n_tokens);
  const Weights w = make_weights(type, s.rows, s.k, static_cast<uint32_t>(s.rows * 131 + s.k * 7 + s.n_tokens));
  auto x = gaussian(s.n_tokens * s.k, static_cast<uint32_t>(s.k + 977 * s.n_tokens), 1.0f);
  for (size_t i = 0; i < x.size(); i += 89) x[i] *= 16.0f;  // outliers, as in real hidden states
  std::vector<float> expect(static_cast<size_t>(s.n_tokens * s.rows));
  for (int64_t t = 0; t < s.n_tokens; ++t) {
    for (int64_t r = 0; r < s.rows; ++r) {
      const float* wr = w.deq.data() + r * s.k;
      const float* xt = x.data() + t * s.k;
      expect[static_cast<size_t>(t * s.rows + r)] = canonical_dot(wr, xt, s.k);
      double ref = 0, mag = 0;
      for (int64_t c = 0; c < s.k; ++c) {
        ref += static_cast<double>(wr[c]) * xt[c];
        mag += std::fabs(static_cast<double>(wr[c]) * xt[c]);
      }
      ASSERT_NEAR(expect[static_cast<size_t>(t * s.rows + r)], ref, 4e-6 * mag + 1e-6) << what;
    }
  }
  const cpu::KernelTuning saved = cpu::kernel_tuning();
  for (cpu::Isa isa : supported_isas()) {
    cpu::set_max_isa(isa);
    // The AVX-512 kernels' per-CPU variants (kernels/cpu/cpu_info.h): prefetch of the rows
    // ahead non-temporal or into L2, panels as stored or widened to fp32.
    for (int variant = 0; variant < (isa == cpu::Isa::kAvx512 ? 4 : 1); ++variant) {
      const bool l2 = (variant & 1) != 0, panels_fp32 = (variant & 2) != 0;
      if (isa == cpu::Isa::kAvx512) cpu::set_float_variants(l2, panels_fp32);
      for (ThreadPool* p : {static_cast<ThreadPool*>(nullptr), pool}) {
        const auto y = run(w, x, s.n_tokens, p);
        for (size_t i = 0; i < y.size(); ++i) {
          uint32_t got, want;
          std::memcpy(&got, &y[i], 4);
          std::memcpy(&want, &expect[i], 4);
          if (got != want) cpu::set_kernel_tuning(saved);
          ASSERT_EQ(got, want) << what << " isa " << cpu::isa_name(isa) << " prefetch " << (l2 ? "L2" : "nta")
                               << " panels " << (panels_fp32 ? "fp32" : "as stored") << (p ? " threads" : " 1 thread")
                               << " token " << i / static_cast<size_t>(s.rows) << " row "
                               << i % static_cast<size_t>(s.rows) << ": " << y[i] << " vs canonical " << expect[i];
        }
      }
    }
  }
  cpu::set_kernel_tuning(saved);
}

TEST(FloatMatmulBatch, BlockedPathIsCanonicalOverBlockEdges) {
  IsaGuard guard;
  MatmulPrecisionScope fp32(MatmulPrecision::kFp32);  // the fp32 kernels (bf16: matmul_precision_test)
  ThreadPool pool(ThreadPoolOptions{.num_threads = 3});
  const Shape shapes[] = {
      {1, 16, 3},      {3, 7, 17},       {5, 33, 1},      {7, 100, 64},    {13, 1000, 129},  {17, 1024, 6},
      {51, 1025, 17},  {49, 2100, 3},    {97, 768, 64},   {103, 517, 129}, {48, 1040, 150},  {21, 3000, 7},
      {9, 64, 300},    {100, 130, 289},
      // Rows too long for one panel of 48 rows: 16-bit weights at k 5632 take blocks of 40
      // rows; F32 at k 4001 and every type at k 7500 are packed chunk by chunk, per token block.
      {45, 5632, 20},  {29, 4001, 13},   {50, 7500, 150},
  };
  for (QuantType type : {QuantType::kF16, QuantType::kBF16, QuantType::kF32}) {
    for (const Shape& s : shapes) {
      check_shape(type, s, &pool);
      if (::testing::Test::HasFatalFailure()) return;
    }
  }
}

TEST(FloatMatmulBatch, TokenResultDoesNotDependOnItsBatch) {
  // A token's row of y must be the same whether it is decoded alone (the matrix-vector path)
  // or sits anywhere in a batch (every tile width, every token block).
  IsaGuard guard;
  const int64_t rows = 37, k = 1100, n_tokens = 157;
  for (QuantType type : {QuantType::kF16, QuantType::kBF16, QuantType::kF32}) {
    const Weights w = make_weights(type, rows, k, 11);
    const auto x = gaussian(n_tokens * k, 12, 1.0f);
    for (cpu::Isa isa : supported_isas()) {
      cpu::set_max_isa(isa);
      const auto batch = run(w, x, n_tokens, nullptr);
      for (int64_t t : {0, 5, 6, 77, 143, 144, 156}) {
        const std::vector<float> one(x.begin() + t * k, x.begin() + (t + 1) * k);
        const auto alone = run(w, one, 1, nullptr);
        ASSERT_EQ(0, std::memcmp(alone.data(), batch.data() + t * rows, static_cast<size_t>(rows) * 4))
            << quant_name(type) << " isa " << cpu::isa_name(isa) << " token " << t;
      }
    }
  }
}

TEST(FloatMatmulBatch, RowSliceWithStrideWritesOnlyItsColumns) {
  IsaGuard guard;
  ThreadPool pool(ThreadPoolOptions{.num_threads = 2});
  const int64_t rows = 150, k = 260, n_tokens = 19, begin = 5, end = 126, stride = 140;
  for (QuantType type : {QuantType::kF16, QuantType::kF32}) {
    const Weights w = make_weights(type, rows, k, 21);
    const auto x = gaussian(n_tokens * k, 22, 1.0f);
    const auto full = run(w, x, n_tokens, &pool);
    std::vector<float> part(static_cast<size_t>(n_tokens * stride), -3.0f);
    matmul_rows(w.view, begin, end, x.data(), n_tokens, part.data(), stride, &pool);
    for (int64_t t = 0; t < n_tokens; ++t)
      for (int64_t j = 0; j < stride; ++j)
        ASSERT_EQ(part[static_cast<size_t>(t * stride + j)],
                  j < end - begin ? full[static_cast<size_t>(t * rows + begin + j)] : -3.0f)
            << quant_name(type) << " token " << t << " column " << j;
  }
}

}  // namespace
}  // namespace tessera
