// Load-time weight formats I8_CH (INT8 per output channel) and I4_G128 (INT4, groups of 128):
// the RTN grids' error bounds, the byte layout, and the integer-dot matmul on every ISA path
// against the dequantized fp32 reference and bit-identical across ISAs, threads and batches.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "common/tensor.h"
#include "common/thread_pool.h"
#include "kernels/cpu/qgemm.h"
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

TEST(Int8PerChannel, RtnErrorIsAtMostHalfAStep) {
  const int64_t k = 96;
  auto x = gaussian(k, 7, 2.0f);
  x[5] = -9.5f;  // the row's amax
  std::vector<uint8_t> row(row_bytes(QuantType::kI8_CH, k));
  ASSERT_EQ(row.size(), static_cast<size_t>(k + 4));
  quantize_row(QuantType::kI8_CH, x.data(), row.data(), k);
  float s;
  std::memcpy(&s, row.data() + k, 4);
  EXPECT_FLOAT_EQ(s, 9.5f / 127.0f);
  EXPECT_EQ(static_cast<int8_t>(row[5]), -127);
  std::vector<float> y(static_cast<size_t>(k));
  dequantize_row(QuantType::kI8_CH, row.data(), y.data(), k);
  for (int64_t i = 0; i < k; ++i) {
    EXPECT_LE(std::fabs(y[i] - x[i]), 0.5f * s * (1 + 1e-5f)) << i;
    EXPECT_EQ(y[i], static_cast<float>(static_cast<int8_t>(row[i])) * s);
  }
  // An all-zero row stays zero.
  std::vector<float> z(static_cast<size_t>(k), 0.0f);
  quantize_row(QuantType::kI8_CH, z.data(), row.data(), k);
  dequantize_row(QuantType::kI8_CH, row.data(), y.data(), k);
  for (float v : y) EXPECT_EQ(v, 0.0f);
}

TEST(Int4Group, RtnErrorBoundsAndLayout) {
  for (Int4Grid grid : {Int4Grid::kAsymmetric, Int4Grid::kSymmetric}) {
    for (uint32_t seed : {1u, 2u, 3u}) {
      auto x = gaussian(256, seed, 0.1f);
      if (seed == 3) for (auto& v : x) v = std::fabs(v) + 0.05f;  // all positive: lo clamps to 0
      std::vector<uint8_t> row(row_bytes(QuantType::kI4_G128, 256));
      ASSERT_EQ(row.size(), 136u);
      quantize_row_int4(x.data(), row.data(), 256, grid);
      std::vector<float> y(256);
      dequantize_row(QuantType::kI4_G128, row.data(), y.data(), 256);
      for (int g = 0; g < 2; ++g) {
        Int4Group q;
        unpack_int4_group(row.data() + 68 * g, &q);
        const float d = fp16_to_f32(q.scale_fp16);
        float lo = 0, hi = 0, amax = 0;
        for (int i = 0; i < 128; ++i) {
          lo = std::min(lo, x[128 * g + i]);
          hi = std::max(hi, x[128 * g + i]);
          amax = std::max(amax, std::fabs(x[128 * g + i]));
        }
        const float want_d = grid == Int4Grid::kSymmetric ? 2 * amax / 15 : (hi - lo) / 15;
        EXPECT_EQ(q.scale_fp16, f32_to_fp16(want_d));
        if (grid == Int4Grid::kSymmetric) {
          EXPECT_EQ(q.zero, 8);
        }
        for (int i = 0; i < 128; ++i) {
          // Half a step, plus the fp16 rounding of d over up to 15 steps at the clamped ends.
          const float bound = 0.5f * d + 15 * std::fabs(d - want_d) + 1e-6f;
          EXPECT_LE(std::fabs(y[128 * g + i] - x[128 * g + i]), bound) << "group " << g << " i " << i;
          EXPECT_EQ(y[128 * g + i], static_cast<float>(q.levels[i] - q.zero) * d);
        }
        // Layout: d, zero, 0, then sub-block s byte j = levels 32s + j | 32s + 16 + j << 4.
        uint16_t h;
        std::memcpy(&h, row.data() + 68 * g, 2);
        EXPECT_EQ(h, q.scale_fp16);
        EXPECT_EQ(row[68 * g + 3], 0);
        EXPECT_EQ(row[68 * g + 4 + 16 * 2 + 5], q.levels[69] | q.levels[85] << 4);
      }
    }
  }
}

