#include "model/gguf.h"

#include <algorithm>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "tests/model/loader_test_util.h"

namespace tessera {
namespace {

using loader_test::Bytes;
using loader_test::GgufBuilder;
using loader_test::put;
using loader_test::put_str;
using loader_test::TempDir;

std::string f32_path() { return loader_test::stories_dir() + "/stories260K-f32.gguf"; }

Result<std::unique_ptr<GgufFile>> open_bytes(const TempDir& dir, const Bytes& b,
                                             const std::string& name = "t.gguf") {
  loader_test::write_file(dir.file(name), b);
  return GgufFile::open(dir.file(name));
}

// Every view must lie inside the mapped file.
void expect_views_inside(const GgufFile& g) {
  for (const auto& t : g.tensors()) {
    if (!t.supported) continue;
    const auto* p = static_cast<const uint8_t*>(t.view.data);
    ASSERT_GE(p, g.file_data()) << t.name;
    ASSERT_LE(static_cast<size_t>(p - g.file_data()) + t.view.nbytes(), g.file_size()) << t.name;
  }
}

TEST(Gguf, OpensStories260K) {
  TESSERA_REQUIRE_STORIES();
  auto r = GgufFile::open(f32_path());
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  const GgufFile& g = **r;
  EXPECT_EQ(g.version(), 3u);
  EXPECT_EQ(g.metadata().size(), 27u);
  EXPECT_EQ(g.tensors().size(), 47u);
  EXPECT_EQ(*g.get_string("general.architecture"), "llama");
  EXPECT_EQ(*g.get_string("general.name"), "stories260K");
  EXPECT_EQ(*g.get_int("llama.block_count"), 5);
  EXPECT_EQ(*g.get_int("llama.attention.head_count_kv"), 4);
  EXPECT_NEAR(*g.get_float("llama.attention.layer_norm_rms_epsilon"), 1e-5, 1e-10);
  EXPECT_DOUBLE_EQ(*g.get_float("llama.block_count"), 5.0);  // ints widen to float
  EXPECT_TRUE(*g.get_bool("tokenizer.ggml.add_bos_token"));
  auto tokens = g.get_string_array("tokenizer.ggml.tokens");
  ASSERT_TRUE(tokens.is_ok());
  ASSERT_EQ(tokens->size(), 512u);
  EXPECT_EQ((*tokens)[1], "<s>");
  EXPECT_EQ((*tokens)[3], "<0x00>");
  auto types = g.get_int_array("tokenizer.ggml.token_type");
  ASSERT_TRUE(types.is_ok());
  EXPECT_EQ((*types)[0], 2);
  EXPECT_EQ((*types)[3], 6);
  auto scores = g.get_float_array("tokenizer.ggml.scores");
  ASSERT_TRUE(scores.is_ok());
  EXPECT_EQ(scores->size(), 512u);

  const GgufTensorInfo* emb = g.find_tensor("token_embd.weight");
  ASSERT_NE(emb, nullptr);
  EXPECT_EQ(emb->shape, (std::vector<int64_t>{512, 64}));
  EXPECT_TRUE(emb->supported);
  EXPECT_EQ(emb->view.type, QuantType::kF32);
  EXPECT_EQ(emb->view.ndim, 2);
  EXPECT_EQ(emb->offset, 0u);
  const GgufTensorInfo* down = g.find_tensor("blk.4.ffn_down.weight");
  ASSERT_NE(down, nullptr);
  EXPECT_EQ(down->shape, (std::vector<int64_t>{64, 172}));
  EXPECT_EQ(down->view.shape_string(), "[64, 172]");
  const GgufTensorInfo* norm = g.find_tensor("output_norm.weight");
  ASSERT_NE(norm, nullptr);
  EXPECT_EQ(norm->shape, (std::vector<int64_t>{64}));
  EXPECT_EQ(g.find_tensor("output.weight"), nullptr);
  // The last tensor ends exactly at the end of the file.
  const Bytes raw = loader_test::read_file(f32_path());
  ASSERT_EQ(g.file_size(), raw.size());
  EXPECT_EQ(static_cast<const uint8_t*>(emb->view.data) - g.file_data(), 14432);
  EXPECT_EQ(static_cast<const uint8_t*>(norm->view.data) + norm->view.nbytes(),
            g.file_data() + raw.size());
  expect_views_inside(g);
  // The view shows the file's bytes.
  float f0;
  std::memcpy(&f0, raw.data() + 14432, 4);
  EXPECT_EQ(static_cast<const float*>(emb->view.data)[0], f0);
}

TEST(Gguf, OpensGgmlOrgStories) {
  TESSERA_REQUIRE_STORIES();
  auto r = GgufFile::open(loader_test::stories_dir() + "/stories260K.ggml-org.gguf");
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_EQ((*r)->tensors().size(), 48u);
  EXPECT_NE((*r)->find_tensor("output.weight"), nullptr);
  // Unset special ids are stored as UINT32_MAX.
  EXPECT_EQ(*(*r)->get_int("tokenizer.ggml.padding_token_id"), 4294967295);
}

TEST(Gguf, TypedAccessorErrors) {
  TESSERA_REQUIRE_STORIES();
  auto r = GgufFile::open(f32_path());
  ASSERT_TRUE(r.is_ok());
  const GgufFile& g = **r;
  auto missing = g.get_int("llama.nope");
  ASSERT_FALSE(missing.is_ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(missing.status().message(), f32_path() + ": no metadata key 'llama.nope'");
  auto wrong = g.get_int("general.name");
  ASSERT_FALSE(wrong.is_ok());
  EXPECT_EQ(wrong.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(wrong.status().message().find("'general.name' has type string"), std::string::npos);
  EXPECT_FALSE(g.get_string("llama.block_count").is_ok());
  EXPECT_FALSE(g.get_bool("llama.block_count").is_ok());
  EXPECT_FALSE(g.get_string_array("tokenizer.ggml.scores").is_ok());
  EXPECT_FALSE(g.get_int_array("tokenizer.ggml.tokens").is_ok());
  EXPECT_FALSE(g.get_float("tokenizer.ggml.model").is_ok());
  EXPECT_TRUE(g.has("general.name"));
  EXPECT_FALSE(g.has("general.nam"));
}

TEST(Gguf, AllValueTypes) {
  TempDir dir;
  GgufBuilder b;
  b.kv<uint8_t>("u8", loader_test::kGU8, 200)
      .kv<int8_t>("i8", loader_test::kGI8, -100)
      .kv<uint16_t>("u16", loader_test::kGU16, 60000)
      .kv<int16_t>("i16", loader_test::kGI16, -30000)
      .kv<uint32_t>("u32", loader_test::kGU32, 4000000000u)
      .kv<int32_t>("i32", loader_test::kGI32, -2000000000)
      .kv<float>("f32", loader_test::kGF32, 1.5f)
      .kv<uint8_t>("bool", loader_test::kGBool, 1)
      .kv<uint8_t>("bool2", loader_test::kGBool, 7)  // any nonzero byte is true
      .kv_str("str", "héllo")
      .kv<uint64_t>("u64", loader_test::kGU64, 1ull << 40)
      .kv<uint64_t>("u64big", loader_test::kGU64, ~0ull)
      .kv<int64_t>("i64", loader_test::kGI64, -(1ll << 50))
      .kv<double>("f64", loader_test::kGF64, 0.125)
      .kv_array<int16_t>("ai16", loader_test::kGI16, {1, -2, 3})
      .kv_array<uint8_t>("abool", loader_test::kGBool, {1, 0})
      .kv_array<double>("af64", loader_test::kGF64, {0.5, 2.0})
      .kv_array<float>("af32", loader_test::kGF32, {})
      .kv_str_array("astr", {"a", "", "ccc"});
  // An array of arrays: [[1, 2], [3]] of uint32.
  Bytes nested;
  put<uint32_t>(&nested, loader_test::kGArr);
  put<uint64_t>(&nested, 2);
  put<uint32_t>(&nested, loader_test::kGU32);
  put<uint64_t>(&nested, 2);
  put<uint32_t>(&nested, 1);
  put<uint32_t>(&nested, 2);
  put<uint32_t>(&nested, loader_test::kGU32);
  put<uint64_t>(&nested, 1);
  put<uint32_t>(&nested, 3);
  b.kv_raw("nested", loader_test::kGArr, nested);
  b.kv_str("after", "still parsed");
  auto r = open_bytes(dir, b.build());
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  const GgufFile& g = **r;
  EXPECT_EQ(*g.get_int("u8"), 200);
  EXPECT_EQ(*g.get_int("i8"), -100);
  EXPECT_EQ(*g.get_int("u16"), 60000);
  EXPECT_EQ(*g.get_int("i16"), -30000);
  EXPECT_EQ(*g.get_int("u32"), 4000000000);
  EXPECT_EQ(*g.get_int("i32"), -2000000000);
  EXPECT_EQ(*g.get_float("f32"), 1.5);
  EXPECT_TRUE(*g.get_bool("bool"));
  EXPECT_TRUE(*g.get_bool("bool2"));
  EXPECT_EQ(*g.get_string("str"), "héllo");
  EXPECT_EQ(*g.get_int("u64"), 1ll << 40);
  EXPECT_EQ(g.get_int("u64big").status().code(), StatusCode::kOutOfRange);
  EXPECT_EQ(*g.get_int("i64"), -(1ll << 50));
  EXPECT_EQ(*g.get_float("f64"), 0.125);
  EXPECT_EQ(*g.get_int_array("ai16"), (std::vector<int64_t>{1, -2, 3}));
  EXPECT_EQ(*g.get_float_array("ai16"), (std::vector<double>{1, -2, 3}));
  EXPECT_EQ(*g.get_float_array("af64"), (std::vector<double>{0.5, 2.0}));
  EXPECT_TRUE(g.get_float_array("af32")->empty());
  EXPECT_EQ(*g.get_string_array("astr"), (std::vector<std::string>{"a", "", "ccc"}));
  const GgufValue& ab = g.metadata().at("abool");
  EXPECT_EQ(ab.array_type, GgufValueType::kBool);
  EXPECT_EQ(std::get<std::vector<int64_t>>(ab.value), (std::vector<int64_t>{1, 0}));
  const GgufValue& nv = g.metadata().at("nested");
  EXPECT_EQ(nv.type, GgufValueType::kArray);
  EXPECT_EQ(nv.array_type, GgufValueType::kArray);
  EXPECT_FALSE(g.get_int_array("nested").is_ok());
  EXPECT_EQ(*g.get_string("after"), "still parsed");
  EXPECT_EQ(g.metadata().at("u32").type, GgufValueType::kUint32);
  EXPECT_TRUE(g.tensors().empty());
}

GgufBuilder two_tensor_file() {
  GgufBuilder b;
  b.kv_str("general.name", "tiny")
      .f32_tensor("a", {2, 3}, {1, 2, 3, 4, 5, 6})
      .tensor("q", {2, 32}, 8, Bytes(2 * 34, 0x11));  // Q8_0: 34 bytes per 32 elements
  return b;
}

TEST(Gguf, TensorsVersionsAndAlignment) {
  TempDir dir;
  for (uint32_t version : {2u, 3u}) {
    for (uint32_t align : {32u, 64u, 8u}) {
      SCOPED_TRACE(::testing::PrintToString(std::make_pair(version, align)));
      auto r = open_bytes(dir, two_tensor_file().build(version, align));
      ASSERT_TRUE(r.is_ok()) << r.status().to_string();
      const GgufFile& g = **r;
      EXPECT_EQ(g.version(), version);
      ASSERT_EQ(g.tensors().size(), 2u);
      const GgufTensorInfo* a = g.find_tensor("a");
      ASSERT_NE(a, nullptr);
      EXPECT_EQ(a->shape, (std::vector<int64_t>{2, 3}));
      EXPECT_EQ(static_cast<const float*>(a->view.data)[5], 6.0f);
      EXPECT_EQ(reinterpret_cast<uintptr_t>(a->view.data) % align, 0u);
      const GgufTensorInfo* q = g.find_tensor("q");
      ASSERT_NE(q, nullptr);
      EXPECT_TRUE(q->supported);
      EXPECT_EQ(q->view.type, QuantType::kQ8_0);
      EXPECT_EQ(q->view.nbytes(), 68u);
      EXPECT_EQ(static_cast<const uint8_t*>(q->view.data)[67], 0x11);
      EXPECT_EQ(q->offset % align, 0u);
    }
  }
}

TEST(Gguf, UnsupportedTypesAreListed) {
  TempDir dir;
  GgufBuilder b;
  b.tensor("iq2", {1, 256}, 16, Bytes(66, 0))      // IQ2_XXS: known size, no QuantType
      .tensor("weird", {4}, 99, Bytes(16, 0))       // unknown type id: size unknown
      .tensor("q2k", {1, 256}, 10, Bytes(84, 0))    // Q2_K: a QuantType
      .f32_tensor("ok", {2}, {1, 2});
  auto r = open_bytes(dir, b.build());
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  const GgufTensorInfo* iq2 = (*r)->find_tensor("iq2");
  ASSERT_NE(iq2, nullptr);
  EXPECT_FALSE(iq2->supported);
  EXPECT_EQ(iq2->ggml_type, 16);
  EXPECT_EQ(iq2->view.data, nullptr);
  EXPECT_EQ(ggml_type_name(16), "IQ2_XXS");
  EXPECT_EQ(ggml_type_name(10), "Q2_K");
  EXPECT_EQ(ggml_type_name(99), "unknown");
  EXPECT_FALSE((*r)->find_tensor("weird")->supported);
  EXPECT_TRUE((*r)->find_tensor("ok")->supported);
  const GgufTensorInfo* q2 = (*r)->find_tensor("q2k");
  ASSERT_NE(q2, nullptr);
  EXPECT_TRUE(q2->supported);
  EXPECT_EQ(q2->view.type, QuantType::kQ2_K);
  EXPECT_EQ(q2->view.nbytes(), 84u);

  // An IQ2_XXS tensor whose bytes would run past the end is still caught.
  GgufBuilder b2;
  b2.tensor("iq2", {2, 256}, 16, Bytes(66, 0));
  auto r2 = open_bytes(dir, b2.build());
  ASSERT_FALSE(r2.is_ok());
  EXPECT_NE(r2.status().message().find("lies outside the file"), std::string::npos);
}

void expect_corrupt(const Result<std::unique_ptr<GgufFile>>& r, const std::string& needle) {
  ASSERT_FALSE(r.is_ok()) << "expected an error containing: " << needle;
  EXPECT_NE(r.status().message().find(needle), std::string::npos) << r.status().to_string();
}

TEST(Gguf, HeaderErrors) {
  TempDir dir;
  Bytes b = two_tensor_file().build();
  Bytes bad = b;
  bad[0] = 'X';
  expect_corrupt(open_bytes(dir, bad), "not a GGUF file");
  bad = b;
  bad[4] = 1;
  auto v1 = open_bytes(dir, bad);
  expect_corrupt(v1, "version 1");
  EXPECT_EQ(v1.status().code(), StatusCode::kUnimplemented);
  bad = b;
  bad[4] = 0;
  bad[7] = 3;  // version 3 written big-endian
  expect_corrupt(open_bytes(dir, bad), "big-endian");
  bad = b;
  bad[4] = 9;
  expect_corrupt(open_bytes(dir, bad), "unknown GGUF version 9");
  bad = b;
  std::memset(bad.data() + 8, 0xff, 8);
  EXPECT_EQ(open_bytes(dir, bad).status().code(), StatusCode::kCorrupt);  // reads padding as info #2
  bad = b;
  std::memset(bad.data() + 16, 0x7f, 8);
  expect_corrupt(open_bytes(dir, bad), "in metadata key #");
  expect_corrupt(open_bytes(dir, Bytes{}), "truncated in header");
  auto missing = GgufFile::open(dir.file("nope.gguf"));
  ASSERT_FALSE(missing.is_ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kIoError);
}

TEST(Gguf, MetadataErrors) {
  TempDir dir;
  {  // string length far beyond the file: error, no allocation
    GgufBuilder b;
    Bytes v;
    put<uint64_t>(&v, ~0ull);
    b.kv_raw("general.name", loader_test::kGStr, v);
    expect_corrupt(open_bytes(dir, b.build()), "string length 18446744073709551615 in metadata key 'general.name'");
  }
  {  // array count beyond the file
    GgufBuilder b;
    Bytes v;
    put<uint32_t>(&v, loader_test::kGStr);
    put<uint64_t>(&v, 1ull << 60);
    b.kv_raw("tokenizer.ggml.tokens", loader_test::kGArr, v);
    expect_corrupt(open_bytes(dir, b.build()), "array length");
  }
  {  // plausible count, but the elements are missing
    GgufBuilder b;
    Bytes v;
    put<uint32_t>(&v, loader_test::kGU32);
    put<uint64_t>(&v, 100);  // more than the header padding could supply
    put<uint32_t>(&v, 1);
    b.kv_raw("arr", loader_test::kGArr, v);
    expect_corrupt(open_bytes(dir, b.build()), "array length 100 in metadata key 'arr'");
  }
  {
    GgufBuilder b;
    b.kv<uint32_t>("x", 13, 0);
    expect_corrupt(open_bytes(dir, b.build()), "unknown value type 13 in metadata key 'x'");
  }
  {
    GgufBuilder b;
    b.kv_u32("x", 1).kv_u32("x", 2);
    expect_corrupt(open_bytes(dir, b.build()), "duplicate metadata key 'x'");
  }
  {  // deeply nested arrays are refused rather than recursed into
    Bytes v;
    for (int i = 0; i < 20; ++i) {
      put<uint32_t>(&v, loader_test::kGArr);
      put<uint64_t>(&v, 1);
    }
    put<uint32_t>(&v, loader_test::kGU8);
    put<uint64_t>(&v, 0);
    GgufBuilder b;
    b.kv_raw("deep", loader_test::kGArr, v);
    expect_corrupt(open_bytes(dir, b.build()), "nested too deeply");
  }
  for (uint32_t bad_align : {0u, 3u, 1u << 20}) {
    GgufBuilder b;
    b.kv_u32("general.alignment", bad_align);
    expect_corrupt(open_bytes(dir, b.build()), "general.alignment");
  }
  {
    GgufBuilder b;
    b.kv_str("general.alignment", "32");
    expect_corrupt(open_bytes(dir, b.build()), "general.alignment");
  }
}

TEST(Gguf, TruncatedMetadataKeyMessage) {
  TESSERA_REQUIRE_STORIES();
  const Bytes raw = loader_test::read_file(f32_path());
  const std::string needle = "stories260K";
  auto it = std::search(raw.begin(), raw.end(), needle.begin(), needle.end());
  ASSERT_NE(it, raw.end());
  TempDir dir;
  const Bytes cut(raw.begin(), it + 3);
  const std::string path = dir.file("cut.gguf");
  loader_test::write_file(path, cut);
  auto r = GgufFile::open(path);
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), StatusCode::kCorrupt);
  EXPECT_EQ(r.status().message(), path + ": truncated in metadata key 'general.name'");
}

TEST(Gguf, TensorInfoErrors) {
  TempDir dir;
  {
    GgufBuilder b;
    b.f32_tensor("x", {1, 1, 1, 1, 2}, {1, 2});
    expect_corrupt(open_bytes(dir, b.build()), "tensor 'x' has 5 dimensions");
  }
  {
    GgufBuilder b;
    b.tensor("x", {0, 4}, 0, {});
    expect_corrupt(open_bytes(dir, b.build()), "tensor 'x' has invalid dimension");
  }
  {  // element count overflow
    GgufBuilder b;
    b.tensor("x", {int64_t{1} << 40, int64_t{1} << 40}, 0, {});
    expect_corrupt(open_bytes(dir, b.build()), "tensor 'x' has invalid dimension");
  }
  {
    GgufBuilder b;
    b.f32_tensor("x", {2}, {1, 2}).f32_tensor("x", {2}, {1, 2});
    expect_corrupt(open_bytes(dir, b.build()), "duplicate tensor 'x'");
  }
  {  // Q8_0 rows must be whole blocks
    GgufBuilder b;
    b.tensor("blk.0.attn_q.weight", {2, 48}, 8, Bytes(2 * 34 * 2, 0));
    expect_corrupt(open_bytes(dir, b.build()),
                   "tensor 'blk.0.attn_q.weight' has 48 elements per row, not a multiple of the "
                   "Q8_0 block size 32");
  }
}

// Patches a tensor-info field of a single-tensor file built by GgufBuilder.
size_t info_offset_pos(const Bytes& b, const std::string& name, size_t n_dims) {
  auto it = std::search(b.begin(), b.end(), name.begin(), name.end());
  return static_cast<size_t>(it - b.begin()) + name.size() + 4 + 8 * n_dims + 4;
}

TEST(Gguf, TensorDataOutsideFileMessage) {
  TempDir dir;
  GgufBuilder b;
  b.f32_tensor("blk.0.attn_q.weight", {4, 4}, std::vector<float>(16, 1.0f));
  Bytes raw = b.build();
  raw.resize(raw.size() - 4);  // lose the last float
  const std::string path = dir.file("short.gguf");
  loader_test::write_file(path, raw);
  auto r = GgufFile::open(path);
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), StatusCode::kCorrupt);
  const size_t start = raw.size() + 4 - 64;
  EXPECT_EQ(r.status().message(),
            fmt::format("{}: tensor 'blk.0.attn_q.weight' data [{}, {}) lies outside the file "
                        "(size {})",
                        path, start, start + 64, raw.size()));

