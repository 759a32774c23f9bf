// The low-bit GGUF formats Q2_K, Q3_K, TQ1_0, TQ2_0: decoders checked bit for bit against
// gguf-py's numpy reference (vectors in data/gguf_low_bit_vectors.inc, written by
// tools/gen_gguf_quant_vectors.py), encoders checked against gguf-py's where it has one
// (ternary) and by their round-trip error on Gaussian rows.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "kernels/cpu/vec.h"
#include "kernels/quant.h"
#include "tests/kernels/data/gguf_low_bit_vectors.inc"

namespace tessera {
namespace {

std::vector<float> from_bits(std::span<const uint32_t> bits) {
  std::vector<float> v(bits.size());
  std::memcpy(v.data(), bits.data(), bits.size() * 4);
  return v;
}

std::vector<float> dequant(QuantType t, std::span<const uint8_t> bytes) {
  const QuantTraits& tr = quant_traits(t);
  const int64_t k = static_cast<int64_t>(bytes.size() / tr.block_bytes) * tr.block_elems;
  std::vector<float> out(static_cast<size_t>(k));
  dequantize_row(t, bytes.data(), out.data(), k);
  return out;
}

std::vector<uint8_t> quant(QuantType t, std::span<const float> x) {
  std::vector<uint8_t> bytes(row_bytes(t, static_cast<int64_t>(x.size())));
  quantize_row(t, x.data(), bytes.data(), static_cast<int64_t>(x.size()));
  return bytes;
}

double rms_error(std::span<const float> a, std::span<const float> b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
  return std::sqrt(s / static_cast<double>(a.size()));
}

struct VectorCase {
  QuantType type;
  std::span<const uint8_t> blocks;
  std::span<const uint32_t> expected;
};

const VectorCase kVectors[] = {
    {QuantType::kQ2_K, gguf_vectors::kQ2_KBlocks, gguf_vectors::kQ2_KExpected},
    {QuantType::kQ3_K, gguf_vectors::kQ3_KBlocks, gguf_vectors::kQ3_KExpected},
    {QuantType::kTQ1_0, gguf_vectors::kTQ1_0Blocks, gguf_vectors::kTQ1_0Expected},
    {QuantType::kTQ2_0, gguf_vectors::kTQ2_0Blocks, gguf_vectors::kTQ2_0Expected},
};

// Runs with the portable decoders forced and with the default dispatch (which has no SIMD
// decoder for these formats yet; the case guards the dispatch).
class LowBitDecode : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override { cpu::set_force_scalar(GetParam()); }
  void TearDown() override { cpu::set_force_scalar(false); }
};

TEST_P(LowBitDecode, MatchesGgufPyBitForBit) {
  for (const VectorCase& c : kVectors) {
    SCOPED_TRACE(std::string(quant_name(c.type)));
    ASSERT_EQ(c.blocks.size() % quant_traits(c.type).block_bytes, 0u);
    const std::vector<float> got = dequant(c.type, c.blocks);
    const std::vector<float> want = from_bits(c.expected);
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i)
      ASSERT_EQ(std::memcmp(&got[i], &want[i], 4), 0) << "element " << i << ": " << got[i] << " vs " << want[i];
  }
}

TEST_P(LowBitDecode, BlocksAreIndependentAcrossTheRow) {
  for (const VectorCase& c : kVectors) {
    const QuantTraits& tr = quant_traits(c.type);
    const std::vector<float> row = dequant(c.type, c.blocks);
    for (size_t b = 0; b * tr.block_bytes < c.blocks.size(); ++b) {
      const std::vector<float> one = dequant(c.type, c.blocks.subspan(b * tr.block_bytes, tr.block_bytes));
      ASSERT_EQ(std::memcmp(one.data(), row.data() + b * tr.block_elems, 4 * one.size()), 0) << tr.name;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Paths, LowBitDecode, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "Scalar" : "Default"; });

TEST(LowBitEncode, ExactTernaryWeightsEncodeAsGgufPyDoes) {
  const std::vector<float> x = from_bits(gguf_vectors::kTernaryInput);
  for (auto [type, want] : {std::pair{QuantType::kTQ1_0, std::span<const uint8_t>(gguf_vectors::kTQ1_0OfTernary)},
                            std::pair{QuantType::kTQ2_0, std::span<const uint8_t>(gguf_vectors::kTQ2_0OfTernary)}}) {
    SCOPED_TRACE(std::string(quant_name(type)));
    const std::vector<uint8_t> got = quant(type, x);
    ASSERT_EQ(got.size(), want.size());
    EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size()), 0);
    const std::vector<float> back = dequant(type, got);
    EXPECT_EQ(std::memcmp(back.data(), x.data(), 4 * x.size()), 0) << "exactly ternary data round-trips exactly";
  }
}

