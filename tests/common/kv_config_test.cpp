#include "common/kv_config.h"

#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

namespace tessera {
namespace {

// The KV dtype table: one row per value, names that parse back, the byte counts.
TEST(KvDtypeTraits, EveryRowParsesBackAndSizesItsRows) {
  std::set<int> values;
  for (const KvDtypeTraits& t : all_kv_dtypes()) {
    SCOPED_TRACE(std::string(t.name));
    EXPECT_TRUE(values.insert(static_cast<int>(t.dtype)).second);
    EXPECT_EQ(&kv_dtype_traits(t.dtype), &t);
    EXPECT_EQ(kv_dtype_name(t.dtype), t.name);
    auto parsed = parse_kv_dtype(t.name);
    ASSERT_TRUE(parsed.is_ok());
    EXPECT_EQ(*parsed, t.dtype);
    EXPECT_EQ(kv_row_bytes(t.dtype, 128), static_cast<uint64_t>(128 * t.elem_bytes + t.row_extra_bytes));
  }
  EXPECT_EQ(values, (std::set<int>{0, 1, 2, 3, 4}));
  for (const char* alias : {"F32", "f16", "i8", "Q8", "e4m3", "FP8_E4M3", "f8"}) EXPECT_TRUE(parse_kv_dtype(alias).is_ok()) << alias;
  EXPECT_EQ(*parse_kv_dtype("q8"), KvDtype::kInt8);
  EXPECT_EQ(*parse_kv_dtype("fp8_e4m3"), KvDtype::kFp8);
  auto bad = parse_kv_dtype("int4");
  ASSERT_FALSE(bad.is_ok());
  EXPECT_EQ(bad.status().message(), "unknown KV dtype 'int4': choose fp32, fp16, int8, bf16 or fp8");
  EXPECT_EQ(kv_row_bytes(KvDtype::kInt8, 256), 260u);  // head_dim int8 values + the fp32 scale
  EXPECT_EQ(kv_dtype_bytes(KvDtype::kBF16), 2);
}

// Which backend stores what: the CPU fp32, fp16, int8; CUDA fp32, fp16; bf16 and fp8 are planned.
TEST(KvDtypeTraits, WhatEachBackendStores) {
  EXPECT_TRUE(kv_dtype_stored(KvDtype::kInt8, KvBackend::kCpu));
  EXPECT_FALSE(kv_dtype_stored(KvDtype::kInt8, KvBackend::kCuda));
  EXPECT_TRUE(kv_dtype_stored(KvDtype::kF16, KvBackend::kCuda));
  for (const KvDtype planned : {KvDtype::kBF16, KvDtype::kFp8})
    for (const KvBackend b : {KvBackend::kCpu, KvBackend::kCuda}) EXPECT_FALSE(kv_dtype_stored(planned, b));
  EXPECT_EQ(kv_dtypes_stored_text(KvBackend::kCpu), "fp32, fp16 or int8");
  EXPECT_EQ(kv_dtypes_stored_text(KvBackend::kCuda), "fp32 or fp16");
  EXPECT_EQ(kv_dtypes_stored_text(KvBackend::kCpu, ", "), "fp32, fp16, int8");
  EXPECT_EQ(kv_backend_name(KvBackend::kCuda), "CUDA");
  EXPECT_EQ(kv_dtype_runtime_names(), (std::vector<std::string>{"fp32", "fp16", "int8"}));
  EXPECT_EQ(kv_dtype_names(), (std::vector<std::string>{"fp32", "fp16", "int8", "bf16", "fp8"}));
}

}  // namespace
}  // namespace tessera