  // An offset that is not a multiple of the alignment.
  Bytes mis = b.build();
  const size_t pos = info_offset_pos(mis, "blk.0.attn_q.weight", 2);
  uint64_t off = 4;
  std::memcpy(mis.data() + pos, &off, 8);
  expect_corrupt(open_bytes(dir, mis), "offset 4 is not a multiple of the alignment 32");
  // A huge offset: overflow is caught.
  off = ~0ull - 31;
  std::memcpy(mis.data() + pos, &off, 8);
  expect_corrupt(open_bytes(dir, mis), "tensor 'blk.0.attn_q.weight'");
}

// A tensor whose type (or shape) was changed in its header no longer spans its data: F32 ->
// Q4_0 leaves a gap before the next tensor, or data after the last one; the error names the
// tensor, and the file's own layout (each tensor padded to the alignment) is accepted.
TEST(Gguf, TensorWhoseTypeNoLongerSpansItsDataIsRefused) {
  TempDir dir;
  GgufBuilder b;
  b.f32_tensor("blk.0.attn_q.weight", {4, 32}, std::vector<float>(128, 0.5f))
      .f32_tensor("blk.0.attn_k.weight", {2, 32}, std::vector<float>(64, 0.25f))
      .f32_tensor("blk.0.norm", {3}, {1, 2, 3});  // the last: 12 bytes, no padding after
  const Bytes raw = b.build();
  ASSERT_TRUE(open_bytes(dir, raw).is_ok());
  for (const char* name : {"blk.0.attn_q.weight", "blk.0.attn_k.weight"}) {
    SCOPED_TRACE(name);
    Bytes changed = raw;
    const uint32_t q4_0 = 2;
    std::memcpy(changed.data() + info_offset_pos(changed, name, 2) - 4, &q4_0, 4);
    const auto r = open_bytes(dir, changed);
    ASSERT_FALSE(r.is_ok());
    EXPECT_EQ(r.status().code(), StatusCode::kCorrupt);
    EXPECT_NE(r.status().message().find(fmt::format("tensor '{}' (Q4_0", name)), std::string::npos)
        << r.status().to_string();
    EXPECT_NE(r.status().message().find("its type or shape does not match its data"), std::string::npos);
  }
  // The last tensor: F32 [2, 32] -> Q8_0 (68 of its 256 bytes), the rest trails to the end.
  GgufBuilder last;
  last.f32_tensor("blk.0.norm", {2}, {1, 2}).f32_tensor("output.weight", {2, 32}, std::vector<float>(64, 1.0f));
  Bytes changed = last.build();
  ASSERT_TRUE(open_bytes(dir, changed).is_ok());
  const uint32_t q8_0 = 8;
  std::memcpy(changed.data() + info_offset_pos(changed, "output.weight", 2) - 4, &q8_0, 4);
  expect_corrupt(open_bytes(dir, changed), "bytes of data follow it to the end of the file");
}

