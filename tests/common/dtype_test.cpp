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
    if (t == QuantType::kQ2_K || t == QuantType::kQ3_K || t == QuantType::kTQ1_0 || t == QuantType::kTQ2_0)
      EXPECT_EQ(tr.cpu, CpuMatmul::kIntDot) << tr.name;
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
  }
  EXPECT_EQ(row_bytes(QuantType::kI8_CH, 4096), 4096u + 4u);  // the fp32 row scale
}

TEST(DtypeTest, CudaBlockFormatsAreTheCudaAbisGgufTypes) {
  const std::set<int> abi = {TESSERA_CUDA_GGUF_Q8_0, TESSERA_CUDA_GGUF_Q4_0, TESSERA_CUDA_GGUF_Q5_0,
                             TESSERA_CUDA_GGUF_Q4_K, TESSERA_CUDA_GGUF_Q5_K, TESSERA_CUDA_GGUF_Q6_K,
                             TESSERA_CUDA_GGUF_Q2_K, TESSERA_CUDA_GGUF_Q3_K, TESSERA_CUDA_GGUF_TQ1_0,
                             TESSERA_CUDA_GGUF_TQ2_0};
  std::set<int> table;
  for (QuantType t : all_types())
    if (quant_traits(t).cuda == CudaWeightForm::kBlocks) table.insert(static_cast<int>(t));
  EXPECT_EQ(table, abi);
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
