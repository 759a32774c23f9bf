#include "model/safetensors.h"

#include <cstring>
#include <functional>

#include <gtest/gtest.h>

#include "tests/model/loader_test_util.h"

namespace tessera {
namespace {

using loader_test::build_safetensors;
using loader_test::Bytes;
using loader_test::StEntry;
using loader_test::TempDir;
using Json = nlohmann::json;

std::string stories_st() { return loader_test::stories_dir() + "/hf/model.safetensors"; }

Result<std::unique_ptr<SafetensorsCheckpoint>> open_bytes(const TempDir& dir, const Bytes& b,
                                                          const std::string& name = "model.safetensors") {
  loader_test::write_file(dir.file(name), b);
  return SafetensorsCheckpoint::open(dir.file(name));
}

void expect_error(const Result<std::unique_ptr<SafetensorsCheckpoint>>& r, const std::string& needle) {
  ASSERT_FALSE(r.is_ok()) << "expected an error containing: " << needle;
  EXPECT_NE(r.status().message().find(needle), std::string::npos) << r.status().to_string();
}

// Every view lies inside the file it names.
void expect_views_inside(const SafetensorsCheckpoint& ck) {
  for (const auto& [name, t] : ck.tensors()) {
    if (!t.view.data) continue;
    const MappedFile* mf = nullptr;
    for (size_t i = 0; i < ck.files().size(); ++i)
      if (&ck.files()[i] == t.file) mf = &ck.mapped_files()[i];
    ASSERT_NE(mf, nullptr) << name;
    const auto* p = static_cast<const uint8_t*>(t.view.data);
    ASSERT_GE(p, mf->data()) << name;
    ASSERT_LE(static_cast<size_t>(p - mf->data()) + t.view.nbytes(), mf->size()) << name;
  }
}

TEST(Safetensors, OpensStories260K) {
  TESSERA_REQUIRE_STORIES();
  auto r = SafetensorsCheckpoint::open(stories_st());
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  const SafetensorsCheckpoint& ck = **r;
  EXPECT_EQ(ck.tensors().size(), 47u);
  EXPECT_EQ(ck.files(), std::vector<std::string>{stories_st()});
  const SafetensorsTensor* e = ck.find("model.embed_tokens.weight");
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->dtype, "F32");
  EXPECT_EQ(e->shape, (std::vector<int64_t>{512, 64}));
  EXPECT_EQ(e->view.type, QuantType::kF32);
  EXPECT_EQ(e->view.shape_string(), "[512, 64]");
  EXPECT_EQ(*e->file, stories_st());
  const SafetensorsTensor* up = ck.find("model.layers.3.mlp.up_proj.weight");
  ASSERT_NE(up, nullptr);
  EXPECT_EQ(up->shape, (std::vector<int64_t>{172, 64}));
  EXPECT_EQ(ck.find("lm_head.weight"), nullptr);
  EXPECT_EQ(ck.find("__metadata__"), nullptr);
  expect_views_inside(ck);
  // The view shows the bytes at 8 + header + data_offsets[0].
  const Bytes raw = loader_test::read_file(stories_st());
  const Json h = loader_test::safetensors_header(raw);
  uint64_t hl;
  std::memcpy(&hl, raw.data(), 8);
  const uint64_t begin = h["model.layers.3.mlp.up_proj.weight"]["data_offsets"][0];
  EXPECT_EQ(std::memcmp(up->view.data, raw.data() + 8 + hl + begin, up->view.nbytes()), 0);

