#include "common/dtype.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/cuda/cuda_api.h"  // a C header: the GGUF type ids of the CUDA ABI

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

std::vector<QuantType> all_types() {
  std::vector<QuantType> v;
  for (int i = 0; i < static_cast<int>(QuantType::kCount); ++i) v.push_back(static_cast<QuantType>(i));
  return v;
}

TEST(DtypeTest, EveryFormatsRowIsSelfConsistent) {
  std::set<std::string> names;
  for (QuantType t : all_types()) {
    const QuantTraits& tr = quant_traits(t);
    SCOPED_TRACE(std::string(tr.name));
    EXPECT_TRUE(names.insert(std::string(tr.name)).second) << "name listed twice";
    EXPECT_EQ(quant_from_name(tr.name), t);
    ASSERT_GE(tr.block_elems, 1);
    ASSERT_GE(tr.block_bytes, 1);
    EXPECT_GE(tr.row_extra_bytes, 0);
    // A row of k elements: k / block_elems blocks, then the trailer.
    for (int64_t n : {1, 3, 40}) {
      const int64_t k = n * tr.block_elems;
      EXPECT_EQ(row_block_bytes(t, k), static_cast<size_t>(n * tr.block_bytes));
      EXPECT_EQ(row_bytes(t, k), static_cast<size_t>(n * tr.block_bytes + tr.row_extra_bytes));
    }
    // ggml ids round-trip, and the ggml table gives this row's sizes.
    if (tr.ggml_type >= 0) {
      EXPECT_EQ(quant_from_ggml(tr.ggml_type), t);
      const std::optional<GgmlTypeInfo> g = ggml_type_info(tr.ggml_type);
      ASSERT_TRUE(g.has_value());
      EXPECT_EQ(g->type, t);
      EXPECT_EQ(g->name, tr.name);
      EXPECT_EQ(g->block_elems, tr.block_elems);
      EXPECT_EQ(g->block_bytes, tr.block_bytes);
      EXPECT_EQ(tr.row_extra_bytes, 0) << "GGUF rows have no trailer";
      EXPECT_FALSE(tr.quant_at_load);
    }
    EXPECT_EQ(tr.is_float, tr.cpu == CpuMatmul::kFloat);
    // A 16-row re-lay: same geometry and bytes per row as its base, CPU only, never in files.
    if (tr.r16 != QuantType::kCount) {
      const QuantTraits& r = quant_traits(tr.r16);
      EXPECT_EQ(r.r16_base, t);
      EXPECT_EQ(r.r16, QuantType::kCount);
      EXPECT_EQ(r.block_elems, tr.block_elems);
      EXPECT_EQ(r.block_bytes, tr.block_bytes);
      EXPECT_EQ(r.row_extra_bytes, tr.row_extra_bytes);
      for (int64_t n : {1, 7}) EXPECT_EQ(row_bytes(tr.r16, n * tr.block_elems), row_bytes(t, n * tr.block_elems));
      EXPECT_EQ(tr.cpu, CpuMatmul::kIntDot);
      EXPECT_EQ(r.cpu, CpuMatmul::kIntDot);
    }
    if (tr.r16_base != t) {
      EXPECT_EQ(quant_traits(tr.r16_base).r16, t);
      EXPECT_EQ(tr.ggml_type, -1);
      EXPECT_FALSE(tr.quant_at_load);
      EXPECT_EQ(tr.cuda, CudaWeightForm::kNone) << "the CPU's re-lays never reach the device";
    } else {
      EXPECT_NE(tr.cuda, CudaWeightForm::kNone) << "every stored format can be uploaded";
    }
    if (t == QuantType::kQ2_K || t == QuantType::kQ3_K || t == QuantType::kTQ1_0 || t == QuantType::kTQ2_0) {
      EXPECT_EQ(tr.cpu, CpuMatmul::kIntDot) << tr.name;
    }
    // Widening rows to fp32 is left to the plain integer types.
    EXPECT_EQ(tr.cpu == CpuMatmul::kWiden, t == QuantType::kI8 || t == QuantType::kI32) << tr.name;
    // What CUDA reads as stored is a GGUF block format the CPU computes as stored too.
    if (tr.cuda == CudaWeightForm::kBlocks) {
      EXPECT_FALSE(tr.is_float);
      EXPECT_GE(tr.ggml_type, 0);
      EXPECT_GE(tr.block_elems, 32);
      EXPECT_EQ(tr.cpu, CpuMatmul::kIntDot);
    }
    // The load-time formats are made from float checkpoints and split for the CUDA kernels.
    EXPECT_EQ(tr.quant_at_load, t == QuantType::kI8_CH || t == QuantType::kI4_G128);
    EXPECT_EQ(tr.quant_at_load, tr.cuda == CudaWeightForm::kRepacked);
    // Every format Tessera reads has a layout for the planner; the re-lays and plain integers not.
    EXPECT_EQ(tr.layout.empty(), tr.r16_base != t || tr.cpu == CpuMatmul::kWiden);
    // A GGUF file of it throughout can be written where it is in files (floats and GGUF blocks).
    EXPECT_EQ(tr.file_type >= 0, tr.is_float || tr.cuda == CudaWeightForm::kBlocks);
    // Fallbacks are formats of smaller blocks that need no fallback themselves.
    for (const QuantType f : {tr.load_fallback, tr.file_fallback}) {
      if (f == QuantType::kCount) continue;
      EXPECT_EQ(tr.block_elems % quant_traits(f).block_elems, 0);
      EXPECT_EQ(quant_traits(f).load_fallback, QuantType::kCount);
    }
  }
  EXPECT_EQ(row_bytes(QuantType::kI8_CH, 4096), 4096u + 4u);  // the fp32 row scale
}

