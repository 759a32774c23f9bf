// The matmul precision switch of kernels/gemm.h: which kernel a float weight reaches in each
// mode, the modes' names, and that matmul() in the bf16 mode is the bf16 kernel's arithmetic
// (so a token alone and in a batch, with or without a thread pool, get the same bits).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "common/dtype.h"
#include "common/tensor.h"
#include "common/thread_pool.h"
#include "kernels/cpu/fgemm.h"
#include "kernels/cpu/fgemm_bf16.h"
#include "kernels/gemm.h"

namespace tessera {
namespace {

struct F16Matrix {
  std::vector<uint16_t> data;
  TensorView view;
};

F16Matrix random_f16(int64_t rows, int64_t cols, uint32_t seed) {
  F16Matrix m;
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 0.5f);
  m.data.resize(static_cast<size_t>(rows * cols));
  for (auto& h : m.data) h = f32_to_fp16(d(rng));
  m.view = make_view(m.data.data(), QuantType::kF16, {rows, cols});
  return m;
}

std::vector<float> random_acts(int64_t n, int64_t k, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(n * k));
  for (float& v : x) v = d(rng);
  return x;
}

TEST(MatmulPrecision, NamesParseAndPrint) {
  for (MatmulPrecision p : {MatmulPrecision::kAuto, MatmulPrecision::kFp32, MatmulPrecision::kBf16}) {
    MatmulPrecision q = MatmulPrecision::kFp32;
    ASSERT_TRUE(parse_matmul_precision(matmul_precision_name(p), &q));
    EXPECT_EQ(q, p);
  }
  MatmulPrecision q = MatmulPrecision::kAuto;
  EXPECT_FALSE(parse_matmul_precision("fp16", &q));
  EXPECT_FALSE(parse_matmul_precision("", &q));
}