  auto d = SafetensorsCheckpoint::open(loader_test::stories_dir() + "/hf");
  ASSERT_TRUE(d.is_ok()) << d.status().to_string();
  EXPECT_EQ((*d)->tensors().size(), 47u);
}

TEST(Safetensors, Dtypes) {
  TempDir dir;
  const std::vector<float> v = loader_test::test_values(6, 1);
  Bytes i32(8);
  const int32_t ints[2] = {-7, 1 << 20};
  std::memcpy(i32.data(), ints, 8);
  auto r = open_bytes(dir, build_safetensors(
                               {
                                   {"f32", "F32", {2, 3}, loader_test::f32_bytes(v)},
                                   {"f16", "F16", {6}, loader_test::f16_bytes(v)},
                                   {"bf16", "BF16", {3, 2}, loader_test::bf16_bytes(v)},
                                   {"i8", "I8", {4}, Bytes{1, 2, 0xff, 4}},
                                   {"u8", "U8", {2, 2}, Bytes{1, 2, 3, 4}},
                                   {"i32", "I32", {2}, i32},
                                   {"f64", "F64", {1}, Bytes(8, 0)},
                                   {"i64", "I64", {2}, Bytes(16, 0)},
                                   {"scalar", "F32", {}, loader_test::f32_bytes({2.5f})},
                                   {"empty", "F32", {0, 4}, {}},
                               },
                               true, Json{{"format", "pt"}}));
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  const auto& ck = **r;
  EXPECT_EQ(ck.tensors().size(), 10u);
  EXPECT_EQ(ck.find("f32")->view.type, QuantType::kF32);
  EXPECT_EQ(static_cast<const float*>(ck.find("f32")->view.data)[4], v[4]);
  EXPECT_EQ(ck.find("f16")->view.type, QuantType::kF16);
  EXPECT_EQ(ck.find("bf16")->view.type, QuantType::kBF16);
  EXPECT_EQ(ck.find("bf16")->view.shape_string(), "[3, 2]");
  EXPECT_EQ(ck.find("i8")->view.type, QuantType::kI8);
  EXPECT_EQ(ck.find("u8")->view.type, QuantType::kI8);
  EXPECT_EQ(ck.find("u8")->dtype, "U8");
  EXPECT_EQ(ck.find("i32")->view.type, QuantType::kI32);
  EXPECT_EQ(static_cast<const int32_t*>(ck.find("i32")->view.data)[1], 1 << 20);
  // Listed but not usable.
  EXPECT_EQ(ck.find("f64")->view.data, nullptr);
  EXPECT_EQ(ck.find("i64")->view.data, nullptr);
  EXPECT_EQ(ck.find("i64")->shape, (std::vector<int64_t>{2}));
  EXPECT_EQ(ck.find("empty")->view.data, nullptr);
  // A 0-d tensor is a one-element view.
  EXPECT_EQ(ck.find("scalar")->view.ndim, 0);
  EXPECT_EQ(ck.find("scalar")->view.numel(), 1);
  EXPECT_EQ(*static_cast<const float*>(ck.find("scalar")->view.data), 2.5f);
  expect_views_inside(ck);
}

// Builds a one-tensor file and patches its header entry.
Bytes patched(const std::function<void(Json&)>& patch) {
  Bytes b = build_safetensors({{"model.norm.weight", "F32", {4}, loader_test::f32_bytes({1, 2, 3, 4})},
                               {"x", "F16", {2}, Bytes(4, 0)}});
  Json h = loader_test::safetensors_header(b);
  patch(h);
  return loader_test::rewrite_safetensors_header(b, h);
}

TEST(Safetensors, HeaderEntryErrorsNameFileAndTensor) {
  TempDir dir;
  const std::string file = dir.file("model.safetensors");
  const std::string t = file + ": tensor 'model.norm.weight': ";
  struct Case {
    std::function<void(Json&)> patch;
    std::string message;
  };
  const Case cases[] = {
      {[](Json& h) { h["model.norm.weight"]["data_offsets"] = {0, 20}; },
       "data_offsets [0, 20) hold 20 bytes, but shape [4] of F32 needs 16"},
      {[](Json& h) { h["model.norm.weight"]["data_offsets"] = {0, 1000}; },
       "data_offsets [0, 1000) lie outside the data section (size 20)"},
      {[](Json& h) { h["model.norm.weight"]["data_offsets"] = {8, 4}; },
       "data_offsets [8, 4) lie outside the data section (size 20)"},
      {[](Json& h) { h["model.norm.weight"]["data_offsets"] = {-4, 12}; },
       "'data_offsets' must be two non-negative integers"},
      {[](Json& h) { h["model.norm.weight"]["data_offsets"] = {0}; },
       "'data_offsets' must be two non-negative integers"},
      {[](Json& h) { h["model.norm.weight"]["data_offsets"] = {0, 18446744073709551615ull}; },
       "data_offsets [0, 18446744073709551615) lie outside the data section (size 20)"},
      {[](Json& h) { h["model.norm.weight"]["dtype"] = "F4"; }, "unknown dtype 'F4'"},
      {[](Json& h) { h["model.norm.weight"].erase("dtype"); }, "missing string 'dtype'"},
      {[](Json& h) { h["model.norm.weight"]["shape"] = "4"; }, "missing array 'shape'"},
      {[](Json& h) { h["model.norm.weight"]["shape"] = {-4}; }, "invalid dimension -4"},
      {[](Json& h) { h["model.norm.weight"]["shape"] = {1.5}; }, "invalid dimension 1.5"},
      {[](Json& h) {
         h["model.norm.weight"]["shape"] = {4294967296ll, 4294967296ll, 4294967296ll};
       },
       "element count overflows"},
      {[](Json& h) { h["model.norm.weight"]["shape"] = {2, 3}; },
       "data_offsets [0, 16) hold 16 bytes, but shape [2,3] of F32 needs 24"},
      {[](Json& h) { h["model.norm.weight"] = 5; }, "header entry is not an object"},
  };
  for (const auto& c : cases) {
    auto r = open_bytes(dir, patched(c.patch));
    ASSERT_FALSE(r.is_ok()) << c.message;
    EXPECT_EQ(r.status().code(), StatusCode::kCorrupt);
    EXPECT_EQ(r.status().message(), t + c.message);
  }
}

TEST(Safetensors, FileLevelErrors) {
  TempDir dir;
  const Bytes good = patched([](Json&) {});
  expect_error(open_bytes(dir, Bytes{1, 2, 3}), "truncated (3 bytes");
  Bytes b = good;
  const uint64_t huge = 1ull << 40;
  std::memcpy(b.data(), &huge, 8);
  expect_error(open_bytes(dir, b), "header length 1099511627776 exceeds the file size");
  b = good;
  b[8] = 'x';
  expect_error(open_bytes(dir, b), "header is not a JSON object");
  Bytes arr;
  const std::string js = "[1, 2]  ";
  loader_test::put<uint64_t>(&arr, js.size());
  arr.insert(arr.end(), js.begin(), js.end());
  expect_error(open_bytes(dir, arr), "header is not a JSON object");
  // Unpadded header: F32 data would sit at an odd address.
  auto r = open_bytes(dir, build_safetensors({{"w", "F32", {1}, loader_test::f32_bytes({1})}},
                                             /*pad=*/false));
  if (!r.is_ok()) {
    EXPECT_EQ(r.status().code(), StatusCode::kUnimplemented);
    EXPECT_NE(r.status().message().find("tensor 'w'"), std::string::npos);
  }
  auto missing = SafetensorsCheckpoint::open(dir.file("none.safetensors"));
  ASSERT_FALSE(missing.is_ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  TempDir empty;
  auto e = SafetensorsCheckpoint::open(empty.path());
  ASSERT_FALSE(e.is_ok());
  EXPECT_EQ(e.status().code(), StatusCode::kNotFound);
}

TEST(Safetensors, EveryHeaderPrefixAndCoarseTruncations) {
  TESSERA_REQUIRE_STORIES();
  const Bytes raw = loader_test::read_file(stories_st());
  uint64_t hl;
  std::memcpy(&hl, raw.data(), 8);
  TempDir dir;
  const std::string path = dir.file("model.safetensors");
  std::vector<size_t> lengths;
  for (size_t n = 0; n < 8 + hl + 64; ++n) lengths.push_back(n);
  for (size_t n = 8 + hl + 64; n < raw.size(); n += 4099) lengths.push_back(n);
  lengths.push_back(raw.size() - 1);
  for (size_t n : lengths) {
    loader_test::write_file(path, raw.data(), n);
    auto r = SafetensorsCheckpoint::open(path);
    ASSERT_FALSE(r.is_ok()) << "prefix of " << n << " bytes opened";
    ASSERT_EQ(r.status().message().rfind(path + ": ", 0), 0u) << r.status().message();
  }
}

void write_sharded(const TempDir& dir, const Json& weight_map) {
  const std::vector<float> a = loader_test::test_values(8, 2), b = loader_test::test_values(4, 3);
  loader_test::write_file(dir.file("model-00001-of-00002.safetensors"),
                          build_safetensors({{"model.embed_tokens.weight", "F32", {2, 4}, loader_test::f32_bytes(a)}}));
  loader_test::write_file(dir.file("model-00002-of-00002.safetensors"),
                          build_safetensors({{"model.norm.weight", "BF16", {4}, loader_test::bf16_bytes(b)},
                                             {"lm_head.weight", "F32", {2, 4}, loader_test::f32_bytes(a)}}));
  loader_test::write_file(dir.file("model.safetensors.index.json"),
                          Json{{"metadata", {{"total_size", 72}}}, {"weight_map", weight_map}}.dump());
}

TEST(Safetensors, ShardedIndex) {
  TempDir dir;
  const Json wm = {{"model.embed_tokens.weight", "model-00001-of-00002.safetensors"},
                   {"model.norm.weight", "model-00002-of-00002.safetensors"},
                   {"lm_head.weight", "model-00002-of-00002.safetensors"}};
  write_sharded(dir, wm);
  for (const std::string& p : {dir.path(), dir.file("model.safetensors.index.json")}) {
    auto r = SafetensorsCheckpoint::open(p);
    ASSERT_TRUE(r.is_ok()) << r.status().to_string();
    const auto& ck = **r;
    EXPECT_EQ(ck.tensors().size(), 3u);
    EXPECT_EQ(ck.files().size(), 2u);
    EXPECT_EQ(*ck.find("model.norm.weight")->file, dir.file("model-00002-of-00002.safetensors"));
    EXPECT_EQ(*ck.find("model.embed_tokens.weight")->file,
              dir.file("model-00001-of-00002.safetensors"));
    EXPECT_EQ(ck.find("model.norm.weight")->view.type, QuantType::kBF16);
    expect_views_inside(ck);
  }
  // The index names a shard that does not hold the tensor.
  Json wrong = wm;
  wrong["model.norm.weight"] = "model-00001-of-00002.safetensors";
  write_sharded(dir, wrong);
  auto r = SafetensorsCheckpoint::open(dir.path());
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().message(),
            dir.file("model.safetensors.index.json") +
                ": tensor 'model.norm.weight' is mapped to 'model-00001-of-00002.safetensors', "
                "which does not hold it");
  // A shard that does not exist.
  Json missing = wm;
  missing["model.norm.weight"] = "model-00003-of-00002.safetensors";
  write_sharded(dir, missing);
  r = SafetensorsCheckpoint::open(dir.path());
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("model-00003-of-00002.safetensors"), std::string::npos);
  // Paths escaping the directory are refused.
  Json escape = wm;
  escape["model.norm.weight"] = "../model.safetensors";
  write_sharded(dir, escape);
  r = SafetensorsCheckpoint::open(dir.path());
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("not a relative path"), std::string::npos);
  // A broken index.
  loader_test::write_file(dir.file("model.safetensors.index.json"), std::string("{\"weight_map\": 3}"));
  r = SafetensorsCheckpoint::open(dir.path());
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("'weight_map'"), std::string::npos);
  loader_test::write_file(dir.file("model.safetensors.index.json"), std::string("{not json"));
  EXPECT_FALSE(SafetensorsCheckpoint::open(dir.path()).is_ok());
}

TEST(Safetensors, DuplicateTensorAcrossShards) {
  TempDir dir;
  const Bytes one = build_safetensors({{"w", "F32", {1}, loader_test::f32_bytes({1})}});
  loader_test::write_file(dir.file("a.safetensors"), one);
  loader_test::write_file(dir.file("b.safetensors"), one);
  auto r = SafetensorsCheckpoint::open(dir.path());  // no index: every *.safetensors
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().message(),
            dir.file("b.safetensors") + ": tensor 'w' is also in " + dir.file("a.safetensors"));
}

}  // namespace
}  // namespace tessera