TEST(DtypeTest, CudaBlockFormatsAreTheCudaAbisGgufTypes) {
  // Both come from common/block_geometry.h's list: each ABI value is its format's QuantType.
  std::set<int> abi;
#define TESSERA_TEST_ABI_TYPE(format, elems, bytes)                                        \
  abi.insert(TESSERA_CUDA_GGUF_##format);                                                 \
  EXPECT_EQ(TESSERA_CUDA_GGUF_##format, static_cast<int>(QuantType::k##format)) << #format; \
  EXPECT_EQ(quant_traits(QuantType::k##format).name, #format);
  TESSERA_GGUF_BLOCK_FORMATS(TESSERA_TEST_ABI_TYPE)
#undef TESSERA_TEST_ABI_TYPE
  EXPECT_EQ(abi.size(), static_cast<size_t>(blocks::kListSize));
  EXPECT_EQ(TESSERA_CUDA_GGUF_Q8_0, 3);  // the ABI's values as they were written out before the list
  EXPECT_EQ(TESSERA_CUDA_GGUF_Q5_K, 7);
  EXPECT_EQ(TESSERA_CUDA_GGUF_TQ2_0, 12);
  std::set<int> table;
  for (QuantType t : all_types())
    if (quant_traits(t).cuda == CudaWeightForm::kBlocks) table.insert(static_cast<int>(t));
  EXPECT_EQ(table, abi);
}

// --quant: the names, their order and what each makes are the table's load columns.
TEST(DtypeTest, WeightQuantModesComeFromTheTable) {
  // Today's modes in the order users know; a format added to the table adds its mode after them.
  std::vector<std::string> names;
  for (const WeightQuant q : all_weight_quants()) names.emplace_back(weight_quant_name(q));
  const std::vector<std::string> today = {"none", "int8", "int4", "int4-sym", "q2_k", "q3_k", "tq1_0", "tq2_0",
                                          "f32",  "q8_0", "q4_0", "q5_0",     "q4_k", "q5_k", "q6_k"};
  ASSERT_GE(names.size(), today.size());
  EXPECT_EQ(std::vector<std::string>(names.begin(), names.begin() + static_cast<ptrdiff_t>(today.size())), today);
  for (const WeightQuant q : all_weight_quants()) {
    const std::string name(weight_quant_name(q));
    SCOPED_TRACE(name);
    auto parsed = parse_weight_quant(name);
    ASSERT_TRUE(parsed.is_ok());
    EXPECT_EQ(*parsed, q);
    if (q == WeightQuant::kNone || q == WeightQuant::kInt4Sym) continue;
    const QuantType t = weight_quant_type(q);
    EXPECT_EQ(quant_traits(t).load_name, name);
    EXPECT_EQ(weight_quant_making(t), q);
  }
  EXPECT_EQ(weight_quant_type(WeightQuant::kInt8), QuantType::kI8_CH);
  EXPECT_EQ(weight_quant_type(WeightQuant::kInt4), QuantType::kI4_G128);
  EXPECT_EQ(weight_quant_type(WeightQuant::kInt4Sym), QuantType::kI4_G128);
  EXPECT_EQ(weight_quant_type(WeightQuant::kQ5_K), QuantType::kQ5_K);
  EXPECT_EQ(weight_quant_type(WeightQuant::kNone), QuantType::kF32);
  EXPECT_EQ(weight_quant_making(QuantType::kF16), WeightQuant::kNone);
  EXPECT_EQ(weight_quant_name(static_cast<WeightQuant>(1 + static_cast<int>(QuantType::kBF16))), "?");
  auto bad = parse_weight_quant("q7_k");
  ASSERT_FALSE(bad.is_ok());
  EXPECT_TRUE(bad.status().message().starts_with(
      "--quant 'q7_k': expected one of none, int8, int4, int4-sym, q2_k, q3_k, tq1_0, tq2_0, f32, q8_0, q4_0, q5_0, "
      "q4_k, q5_k, q6_k"))
      << bad.status().message();
  const std::string help = weight_quant_help();
  EXPECT_TRUE(help.starts_with("none, int8, int4 (asymmetric, groups of 128), int4-sym, the GGUF formats q8_0, q4_0, "
                               "q5_0 (columns a multiple of 32), q2_k, q3_k, tq1_0, tq2_0, q4_k, q5_k, q6_k"))
      << help;
  EXPECT_TRUE(help.ends_with("(a multiple of 256), or f32 (widen to fp32: the reference precision)")) << help;
}

TEST(DtypeTest, WeightQuantFallsBackWhereColumnsFillNoSuperBlock) {
  const std::tuple<WeightQuant, QuantType> fallbacks[] = {
      {WeightQuant::kQ2_K, QuantType::kQ4_0}, {WeightQuant::kQ3_K, QuantType::kQ4_0},
      {WeightQuant::kTQ1_0, QuantType::kQ4_0}, {WeightQuant::kTQ2_0, QuantType::kQ4_0},
      {WeightQuant::kQ4_K, QuantType::kQ5_0}, {WeightQuant::kQ5_K, QuantType::kQ5_0},
      {WeightQuant::kQ6_K, QuantType::kQ8_0}};
  for (const auto& [q, fallback] : fallbacks) {
    SCOPED_TRACE(std::string(weight_quant_name(q)));
    EXPECT_EQ(weight_quant_type_for(q, 768), weight_quant_type(q));
    EXPECT_EQ(weight_quant_type_for(q, 640), fallback);  // Gemma-3-270M's hidden size
    EXPECT_EQ(weight_quant_type_for(q, 100), fallback);  // fits neither: the caller decides
  }
  for (const WeightQuant q : all_weight_quants()) {
    const QuantType t = weight_quant_type(q);
    if (quant_traits(t).load_fallback != QuantType::kCount) continue;
    EXPECT_EQ(weight_quant_type_for(q, 100), t) << weight_quant_name(q);  // no fallback: the format itself
  }
}

TEST(DtypeTest, Int4GroupLayout) {
  Int4Group g;
  g.scale_fp16 = 0x3c00;
  g.zero = 7;
  for (int i = 0; i < kInt4Group; ++i) g.levels[i] = static_cast<uint8_t>(i % 16);
  uint8_t bytes[68];
  write_int4_group(g, bytes);
  EXPECT_EQ(bytes[0], 0x00);
  EXPECT_EQ(bytes[1], 0x3c);
  EXPECT_EQ(bytes[2], 7);
  EXPECT_EQ(bytes[3], 0);
  // Byte j of sub-block s: element 32s + j low, element 32s + 16 + j high.
  EXPECT_EQ(bytes[4 + 16 * 1 + 3], static_cast<uint8_t>((35 % 16) | ((51 % 16) << 4)));
  EXPECT_EQ(row_bytes(QuantType::kI4_G128, kInt4Group), sizeof(bytes));
}

TEST(DtypeTest, GgmlTypeTable) {
  const std::span<const int> ids = ggml_type_ids();
  ASSERT_FALSE(ids.empty());
  std::set<std::string> names;
  size_t with_quant = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i > 0) {
      EXPECT_LT(ids[i - 1], ids[i]);
    }
    const std::optional<GgmlTypeInfo> g = ggml_type_info(ids[i]);
    ASSERT_TRUE(g.has_value()) << ids[i];
    SCOPED_TRACE(std::string(g->name));
    EXPECT_EQ(g->id, ids[i]);
    EXPECT_TRUE(names.insert(std::string(g->name)).second);
    EXPECT_GE(g->block_elems, 1);
    EXPECT_GE(g->block_bytes, 1);
    EXPECT_EQ(g->type, quant_from_ggml(ids[i]));
    with_quant += g->type.has_value();
  }
  size_t quant_with_ggml = 0;
  for (QuantType t : all_types()) quant_with_ggml += quant_traits(t).ggml_type >= 0;
  EXPECT_EQ(with_quant, quant_with_ggml);
  // Types Tessera cannot compute with still have their sizes.
  const auto q8k = ggml_type_info(15);
  ASSERT_TRUE(q8k.has_value());
  EXPECT_EQ(q8k->name, "Q8_K");
  EXPECT_EQ(q8k->block_elems, 256);
  EXPECT_EQ(q8k->block_bytes, 292);
  EXPECT_FALSE(q8k->type.has_value());
  // The low-bit GGUF formats, ggml's sizes and ids.
  for (auto [id, name, bytes, type] : {std::tuple{10, "Q2_K", 84, QuantType::kQ2_K}, {11, "Q3_K", 110, QuantType::kQ3_K},
                                       {34, "TQ1_0", 54, QuantType::kTQ1_0}, {35, "TQ2_0", 66, QuantType::kTQ2_0}}) {
    const auto g = ggml_type_info(id);
    ASSERT_TRUE(g.has_value()) << name;
    EXPECT_EQ(g->name, name);
    EXPECT_EQ(g->block_elems, 256);
    EXPECT_EQ(g->block_bytes, bytes);
    EXPECT_EQ(g->type, type);
  }
  EXPECT_EQ(ggml_type_info(39)->name, "MXFP4");
  EXPECT_FALSE(ggml_type_info(4).has_value());  // removed from ggml (Q4_2)
  EXPECT_FALSE(ggml_type_info(-1).has_value());
  EXPECT_FALSE(ggml_type_info(99).has_value());
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
