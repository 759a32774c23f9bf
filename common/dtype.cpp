#include "common/dtype.h"

#include <array>
#include <cctype>
#include <cmath>
#include <cstring>

#include "common/check.h"

namespace tessera {
namespace {

constexpr std::array<QuantTraits, static_cast<size_t>(QuantType::kCount)> kTraits = {{
    {QuantType::kF32, "F32", 1, 4, 0, true, 0},
    {QuantType::kF16, "F16", 1, 2, 1, true, 0},
    {QuantType::kBF16, "BF16", 1, 2, 30, true, 0},
    {QuantType::kQ8_0, "Q8_0", 32, 34, 8, false, 0},
    {QuantType::kQ4_0, "Q4_0", 32, 18, 2, false, 0},
    {QuantType::kQ5_0, "Q5_0", 32, 22, 6, false, 0},
    {QuantType::kQ4_K, "Q4_K", 256, 144, 12, false, 0},
    {QuantType::kQ5_K, "Q5_K", 256, 176, 13, false, 0},
    {QuantType::kQ6_K, "Q6_K", 256, 210, 14, false, 0},
    {QuantType::kI8, "I8", 1, 1, 24, false, 0},
    {QuantType::kI32, "I32", 1, 4, 26, false, 0},
    {QuantType::kI8_CH, "I8_CH", 32, 32, -1, false, 4},
    {QuantType::kI4_G128, "I4_G128", 128, 68, -1, false, 0},
    {QuantType::kQ8_0_R16, "Q8_0_R16", 32, 34, -1, false, 0},
    {QuantType::kQ4_0_R16, "Q4_0_R16", 32, 18, -1, false, 0},
    {QuantType::kQ5_0_R16, "Q5_0_R16", 32, 22, -1, false, 0},
    {QuantType::kQ4_K_R16, "Q4_K_R16", 256, 144, -1, false, 0},
    {QuantType::kQ5_K_R16, "Q5_K_R16", 256, 176, -1, false, 0},
    {QuantType::kQ6_K_R16, "Q6_K_R16", 256, 210, -1, false, 0},
    {QuantType::kI8_CH_R16, "I8_CH_R16", 32, 32, -1, false, 4},
    {QuantType::kI4_G128_R16, "I4_G128_R16", 128, 68, -1, false, 0},
}};

}  // namespace

const QuantTraits& quant_traits(QuantType t) {
  const auto i = static_cast<size_t>(t);
  TESSERA_CHECK(i < kTraits.size(), "bad QuantType {}", i);
  return kTraits[i];
}

std::optional<QuantType> quant_from_ggml(int ggml_type) {
  for (const auto& tr : kTraits)
    if (tr.ggml_type >= 0 && tr.ggml_type == ggml_type) return tr.type;
  return std::nullopt;
}

std::optional<QuantType> quant_from_name(std::string_view name) {
  for (const auto& tr : kTraits) {
    if (tr.name.size() != name.size()) continue;
    bool eq = true;
    for (size_t i = 0; i < name.size() && eq; ++i)
      eq = std::toupper(static_cast<unsigned char>(name[i])) == tr.name[i];
    if (eq) return tr.type;
  }
  return std::nullopt;
}

float fp16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ff;
  uint32_t u;
  if (exp == 0) {
    if (mant == 0) {
      u = sign;
    } else {  // subnormal: normalise
      int e = -1;
      do {
        ++e;
        mant <<= 1;
      } while ((mant & 0x400) == 0);
      mant &= 0x3ff;
      u = sign | (static_cast<uint32_t>(127 - 15 - e) << 23) | (mant << 13);
    }
  } else if (exp == 0x1f) {
    u = sign | 0x7f800000u | (mant << 13);
  } else {
    u = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

uint16_t f32_to_fp16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint32_t sign = (u >> 16) & 0x8000;
  const uint32_t abs = u & 0x7fffffff;
  if (abs >= 0x7f800000u) {  // inf or nan
    return static_cast<uint16_t>(sign | 0x7c00 | (abs > 0x7f800000u ? 0x200 : 0));
  }
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00);  // overflow to inf
  if (abs < 0x38800000u) {  // subnormal half (or zero)
    // value = abs_f * 2^24 rounded to nearest even
    float af;
    std::memcpy(&af, &abs, 4);
    const float scaled = af * 16777216.0f;  // 2^24
    const auto q = static_cast<uint32_t>(std::nearbyint(scaled));
    return static_cast<uint16_t>(sign | q);
  }
  uint32_t mant = abs & 0x7fffff;
  uint32_t exp = (abs >> 23) - 127 + 15;
  uint32_t h = (exp << 10) | (mant >> 13);
  const uint32_t rem = mant & 0x1fff;
  if (rem > 0x1000 || (rem == 0x1000 && (h & 1))) ++h;  // may carry into exponent: correct
  return static_cast<uint16_t>(sign | h);
}

uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffff) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // quiet nan
  const uint32_t rounding = 0x7fff + ((u >> 16) & 1);
  return static_cast<uint16_t>((u + rounding) >> 16);
}

}  // namespace tessera
