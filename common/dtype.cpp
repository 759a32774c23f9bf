#include "common/dtype.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <cmath>
#include <cstring>
#include <iterator>
#include <map>
#include <optional>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "common/block_geometry.h"
#include "common/check.h"

namespace tessera {
namespace {

using Q = QuantType;
using Cpu = CpuMatmul;
using Cuda = CudaWeightForm;
constexpr Q kNoR16 = Q::kCount;
constexpr Q kNone = Q::kCount;  // no load_fallback / file_fallback

// THE table of formats (common/dtype.h). GGUF block sizes follow ggml's published layouts.
// Each row is two lines: what the format is and who computes it; then who makes it (--quant,
// tessera-make-model's GGUF files) and how `tessera plan` describes it.
constexpr std::array<QuantTraits, static_cast<size_t>(Q::kCount)> kTraits = {{
    // type, name, elems, bytes (GGUF blocks: common/block_geometry.h), trailer, ggml, float, at load, cpu, cuda, r16, r16_base,
    //   load_name, load_order, load_fallback, file_type, file_fallback, layout
    {Q::kF32,         "F32",         1,                     4,                     0,  0,   true,  false, Cpu::kFloat,  Cuda::kF16,       kNoR16,           Q::kF32,
     "f32",   7,  kNone,     0,  kNone,     "32-bit float"},
    {Q::kF16,         "F16",         1,                     2,                     0,  1,   true,  false, Cpu::kFloat,  Cuda::kF16,       kNoR16,           Q::kF16,
     "",      0,  kNone,     1,  kNone,     "16-bit float"},
    {Q::kBF16,        "BF16",        1,                     2,                     0,  30,  true,  false, Cpu::kFloat,  Cuda::kF16,       kNoR16,           Q::kBF16,
     "",      0,  kNone,     32, kNone,     "bfloat16"},
    {Q::kQ8_0,        "Q8_0",        blocks::kQ8_0.elems,   blocks::kQ8_0.bytes,   0,  8,   false, false, Cpu::kIntDot, Cuda::kBlocks,    Q::kQ8_0_R16,     Q::kQ8_0,
     "q8_0",  8,  kNone,     7,  kNone,     "GGUF Q8_0: 32 x int8 + fp16 scale per 32"},
    {Q::kQ4_0,        "Q4_0",        blocks::kQ4_0.elems,   blocks::kQ4_0.bytes,   0,  2,   false, false, Cpu::kIntDot, Cuda::kBlocks,    Q::kQ4_0_R16,     Q::kQ4_0,
     "q4_0",  9,  kNone,     2,  kNone,     "GGUF Q4_0: 16 B of nibbles + fp16 scale per 32"},
    {Q::kQ5_0,        "Q5_0",        blocks::kQ5_0.elems,   blocks::kQ5_0.bytes,   0,  6,   false, false, Cpu::kIntDot, Cuda::kBlocks,    Q::kQ5_0_R16,     Q::kQ5_0,
     "q5_0",  10, kNone,     8,  kNone,     "GGUF Q5_0: 16 B of nibbles + 4 B of high bits + fp16 scale per 32"},
    {Q::kQ4_K,        "Q4_K",        blocks::kQ4_K.elems,   blocks::kQ4_K.bytes,   0,  12,  false, false, Cpu::kIntDot, Cuda::kBlocks,    Q::kQ4_K_R16,     Q::kQ4_K,
     "q4_k",  11, Q::kQ5_0,  14, Q::kQ5_0,  "GGUF Q4_K: 144 B per super-block of 256"},
    {Q::kQ5_K,        "Q5_K",        blocks::kQ5_K.elems,   blocks::kQ5_K.bytes,   0,  13,  false, false, Cpu::kIntDot, Cuda::kBlocks,    Q::kQ5_K_R16,     Q::kQ5_K,
     "q5_k",  12, Q::kQ5_0,  16, Q::kQ8_0,  "GGUF Q5_K: 176 B per super-block of 256"},
    {Q::kQ6_K,        "Q6_K",        blocks::kQ6_K.elems,   blocks::kQ6_K.bytes,   0,  14,  false, false, Cpu::kIntDot, Cuda::kBlocks,    Q::kQ6_K_R16,     Q::kQ6_K,
     "q6_k",  13, Q::kQ8_0,  18, Q::kQ8_0,  "GGUF Q6_K: 210 B per super-block of 256"},
    {Q::kQ2_K,        "Q2_K",        blocks::kQ2_K.elems,   blocks::kQ2_K.bytes,   0,  10,  false, false, Cpu::kIntDot, Cuda::kBlocks,    kNoR16,           Q::kQ2_K,
     "q2_k",  3,  Q::kQ4_0,  10, Q::kQ4_0,  "GGUF Q2_K: 84 B per super-block of 256"},
    {Q::kQ3_K,        "Q3_K",        blocks::kQ3_K.elems,   blocks::kQ3_K.bytes,   0,  11,  false, false, Cpu::kIntDot, Cuda::kBlocks,    kNoR16,           Q::kQ3_K,
     "q3_k",  4,  Q::kQ4_0,  11, Q::kQ4_0,  "GGUF Q3_K: 110 B per super-block of 256"},
    {Q::kTQ1_0,       "TQ1_0",       blocks::kTQ1_0.elems,  blocks::kTQ1_0.bytes,  0,  34,  false, false, Cpu::kIntDot, Cuda::kBlocks,    kNoR16,           Q::kTQ1_0,
     "tq1_0", 5,  Q::kQ4_0,  36, kNone,     "GGUF TQ1_0: ternary, 5 trits per byte, 54 B per super-block of 256"},
    {Q::kTQ2_0,       "TQ2_0",       blocks::kTQ2_0.elems,  blocks::kTQ2_0.bytes,  0,  35,  false, false, Cpu::kIntDot, Cuda::kBlocks,    kNoR16,           Q::kTQ2_0,
     "tq2_0", 6,  Q::kQ4_0,  37, kNone,     "GGUF TQ2_0: ternary, 66 B per super-block of 256"},
    {Q::kI8,          "I8",          1,                     1,                     0,  24,  false, false, Cpu::kWiden,  Cuda::kF16,       kNoR16,           Q::kI8,
     "",      0,  kNone,     -1, kNone,     ""},
    {Q::kI32,         "I32",         1,                     4,                     0,  26,  false, false, Cpu::kWiden,  Cuda::kF16,       kNoR16,           Q::kI32,
     "",      0,  kNone,     -1, kNone,     ""},
    {Q::kI8_CH,       "I8_CH",       32,                    32,                    4,  -1,  false, true,  Cpu::kIntDot, Cuda::kRepacked,  Q::kI8_CH_R16,    Q::kI8_CH,
     "int8",  1,  kNone,     -1, kNone,     "8-bit per-channel (W8A16, I8_CH): int8 + one fp32 scale per output row"},
    {Q::kI4_G128,     "I4_G128",     128,                   68,                    0,  -1,  false, true,  Cpu::kIntDot, Cuda::kRepacked,  Q::kI4_G128_R16,  Q::kI4_G128,
     "int4",  2,  kNone,     -1, kNone,     "4-bit, group 128 (W4A16, I4_G128): 64 B of nibbles + fp16 scale + uint8 zero + 1 B pad per group"},
    {Q::kQ8_0_R16,    "Q8_0_R16",    blocks::kQ8_0.elems,   blocks::kQ8_0.bytes,   0,  -1,  false, false, Cpu::kIntDot, Cuda::kNone,      kNoR16,           Q::kQ8_0,
     "",      0,  kNone,     -1, kNone,     ""},
    {Q::kQ4_0_R16,    "Q4_0_R16",    blocks::kQ4_0.elems,   blocks::kQ4_0.bytes,   0,  -1,  false, false, Cpu::kIntDot, Cuda::kNone,      kNoR16,           Q::kQ4_0,
     "",      0,  kNone,     -1, kNone,     ""},
    {Q::kQ5_0_R16,    "Q5_0_R16",    blocks::kQ5_0.elems,   blocks::kQ5_0.bytes,   0,  -1,  false, false, Cpu::kIntDot, Cuda::kNone,      kNoR16,           Q::kQ5_0,
     "",      0,  kNone,     -1, kNone,     ""},
    {Q::kQ4_K_R16,    "Q4_K_R16",    blocks::kQ4_K.elems,   blocks::kQ4_K.bytes,   0,  -1,  false, false, Cpu::kIntDot, Cuda::kNone,      kNoR16,           Q::kQ4_K,
     "",      0,  kNone,     -1, kNone,     ""},
    {Q::kQ5_K_R16,    "Q5_K_R16",    blocks::kQ5_K.elems,   blocks::kQ5_K.bytes,   0,  -1,  false, false, Cpu::kIntDot, Cuda::kNone,      kNoR16,           Q::kQ5_K,
     "",      0,  kNone,     -1, kNone,     ""},
    {Q::kQ6_K_R16,    "Q6_K_R16",    blocks::kQ6_K.elems,   blocks::kQ6_K.bytes,   0,  -1,  false, false, Cpu::kIntDot, Cuda::kNone,      kNoR16,           Q::kQ6_K,
     "",      0,  kNone,     -1, kNone,     ""},
    {Q::kI8_CH_R16,   "I8_CH_R16",   32,                    32,                    4,  -1,  false, false, Cpu::kIntDot, Cuda::kNone,      kNoR16,           Q::kI8_CH,
     "",      0,  kNone,     -1, kNone,     ""},
    {Q::kI4_G128_R16, "I4_G128_R16", 128,                   68,                    0,  -1,  false, false, Cpu::kIntDot, Cuda::kNone,      kNoR16,           Q::kI4_G128,
     "",      0,  kNone,     -1, kNone,     ""},
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

// --quant's columns: a mode per load_name, each with its own place in the list; a fallback is a
// format of fewer elements per block that the mode's own matrices cannot need a fallback of.
constexpr bool load_columns_are_consistent() {
  for (const QuantTraits& t : kTraits) {
    if (t.load_name.empty() != (t.load_order == 0) || t.load_order < 0) return false;
    for (const QuantTraits& u : kTraits)
      if (u.type != t.type && t.load_order > 0 && (u.load_order == t.load_order || u.load_name == t.load_name))
        return false;
    for (const Q f : {t.load_fallback, t.file_fallback}) {
      if (f == kNone) continue;
      const QuantTraits& fb = kTraits[static_cast<size_t>(f)];
      if (fb.block_elems >= t.block_elems || t.block_elems % fb.block_elems != 0) return false;
    }
    if (t.load_fallback != kNone && kTraits[static_cast<size_t>(t.load_fallback)].load_name.empty()) return false;
    if (t.load_fallback != kNone && t.load_name.empty()) return false;
  }
  return true;
}
static_assert(load_columns_are_consistent(),
              "common/dtype.cpp: the --quant columns of the format table contradict themselves");

// Every format of common/block_geometry.h's list: a GGUF type, with its geometry.
constexpr bool block_list_matches_table() {
#define TESSERA_CHECK_BLOCK_ROW(format, elems, bytes)                                               \
  if (const QuantTraits& t = kTraits[static_cast<size_t>(Q::k##format)];                           \
      t.name != #format || t.block_elems != (elems) || t.block_bytes != (bytes) || t.ggml_type < 0 || \
      t.cuda != Cuda::kBlocks)                                                                      \
    return false;
  TESSERA_GGUF_BLOCK_FORMATS(TESSERA_CHECK_BLOCK_ROW)
#undef TESSERA_CHECK_BLOCK_ROW
  return true;
}
static_assert(block_list_matches_table(),
              "common/block_geometry.h: a GGUF format's row in common/dtype.cpp differs");

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

void write_int4_group(const Int4Group& g, uint8_t* dst) {
  std::memcpy(dst, &g.scale_fp16, 2);
  dst[2] = g.zero;
  dst[3] = 0;
  for (int s = 0; s < 4; ++s)
    for (int j = 0; j < 16; ++j)
      dst[4 + 16 * s + j] = static_cast<uint8_t>((g.levels[32 * s + j] & 0xF) | (g.levels[32 * s + 16 + j] << 4));
}

// ---- --quant (WeightQuant) ----

namespace {

// A mode that is no format of its own: a grid of a format (listed right after that format's mode).
struct GridMode {
  WeightQuant mode;
  std::string_view name;
  QuantType type;
};
constexpr GridMode kGridModes[] = {{WeightQuant::kInt4Sym, "int4-sym", QuantType::kI4_G128}};

// The format a mode value makes, or nullopt for a value that is no mode (kNone included).
std::optional<QuantType> made_type(WeightQuant q) {
  for (const GridMode& g : kGridModes)
    if (g.mode == q) return g.type;
  const int v = static_cast<int>(q) - 1;
  if (v < 0 || v >= static_cast<int>(QuantType::kCount)) return std::nullopt;
  if (kTraits[static_cast<size_t>(v)].load_name.empty()) return std::nullopt;
  return static_cast<QuantType>(v);
}

}  // namespace

WeightQuant weight_quant_making(QuantType t) {
  const auto i = static_cast<size_t>(t);
  if (i >= kTraits.size() || kTraits[i].load_name.empty()) return WeightQuant::kNone;
  return static_cast<WeightQuant>(i + 1);
}

std::string_view weight_quant_name(WeightQuant q) {
  if (q == WeightQuant::kNone) return "none";
  for (const GridMode& g : kGridModes)
    if (g.mode == q) return g.name;
  const std::optional<QuantType> t = made_type(q);
  return t ? quant_traits(*t).load_name : "?";
}

QuantType weight_quant_type(WeightQuant q) { return made_type(q).value_or(QuantType::kF32); }

QuantType weight_quant_type_for(WeightQuant q, int64_t cols) {
  const QuantType type = weight_quant_type(q);
  const QuantTraits& tr = quant_traits(type);
  if (cols % tr.block_elems == 0 || tr.load_fallback == kNone) return type;
  return tr.load_fallback;
}

std::span<const WeightQuant> all_weight_quants() {
  static const std::vector<WeightQuant> modes = [] {
    std::vector<const QuantTraits*> made;
    for (const QuantTraits& t : kTraits)
      if (t.load_order > 0) made.push_back(&t);
    std::sort(made.begin(), made.end(),
              [](const QuantTraits* a, const QuantTraits* b) { return a->load_order < b->load_order; });
    std::vector<WeightQuant> v = {WeightQuant::kNone};
    for (const QuantTraits* t : made) {
      v.push_back(weight_quant_making(t->type));
      for (const GridMode& g : kGridModes)
        if (g.type == t->type) v.push_back(g.mode);
    }
    return v;
  }();
  return modes;
}

std::string weight_quant_names_text() {
  std::string names;
  for (const WeightQuant q : all_weight_quants())
    names += fmt::format("{}{}", names.empty() ? "" : ", ", weight_quant_name(q));
  return names;
}

std::string weight_quant_help() {
  // The modes of Tessera's own formats, then the GGUF ones by block size, then the float one.
  std::string own, floats;
  std::map<int, std::string> gguf;  // block elements -> the modes' names
  for (const WeightQuant q : all_weight_quants()) {
    if (q == WeightQuant::kNone) continue;
    const QuantType type = weight_quant_type(q);
    const QuantTraits& tr = quant_traits(type);
    const std::string_view name = weight_quant_name(q);
    std::string& list = tr.is_float ? floats : tr.ggml_type < 0 ? own : gguf[tr.block_elems];
    std::string note;
    if (tr.is_float)
      note = fmt::format(" (widen to {}: the reference precision)", type == QuantType::kF32 ? "fp32" : name);
    if (!tr.is_float && tr.ggml_type < 0 && name == tr.load_name)
      for (const GridMode& g : kGridModes)
        if (g.type == type) note = fmt::format(" (asymmetric, groups of {})", tr.block_elems);
    list += fmt::format("{}{}{}", list.empty() ? "" : ", ", name, note);
  }
  std::string formats;
  for (const auto& [elems, names] : gguf)
    formats += fmt::format("{}{} ({}a multiple of {})", formats.empty() ? "" : ", ", names,
                           formats.empty() ? "columns " : "", elems);
  return fmt::format("none, {}, the GGUF formats {}, or {}", own, formats, floats);
}

Result<WeightQuant> parse_weight_quant(std::string_view name) {
  for (const WeightQuant q : all_weight_quants())
    if (name == weight_quant_name(q)) return q;
  return Status::invalid_argument(fmt::format("--quant '{}': expected one of {}", name, weight_quant_names_text()));
}

}  // namespace tessera