TEST(Int4Group, PackUnpackRoundTrip) {
  Int4Group g;
  g.scale_fp16 = f32_to_fp16(0.03125f);
  g.zero = 11;
  for (int i = 0; i < 128; ++i) g.levels[i] = static_cast<uint8_t>((i * 7 + 3) % 16);
  uint8_t bytes[68];
  pack_int4_group(g, bytes);
  Int4Group back;
  unpack_int4_group(bytes, &back);
  EXPECT_EQ(back.scale_fp16, g.scale_fp16);
  EXPECT_EQ(back.zero, g.zero);
  EXPECT_EQ(std::memcmp(back.levels, g.levels, 128), 0);
}

// The loaders write I4_G128 blocks with common/dtype.h's write_int4_group (model/ links no
// kernels): the same bytes as the kernels' pack_int4_group.
TEST(Int4Group, CommonWriterMatchesThePacker) {
  Int4Group g;
  g.scale_fp16 = f32_to_fp16(-0.75f);
  g.zero = 3;
  for (int i = 0; i < 128; ++i) g.levels[i] = static_cast<uint8_t>((i * 5 + 1) % 16);
  uint8_t packed[68], written[68];
  std::memset(written, 0xAB, sizeof(written));
  pack_int4_group(g, packed);
  write_int4_group(g, written);
  EXPECT_EQ(std::memcmp(packed, written, sizeof(packed)), 0);
}

using Matrix = test::TestMatrix;
using test::run_matmul;

Matrix make_matrix(QuantType type, Int4Grid grid, int64_t rows, int64_t cols, uint32_t seed) {
  return test::make_test_matrix(type, rows, cols, seed, 0.5f, [&](const float* src, uint8_t* dst, int64_t n) {
    if (type == QuantType::kI4_G128) {
      quantize_row_int4(src, dst, n, grid);
    } else {
      quantize_row(type, src, dst, n);
    }
  });
}

// int8 activations per 32-block.
void check_against_reference(const Matrix& m, const std::vector<float>& x, int64_t n_tokens,
                             const std::vector<float>& y, const std::string& what) {
  test::expect_near_reference(m, x, n_tokens, y, 32, what);
}

struct Format {
  QuantType type;
  Int4Grid grid;
  const char* name;
};

TEST(IntMatmul, EveryIsaMatchesReferenceAndEachOther) {
  IsaGuard guard;
  const Format formats[] = {{QuantType::kI8_CH, Int4Grid::kAsymmetric, "I8_CH"},
                            {QuantType::kI4_G128, Int4Grid::kAsymmetric, "I4_G128 asym"},
                            {QuantType::kI4_G128, Int4Grid::kSymmetric, "I4_G128 sym"}};
  for (const Format& f : formats) {
    const std::vector<int64_t> ks = f.type == QuantType::kI8_CH ? std::vector<int64_t>{32, 96, 800}
                                                                 : std::vector<int64_t>{128, 384, 1152};
    for (int64_t rows : {1, 7, 15, 17, 40}) {
      for (int64_t k : ks) {
        const Matrix m = make_matrix(f.type, f.grid, rows, k, static_cast<uint32_t>(rows * 131 + k));
        for (int64_t n_tokens : {1, 2, 9, 17}) {
          const auto x = gaussian(n_tokens * k, static_cast<uint32_t>(k * 7 + n_tokens));
          const std::string what = std::string(f.name) + " rows " + std::to_string(rows) + " k " +
                                   std::to_string(k) + " tokens " + std::to_string(n_tokens);
          test::expect_same_bits_everywhere(
              [&](const std::vector<float>& xs, int64_t n, ThreadPool* pool) { return run_matmul(m, xs, n, pool); },
              [&](const std::vector<float>& y) { check_against_reference(m, x, n_tokens, y, what); }, x, rows, k,
              n_tokens, what);
        }
      }
    }
  }
}

TEST(IntMatmul, RowSliceOfTheLmHead) {
  const Matrix m = make_matrix(QuantType::kI4_G128, Int4Grid::kAsymmetric, 50, 256, 99);
  const auto x = gaussian(3 * 256, 5);
  const auto full = run_matmul(m, x, 3, nullptr);
  std::vector<float> part(3 * 20, NAN);
  matmul_rows(m.view, 17, 37, x.data(), 3, part.data(), 20, nullptr);
  for (int t = 0; t < 3; ++t)
    for (int r = 0; r < 20; ++r) EXPECT_EQ(part[t * 20 + r], full[t * 50 + 17 + r]);
}

}  // namespace
}  // namespace tessera