// The loader sizes tensors of every ggml type, computable or not, with the format table's
// numbers (common/dtype.h): exactly rows * (cols / block_elems) * block_bytes bytes fit, one
// byte less does not, and a row that is not whole blocks is refused.
TEST(Gguf, BoundsCheckUsesTheFormatTableForEveryGgmlType) {
  TempDir dir;
  for (const int id : ggml_type_ids()) {
    const GgmlTypeInfo g = ggml_type_info(id).value();
    SCOPED_TRACE(std::string(g.name));
    const int64_t rows = 3, cols = 2 * static_cast<int64_t>(g.block_elems);
    const size_t bytes = static_cast<size_t>(rows * 2 * g.block_bytes);
    GgufBuilder b;
    b.tensor("w", {rows, cols}, static_cast<uint32_t>(id), Bytes(bytes, 0x5a));
    auto r = open_bytes(dir, b.build());
    ASSERT_TRUE(r.is_ok()) << r.status().to_string();
    const GgufTensorInfo* t = (*r)->find_tensor("w");
    ASSERT_NE(t, nullptr);
    EXPECT_EQ(t->supported, g.type.has_value());
    if (g.type) {
      EXPECT_EQ(t->view.type, *g.type);
      EXPECT_EQ(t->view.nbytes(), bytes);
      EXPECT_EQ(t->view.nbytes(), rows * row_bytes(*g.type, cols));
    }
    EXPECT_EQ(ggml_type_name(id), g.name);

    GgufBuilder short_by_one;
    short_by_one.tensor("w", {rows, cols}, static_cast<uint32_t>(id), Bytes(bytes - 1, 0x5a));
    expect_corrupt(open_bytes(dir, short_by_one.build()), "lies outside the file");

    if (g.block_elems > 1) {
      GgufBuilder ragged;
      ragged.tensor("w", {1, cols + 1}, static_cast<uint32_t>(id), Bytes(bytes, 0x5a));
      expect_corrupt(open_bytes(dir, ragged.build()),
                     fmt::format("not a multiple of the {} block size {}", g.name, g.block_elems));
    }
  }
}

