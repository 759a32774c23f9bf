// SHA-256 against the FIPS 180-4 example digests, across update() piece boundaries, and of a file.
#include "common/sha256.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <string>

namespace tessera {
namespace {

TEST(Sha256Test, KnownDigests) {
  EXPECT_EQ(sha256_hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(sha256_hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(sha256_hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  EXPECT_EQ(sha256_hex(std::string(1000000, 'a')), "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST(Sha256Test, PiecesAndFile) {
  std::string data;
  for (int i = 0; i < 5000; ++i) data.push_back(static_cast<char>(i * 7 + 3));
  const std::string whole = sha256_hex(data);
  for (size_t piece : {1u, 3u, 63u, 64u, 65u, 1000u}) {
    Sha256 h;
    for (size_t i = 0; i < data.size(); i += piece) h.update(data.data() + i, std::min(piece, data.size() - i));
    EXPECT_EQ(Sha256::hex(h.finish()), whole) << piece;
  }
  const std::string path = (std::filesystem::temp_directory_path() / "tessera_sha256_test.bin").string();
  FILE* f = std::fopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  std::fwrite(data.data(), 1, data.size(), f);
  std::fclose(f);
  auto h = sha256_file(path);
  ASSERT_TRUE(h.is_ok());
  EXPECT_EQ(*h, whole);
  std::filesystem::remove(path);
  EXPECT_FALSE(sha256_file(path).is_ok());
}

}  // namespace
}  // namespace tessera
