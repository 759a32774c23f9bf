// Importance-weighted encoders (quantize_row_weighted): never worse than round to nearest
// under uniform importance, clearly better in weighted error under activation-like
// heavy-tailed importance, byte-identical to quantize_row without importance, and decodable.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "kernels/quant.h"

namespace tessera {
namespace {

constexpr int64_t kRowElems = 256 * 8;
constexpr int kRows = 8;

struct TypeCase {
  QuantType type;
  double max_heavy_ratio;  // asserted bound on weighted RMSE (weighted encoder / RTN), heavy-tailed case
};

// Bounds from the measured worst ratio over 4 seeds of 8 rows (printed by
// HeavyTailedImportanceBeatsRtn; 2026-12-03: Q2_K 0.70, Q3_K 0.81, Q4_0 0.85, Q4_K 0.78,
// Q5_K 0.76, Q6_K 0.76, Q5_0 0.83, Q8_0 0.78, TQ1_0 / TQ2_0 0.97) with slack.
const TypeCase kTypes[] = {
    {QuantType::kQ2_K, 0.80},  {QuantType::kQ3_K, 0.90}, {QuantType::kQ4_0, 0.90},
    {QuantType::kQ4_K, 0.85},  {QuantType::kQ5_K, 0.85}, {QuantType::kQ6_K, 0.85},
    {QuantType::kQ5_0, 0.90},  {QuantType::kQ8_0, 0.85}, {QuantType::kTQ1_0, 0.99},
    {QuantType::kTQ2_0, 0.99},
};

std::vector<float> gaussian_rows(uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  std::vector<float> x(static_cast<size_t>(kRows * kRowElems));
  for (float& v : x) v = normal(rng);
  return x;
}

// Per column (shared by the rows, as one weight matrix's input columns): log-normal with
// sigma 1.5, and 8 outlier columns 100 times larger, as activation statistics look.
std::vector<float> heavy_tailed_importance(uint32_t seed) {
  std::mt19937 rng(seed);
  std::lognormal_distribution<float> lognormal(0.0f, 1.5f);
  std::vector<float> imp(kRowElems);
  for (float& v : imp) v = lognormal(rng);
  std::uniform_int_distribution<int64_t> col(0, kRowElems - 1);
  for (int i = 0; i < 8; ++i) imp[static_cast<size_t>(col(rng))] *= 100.0f;
  return imp;
}

std::vector<uint8_t> encode(QuantType t, const float* x, const float* imp) {
  std::vector<uint8_t> bytes(row_bytes(t, kRowElems));
  if (imp == nullptr)
    quantize_row(t, x, bytes.data(), kRowElems);
  else
    quantize_row_weighted(t, x, imp, bytes.data(), kRowElems);
  return bytes;
}

// sum_j imp_j * (x_j - decoded_j)^2 over the rows.
double weighted_sq_error(QuantType t, const std::vector<float>& x, const std::vector<float>& imp, bool weighted) {
  double err = 0;
  std::vector<float> y(kRowElems);
  for (int r = 0; r < kRows; ++r) {
    const float* row = x.data() + r * kRowElems;
    const std::vector<uint8_t> bytes = encode(t, row, weighted ? imp.data() : nullptr);
    dequantize_row(t, bytes.data(), y.data(), kRowElems);
    for (int64_t j = 0; j < kRowElems; ++j) {
      const double e = static_cast<double>(row[j]) - y[j];
      err += imp[j] * e * e;
    }
  }
  return err;
}

// Weighted RMSE of the weighted encoder over that of round to nearest.
double rmse_ratio(QuantType t, const std::vector<float>& x, const std::vector<float>& imp) {
  return std::sqrt(weighted_sq_error(t, x, imp, true) / weighted_sq_error(t, x, imp, false));
}

TEST(QuantWeighted, UniformImportanceNoWorseThanRtn) {
  const std::vector<float> x = gaussian_rows(1);
  const std::vector<float> uniform(kRowElems, 1.0f);
  for (const TypeCase& c : kTypes) {
    SCOPED_TRACE(std::string(quant_name(c.type)));
    const double ratio = rmse_ratio(c.type, x, uniform);
    std::printf("uniform importance  %-6s weighted/RTN RMSE %.4f\n", quant_name(c.type).data(), ratio);
    EXPECT_LE(ratio * ratio, 1.01);  // squared error within 1%
  }
}

TEST(QuantWeighted, HeavyTailedImportanceBeatsRtn) {
  for (const TypeCase& c : kTypes) {
    SCOPED_TRACE(std::string(quant_name(c.type)));
    double worst = 0, sum = 0;
    constexpr int kSeeds = 4;
    for (int seed = 0; seed < kSeeds; ++seed) {
      const double ratio =
          rmse_ratio(c.type, gaussian_rows(100 + seed), heavy_tailed_importance(200 + seed));
      worst = std::max(worst, ratio);
      sum += ratio;
    }
    std::printf("heavy-tailed importance  %-6s weighted/RTN RMSE mean %.4f worst %.4f\n",
                quant_name(c.type).data(), sum / kSeeds, worst);
    EXPECT_LE(worst, c.max_heavy_ratio);
  }
}

TEST(QuantWeighted, AllZeroImportanceIsUniform) {
  const std::vector<float> x = gaussian_rows(3);
  const std::vector<float> zeros(kRowElems, 0.0f), ones(kRowElems, 1.0f);
  for (const TypeCase& c : kTypes) {
    SCOPED_TRACE(std::string(quant_name(c.type)));
    EXPECT_EQ(encode(c.type, x.data(), zeros.data()), encode(c.type, x.data(), ones.data()));
  }
}

TEST(QuantWeighted, NullImportanceIsQuantizeRow) {
  const std::vector<float> x = gaussian_rows(4);
  for (int i = 0; i < static_cast<int>(QuantType::kCount); ++i) {
    const auto t = static_cast<QuantType>(i);
    if (!can_quantize(t)) continue;
    SCOPED_TRACE(std::string(quant_name(t)));
    EXPECT_EQ(encode(t, x.data(), nullptr), [&] {
      std::vector<uint8_t> bytes(row_bytes(t, kRowElems));
      quantize_row_weighted(t, x.data(), nullptr, bytes.data(), kRowElems);
      return bytes;
    }());
  }
}

TEST(QuantWeighted, SupportedTypes) {
  for (const TypeCase& c : kTypes) EXPECT_TRUE(can_quantize_weighted(c.type)) << quant_name(c.type);
  EXPECT_TRUE(can_quantize_weighted(QuantType::kF16));
  EXPECT_FALSE(can_quantize_weighted(QuantType::kI4_G128));
  EXPECT_FALSE(can_quantize_weighted(QuantType::kQ4_K_R16));
}

// Awkward rows: zeros, a constant, one spike, huge and tiny magnitudes, zero-importance
// columns; every weighted encoding decodes to finite values and is deterministic.
TEST(QuantWeighted, DecodesToFiniteValuesAndIsDeterministic) {
  std::vector<std::vector<float>> rows;
  rows.emplace_back(kRowElems, 0.0f);
  rows.emplace_back(kRowElems, -0.5f);
  rows.emplace_back(kRowElems, 0.0f);
  rows.back()[300] = 7.0f;
  for (const float magnitude : {1e4f, 1e-6f}) {
    std::vector<float> r = gaussian_rows(5);
    r.resize(kRowElems);
    for (float& v : r) v *= magnitude;
    rows.push_back(r);
  }
  std::vector<float> imp = heavy_tailed_importance(6);
  for (int64_t j = 0; j < kRowElems; j += 3) imp[j] = 0.0f;
  std::vector<float> y(kRowElems);
  for (const TypeCase& c : kTypes) {
    SCOPED_TRACE(std::string(quant_name(c.type)));
    for (const std::vector<float>& r : rows) {
      const std::vector<uint8_t> bytes = encode(c.type, r.data(), imp.data());
      EXPECT_EQ(bytes, encode(c.type, r.data(), imp.data()));
      dequantize_row(c.type, bytes.data(), y.data(), kRowElems);
      for (int64_t j = 0; j < kRowElems; ++j) ASSERT_TRUE(std::isfinite(y[j])) << "element " << j;
    }
  }
}

TEST(QuantWeightedDeathTest, RowLengthNotAMultipleOfTheBlock) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const std::vector<float> x(300, 1.0f), imp(300, 1.0f);
  std::vector<uint8_t> out(1024);
  EXPECT_DEATH(quantize_row(QuantType::kQ4_K, x.data(), out.data(), 300), "not a multiple of 256");
  EXPECT_DEATH(quantize_row_weighted(QuantType::kQ4_K, x.data(), imp.data(), out.data(), 300),
               "not a multiple of 256");
  EXPECT_DEATH(quantize_row_weighted(QuantType::kQ4_0, x.data(), imp.data(), out.data(), 33),
               "not a multiple of 32");
}

TEST(QuantWeightedDeathTest, NegativeImportance) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const std::vector<float> x(256, 1.0f);
  std::vector<float> imp(256, 1.0f);
  imp[17] = -1.0f;
  std::vector<uint8_t> out(256);
  EXPECT_DEATH(quantize_row_weighted(QuantType::kQ2_K, x.data(), imp.data(), out.data(), 256), "importance\\[17\\]");
}

}  // namespace
}  // namespace tessera