TEST(LowBitEncode, TernaryErrorIsNoWorseThanGgufPysAbsmax) {
  // gguf-py rounds x / absmax; the least-squares threshold and scale must not do worse.
  const std::vector<float> x = from_bits(gguf_vectors::kGaussianInput);
  for (auto [type, ref] : {std::pair{QuantType::kTQ1_0, gguf_vectors::kGgufPyTQ1_0Rmse},
                           std::pair{QuantType::kTQ2_0, gguf_vectors::kGgufPyTQ2_0Rmse}}) {
    const double err = rms_error(x, dequant(type, quant(type, x)));
    std::printf("  %-5s RMSE %.4f on N(0, 1) (gguf-py absmax encoder: %.4f)\n", std::string(quant_name(type)).c_str(),
                err, ref);
    EXPECT_LT(err, ref) << quant_name(type);
  }
}

TEST(LowBitEncode, TritPackingRoundTripsEveryPattern) {
  // Every trit at every position: a block whose trits cycle through -1, 0, 1 with shifts.
  for (QuantType type : {QuantType::kTQ1_0, QuantType::kTQ2_0}) {
    for (int shift = 0; shift < 3; ++shift) {
      std::vector<float> x(256);
      for (int i = 0; i < 256; ++i) x[i] = 0.25f * static_cast<float>((i * 7 + shift) % 3 - 1);
      const std::vector<float> back = dequant(type, quant(type, x));
      for (int i = 0; i < 256; ++i) ASSERT_EQ(back[i], x[i]) << quant_name(type) << " elem " << i << " shift " << shift;
    }
  }
}

// Q3_K's signed 6-bit scales and third bit, Q2_K's 4-bit scales and mins: on data that lies on
// a grid of the format the encoder finds it again (up to the fp16 super-block scale).
TEST(LowBitEncode, KQuantsRecoverDataOnTheirGrid) {
  std::mt19937 rng(7);
  std::vector<float> x(512);
  // Q3_K: x = 0.01 * sc_j * q, q in -4..3, sc_j in -32..31 with one sub-block at -32.
  for (int j = 0; j < 32; ++j) {
    const int sc = j % 16 == 0 ? -32 : static_cast<int>(rng() % 64) - 32;
    for (int i = 0; i < 16; ++i) {
      int q = static_cast<int>(rng() % 8) - 4;
      if (i == 0) q = -4;  // the extreme level is present
      x[16 * j + i] = 0.0078125f * static_cast<float>(sc * q);
    }
  }
  const std::vector<float> back = dequant(QuantType::kQ3_K, quant(QuantType::kQ3_K, x));
  double max_abs = 0;
  for (float v : x) max_abs = std::max(max_abs, std::fabs(static_cast<double>(v)));
  EXPECT_LT(rms_error(x, back), 0.02 * max_abs);
}

// ------------------------------------------------------------------ round trip on Gaussian rows

struct ErrorCase {
  QuantType type;
  double max_rel_rms;  // relative RMS error bound (RMSE / RMS of the data)
};

class LowBitRoundTrip : public ::testing::TestWithParam<ErrorCase> {};

std::vector<float> gaussian(int64_t n, uint32_t seed, float sigma) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, sigma);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = dist(rng);
  return v;
}

