#include "common/dtype.h"

#include <array>
#include <cctype>
#include <cmath>
#include <cstring>
#include <iterator>
#include <utility>

#include "common/block_geometry.h"
#include "common/check.h"

namespace tessera {
namespace {

using Q = QuantType;
using Cpu = CpuMatmul;
using Cuda = CudaWeightForm;
constexpr Q kNoR16 = Q::kCount;

// THE table of formats (common/dtype.h). GGUF block sizes follow ggml's published layouts.
constexpr std::array<QuantTraits, static_cast<size_t>(Q::kCount)> kTraits = {{
    // type, name, elems, bytes (GGUF blocks: common/block_geometry.h), trailer, ggml, float, load, cpu, cuda, r16, r16_base
    {Q::kF32,          "F32",          1,     4,  0,      0, true,  false, Cpu::kFloat,  Cuda::kF16,      kNoR16,          Q::kF32},
    {Q::kF16,          "F16",          1,     2,  0,      1, true,  false, Cpu::kFloat,  Cuda::kF16,      kNoR16,          Q::kF16},
    {Q::kBF16,         "BF16",         1,     2,  0,     30, true,  false, Cpu::kFloat,  Cuda::kF16,      kNoR16,          Q::kBF16},
    {Q::kQ8_0,         "Q8_0",        blocks::kQ8_0.elems, blocks::kQ8_0.bytes,  0,      8, false, false, Cpu::kIntDot, Cuda::kBlocks,   Q::kQ8_0_R16,    Q::kQ8_0},
    {Q::kQ4_0,         "Q4_0",        blocks::kQ4_0.elems, blocks::kQ4_0.bytes,  0,      2, false, false, Cpu::kIntDot, Cuda::kBlocks,   Q::kQ4_0_R16,    Q::kQ4_0},
    {Q::kQ5_0,         "Q5_0",        blocks::kQ5_0.elems, blocks::kQ5_0.bytes,  0,      6, false, false, Cpu::kIntDot, Cuda::kBlocks,   Q::kQ5_0_R16,    Q::kQ5_0},
    {Q::kQ4_K,         "Q4_K",       blocks::kQ4_K.elems, blocks::kQ4_K.bytes,  0,     12, false, false, Cpu::kIntDot, Cuda::kBlocks,   Q::kQ4_K_R16,    Q::kQ4_K},
    {Q::kQ5_K,         "Q5_K",       blocks::kQ5_K.elems, blocks::kQ5_K.bytes,  0,     13, false, false, Cpu::kIntDot, Cuda::kBlocks,   Q::kQ5_K_R16,    Q::kQ5_K},
    {Q::kQ6_K,         "Q6_K",       blocks::kQ6_K.elems, blocks::kQ6_K.bytes,  0,     14, false, false, Cpu::kIntDot, Cuda::kBlocks,   Q::kQ6_K_R16,    Q::kQ6_K},
    {Q::kQ2_K,         "Q2_K",       blocks::kQ2_K.elems, blocks::kQ2_K.bytes,  0,     10, false, false, Cpu::kIntDot, Cuda::kBlocks,   kNoR16,          Q::kQ2_K},
    {Q::kQ3_K,         "Q3_K",       blocks::kQ3_K.elems, blocks::kQ3_K.bytes,  0,     11, false, false, Cpu::kIntDot, Cuda::kBlocks,   kNoR16,          Q::kQ3_K},
    {Q::kTQ1_0,        "TQ1_0",      blocks::kTQ1_0.elems, blocks::kTQ1_0.bytes, 0,     34, false, false, Cpu::kIntDot, Cuda::kBlocks,   kNoR16,          Q::kTQ1_0},
    {Q::kTQ2_0,        "TQ2_0",      blocks::kTQ2_0.elems, blocks::kTQ2_0.bytes, 0,     35, false, false, Cpu::kIntDot, Cuda::kBlocks,   kNoR16,          Q::kTQ2_0},
    {Q::kI8,           "I8",           1,     1,  0,     24, false, false, Cpu::kWiden,  Cuda::kF16,      kNoR16,          Q::kI8},
    {Q::kI32,          "I32",          1,     4,  0,     26, false, false, Cpu::kWiden,  Cuda::kF16,      kNoR16,          Q::kI32},
    {Q::kI8_CH,        "I8_CH",       32,    32,  4,     -1, false, true,  Cpu::kIntDot, Cuda::kRepacked, Q::kI8_CH_R16,   Q::kI8_CH},
    {Q::kI4_G128,      "I4_G128",    128,    68,  0,     -1, false, true,  Cpu::kIntDot, Cuda::kRepacked, Q::kI4_G128_R16, Q::kI4_G128},
    {Q::kQ8_0_R16,     "Q8_0_R16",    blocks::kQ8_0.elems, blocks::kQ8_0.bytes,  0,     -1, false, false, Cpu::kIntDot, Cuda::kNone,     kNoR16,          Q::kQ8_0},
    {Q::kQ4_0_R16,     "Q4_0_R16",    blocks::kQ4_0.elems, blocks::kQ4_0.bytes,  0,     -1, false, false, Cpu::kIntDot, Cuda::kNone,     kNoR16,          Q::kQ4_0},
    {Q::kQ5_0_R16,     "Q5_0_R16",    blocks::kQ5_0.elems, blocks::kQ5_0.bytes,  0,     -1, false, false, Cpu::kIntDot, Cuda::kNone,     kNoR16,          Q::kQ5_0},
    {Q::kQ4_K_R16,     "Q4_K_R16",   blocks::kQ4_K.elems, blocks::kQ4_K.bytes,  0,     -1, false, false, Cpu::kIntDot, Cuda::kNone,     kNoR16,          Q::kQ4_K},
    {Q::kQ5_K_R16,     "Q5_K_R16",   blocks::kQ5_K.elems, blocks::kQ5_K.bytes,  0,     -1, false, false, Cpu::kIntDot, Cuda::kNone,     kNoR16,          Q::kQ5_K},
    {Q::kQ6_K_R16,     "Q6_K_R16",   blocks::kQ6_K.elems, blocks::kQ6_K.bytes,  0,     -1, false, false, Cpu::kIntDot, Cuda::kNone,     kNoR16,          Q::kQ6_K},
    {Q::kI8_CH_R16,    "I8_CH_R16",   32,    32,  4,     -1, false, false, Cpu::kIntDot, Cuda::kNone,     kNoR16,          Q::kI8_CH},
    {Q::kI4_G128_R16,  "I4_G128_R16",128,    68,  0,     -1, false, false, Cpu::kIntDot, Cuda::kNone,     kNoR16,          Q::kI4_G128},
}};

// ggml types without a QuantType (Tessera cannot compute with them): only their geometry, so
// the GGUF loader can bounds-check their tensors. The ids with a QuantType are in kTraits.
struct GgmlOnlyType {
  int id;
  std::string_view name;
  int block_elems;
  int block_bytes;
};
constexpr GgmlOnlyType kGgmlOnly[] = {
    {3, "Q4_1", 32, 20},      {7, "Q5_1", 32, 24},     {9, "Q8_1", 32, 36},
    {15, "Q8_K", 256, 292},  {16, "IQ2_XXS", 256, 66}, {17, "IQ2_XS", 256, 74},
    {18, "IQ3_XXS", 256, 98}, {19, "IQ1_S", 256, 50},  {20, "IQ4_NL", 32, 18},  {21, "IQ3_S", 256, 110},
    {22, "IQ2_S", 256, 82},   {23, "IQ4_XS", 256, 136}, {25, "I16", 1, 2},      {27, "I64", 1, 8},
    {28, "F64", 1, 8},        {29, "IQ1_M", 256, 56},  {39, "MXFP4", 32, 17},
};

// What the rest of the tree relies on without looking (the unit test walks the rest).
constexpr bool table_is_consistent() {
  for (size_t i = 0; i < kTraits.size(); ++i) {
    const QuantTraits& t = kTraits[i];
    if (static_cast<size_t>(t.type) != i || t.block_elems < 1 || t.block_bytes < 1) return false;
    if (t.r16 != kNoR16 && kTraits[static_cast<size_t>(t.r16)].r16_base != t.type) return false;
    if (t.r16_base != t.type && kTraits[static_cast<size_t>(t.r16_base)].r16 != t.type) return false;
  }
  for (size_t i = 0; i < kTraits.size(); ++i)  // a ggml id names one format
    for (size_t j = i + 1; j < kTraits.size(); ++j)
      if (kTraits[i].ggml_type >= 0 && kTraits[i].ggml_type == kTraits[j].ggml_type) return false;
  for (const GgmlOnlyType& g : kGgmlOnly)
    for (const QuantTraits& t : kTraits)
      if (t.ggml_type == g.id) return false;
  return true;
}
static_assert(table_is_consistent(), "common/dtype.cpp: the format table contradicts itself");

constexpr size_t count_ggml_ids() {
  size_t n = std::size(kGgmlOnly);
  for (const QuantTraits& t : kTraits) n += t.ggml_type >= 0 ? 1 : 0;
  return n;
}

constexpr std::array<int, count_ggml_ids()> ggml_ids_sorted() {
  std::array<int, count_ggml_ids()> ids{};
  size_t n = 0;
  for (const QuantTraits& t : kTraits)
    if (t.ggml_type >= 0) ids[n++] = t.ggml_type;
  for (const GgmlOnlyType& g : kGgmlOnly) ids[n++] = g.id;
  for (size_t i = 1; i < n; ++i)  // insertion sort: constexpr and tiny
    for (size_t j = i; j > 0 && ids[j - 1] > ids[j]; --j) std::swap(ids[j - 1], ids[j]);
  return ids;
}
constexpr auto kGgmlIds = ggml_ids_sorted();

constexpr bool strictly_ascending(const auto& ids) {
  for (size_t i = 1; i < ids.size(); ++i)
    if (ids[i - 1] >= ids[i]) return false;
  return true;
}
static_assert(strictly_ascending(kGgmlIds), "common/dtype.cpp: a ggml type id is listed twice");

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

std::optional<GgmlTypeInfo> ggml_type_info(int ggml_type) {
  if (const std::optional<QuantType> q = quant_from_ggml(ggml_type)) {
    const QuantTraits& tr = quant_traits(*q);
    return GgmlTypeInfo{ggml_type, tr.name, tr.block_elems, tr.block_bytes, q};
  }
  for (const GgmlOnlyType& g : kGgmlOnly)
    if (g.id == ggml_type) return GgmlTypeInfo{g.id, g.name, g.block_elems, g.block_bytes, std::nullopt};
  return std::nullopt;
}

std::span<const int> ggml_type_ids() { return kGgmlIds; }

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