TEST(Gguf, TruncationAtEveryHeaderLengthAndCoarseSteps) {
  TESSERA_REQUIRE_STORIES();
  const Bytes raw = loader_test::read_file(f32_path());
  TempDir dir;
  const std::string path = dir.file("trunc.gguf");
  // Header region: every length (the tensor data starts at 14432). Beyond it: coarse steps.
  std::vector<size_t> lengths;
  for (size_t n = 0; n < 14500; n += (n < 600 ? 1 : 7)) lengths.push_back(n);
  for (size_t n = 14500; n < raw.size(); n += 4099) lengths.push_back(n);
  lengths.push_back(raw.size() - 1);
  for (size_t n : lengths) {
    loader_test::write_file(path, raw.data(), n);
    auto r = GgufFile::open(path);
    ASSERT_FALSE(r.is_ok()) << "prefix of " << n << " bytes opened";
    ASSERT_EQ(r.status().code(), StatusCode::kCorrupt) << n << ": " << r.status().to_string();
    ASSERT_EQ(r.status().message().rfind(path + ": ", 0), 0u) << r.status().message();
  }
  loader_test::write_file(path, raw);
  EXPECT_TRUE(GgufFile::open(path).is_ok());
}

TEST(Gguf, HandBuiltTruncations) {
  TempDir dir;
  GgufBuilder b = two_tensor_file();
  b.kv_str_array("arr", {"x", "yy"}).kv_array<uint32_t>("ints", loader_test::kGU32, {1, 2, 3});
  const Bytes raw = b.build();
  for (size_t n = 0; n < raw.size(); ++n) {
    auto r = open_bytes(dir, Bytes(raw.begin(), raw.begin() + static_cast<std::ptrdiff_t>(n)));
    ASSERT_FALSE(r.is_ok()) << n;
  }
  auto r = open_bytes(dir, raw);
  ASSERT_TRUE(r.is_ok());
  expect_views_inside(**r);
}


