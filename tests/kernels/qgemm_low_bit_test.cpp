// The integer-dot matmul of the low-bit GGUF formats Q2_K, Q3_K, TQ1_0, TQ2_0 (kernels/cpu/
// qgemm.h): every ISA path this CPU has (scalar, AVX2, AVX-512) against the dequantized weights
// times the activations quantized as the contract quantizes them (tight: only fp32 rounding
// may differ) and against the float product (the activation-quantization bound), over a grid
// of shapes, for weights from the encoders and for random raw blocks; and the same bits on
// every ISA, thread count and batch composition (a token alone vs inside a batch).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "common/tensor.h"
#include "common/thread_pool.h"
#include "kernels/cpu/qgemm.h"
#include "kernels/cpu/vec.h"
#include "kernels/gemm.h"
#include "kernels/quant.h"
#include "tests/kernels/kernel_test_util.h"

namespace tessera {
namespace {

using test::IsaGuard;
using test::same_bits;
using test::TestMatrix;

const QuantType kLowBit[] = {QuantType::kQ2_K, QuantType::kQ3_K, QuantType::kTQ1_0, QuantType::kTQ2_0};

// Byte offsets of a block's fp16 scales (kernels/cpu/quant.cpp's layouts).
std::vector<int> f16_fields(QuantType type) {
  switch (type) {
    case QuantType::kQ2_K: return {80, 82};
    case QuantType::kQ3_K: return {108};
    case QuantType::kTQ1_0: return {52};
    default: return {64};  // TQ2_0
  }
}

// Random block bytes: every level, scale and mask pattern the format can hold, with finite fp16
// scales of either sign between 2^-10 and 1.
TestMatrix random_blocks(QuantType type, int64_t rows, int64_t cols, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_real_distribution<float> expo(-10.0f, 0.0f);
  TestMatrix m;
  const size_t rb = row_bytes(type, cols);
  const auto bb = static_cast<size_t>(quant_traits(type).block_bytes);
  m.bytes.resize(rb * static_cast<size_t>(rows));
  for (auto& b : m.bytes) b = static_cast<uint8_t>(byte(rng));
  for (size_t blk = 0; blk < m.bytes.size(); blk += bb) {
    for (int off : f16_fields(type)) {
      const float v = std::exp2(expo(rng)) * (byte(rng) % 2 ? 1.0f : -1.0f);
      const uint16_t h = f32_to_fp16(v);
      std::memcpy(&m.bytes[blk + static_cast<size_t>(off)], &h, 2);
    }
  }
  m.deq.resize(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r)
    dequantize_row(type, m.bytes.data() + static_cast<size_t>(r) * rb, m.deq.data() + r * cols, cols);
  m.view = make_view(m.bytes.data(), type, {rows, cols});
  return m;
}

TestMatrix encoded(QuantType type, int64_t rows, int64_t cols, uint32_t seed) {
  return test::make_test_matrix(type, rows, cols, seed, 0.5f);
}

// Q2_K's per-element min term dmin * m[s] (the dequantized row with every level zeroed, negated);
// 0 for the other formats. A level sum can cancel it, so the rounding bound counts it apart.
std::vector<float> q2_k_mins(const TestMatrix& m) {
  const int64_t rows = m.view.rows(), cols = m.view.cols();
  std::vector<float> mins(static_cast<size_t>(rows * cols), 0.0f);
  if (m.view.type != QuantType::kQ2_K) return mins;
  std::vector<uint8_t> bytes = m.bytes;
  for (size_t blk = 0; blk < bytes.size(); blk += 84) std::memset(&bytes[blk + 16], 0, 64);
  const size_t rb = row_bytes(QuantType::kQ2_K, cols);
  for (int64_t r = 0; r < rows; ++r) dequantize_row(QuantType::kQ2_K, bytes.data() + static_cast<size_t>(r) * rb, mins.data() + r * cols, cols);
  return mins;
}

// The activations as the contract quantizes them (qgemm.h): per 256-block q = rne(x * 127 / amax),
// scale 1 / (127 / amax); returned as q * scale in double.
std::vector<double> contract_acts(const std::vector<float>& x, int64_t n_tokens, int64_t k) {
  std::vector<double> xa(x.size());
  for (int64_t t = 0; t < n_tokens; ++t) {
    for (int64_t b = 0; b < k; b += 256) {
      const float* xb = x.data() + t * k + b;
      float amax = 0.0f;
      for (int j = 0; j < 256; ++j) amax = std::max(amax, std::fabs(xb[j]));
      const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
      const float dx = amax != 0.0f ? 1.0f / id : 0.0f;
      for (int j = 0; j < 256; ++j)
        xa[static_cast<size_t>(t * k + b + j)] = std::nearbyint(xb[j] * id) * static_cast<double>(dx);
    }
  }
  return xa;
}

// y against sum_j w_j * xa_j in double: the weights exactly as the decoder gives them, the
// activations exactly as the contract quantizes them, so only fp32 roundings differ (the
// block scale products, one fma per term, the decoder's own roundings): a few ulps of the
// magnitude sum per block. A wrong level, scale or offset moves a result by a whole term.
void expect_near_contract(const TestMatrix& m, const std::vector<float>& x, int64_t n_tokens,
                          const std::vector<float>& y, const std::string& what) {
  const int64_t rows = m.view.rows(), k = m.view.cols();
  const std::vector<double> xa = contract_acts(x, n_tokens, k);
  const std::vector<float> mins = q2_k_mins(m);
  for (int64_t t = 0; t < n_tokens; ++t) {
    for (int64_t r = 0; r < rows; ++r) {
      double ref = 0, mag = 0;
      for (int64_t c = 0; c < k; ++c) {
        const double w = m.deq[static_cast<size_t>(r * k + c)], xv = xa[static_cast<size_t>(t * k + c)];
        ref += w * xv;
        mag += (std::fabs(w) + 2.0 * std::fabs(mins[static_cast<size_t>(r * k + c)])) * std::fabs(xv);
      }
      const double got = y[static_cast<size_t>(t * rows + r)];
      ASSERT_NEAR(got, ref, 1e-5 * mag + 1e-30) << what << " token " << t << " row " << r;
    }
  }
}

std::string describe(const char* source, QuantType type, int64_t rows, int64_t k, int64_t n_tokens) {
  return std::string(source) + " " + std::string(quant_name(type)) + " rows " + std::to_string(rows) + " k " +
         std::to_string(k) + " tokens " + std::to_string(n_tokens);
}

TEST(QGemmLowBit, IntegerDotKernelsServeTheFormats) {
  for (QuantType type : kLowBit) {
    EXPECT_EQ(quant_traits(type).cpu, CpuMatmul::kIntDot) << quant_name(type);
    EXPECT_TRUE(cpu::has_qdot(type)) << quant_name(type);
    EXPECT_TRUE(cpu::is_low_bit(type)) << quant_name(type);
    EXPECT_EQ(cpu::act_block(type), cpu::kActBlock256) << quant_name(type);
    EXPECT_EQ(cpu::kernel_block_elems(type), 256) << quant_name(type);
    EXPECT_FALSE(cpu::r16_of(type, 32).has_value()) << quant_name(type);
  }
  EXPECT_FALSE(cpu::is_low_bit(QuantType::kQ4_K));
}

// Every shape of the grid, on every ISA, threads and batch composition (the same bits), the
// first ISA's result against both references.
void check_grid(const char* source, TestMatrix (*make)(QuantType, int64_t, int64_t, uint32_t)) {
  IsaGuard guard;
  for (QuantType type : kLowBit) {
    for (int64_t k : {256, 512, 1280, 2048}) {
      for (int64_t rows : {1, 3, 16, 17, 40}) {
        const TestMatrix m = make(type, rows, k, static_cast<uint32_t>(rows * 1009 + k + 7 * static_cast<int>(type)));
        for (int64_t n_tokens : {1, 2, 5, 16, 17, 33}) {
          auto x = test::gaussian(n_tokens * k, static_cast<uint32_t>(k * 13 + n_tokens));
          for (size_t i = 0; i < x.size(); i += 97) x[i] *= 8.0f;  // outliers, as hidden states have
          const std::string what = describe(source, type, rows, k, n_tokens);
          test::expect_same_bits_everywhere(
              [&](const std::vector<float>& xs, int64_t n, ThreadPool* pool) { return test::run_matmul(m, xs, n, pool); },
              [&](const std::vector<float>& y) {
                expect_near_contract(m, x, n_tokens, y, what);
                test::expect_near_reference(m, x, n_tokens, y, cpu::kActBlock256, what);
              },
              x, rows, k, n_tokens, what);
          if (::testing::Test::HasFatalFailure()) return;
        }
      }
    }
  }
}

TEST(QGemmLowBit, EncodedWeightsEveryIsaMatchesReferenceAndEachOther) { check_grid("encoded", encoded); }

TEST(QGemmLowBit, RandomBlocksEveryIsaMatchesReferenceAndEachOther) { check_grid("random blocks", random_blocks); }

TEST(QGemmLowBit, EveryBatchSizeGivesEachTokenItsBitsAlone) {
  // 2..16 tokens are the batched-decode sizes, more are prefill; 37 rows and 3 blocks per row.
  IsaGuard guard;
  for (QuantType type : kLowBit) {
    const int64_t rows = 37, k = 256 * 3;
    const TestMatrix m = random_blocks(type, rows, k, 4242 + static_cast<uint32_t>(type));
    for (int64_t n_tokens = 2; n_tokens <= 18; ++n_tokens) {
      const auto x = test::gaussian(n_tokens * k, static_cast<uint32_t>(31 * n_tokens + 5));
      const std::string what = describe("batch", type, rows, k, n_tokens);
      test::expect_same_bits_everywhere(
          [&](const std::vector<float>& xs, int64_t n, ThreadPool* pool) { return test::run_matmul(m, xs, n, pool); },
          [&](const std::vector<float>& y) { expect_near_contract(m, x, n_tokens, y, what); }, x, rows, k, n_tokens,
          what);
      if (::testing::Test::HasFatalFailure()) return;
    }
  }
}

TEST(QGemmLowBit, RowSlicesWithAStrideAndZeroActivations) {
  // A row range written with a stride (the vocabulary-parallel LM head) equals the full product;
  // an all-zero activation block (scale 0) contributes nothing.
  IsaGuard guard;
  ThreadPool pool(ThreadPoolOptions{.num_threads = 3});
  for (QuantType type : kLowBit) {
    const int64_t rows = 45, k = 256 * 5, n_tokens = 3, begin = 7, end = 38, stride = 40;
    const TestMatrix m = encoded(type, rows, k, 99);
    auto x = test::gaussian(n_tokens * k, 17);
    std::fill(x.begin() + 256, x.begin() + 512, 0.0f);
    for (cpu::Isa isa : test::supported_isas()) {
      cpu::set_max_isa(isa);
      const auto full = test::run_matmul(m, x, n_tokens, &pool);
      expect_near_contract(m, x, n_tokens, full, std::string(quant_name(type)) + " zero block");
      std::vector<float> part(static_cast<size_t>(n_tokens * stride), -7.0f);
      matmul_rows(m.view, begin, end, x.data(), n_tokens, part.data(), stride, &pool);
      for (int64_t t = 0; t < n_tokens; ++t)
        for (int64_t j = 0; j < stride; ++j)
          ASSERT_EQ(part[static_cast<size_t>(t * stride + j)],
                    j < end - begin ? full[static_cast<size_t>(t * rows + begin + j)] : -7.0f)
              << quant_name(type) << " isa " << cpu::isa_name(isa) << " t " << t << " j " << j;
    }
  }
}

}  // namespace
}  // namespace tessera