TEST_P(LowBitRoundTrip, GaussianErrorWithinBound) {
  const auto [type, bound] = GetParam();
  const int64_t k = 4096;
  for (uint32_t seed : {1u, 2u, 3u}) {
    for (float sigma : {1e-3f, 1.0f, 30.0f}) {
      const std::vector<float> x = gaussian(k, seed, sigma);
      const double rel = rms_error(x, dequant(type, quant(type, x))) / sigma;
      EXPECT_LT(rel, bound) << quant_name(type) << " seed " << seed << " sigma " << sigma;
      if (seed == 1 && sigma == 1.0f)
        std::printf("  %-5s RMSE %.4f on N(0, 1) rows of %lld (bound %.3f)\n", std::string(quant_name(type)).c_str(),
                    rel, static_cast<long long>(k), bound);
    }
  }
}

TEST_P(LowBitRoundTrip, DegenerateRowsStayFinite) {
  const QuantType type = GetParam().type;
  const int64_t k = 512;
  std::vector<std::vector<float>> rows;
  rows.emplace_back(k, 0.0f);
  rows.emplace_back(k, -0.75f);
  rows.emplace_back(k, 3.0f);
  std::vector<float> outlier = gaussian(k, 9, 0.01f);
  outlier[77] = 50.0f;
  rows.push_back(outlier);
  for (size_t r = 0; r < rows.size(); ++r) {
    const std::vector<float> back = dequant(type, quant(type, rows[r]));
    for (int64_t i = 0; i < k; ++i) {
      ASSERT_TRUE(std::isfinite(back[i])) << quant_name(type) << " row " << r;
      if (r == 0) {
        ASSERT_EQ(back[i], 0.0f) << quant_name(type);
      }
    }
    if (r == 3) {
      EXPECT_NEAR(back[77], 50.0f, 50.0f * 0.15) << quant_name(type) << ": the outlier survives";
    }
  }
}

TEST_P(LowBitRoundTrip, QuantizingDequantizedDataIsStable) {
  const QuantType type = GetParam().type;
  const std::vector<float> x = gaussian(1024, 4, 1.0f);
  const std::vector<float> once = dequant(type, quant(type, x));
  const std::vector<float> twice = dequant(type, quant(type, once));
  EXPECT_LT(rms_error(once, twice), GetParam().max_rel_rms / 4) << quant_name(type);
}

// Measured relative RMS error on N(0, 1) rows of 4096 (printed by the test; 2026-12-03):
// Q3_K 0.146, Q2_K 0.273, TQ2_0 = TQ1_0 0.446 (the best ternary code of a Gaussian with one
// scale per 256 is ~0.44). Bounds have ~15% margin; sigma 1e-3 runs into fp16-subnormal
// super-block scales and stays within them too.
INSTANTIATE_TEST_SUITE_P(Formats, LowBitRoundTrip,
                         ::testing::Values(ErrorCase{QuantType::kQ3_K, 0.17}, ErrorCase{QuantType::kQ2_K, 0.31},
                                           ErrorCase{QuantType::kTQ2_0, 0.50}, ErrorCase{QuantType::kTQ1_0, 0.50}),
                         [](const auto& info) { return std::string(quant_name(info.param.type)); });

TEST(LowBit, CanQuantizeAndSizes) {
  for (QuantType t : {QuantType::kQ2_K, QuantType::kQ3_K, QuantType::kTQ1_0, QuantType::kTQ2_0}) {
    EXPECT_TRUE(can_quantize(t)) << quant_name(t);
    EXPECT_EQ(quant_traits(t).cpu, CpuMatmul::kIntDot) << quant_name(t);  // tests/kernels/qgemm_low_bit_test.cpp
  }
  EXPECT_EQ(row_bytes(QuantType::kQ2_K, 512), 168u);
  EXPECT_EQ(row_bytes(QuantType::kQ3_K, 512), 220u);
  EXPECT_EQ(row_bytes(QuantType::kTQ1_0, 512), 108u);
  EXPECT_EQ(row_bytes(QuantType::kTQ2_0, 512), 132u);
}

}  // namespace
}  // namespace tessera
