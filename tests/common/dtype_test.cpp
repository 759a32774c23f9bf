#include "common/dtype.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

namespace tessera {
namespace {

TEST(DtypeTest, TraitsTable) {
  EXPECT_EQ(quant_traits(QuantType::kQ4_K).block_bytes, 144);
  EXPECT_EQ(quant_traits(QuantType::kQ6_K).block_elems, 256);
  EXPECT_EQ(row_bytes(QuantType::kQ8_0, 64), 68u);
  EXPECT_EQ(row_bytes(QuantType::kBF16, 10), 20u);
  EXPECT_EQ(quant_from_ggml(12), QuantType::kQ4_K);
  EXPECT_EQ(quant_from_ggml(30), QuantType::kBF16);
  EXPECT_FALSE(quant_from_ggml(99).has_value());
  EXPECT_EQ(quant_from_name("q4_0"), QuantType::kQ4_0);
  for (int i = 0; i < static_cast<int>(QuantType::kCount); ++i)
    EXPECT_EQ(static_cast<int>(quant_traits(static_cast<QuantType>(i)).type), i);
}

TEST(DtypeTest, Fp16RoundTripsEveryHalf) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = fp16_to_f32(static_cast<uint16_t>(h));
    if (std::isnan(f)) continue;
    EXPECT_EQ(f32_to_fp16(f), h) << "half 0x" << std::hex << h;
  }
  EXPECT_EQ(fp16_to_f32(0x3c00), 1.0f);
  EXPECT_EQ(fp16_to_f32(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(f32_to_fp16(65520.0f), 0x7c00);  // rounds to inf
  EXPECT_EQ(f32_to_fp16(1.0f + std::ldexp(1.0f, -11)), 0x3c00);  // tie to even
}

TEST(DtypeTest, Bf16Rounding) {
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(bf16_to_f32(0x3f80), 1.0f);
  for (uint32_t b = 0; b < 0x10000; b += 7) {
    const float f = bf16_to_f32(static_cast<uint16_t>(b));
    if (std::isnan(f)) continue;
    EXPECT_EQ(f32_to_bf16(f), b);
  }
}

}  // namespace
}  // namespace tessera