// ---- open_metadata: the header without a mapping ----

// The same metadata and tensor infos as open(), with no view into a mapping.
void expect_same_header(const GgufFile& mapped, const GgufFile& header) {
  EXPECT_EQ(header.file_data(), nullptr);
  EXPECT_EQ(header.path(), mapped.path());
  EXPECT_EQ(header.version(), mapped.version());
  ASSERT_EQ(header.metadata().size(), mapped.metadata().size());
  for (const auto& [key, v] : mapped.metadata()) {
    auto it = header.metadata().find(key);
    ASSERT_NE(it, header.metadata().end()) << key;
    EXPECT_EQ(it->second.type, v.type) << key;
    EXPECT_EQ(it->second.array_type, v.array_type) << key;
    EXPECT_TRUE(it->second.value == v.value) << key;
  }
  ASSERT_EQ(header.tensors().size(), mapped.tensors().size());
  for (size_t i = 0; i < mapped.tensors().size(); ++i) {
    const GgufTensorInfo& a = mapped.tensors()[i];
    const GgufTensorInfo& b = header.tensors()[i];
    EXPECT_EQ(b.name, a.name);
    EXPECT_EQ(b.ggml_type, a.ggml_type) << a.name;
    EXPECT_EQ(b.shape, a.shape) << a.name;
    EXPECT_EQ(b.offset, a.offset) << a.name;
    EXPECT_EQ(b.supported, a.supported) << a.name;
    EXPECT_EQ(b.view.data, nullptr) << a.name;
    EXPECT_EQ(b.view.type, a.view.type) << a.name;
    EXPECT_EQ(b.view.shape_string(), a.view.shape_string()) << a.name;
    EXPECT_EQ(header.find_tensor(a.name), &b);
    if (!a.supported) continue;
    // read_tensor_data gives the mapped bytes either way.
    Bytes want(a.view.nbytes()), got_mapped(a.view.nbytes()), got_read(a.view.nbytes());
    std::memcpy(want.data(), a.view.data, want.size());
    ASSERT_TRUE(mapped.read_tensor_data(a, got_mapped.data(), got_mapped.size()).is_ok()) << a.name;
    ASSERT_TRUE(header.read_tensor_data(b, got_read.data(), got_read.size()).is_ok()) << a.name;
    EXPECT_EQ(got_mapped, want) << a.name;
    EXPECT_EQ(got_read, want) << a.name;
  }
}

