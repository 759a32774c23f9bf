// The bf16 compute mode of the float-weight matmul (kernels/cpu/fgemm_bf16.h): the rounding
// rule, the activation conversion, and fmatmul_bf16 on a grid of shapes that crosses the
// 32-column step, the 4-row quad, the 16-row thread group, the 6-token tile, the 16-token
// switch to the blocked GEMM and the 1024-column k chunk. Every result must equal the scalar
// reference bit for bit, for any row split and for a token alone or in any batch, and be as
// close to the fp64 product of the unrounded inputs as bf16 inputs allow.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "common/thread_pool.h"
#include "kernels/cpu/fgemm_bf16.h"
#include "tests/kernels/kernel_test_util.h"

namespace tessera {
namespace {

using test::gaussian;

uint32_t f32_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

float bits_f32(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Equal bits, or both NaN (the payload of a NaN made inside an fma is not part of the contract).
bool same_value(float a, float b) { return f32_bits(a) == f32_bits(b) || (std::isnan(a) && std::isnan(b)); }

// ------------------------------------------------------------------ rounding

TEST(Bf16Rounding, RoundToBf16FollowsTheRule) {
  struct Case {
    uint32_t in;
    uint16_t out;
    const char* what;
  };
  const Case cases[] = {
      {0x3f800000u, 0x3f80, "1.0 exact"},
      {0x3f808000u, 0x3f80, "tie, even below"},
      {0x3f818000u, 0x3f82, "tie, even above"},
      {0x3f808001u, 0x3f81, "just above a tie"},
      {0x3f807fffu, 0x3f80, "just below a tie"},
      {0xbf808000u, 0xbf80, "negative tie, even below"},
      {0xbf818000u, 0xbf82, "negative tie, even above"},
      {0x3fffffffu, 0x4000, "carry into the exponent"},
      {0x7f7f7fffu, 0x7f7f, "largest that stays finite"},
      {0x7f7fffffu, 0x7f80, "largest float rounds to infinity"},
      {0x7f800000u, 0x7f80, "+inf"},
      {0xff800000u, 0xff80, "-inf"},
      {0x7fc00000u, 0x7fc0, "quiet NaN"},
      {0x7f800001u, 0x7fc0, "signaling NaN, payload only in low bits, stays NaN"},
      {0x7f810000u, 0x7fc1, "signaling NaN keeps its top payload bits"},
      {0xffc12345u, 0xffc1, "negative NaN truncated"},
      {0x00000000u, 0x0000, "+0"},
      {0x80000000u, 0x8000, "-0"},
      {0x007fffffu, 0x0000, "largest denormal flushes (does not round up to 2^-126)"},
      {0x807fffffu, 0x8000, "negative denormal flushes to -0"},
      {0x00000001u, 0x0000, "smallest denormal"},
      {0x00800000u, 0x0080, "smallest normal"},
      {0x00808000u, 0x0080, "tie at the smallest normal"},
  };
  for (const Case& c : cases)
    EXPECT_EQ(cpu::round_to_bf16(bits_f32(c.in)), c.out) << c.what << " (0x" << std::hex << c.in << ")";
}

TEST(Bf16Rounding, ConvertActsRoundsPadsAndKeepsOtherTokens) {
  std::mt19937 rng(5);
  for (int64_t k : {1, 16, 31, 32, 33, 100, 2050}) {
    const int64_t n_tokens = 4, kpad = cpu::bf16_kpad(k);
    std::vector<float> x(static_cast<size_t>(n_tokens * k));
    // Any bit pattern: normals, denormals, zeros, infinities, NaNs, and exact ties.
    for (size_t i = 0; i < x.size(); ++i) {
      uint32_t u = static_cast<uint32_t>(rng());
      if (i % 7 == 1) u &= 0x807fffffu;                     // denormal or zero
      if (i % 7 == 2) u = (u & 0xffff0000u) | 0x8000u;      // tie
      if (i % 7 == 3) u |= 0x7f800000u;                     // inf / NaN
      x[i] = bits_f32(u);
    }
    ASSERT_EQ(cpu::bf16_acts_bytes(n_tokens, k), static_cast<size_t>(n_tokens * kpad) * 2);
    std::vector<uint16_t> dst(static_cast<size_t>(n_tokens * kpad), 0xabcd);
    cpu::convert_acts_bf16(x.data(), k, 1, 3, dst.data());  // tokens 1 and 2 only
    for (int64_t t = 0; t < n_tokens; ++t) {
      for (int64_t c = 0; c < kpad; ++c) {
        const uint16_t got = dst[static_cast<size_t>(t * kpad + c)];
        const uint16_t want = t < 1 || t >= 3 ? 0xabcd : c < k ? cpu::round_to_bf16(x[static_cast<size_t>(t * k + c)]) : 0;
        ASSERT_EQ(got, want) << "k " << k << " token " << t << " column " << c << " input 0x" << std::hex
                             << (c < k ? f32_bits(x[static_cast<size_t>(t * k + c)]) : 0u);
      }
    }
  }
}

// ------------------------------------------------------------------ matmul

using Weights = test::TestMatrix;

cpu::FMatmulArgs args_for(const Weights& w, int64_t n_tokens, float* y, int64_t y_stride) {
  cpu::FMatmulArgs a;
  a.type = w.view.type;
  a.w = w.bytes.data();
  a.row_bytes = row_bytes(w.view.type, w.view.cols());
  a.k = w.view.cols();
  a.n_tokens = n_tokens;
  a.y = y;
  a.y_stride = y_stride;
  return a;
}

std::vector<uint16_t> convert(const std::vector<float>& x, int64_t k, int64_t n_tokens) {
  std::vector<uint16_t> xb(cpu::bf16_acts_bytes(n_tokens, k) / 2);
  cpu::convert_acts_bf16(x.data(), k, 0, n_tokens, xb.data());
  return xb;
}

// Piece boundaries inside (0, rows): every `step` rows.
std::vector<int64_t> splits_every(int64_t step, int64_t rows) {
  std::vector<int64_t> out;
  for (int64_t s = step; s < rows; s += step) out.push_back(s);
  return out;
}

// Rows [r0, r1) in one call per piece: `splits` are the piece boundaries inside (0, rows).
std::vector<float> run_bf16(const Weights& w, const std::vector<uint16_t>& xb, int64_t n_tokens,
                            const std::vector<int64_t>& splits = {}) {
  const int64_t rows = w.view.rows();
  std::vector<float> y(static_cast<size_t>(n_tokens * rows), NAN);
  const cpu::FMatmulArgs a = args_for(w, n_tokens, y.data(), rows);
  int64_t r0 = 0;
  for (int64_t s : splits) {
    cpu::fmatmul_bf16(a, xb.data(), r0, s);
    r0 = s;
  }
  cpu::fmatmul_bf16(a, xb.data(), r0, rows);
  return y;
}

std::vector<float> run_reference(const Weights& w, const std::vector<uint16_t>& xb, int64_t n_tokens) {
  const int64_t rows = w.view.rows();
  std::vector<float> y(static_cast<size_t>(n_tokens * rows), NAN);
  cpu::fmatmul_bf16_reference(args_for(w, n_tokens, y.data(), rows), xb.data(), 0, rows);
  return y;
}

// Bits of y equal to `want` (n_tokens x rows) or the first mismatch.
::testing::AssertionResult same_outputs(const std::vector<float>& y, const std::vector<float>& want, int64_t rows) {
  for (size_t i = 0; i < y.size(); ++i) {
    if (!same_value(y[i], want[i]))
      return ::testing::AssertionFailure() << "token " << i / static_cast<size_t>(rows) << " row "
                                           << i % static_cast<size_t>(rows) << ": " << y[i] << " (0x" << std::hex
                                           << f32_bits(y[i]) << ") vs " << want[i] << " (0x" << f32_bits(want[i])
                                           << ")";
  }
  return ::testing::AssertionSuccess();
}

// y (n_tokens x rows) against the fp64 product of the unrounded inputs (w.deq, x).
// Per output, a bound for any inputs: rounding w and x to bf16 (8 significant bits, unit
// roundoff u = 2^-8) changes each product by at most (2u + u^2) |w x|; each fp32 partial sum
// takes kpad/16 fma roundings and the reduction 4 adds, each at most 2^-24 relative to a sum
// bounded by (1 + 2u + u^2) sum |w x|. Rounding errors of independent values mostly cancel,
// so the root-mean-square error must also stay near its prediction: a rounding error
// delta = (bf16(v) - v) / v has variance ~ 2^-14 / 12 * E[1/m^2] (m the significand,
// E = 0.54 for log-uniform values), so sum_c (w_c x_c)^2 * 2 * 2^-14 * 0.045 per output
// (the factor 2: w and x both rounded). A systematic error (a dropped column, a weight off by
// 2^-6) shows there even when it hides under the worst-case bound.
::testing::AssertionResult close_to_fp64(const Weights& w, const std::vector<float>& x, int64_t n_tokens,
                                         const std::vector<float>& y) {
  const int64_t rows = w.view.rows(), k = w.view.cols(), kpad = cpu::bf16_kpad(k);
  const double u = std::ldexp(1.0, -8), eps32 = std::ldexp(1.0, -24);
  const double rel_bound = (2 * u + u * u) + static_cast<double>(kpad / 16 + 4) * eps32 * (1 + 2 * u + u * u);
  const double var_rel = 2 * std::ldexp(1.0, -14) * 0.045;
  double sq_err = 0, sq_pred = 0;
  for (int64_t t = 0; t < n_tokens; ++t) {
    for (int64_t r = 0; r < rows; ++r) {
      double ref = 0, mag = 0, sq = 0;
      for (int64_t c = 0; c < k; ++c) {
        const double p = static_cast<double>(w.deq[static_cast<size_t>(r * k + c)]) * x[static_cast<size_t>(t * k + c)];
        ref += p;
        mag += std::fabs(p);
        sq += p * p;
      }
      const double got = y[static_cast<size_t>(t * rows + r)];
      if (!(std::fabs(got - ref) <= rel_bound * mag))
        return ::testing::AssertionFailure() << "token " << t << " row " << r << ": " << got << " vs fp64 " << ref
                                             << ", bound " << rel_bound * mag;
      sq_err += (got - ref) * (got - ref);
      sq_pred += sq * var_rel;
    }
  }
  const double ratio = std::sqrt(sq_err / sq_pred);
  // Measured 0.87-1.19 for F16 / F32 weights, ~0.67 for BF16 (only x is rounded).
  if (!(ratio < 1.5))
    return ::testing::AssertionFailure() << "rms error " << ratio << " x the prediction for bf16 rounding";
  return ::testing::AssertionSuccess() << "rms ratio " << ratio;
}

std::vector<float> activations(int64_t n_tokens, int64_t k, uint32_t seed) {
  auto x = gaussian(n_tokens * k, seed, 1.0f);
  for (size_t i = 0; i < x.size(); i += 89) x[i] *= 16.0f;  // outliers, as in real hidden states
  return x;
}

#define SKIP_WITHOUT_BF16_DOT() \
  if (!cpu::has_bf16_dot()) GTEST_SKIP() << "this CPU has no AVX512_BF16 (fmatmul_bf16 would run the reference)"

TEST(FloatMatmulBf16, MatchesReferenceForAnySplitAndBatch) {
  SKIP_WITHOUT_BF16_DOT();
  // 1 and 61: row tails of 1 and 29 columns (masks of both 16-lane halves).
  const int64_t ks[] = {1, 32, 48, 61, 640, 768, 2048, 2050};
  const int64_t row_counts[] = {1, 3, 16, 17, 64, 100};
  // Up to 64 tokens stream the weights; 65, 150 (144 + 6) and 200 (144 + 9 x 6 + 2) take the
  // blocked GEMM, with partial tiles and a second token block.
  const int64_t token_counts[] = {1, 2, 5, 6, 7, 16, 17, 33, 64, 65, 150, 200};
  const int64_t max_tokens = 200;
  ThreadPool pool(ThreadPoolOptions{.num_threads = 3});
  for (QuantType type : {QuantType::kF16, QuantType::kBF16, QuantType::kF32}) {
    for (int64_t k : ks) {
      const auto x = activations(max_tokens, k, static_cast<uint32_t>(k));
      const auto xb = convert(x, k, max_tokens);
      for (int64_t rows : row_counts) {
        const std::string what = std::string(quant_name(type)) + " k " + std::to_string(k) + " rows " +
                                 std::to_string(rows);
        const Weights w = test::make_test_matrix(type, rows, k, static_cast<uint32_t>(rows * 131 + k), 0.3f);
        // A token's outputs do not depend on the batch, so the reference of the largest batch
        // covers every prefix of it.
        const auto ref = run_reference(w, xb, max_tokens);
        ASSERT_TRUE(close_to_fp64(w, x, max_tokens, ref)) << what;
        // Each token alone (the 1-token path).
        std::vector<float> alone(static_cast<size_t>(max_tokens * rows));
        for (int64_t t = 0; t < max_tokens; ++t) {
          const std::vector<uint16_t> xt(xb.begin() + t * cpu::bf16_kpad(k), xb.begin() + (t + 1) * cpu::bf16_kpad(k));
          const auto y = run_bf16(w, xt, 1);
          std::copy(y.begin(), y.end(), alone.begin() + t * rows);
        }
        ASSERT_TRUE(same_outputs(alone, ref, rows)) << what << " tokens alone vs reference";
        for (int64_t n : token_counts) {
          const std::string at = what + " tokens " + std::to_string(n);
          const std::vector<float> want(ref.begin(), ref.begin() + n * rows);
          ASSERT_TRUE(same_outputs(run_bf16(w, xb, n), want, rows)) << at << " one call";
          // Row splits at multiples of 16 (kFRowGroup): every piece of 16, and one uneven cut.
          ASSERT_TRUE(same_outputs(run_bf16(w, xb, n, splits_every(16, rows)), want, rows)) << at << " split by 16";
          if (rows > 32) {
            ASSERT_TRUE(same_outputs(run_bf16(w, xb, n, {32}), want, rows)) << at << " split at 32";
          }
        }
        // Real threads (per-thread scratch) on the batch sizes of both paths.
        for (int64_t n : {16, 65, 200}) {
          std::vector<float> y(static_cast<size_t>(n * rows), NAN);
          const cpu::FMatmulArgs a = args_for(w, n, y.data(), rows);
          pool.parallel_for(rows, cpu::kFRowGroup,
                            [&](int64_t b, int64_t e, int) { cpu::fmatmul_bf16(a, xb.data(), b, e); });
          ASSERT_TRUE(same_outputs(y, std::vector<float>(ref.begin(), ref.begin() + n * rows), rows))
              << what << " tokens " << n << " on 3 threads";
        }
      }
    }
  }
}

// Rows longer than one k chunk of the blocked GEMM (4096 columns): accumulators parked between
// chunks; at k 5000 the panel of a row block still holds whole rows (blocks of 44 rows), at
// k 8200 it does not and is packed chunk by chunk, again for each block of 144 tokens.
TEST(FloatMatmulBf16, LongRowsMatchReference) {
  SKIP_WITHOUT_BF16_DOT();
  struct Shape {
    int64_t rows, k, n_tokens;
  };
  const Shape shapes[] = {{45, 5000, 20}, {50, 4097, 7},                        // streamed
                          {93, 5000, 143}, {29, 8200, 151}, {20, 4500, 70}};  // blocked
  for (const Shape& s : shapes) {
    const auto x = activations(s.n_tokens, s.k, static_cast<uint32_t>(s.k + s.n_tokens));
    const auto xb = convert(x, s.k, s.n_tokens);
    for (QuantType type : {QuantType::kF16, QuantType::kBF16, QuantType::kF32}) {
      const std::string what = std::string(quant_name(type)) + " rows " + std::to_string(s.rows) + " k " +
                               std::to_string(s.k) + " tokens " + std::to_string(s.n_tokens);
      const Weights w = test::make_test_matrix(type, s.rows, s.k, static_cast<uint32_t>(s.rows), 0.3f);
      const auto ref = run_reference(w, xb, s.n_tokens);
      ASSERT_TRUE(same_outputs(run_bf16(w, xb, s.n_tokens), ref, s.rows)) << what;
      ASSERT_TRUE(same_outputs(run_bf16(w, xb, s.n_tokens, splits_every(16, s.rows)), ref, s.rows)) << what << " split";
      ASSERT_TRUE(close_to_fp64(w, x, s.n_tokens, ref)) << what;
    }
  }
}

TEST(FloatMatmulBf16, RowSliceWithStrideWritesOnlyItsColumns) {
  SKIP_WITHOUT_BF16_DOT();
  const int64_t rows = 150, k = 260, begin = 5, end = 126, stride = 140;
  for (int64_t n_tokens : {1, 9, 70}) {
    for (QuantType type : {QuantType::kF16, QuantType::kF32}) {
      const Weights w = test::make_test_matrix(type, rows, k, 21, 0.3f);
      const auto xb = convert(activations(n_tokens, k, 22), k, n_tokens);
      const auto full = run_bf16(w, xb, n_tokens);
      std::vector<float> part(static_cast<size_t>(n_tokens * stride), -3.0f);
      cpu::FMatmulArgs a = args_for(w, n_tokens, part.data(), stride);
      a.w += static_cast<size_t>(begin) * a.row_bytes;
      cpu::fmatmul_bf16(a, xb.data(), 0, end - begin);
      for (int64_t t = 0; t < n_tokens; ++t)
        for (int64_t j = 0; j < stride; ++j)
          ASSERT_EQ(part[static_cast<size_t>(t * stride + j)],
                    j < end - begin ? full[static_cast<size_t>(t * rows + begin + j)] : -3.0f)
              << quant_name(type) << " tokens " << n_tokens << " column " << j;
    }
  }
}

// Values whose products underflow into the denormal range, overflow, or start as fp32
// denormals, and infinities: the instruction's DAZ / FTZ and overflow behaviour must be the
// reference's (this is where an implementation of VDPBF16PS could differ from the SDM).
TEST(FloatMatmulBf16, ExtremeValuesMatchReference) {
  SKIP_WITHOUT_BF16_DOT();
  std::mt19937 rng(9);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  const int64_t rows = 37, k = 1100;
  for (int range = 0; range < 3; ++range) {
    // Exponents of w and x: products near 2^-126 (range 0), mixed tiny and huge (1), near 2^128 (2).
    auto scaled = [&](int64_t i) {
      const int e = range == 0 ? -63 - static_cast<int>(rng() % 12) + 6
                  : range == 1 ? static_cast<int>(rng() % 120) - 60
                               : 58 + static_cast<int>(rng() % 12);
      float v = std::ldexp(dist(rng), e);
      if (i % 97 == 5) v = bits_f32(static_cast<uint32_t>(rng()) & 0x807fffffu);  // fp32 denormal
      if (range == 1 && i % 1009 == 7) v = (i % 2 ? 1.0f : -1.0f) * INFINITY;
      return v;
    };
    std::vector<float> wsrc(static_cast<size_t>(rows * k));
    for (size_t i = 0; i < wsrc.size(); ++i) wsrc[i] = scaled(static_cast<int64_t>(i));
    for (int64_t n_tokens : {1, 7, 70}) {
      std::vector<float> x(static_cast<size_t>(n_tokens * k));
      for (size_t i = 0; i < x.size(); ++i) x[i] = scaled(static_cast<int64_t>(i));
      const auto xb = convert(x, k, n_tokens);
      for (QuantType type : {QuantType::kF32, QuantType::kBF16}) {
        Weights m;
        m.bytes.resize(row_bytes(type, k) * static_cast<size_t>(rows));
        for (int64_t r = 0; r < rows; ++r)
          quantize_row(type, wsrc.data() + r * k, m.bytes.data() + static_cast<size_t>(r) * row_bytes(type, k), k);
        m.view = make_view(m.bytes.data(), type, {rows, k});
        ASSERT_TRUE(same_outputs(run_bf16(m, xb, n_tokens), run_reference(m, xb, n_tokens), rows))
            << quant_name(type) << " range " << range << " tokens " << n_tokens;
      }
    }
  }
}

// The checks above must be able to fail: a weight changed in its last column (the tail of the
// row, read through masked loads) must change that row's outputs on every path, and a
// systematic error well under the worst-case bound must fail the fp64 comparison.
TEST(FloatMatmulBf16, ChecksCatchAChangedWeight) {
  SKIP_WITHOUT_BF16_DOT();
  const int64_t rows = 20, k = 2050;
  for (QuantType type : {QuantType::kF16, QuantType::kBF16, QuantType::kF32}) {
    const Weights w = test::make_test_matrix(type, rows, k, 3, 0.3f);
    Weights changed = w;
    const size_t elem = type == QuantType::kF32 ? 4 : 2;
    const size_t last = 13 * row_bytes(type, k) + static_cast<size_t>(k - 1) * elem;
    changed.bytes[last + elem - 1] ^= 0x80;  // the sign of row 13, column k - 1
    changed.view = make_view(changed.bytes.data(), type, {rows, k});
    for (int64_t n_tokens : {1, 7, 70}) {
      const auto x = activations(n_tokens, k, 4);
      const auto xb = convert(x, k, n_tokens);
      const auto ref = run_reference(w, xb, n_tokens);
      const auto y = run_bf16(changed, xb, n_tokens);
      for (int64_t t = 0; t < n_tokens; ++t)
        for (int64_t r = 0; r < rows; ++r)
          EXPECT_EQ(r == 13, !same_value(y[static_cast<size_t>(t * rows + r)], ref[static_cast<size_t>(t * rows + r)]))
              << quant_name(type) << " tokens " << n_tokens << " token " << t << " row " << r;
      EXPECT_TRUE(close_to_fp64(w, x, n_tokens, ref)) << quant_name(type);
      // Every output scaled by 1 + 2^-6: inside the worst-case bound for most outputs, but a
      // systematic error the rms check must see.
      auto scaled = ref;
      for (float& v : scaled) v *= 1.0f + 1.0f / 64;
      EXPECT_FALSE(close_to_fp64(w, x, n_tokens, scaled)) << quant_name(type) << " tokens " << n_tokens;
    }
  }
}

}  // namespace
}  // namespace tessera
