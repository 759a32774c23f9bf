// Test helpers for the model loaders: temp directories and small hand-built GGUF / safetensors
// files, including deliberately malformed ones (which is why the real writers are not used).
#pragma once

#include <stdlib.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "common/dtype.h"
#include "common/env.h"
#include "tests/testdata.h"

namespace tessera::loader_test {

using Bytes = std::vector<uint8_t>;

// A directory under the test temp dir, removed with everything in it at scope exit.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = ::testing::TempDir() + "tessera_loaders_XXXXXX";
    char* p = ::mkdtemp(tmpl.data());
    EXPECT_NE(p, nullptr) << "mkdtemp failed for " << tmpl;
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

inline void write_file(const std::string& path, const void* data, size_t n) {
  // Unlink first: truncating a file with unwritten data makes ext4 flush it (auto_da_alloc),
  // which turns thousands of small rewrites into seconds of disk waits.
  std::error_code ec;
  std::filesystem::remove(path, ec);
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  ASSERT_TRUE(out.good()) << "cannot write " << path;
  out.write(static_cast<const char*>(data), static_cast<std::streamsize>(n));
  ASSERT_TRUE(out.good()) << "write failed: " << path;
}
inline void write_file(const std::string& path, const Bytes& b) { write_file(path, b.data(), b.size()); }
inline void write_file(const std::string& path, const std::string& s) {
  write_file(path, s.data(), s.size());
}

inline Bytes read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return Bytes(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

inline std::string stories_dir() { return testdata_dir() + "/stories260K"; }
// Fails the test, naming the missing file, unless stories260K's GGUF and safetensors are there.
#define TESSERA_REQUIRE_STORIES()                                                              \
  do {                                                                                         \
    TESSERA_REQUIRE_TESTDATA(::tessera::loader_test::stories_dir() + "/stories260K-f32.gguf");  \
    TESSERA_REQUIRE_TESTDATA(::tessera::loader_test::stories_dir() + "/hf/model.safetensors"); \
  } while (0)

template <typename T>
void put(Bytes* b, T v) {
  const auto* p = reinterpret_cast<const uint8_t*>(&v);
  b->insert(b->end(), p, p + sizeof(T));
}
inline void put_str(Bytes* b, const std::string& s) {
  put<uint64_t>(b, s.size());
  b->insert(b->end(), s.begin(), s.end());
}

// ---- GGUF ----

enum : uint32_t {
  kGU8 = 0, kGI8 = 1, kGU16 = 2, kGI16 = 3, kGU32 = 4, kGI32 = 5, kGF32 = 6, kGBool = 7,
  kGStr = 8, kGArr = 9, kGU64 = 10, kGI64 = 11, kGF64 = 12,
};

// Builds GGUF bytes. Values are stored raw so malformed files are easy to express.
class GgufBuilder {
 public:
  struct Tensor {
    std::string name;
    std::vector<int64_t> shape;  // outermost first (written reversed, as GGUF's ne[])
    uint32_t ggml_type;
    Bytes data;
  };

  GgufBuilder& kv_raw(const std::string& key, uint32_t type, const Bytes& value) {
    Bytes b;
    put_str(&b, key);
    put<uint32_t>(&b, type);
    b.insert(b.end(), value.begin(), value.end());
    kvs_.push_back(std::move(b));
    return *this;
  }
  template <typename T>
  GgufBuilder& kv(const std::string& key, uint32_t type, T v) {
    Bytes b;
    put<T>(&b, v);
    return kv_raw(key, type, b);
  }
  GgufBuilder& kv_u32(const std::string& k, uint32_t v) { return kv(k, kGU32, v); }
  GgufBuilder& kv_f32(const std::string& k, float v) { return kv(k, kGF32, v); }
  GgufBuilder& kv_str(const std::string& k, const std::string& v) {
    Bytes b;
    put_str(&b, v);
    return kv_raw(k, kGStr, b);
  }
  GgufBuilder& kv_str_array(const std::string& k, const std::vector<std::string>& v) {
    Bytes b;
    put<uint32_t>(&b, kGStr);
    put<uint64_t>(&b, v.size());
    for (const auto& s : v) put_str(&b, s);
    return kv_raw(k, kGArr, b);
  }
  template <typename T>
  GgufBuilder& kv_array(const std::string& k, uint32_t elem_type, const std::vector<T>& v) {
    Bytes b;
    put<uint32_t>(&b, elem_type);
    put<uint64_t>(&b, v.size());
    for (const T& x : v) put<T>(&b, x);
    return kv_raw(k, kGArr, b);
  }
  GgufBuilder& tensor(const std::string& name, std::vector<int64_t> shape, uint32_t ggml_type,
                      Bytes data) {
    tensors_.push_back({name, std::move(shape), ggml_type, std::move(data)});
    return *this;
  }
  GgufBuilder& f32_tensor(const std::string& name, std::vector<int64_t> shape,
                          const std::vector<float>& v) {
    Bytes b(v.size() * 4);
    std::memcpy(b.data(), v.data(), b.size());
    return tensor(name, std::move(shape), 0, std::move(b));
  }

  // `alignment` is the data alignment used for layout; it is written as general.alignment only
  // when it differs from 32 (call kv_u32 yourself to write something inconsistent).
  Bytes build(uint32_t version = 3, uint32_t alignment = 32) const {
    Bytes b;
    b.insert(b.end(), {'G', 'G', 'U', 'F'});
    put<uint32_t>(&b, version);
    put<uint64_t>(&b, tensors_.size());
    const bool write_align = alignment != 32;
    put<uint64_t>(&b, kvs_.size() + (write_align ? 1 : 0));
    for (const auto& kv : kvs_) b.insert(b.end(), kv.begin(), kv.end());
    if (write_align) {
      put_str(&b, "general.alignment");
      put<uint32_t>(&b, kGU32);
      put<uint32_t>(&b, alignment);
    }
    uint64_t off = 0;
    std::vector<uint64_t> offsets;
    for (const auto& t : tensors_) {
      put_str(&b, t.name);
      put<uint32_t>(&b, static_cast<uint32_t>(t.shape.size()));
      for (size_t i = t.shape.size(); i-- > 0;) put<uint64_t>(&b, static_cast<uint64_t>(t.shape[i]));
      put<uint32_t>(&b, t.ggml_type);
      put<uint64_t>(&b, off);
      offsets.push_back(off);
      off += (t.data.size() + alignment - 1) / alignment * alignment;
    }
    while (b.size() % alignment) b.push_back(0);
    const size_t data_start = b.size();
    for (size_t i = 0; i < tensors_.size(); ++i) {
      b.resize(data_start + offsets[i]);
      b.insert(b.end(), tensors_[i].data.begin(), tensors_[i].data.end());
    }
    return b;
  }

 private:
  std::vector<Bytes> kvs_;
  std::vector<Tensor> tensors_;
};

// ---- safetensors ----

struct StEntry {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
  Bytes data;
};

// Header padded with spaces to a multiple of 8 (as the safetensors library does) unless
// `pad` is false.
inline Bytes build_safetensors(const std::vector<StEntry>& entries, bool pad = true,
                               const nlohmann::json& metadata = nullptr) {
  nlohmann::json h = nlohmann::json::object();
  if (!metadata.is_null()) h["__metadata__"] = metadata;
  uint64_t off = 0;
  for (const auto& e : entries) {
    h[e.name] = {{"dtype", e.dtype}, {"shape", e.shape}, {"data_offsets", {off, off + e.data.size()}}};
    off += e.data.size();
  }
  std::string hs = h.dump();
  if (pad)
    while ((8 + hs.size()) % 8) hs.push_back(' ');
  Bytes b;
  put<uint64_t>(&b, hs.size());
  b.insert(b.end(), hs.begin(), hs.end());
  for (const auto& e : entries) b.insert(b.end(), e.data.begin(), e.data.end());
  return b;
}

// Rewrites the JSON header of a safetensors file (data section kept as is).
inline Bytes rewrite_safetensors_header(const Bytes& file, const nlohmann::json& header) {
  uint64_t n = 0;
  std::memcpy(&n, file.data(), 8);
  std::string hs = header.dump();
  while ((8 + hs.size()) % 8) hs.push_back(' ');
  Bytes b;
  put<uint64_t>(&b, hs.size());
  b.insert(b.end(), hs.begin(), hs.end());
  b.insert(b.end(), file.begin() + static_cast<std::ptrdiff_t>(8 + n), file.end());
  return b;
}
inline nlohmann::json safetensors_header(const Bytes& file) {
  uint64_t n = 0;
  std::memcpy(&n, file.data(), 8);
  return nlohmann::json::parse(file.begin() + 8, file.begin() + static_cast<std::ptrdiff_t>(8 + n));
}

inline Bytes f32_bytes(const std::vector<float>& v) {
  Bytes b(v.size() * 4);
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}
inline Bytes f16_bytes(const std::vector<float>& v) {
  Bytes b(v.size() * 2);
  for (size_t i = 0; i < v.size(); ++i) {
    const uint16_t h = f32_to_fp16(v[i]);
    std::memcpy(b.data() + 2 * i, &h, 2);
  }
  return b;
}
inline Bytes bf16_bytes(const std::vector<float>& v) {
  Bytes b(v.size() * 2);
  for (size_t i = 0; i < v.size(); ++i) {
    const uint16_t h = f32_to_bf16(v[i]);
    std::memcpy(b.data() + 2 * i, &h, 2);
  }
  return b;
}
// Values exactly representable in fp16 and bf16 (small multiples of 1/64), so conversions
// round-trip exactly.
inline std::vector<float> test_values(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> d(-64, 64);
  std::vector<float> v(n);
  for (auto& x : v) x = static_cast<float>(d(rng)) / 64.0f;
  return v;
}

}  // namespace tessera::loader_test