TEST(MatmulPrecision, WhatEachWeightTypeComputesWith) {
  MatmulPrecisionScope guard(matmul_precision());  // restored after the test
  ASSERT_TRUE(set_matmul_precision(MatmulPrecision::kFp32).is_ok());
  EXPECT_STREQ(matmul_compute_for(QuantType::kF16), "fp32");
  EXPECT_STREQ(matmul_compute_for(QuantType::kQ4_K), "int8-dot");
  ASSERT_TRUE(set_matmul_precision(MatmulPrecision::kAuto).is_ok());
  // auto: 16-bit weights take the bf16 dot products where the CPU has them and they outrun the
  // fp32 fma; F32 weights never.
  EXPECT_STREQ(matmul_compute_for(QuantType::kF16), cpu::bf16_dot_pays() ? "bf16" : "fp32");
  EXPECT_STREQ(matmul_compute_for(QuantType::kBF16), cpu::bf16_dot_pays() ? "bf16" : "fp32");
  if (!cpu::has_bf16_dot()) {
    EXPECT_FALSE(cpu::bf16_dot_pays());
  }
  EXPECT_STREQ(matmul_compute_for(QuantType::kF32), "fp32");
  const Status bf16 = set_matmul_precision(MatmulPrecision::kBf16);
  if (cpu::has_bf16_dot()) {
    ASSERT_TRUE(bf16.is_ok());
    EXPECT_STREQ(matmul_compute_for(QuantType::kF32), "bf16");
  } else {
    EXPECT_EQ(bf16.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(bf16.message().find("AVX512_BF16"), std::string::npos) << bf16.message();
    EXPECT_EQ(matmul_precision(), MatmulPrecision::kAuto);  // unchanged
  }
}

// The measured rate of the bf16 dot product: positive where the CPU has it (a Zen 4 / 5 gives
// about 2, an Intel Xeon of the Sapphire / Emerald Rapids class 0.5; the test does not assert on
// speed), the same value on every call, and what auto decides by.
TEST(MatmulPrecision, AutoFollowsTheMeasuredBf16DotRate) {
  const double speedup = cpu::bf16_dot_speedup();
  EXPECT_EQ(cpu::bf16_dot_speedup(), speedup);
  if (!cpu::has_bf16_dot()) {
    EXPECT_EQ(speedup, 0.0);
    return;
  }
  EXPECT_GT(speedup, 0.0);
  EXPECT_LT(speedup, 16.0);
  EXPECT_EQ(cpu::bf16_dot_pays(), speedup >= cpu::kBf16DotMinSpeedup);
}

TEST(MatmulPrecision, Bf16ModeIsTheBf16KernelForAnyBatchAndThreads) {
  if (!cpu::has_bf16_dot()) GTEST_SKIP() << "no AVX512_BF16 on this CPU";
  MatmulPrecisionScope guard(matmul_precision());  // restored after the test
  ASSERT_TRUE(set_matmul_precision(MatmulPrecision::kBf16).is_ok());
  constexpr int64_t kRows = 72, kCols = 800, kTokens = 37;
  const F16Matrix w = random_f16(kRows, kCols, 7);
  const std::vector<float> x = random_acts(kTokens, kCols, 8);
  // The expected bits: the scalar reference of fgemm_bf16.h.
  std::vector<uint16_t> xb(cpu::bf16_acts_bytes(kTokens, kCols) / 2);
  cpu::convert_acts_bf16(x.data(), kCols, 0, kTokens, xb.data());
  std::vector<float> want(static_cast<size_t>(kTokens * kRows));
  cpu::FMatmulArgs a;
  a.type = QuantType::kF16;
  a.w = reinterpret_cast<const uint8_t*>(w.data.data());
  a.row_bytes = static_cast<size_t>(kCols) * 2;
  a.k = kCols;
  a.n_tokens = kTokens;
  a.y = want.data();
  a.y_stride = kRows;
  cpu::fmatmul_bf16_reference(a, xb.data(), 0, kRows);

  ThreadPoolOptions po;
  po.num_threads = 3;
  ThreadPool pool(po);
  std::vector<float> batch(want.size()), alone(want.size());
  matmul(w.view, x.data(), kTokens, batch.data(), &pool);
  for (int64_t t = 0; t < kTokens; ++t) matmul(w.view, x.data() + t * kCols, 1, alone.data() + t * kRows, nullptr);
  EXPECT_EQ(std::memcmp(batch.data(), want.data(), want.size() * 4), 0) << "batch differs from the reference";
  EXPECT_EQ(std::memcmp(alone.data(), want.data(), want.size() * 4), 0) << "a token alone differs from the reference";

  // fp32 mode: the fp32 kernel, which differs from the bf16 one (the switch really switches).
  ASSERT_TRUE(set_matmul_precision(MatmulPrecision::kFp32).is_ok());
  std::vector<float> fp32(want.size());
  matmul(w.view, x.data(), kTokens, fp32.data(), &pool);
  EXPECT_NE(std::memcmp(fp32.data(), want.data(), want.size() * 4), 0);
  // bf16 accuracy: each input rounded to 8 significant bits (relative error <= 2^-9), so each
  // product is within ~2^-8 of the exact one; the bound is on the sum of |products|.
  for (int64_t t = 0; t < kTokens; ++t)
    for (int64_t r = 0; r < kRows; ++r) {
      double mag = 0;
      for (int64_t c = 0; c < kCols; ++c)
        mag += std::abs(static_cast<double>(fp16_to_f32(w.data[static_cast<size_t>(r * kCols + c)])) *
                        x[static_cast<size_t>(t * kCols + c)]);
      const size_t i = static_cast<size_t>(t * kRows + r);
      ASSERT_LE(std::abs(static_cast<double>(fp32[i]) - want[i]), 0x1p-7 * mag)
          << "bf16 and fp32 should agree to bf16 accuracy: token " << t << " row " << r;
    }
}

}  // namespace
}  // namespace tessera
