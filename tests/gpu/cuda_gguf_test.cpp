// GGUF block GEMM and f16 expansion (kernels/cuda/gguf_gemm.cu) against the CPU reference
// decoder (kernels/quant.h's dequantize_row): for every supported block type (the low-bit
// Q2_K, Q3_K, TQ1_0, TQ2_0 included), rows quantized with the CPU quantizers, a grid of shapes
// and token counts, a double-precision reference sum; the f16 expansion must be bit-identical
// to f32_to_fp16(dequantize_row(...)).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "kernels/quant.h"
#include "tests/gpu/gpu_test_util.h"

namespace tessera {
namespace {

using gpu_test::gaussian;

const QuantType kTypes[] = {QuantType::kQ8_0, QuantType::kQ4_0, QuantType::kQ5_0,
                            QuantType::kQ4_K, QuantType::kQ5_K, QuantType::kQ6_K};
const QuantType kLowBitTypes[] = {QuantType::kQ2_K, QuantType::kQ3_K, QuantType::kTQ1_0, QuantType::kTQ2_0};

// rows x cols weights in `type`, row r at r * row_bytes (padding bytes after the blocks hold
// 0xFF so a kernel that reads them shows), and the fp32 values the CPU decodes from them.
struct GgufMatrix {
  std::vector<uint8_t> bytes;
  int64_t row_bytes = 0;
  std::vector<float> values;  // [rows, cols] from dequantize_row
};

GgufMatrix make_matrix(QuantType type, int64_t rows, int64_t cols, int64_t pad_bytes, uint32_t seed) {
  GgufMatrix m;
  const int64_t blocks_bytes = static_cast<int64_t>(row_block_bytes(type, cols));
  m.row_bytes = blocks_bytes + pad_bytes;
  m.bytes.assign(static_cast<size_t>(rows * m.row_bytes), 0xFF);
  m.values.resize(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r) {
    // Rows of different magnitudes, and an offset so the K-quants' mins are used.
    std::vector<float> src = gaussian(cols, seed + static_cast<uint32_t>(r), 0.05f * static_cast<float>(1 + r % 5));
    for (size_t c = 0; c < src.size(); ++c) src[c] += 0.01f * static_cast<float>(r % 3);
    uint8_t* row = &m.bytes[static_cast<size_t>(r * m.row_bytes)];
    quantize_row(type, src.data(), row, cols);
    dequantize_row(type, row, &m.values[static_cast<size_t>(r * cols)], cols);
  }
  return m;
}

std::vector<uint16_t> to_f16(const std::vector<float>& x) {
  std::vector<uint16_t> h(x.size());
  for (size_t i = 0; i < x.size(); ++i) h[i] = f32_to_fp16(x[i]);
  return h;
}

class CudaGguf : public gpu_test::GpuTest {
 protected:
  // dequantize_gguf must give f32_to_fp16(m.values) bit for bit; gemm_gguf, for each token
  // count, the double-precision sum of m.values * x within 1e-5 + 2e-5 * sum |w x|.
  void check_matrix(QuantType type, const GgufMatrix& m, int64_t rows, int64_t cols,
                    std::span<const int64_t> token_counts, const std::string& shape) {
    const uint8_t* d_w = to_device(m.bytes);
    uint16_t* d_f16 = alloc<uint16_t>(rows * cols);
    ASSERT_EQ(api_->dequantize_gguf(static_cast<int>(type), d_w, m.row_bytes, d_f16, rows, cols, nullptr), 0)
        << shape << ": " << api_->last_error();
    const std::vector<uint16_t> f16 = to_host(d_f16, rows * cols);
    for (int64_t i = 0; i < rows * cols; ++i)
      ASSERT_EQ(f16[static_cast<size_t>(i)], f32_to_fp16(m.values[static_cast<size_t>(i)]))
          << shape << " dequantize_gguf element (" << i / cols << ", " << i % cols << ")";

    for (int64_t n : token_counts) {
      const std::vector<uint16_t> x16 = to_f16(gaussian(n * cols, static_cast<uint32_t>(n + 17 * cols)));
      std::vector<double> want(static_cast<size_t>(n * rows)), mag(want.size());
      for (int64_t t = 0; t < n; ++t)
        for (int64_t r = 0; r < rows; ++r) {
          double acc = 0, a = 0;
          for (int64_t c = 0; c < cols; ++c) {
            const double p = static_cast<double>(m.values[static_cast<size_t>(r * cols + c)]) *
                             fp16_to_f32(x16[static_cast<size_t>(t * cols + c)]);
            acc += p;
            a += std::fabs(p);
          }
          want[static_cast<size_t>(t * rows + r)] = acc;
          mag[static_cast<size_t>(t * rows + r)] = a;
        }
      float* d_y = alloc<float>(n * rows);
      ASSERT_EQ(api_->gemm_gguf(static_cast<int>(type), d_w, m.row_bytes, to_device(x16), d_y, rows, cols, n, nullptr),
                0)
          << shape << ": " << api_->last_error();
      const std::vector<float> got = to_host(d_y, n * rows);
      for (size_t i = 0; i < got.size(); ++i)
        ASSERT_NEAR(got[i], want[i], 1e-5 + 2e-5 * mag[i])
            << shape << " n=" << n << ": gemm_gguf y[" << i / static_cast<size_t>(rows) << ", "
            << i % static_cast<size_t>(rows) << "]";
    }
  }