TEST(GgufMetadata, MatchesOpenOnStories) {
  TESSERA_REQUIRE_STORIES();
  for (const std::string& path : {f32_path(), loader_test::stories_dir() + "/stories260K.ggml-org.gguf"}) {
    SCOPED_TRACE(path);
    auto mapped = GgufFile::open(path);
    auto header = GgufFile::open_metadata(path);
    ASSERT_TRUE(mapped.is_ok()) << mapped.status().to_string();
    ASSERT_TRUE(header.is_ok()) << header.status().to_string();
    expect_same_header(**mapped, **header);
  }
}

TEST(GgufMetadata, MatchesOpenOnHandBuiltFiles) {
  TempDir dir;
  for (uint32_t version : {2u, 3u}) {
    for (uint32_t align : {32u, 64u, 8u}) {
      SCOPED_TRACE(::testing::PrintToString(std::make_pair(version, align)));
      GgufBuilder b = two_tensor_file();
      b.kv_str_array("arr", {"x", "yy"}).kv_array<uint32_t>("ints", loader_test::kGU32, {1, 2, 3});
      loader_test::write_file(dir.file("t.gguf"), b.build(version, align));
      auto mapped = GgufFile::open(dir.file("t.gguf"));
      auto header = GgufFile::open_metadata(dir.file("t.gguf"));
      ASSERT_TRUE(mapped.is_ok()) << mapped.status().to_string();
      ASSERT_TRUE(header.is_ok()) << header.status().to_string();
      expect_same_header(**mapped, **header);
    }
  }
}

// Metadata larger than the 64 KiB read window: strings and arrays that straddle windows.
TEST(GgufMetadata, MetadataLargerThanTheReadWindow) {
  TempDir dir;
  std::vector<std::string> tokens;
  for (int i = 0; i < 30000; ++i) tokens.push_back(fmt::format("token-{}", i * 7919));
  GgufBuilder b = two_tensor_file();
  b.kv_str_array("tokenizer.ggml.tokens", tokens).kv_str("long", std::string(200000, 'x'));
  loader_test::write_file(dir.file("big.gguf"), b.build());
  auto mapped = GgufFile::open(dir.file("big.gguf"));
  auto header = GgufFile::open_metadata(dir.file("big.gguf"));
  ASSERT_TRUE(mapped.is_ok()) << mapped.status().to_string();
  ASSERT_TRUE(header.is_ok()) << header.status().to_string();
  expect_same_header(**mapped, **header);
  EXPECT_EQ(*(*header)->get_string_array("tokenizer.ggml.tokens"), tokens);
}

// Bytes this process has read through read(2) / pread(2) so far, or -1 when /proc does not say.
int64_t bytes_read_by_this_process() {
  std::ifstream in("/proc/self/io");
  std::string key;
  int64_t value = 0;
  while (in >> key >> value)
    if (key == "rchar:") return value;
  return -1;
}