  // Every type of `types` over rows x cols (plus a partial 256-column piece for the 32-element
  // blocks) x token_counts, on rows the CPU quantizer made.
  void check_grid(std::span<const QuantType> types, std::span<const int64_t> row_counts,
                  std::span<const int64_t> token_counts) {
    for (QuantType type : types) {
      const bool k_quant = quant_traits(type).block_elems == 256;
      std::vector<int64_t> col_counts = {256, 512, 2816};
      if (!k_quant) col_counts.push_back(96);  // a partial 256-column piece
      for (int64_t rows : row_counts) {
        for (int64_t cols : col_counts) {
          const int64_t pad = rows % 2 == 1 ? 6 : 0;  // odd row counts use a row stride > the blocks
          const GgufMatrix m = make_matrix(type, rows, cols, pad, static_cast<uint32_t>(rows * 131 + cols));
          const std::string shape = std::string(quant_name(type)) + " " + std::to_string(rows) + "x" +
                                    std::to_string(cols);
          check_matrix(type, m, rows, cols, token_counts, shape);
          if (HasFatalFailure()) return;
        }
      }
    }
  }
};

TEST_F(CudaGguf, GemmAndDequantizeMatchDequantizeRow) {
  const int64_t row_counts[] = {1, 7, 64, 300};
  const int64_t token_counts[] = {1, 3, 8, 40};
  check_grid(kTypes, row_counts, token_counts);
}

// The low-bit formats: every token-tile width of the GEMM (1, 2, 4, 8 tokens per block, full
// and partial) and more than one tile of tokens.
TEST_F(CudaGguf, LowBitGemmAndDequantizeMatchDequantizeRow) {
  const int64_t row_counts[] = {1, 7, 64, 300};
  const int64_t token_counts[] = {1, 2, 3, 5, 8, 9, 40};
  check_grid(kLowBitTypes, row_counts, token_counts);
}

// The low-bit formats on arbitrary block bytes (each fp16 scale replaced by a finite one, so the
// weights are finite): every bit pattern of the levels, scales, masks and base-3 bytes, also
// those the quantizers never write (a TQ1_0 byte >= 243, a Q3_K scale of -32), decodes as
// dequantize_row does.
TEST_F(CudaGguf, LowBitFormatsDecodeArbitraryBytesAsTheCpu) {
  struct Fp16Fields {
    QuantType type;
    std::vector<int> offsets;  // of the fp16 fields in a block
  };
  const Fp16Fields formats[] = {{QuantType::kQ2_K, {80, 82}},
                                {QuantType::kQ3_K, {108}},
                                {QuantType::kTQ1_0, {52}},
                                {QuantType::kTQ2_0, {64}}};
  const int64_t rows = 9, cols = 1024, token_counts[] = {1, 4, 9};
  std::mt19937 rng(1234);
  for (const Fp16Fields& f : formats) {
    const QuantTraits& tr = quant_traits(f.type);
    GgufMatrix m;
    m.row_bytes = static_cast<int64_t>(row_block_bytes(f.type, cols));
    m.bytes.resize(static_cast<size_t>(rows * m.row_bytes));
    for (uint8_t& b : m.bytes) b = static_cast<uint8_t>(rng());
    std::uniform_real_distribution<float> scale(-0.05f, 0.05f);
    for (int64_t blk = 0; blk < rows * cols / tr.block_elems; ++blk)
      for (int off : f.offsets) {
        const uint16_t h = f32_to_fp16(scale(rng));
        std::memcpy(&m.bytes[static_cast<size_t>(blk * tr.block_bytes + off)], &h, 2);
      }
    m.values.resize(static_cast<size_t>(rows * cols));
    for (int64_t r = 0; r < rows; ++r)
      dequantize_row(f.type, &m.bytes[static_cast<size_t>(r * m.row_bytes)], &m.values[static_cast<size_t>(r * cols)],
                     cols);
    check_matrix(f.type, m, rows, cols, token_counts, std::string(quant_name(f.type)) + " arbitrary bytes");
    if (HasFatalFailure()) return;
  }
}

TEST_F(CudaGguf, RejectsUnsupportedTypesAndBadShapes) {
  std::vector<uint8_t> bytes(1024, 0);
  const uint8_t* d_w = to_device(bytes);
  const std::vector<uint16_t> x(256, 0);
  const uint16_t* d_x = to_device(x);
  float* d_y = alloc<float>(4);
  uint16_t* d_out = alloc<uint16_t>(256);
  // Float formats, the load-time formats and the CPU's 16-row re-lays are not GGUF blocks.
  for (QuantType t : {QuantType::kF16, QuantType::kI8_CH, QuantType::kI4_G128, QuantType::kQ4_K_R16}) {
    EXPECT_EQ(api_->gemm_gguf(static_cast<int>(t), d_w, 512, d_x, d_y, 1, 256, 1, nullptr), -1) << quant_name(t);
    EXPECT_NE(std::string(api_->last_error()).find("type " + std::to_string(static_cast<int>(t))), std::string::npos)
        << api_->last_error();
    EXPECT_EQ(api_->dequantize_gguf(static_cast<int>(t), d_w, 512, d_out, 1, 256, nullptr), -1) << quant_name(t);
  }
  // Q4_K needs whole 256-element super-blocks; a row_bytes shorter than the blocks is refused.
  EXPECT_EQ(api_->gemm_gguf(static_cast<int>(QuantType::kQ4_K), d_w, 144, d_x, d_y, 1, 128, 1, nullptr), -1);
  EXPECT_EQ(api_->gemm_gguf(static_cast<int>(QuantType::kQ8_0), d_w, 30, d_x, d_y, 1, 32, 1, nullptr), -1);
  // So do the low-bit formats (256-element super-blocks of 84 / 110 / 54 / 66 bytes).
  for (QuantType t : kLowBitTypes) {
    const int bytes = quant_traits(t).block_bytes;
    EXPECT_EQ(api_->gemm_gguf(static_cast<int>(t), d_w, bytes, d_x, d_y, 1, 128, 1, nullptr), -1) << quant_name(t);
    EXPECT_EQ(api_->gemm_gguf(static_cast<int>(t), d_w, bytes - 2, d_x, d_y, 1, 256, 1, nullptr), -1) << quant_name(t);
    EXPECT_EQ(api_->dequantize_gguf(static_cast<int>(t), d_w, bytes + 1, d_out, 1, 256, nullptr), -1) << quant_name(t);
    EXPECT_EQ(api_->gemm_gguf(static_cast<int>(t), d_w, bytes, d_x, d_y, 0, 256, 1, nullptr), 0) << api_->last_error();
  }
  // Empty shapes are fine.
  EXPECT_EQ(api_->gemm_gguf(static_cast<int>(QuantType::kQ8_0), d_w, 34, d_x, d_y, 0, 32, 1, nullptr), 0)
      << api_->last_error();
  EXPECT_EQ(api_->gemm_gguf(static_cast<int>(QuantType::kQ8_0), d_w, 34, d_x, d_y, 1, 32, 0, nullptr), 0)
      << api_->last_error();
}

}  // namespace
}  // namespace tessera