TEST(GgufMetadata, DoesNotReadTheTensorData) {
  TempDir dir;
  GgufBuilder b;
  b.kv_str("general.architecture", "llama")
      .f32_tensor("big", {1024, 1024}, std::vector<float>(1024 * 1024, 0.5f));  // 4 MiB of data
  const Bytes raw = b.build();
  const std::string path = dir.file("big.gguf");
  loader_test::write_file(path, raw);
  const int64_t before = bytes_read_by_this_process();
  if (before < 0) GTEST_SKIP() << "/proc/self/io has no rchar";
  auto header = GgufFile::open_metadata(path);
  const int64_t after = bytes_read_by_this_process();
  ASSERT_TRUE(header.is_ok()) << header.status().to_string();
  EXPECT_EQ((*header)->file_data(), nullptr);
  ASSERT_NE((*header)->find_tensor("big"), nullptr);
  EXPECT_EQ((*header)->find_tensor("big")->view.data, nullptr);
  // The header is a few hundred bytes; one read window (64 KiB) at most, plus /proc/self/io.
  EXPECT_LT(after - before, int64_t{64 << 10} + 4096);
}

TEST(GgufMetadata, RefusesWhatOpenRefusesWithTheSameMessage) {
  TempDir dir;
  GgufBuilder b = two_tensor_file();
  b.kv_str_array("arr", {"x", "yy"}).kv_array<uint32_t>("ints", loader_test::kGU32, {1, 2, 3});
  const Bytes raw = b.build();
  const std::string path = dir.file("t.gguf");
  for (size_t n = 0; n < raw.size(); ++n) {
    loader_test::write_file(path, raw.data(), n);
    auto mapped = GgufFile::open(path);
    auto header = GgufFile::open_metadata(path);
    ASSERT_FALSE(mapped.is_ok()) << n;
    ASSERT_FALSE(header.is_ok()) << n;
    EXPECT_EQ(header.status().code(), mapped.status().code()) << n;
    EXPECT_EQ(header.status().message(), mapped.status().message()) << n;
  }
  auto missing = GgufFile::open_metadata(dir.file("missing.gguf"));
  ASSERT_FALSE(missing.is_ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kIoError);
  EXPECT_NE(missing.status().message().find(dir.file("missing.gguf")), std::string::npos);
  EXPECT_EQ(GgufFile::open_metadata(dir.path()).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tessera
